"""Benchmarks of rapids_attn, run from the repository root: ``python -m benchmarks`` (docs/benchmarks.md).

They live beside the package, not in it (as scikit-learn's asv_benchmarks do): they need the
checkout's jobs/ and the sibling ../shared data, which an installed wheel has neither of.
"""

import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
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


@contextlib.contextmanager
def scratch(prefix: str = "rapids-attn-bench-"):
    """One folder for everything a benchmark run writes to temporary folders (its cases' run folders, data
    segments, codec trials), removed when the run ends, however it ends. It is TMPDIR for this process and
    for the case processes it starts (``run_in_process``), so a case's ``tempfile.mkdtemp`` lands inside it:
    a benchmark leaves nothing behind in /tmp, where hundreds of runs once filled the disk."""
    old_env, old_dir = os.environ.get("TMPDIR"), tempfile.tempdir
    d = tempfile.mkdtemp(prefix=prefix)
    os.environ["TMPDIR"], tempfile.tempdir = d, d
    try:
        yield Path(d)
    finally:
        tempfile.tempdir = old_dir
        if old_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = old_env
        shutil.rmtree(d, ignore_errors=True)


def run_in_process(module: str, *args: str) -> dict:
    """Run ``python -m module *args`` from the repository root, in a fresh process (so each case's
    peak memory is its own), and return the JSON it printed on its last ``RESULT `` line."""
    p = subprocess.run([sys.executable, "-m", module, *args], check=False, capture_output=True, text=True, cwd=_REPO)
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"{module} {' '.join(args)} failed:\n{p.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])
