"""Benchmarks of rapids_attn, run from the repository root: ``python -m benchmarks`` (docs/benchmarks.md).

They live beside the package, not in it (as scikit-learn's asv_benchmarks do): they need the
checkout's jobs/ and the sibling ../shared data, which an installed wheel has neither of.
"""

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent


def machine_info(**extra) -> dict:
    """What a benchmark's JSON records of where and when it ran: the platform, the CPUs, the checkout's commit
    (``unknown`` outside a git checkout) and the date, with ``extra`` (e.g. ``torch=torch.__version__``)."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], check=False, cwd=_REPO, capture_output=True, text=True
    ).stdout.strip()
    info = {"platform": platform.platform(), "cpus": os.cpu_count()}
    info.update(extra)
    info.update(commit=commit or "unknown", date=time.strftime("%Y-%m-%d %H:%M %Z"))
    return info


def run_in_process(module: str, *args: str) -> dict:
    """Run ``python -m module *args`` from the repository root, in a fresh process (so each case's
    peak memory is its own), and return the JSON it printed on its last ``RESULT `` line."""
    p = subprocess.run([sys.executable, "-m", module, *args], check=False, capture_output=True, text=True, cwd=_REPO)
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"{module} {' '.join(args)} failed:\n{p.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])
