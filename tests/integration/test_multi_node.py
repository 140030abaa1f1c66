"""The multi-node commands a user copies run a job over TLS (issue 47, item 2).

The block between the markers in docs/deployment.md, section 4 ("By hand"), is read and run as written, on this
machine, with these substitutions only: ``/shared`` is a temporary folder; ``python`` and ``dask`` are this
environment's; ``dask cuda worker`` is ``dask worker`` without its two GPU options (``--rmm-pool-size``,
``--set-rmm-allocator-for-libs``); the scheduler takes a free port (``--port 0``) and a free dashboard port for
8786 and 8787; the job line gets ``--set`` overrides for a tiny, offline job (MiniLM, 12 questions, pooled
features, CPU). The scheduler and the worker are separate processes, as on separate nodes. Then: a client without
the key, with a key of its own and over plain TCP is refused, and so is a job with another folder's key, in one
line; a job without credentials is refused at ``--check``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from distributed.security import Security
from helpers import REPO
from tls_probe import REFUSED, _client_runs, _identity, _no_certificate

from rapids_attn import tls

BIN = Path(sys.executable).parent
JOB_SETTINGS = [
    "model.name=minilm-l6",
    "embed.name=pooled",
    "extract.device=cpu",
    "runtime.learn_backend=cpu",
    "data.format=squad",
    f"data.path={REPO / 'rapids_attn' / 'data' / 'quickstart.json'}",
    "data.sample=12",
    "extract.shard_size=4",
]


def documented_commands() -> list[str]:
    """The shell lines of docs/deployment.md's multi-node block: continuations joined, comments dropped."""
    text = (REPO / "docs" / "deployment.md").read_text()
    block = re.search(
        r"<!-- multi-node commands: begin -->\n```bash\n(.*?)```\n<!-- multi-node commands: end -->", text, re.DOTALL
    )
    assert block, "docs/deployment.md lost its multi-node block"
    lines = block.group(1).replace("\\\n", " ").splitlines()
    return [
        re.sub(r"\s+#.*$", "", line).strip() for line in lines if line.strip() and not line.lstrip().startswith("#")
    ]


def adapted(line: str, shared: Path) -> str:
    """One documented line with this file's substitutions (the module's docstring)."""
    line = line.replace("/shared", str(shared))
    line = re.sub(r"^python ", f"{shlex.quote(sys.executable)} ", line)
    if line.startswith("dask cuda worker"):
        line = line.replace("dask cuda worker", "dask worker", 1)
        line = re.sub(r"\s--rmm-pool-size \S+", "", line)
        line = re.sub(r"\s--set-rmm-allocator-for-libs \S+", "", line)
    if line.startswith("dask scheduler"):
        line = line.replace("127.0.0.1:8787", "127.0.0.1:0") + " --port 0"
    return re.sub(r"^dask ", f"{shlex.quote(str(BIN / 'dask'))} ", line)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.slow
@pytest.mark.budget(100, reason="a TLS scheduler, a worker and the job, started as the docs' commands start them")
def test_the_documented_multi_node_commands_run_a_job_over_tls(tmp_path):
    lines = documented_commands()
    starts = [
        "python -m rapids_attn.tls ",
        'TLS="--tls-ca-file ',
        "dask scheduler --protocol tls $TLS ",
        "dask cuda worker ",
        "python -m rapids_attn.run jobs/multi_node.yaml",
        "python -m rapids_attn.run jobs/multi_node.yaml ",
    ]
    assert len(lines) == len(starts) and all(map(str.startswith, lines, starts)), lines
    shared = tmp_path / "shared"
    shared.mkdir()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    setup = "\n".join(["set -e", adapted(lines[0], shared), adapted(lines[1], shared)])
    made = subprocess.run(["bash", "-c", setup], env=env, capture_output=True, text=True, check=False)
    assert made.returncode == 0, made.stderr
    assert (shared / "tls" / "dask.key").stat().st_mode & 0o077 == 0  # readable by its owner only
    prefix = adapted(lines[1], shared) + "\nexec "
    started = []
    try:
        for line in lines[2:4]:  # the scheduler, then a worker: processes of their own, as on separate nodes
            started.append(
                subprocess.Popen(
                    ["bash", "-c", prefix + adapted(line, shared)],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
            )
            if line.startswith("dask scheduler"):
                deadline = time.monotonic() + 60
                while not (shared / "scheduler.json").is_file() and time.monotonic() < deadline:
                    time.sleep(0.5)
                assert (shared / "scheduler.json").is_file(), started[0].stderr.read1().decode()
        address = json.loads((shared / "scheduler.json").read_text())["address"]
        assert address.startswith("tls://"), address

        # the job, as the docs' line runs it, on jobs/multi_node.yaml with /shared moved
        job = tmp_path / "multi_node.yaml"
        job.write_text((REPO / "jobs" / "multi_node.yaml").read_text().replace("/shared", str(shared)))
        words = shlex.split(adapted(lines[4], shared).replace("jobs/multi_node.yaml", str(job)))
        r = _run([*words, "--set", *JOB_SETTINGS], cwd=REPO)
        assert r.returncode == 0, r.stderr[-3000:]
        s = json.loads((shared / "runs" / "multi_node" / "summary.json").read_text())
        assert s["backend"]["runtime"]["cluster"] == "scheduler" and s["backend"]["runtime"]["protocol"] == "tls"
        assert s["counts"]["maps"] == 12 * 72 and s["backend"]["runtime"]["n_workers"] == 1

        # without the key: refused, however it is tried; with it: answered (so the probe can fail)
        ours = tls.security(shared / "tls")
        assert _identity(address, **ours.get_connection_args("client"))["type"] == "Scheduler"
        assert _client_runs(address, ours) == ["ran"]
        for security in (None, Security.temporary()):
            with pytest.raises((*REFUSED, TypeError)):
                _client_runs(address, security)
        with pytest.raises(REFUSED):
            _identity("tcp://" + address.split("://", 1)[1])
        with pytest.raises(REFUSED):
            _identity(address, **_no_certificate())

        # a job with another cluster's key, and one with none: one line each, exit 2, before any stage
        other = tls.make(tmp_path / "other")
        r = _run([*words, "--set", *JOB_SETTINGS, f"runtime.tls={other}", "--check"], cwd=REPO)
        said = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(said) == 1, r.stderr[-3000:]
        assert "do not accept each other's TLS certificates" in said[0] and str(other) in said[0]
        r = _run([*words, "--set", *JOB_SETTINGS, "runtime.tls=null", "--check"], cwd=REPO)
        said = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(said) == 1, r.stderr[-3000:]
        assert "speaks TLS and this process has no TLS credentials" in said[0]
    finally:
        for proc in reversed(started):
            _stop(proc)
