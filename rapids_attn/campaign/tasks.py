"""A campaign's runs as tasks: one code path (:func:`run_task`, one run by its index) for every way of executing
them: in sequence on one machine, several at once (``--parallel``), or one task per array index of a batch
scheduler (``run --index $SLURM_ARRAY_TASK_ID``; :mod:`rapids_attn.campaign.scripts`).

A task runs ``python -m rapids_attn.run`` on its run's job in a process of its own, so a model that fails (or
crashes its process) stops nothing else; its output goes to ``logs/<index>.log``, and its record
``tasks/<index>.json`` says when it started and ended, its exit code and, for a failure, the run's one-line error.
The run directory is the run's own, content-keyed as any run's: an interrupted task is resumed by running it
again (finished shards kept), and a task whose record says it finished with the same spec is skipped.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rapids_attn.campaign.plan import Campaign, Run

#: the states :func:`status` reports
DONE, RUNNING, FAILED, STALE, INTERRUPTED, PENDING = "done", "running", "failed", "stale", "interrupted", "pending"


def _record_path(c: Campaign, r: Run) -> Path:
    return c.tasks_dir / f"{r.index}.json"


def read_record(c: Campaign, r: Run) -> dict | None:
    try:
        return json.loads(_record_path(c, r).read_text())
    except (OSError, ValueError):
        return None


def _write_record(c: Campaign, r: Run, rec: dict) -> None:
    c.tasks_dir.mkdir(parents=True, exist_ok=True)
    path = _record_path(c, r)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(rec, indent=1) + "\n")
    tmp.replace(path)


def _error_line(log: Path) -> str:
    """The run's one-line error (its last line starting ``error:``), else the log's last line."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    errors = [ln for ln in lines if ln.startswith(("error:", "interrupted", "terminated"))]
    return (errors or lines or [""])[-1][:400]


@dataclass
class TaskState:
    run: Run
    state: str
    detail: str = ""


def state_of(c: Campaign, r: Run) -> TaskState:
    """done (finished with this spec), running (its run directory locked now), failed (with the error),
    interrupted (started, never ended: a killed task), stale (finished with another spec, or its outputs gone),
    pending (never started)."""
    from rapids_attn.runlock import held

    rec = read_record(c, r)
    if held(r.run_dir):
        return TaskState(r, RUNNING, f"since {rec.get('started', '?')}" if rec else "")
    if rec is None:
        return TaskState(r, PENDING)
    if rec.get("rc") is None:
        return TaskState(r, INTERRUPTED, f"started {rec.get('started')} on {rec.get('host')}, never ended")
    if rec["rc"] != 0:
        return TaskState(r, FAILED, rec.get("error") or f"exit {rec['rc']}")
    if rec.get("spec") != r.spec_hash:
        return TaskState(r, STALE, "the campaign changed this run since it finished")
    if not (r.run_dir / "summary.json").is_file():
        return TaskState(r, STALE, "its summary.json is gone")
    return TaskState(r, DONE, f"in {rec.get('seconds', 0):.0f} s")


def run_task(c: Campaign, r: Run, force: bool = False) -> TaskState:
    """Run one task (skipped when done, unless ``force``); returns its state after."""
    before = state_of(c, r)
    if before.state == DONE and not force:
        return before
    if before.state == RUNNING:
        return before
    c.logs_dir.mkdir(parents=True, exist_ok=True)
    log = c.logs_dir / f"{r.index}.log"
    rec = {
        "index": r.index,
        "label": r.label,
        "run_dir": str(r.run_dir),
        "spec": r.spec_hash,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "rc": None,
    }
    _write_record(c, r, rec)
    cmd = [sys.executable, "-m", "rapids_attn.run", str(c.job)]
    for o in r.overrides:
        cmd += ["--set", o]
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=False).returncode
    rec.update(
        rc=rc,
        seconds=round(time.perf_counter() - t0, 1),
        finished=time.strftime("%Y-%m-%dT%H:%M:%S"),
        error=_error_line(log) if rc else "",
    )
    _write_record(c, r, rec)
    return state_of(c, r)


def run_tasks(c: Campaign, indices: list[int] | None, parallel: int = 1, force: bool = False, say=print) -> list:
    """The tasks ``indices`` (all: None) in index order, ``parallel`` at a time; each line as it ends."""
    from concurrent.futures import ThreadPoolExecutor

    runs = c.runs if indices is None else [c.runs[i] for i in indices]
    total = len(runs)

    def one(r: Run) -> TaskState:
        st = run_task(c, r, force)
        say(f"[{r.index + 1}/{len(c.runs)}] {r.label}: {st.state}{': ' + st.detail if st.detail else ''}")
        return st

    if parallel <= 1 or total <= 1:
        return [one(r) for r in runs]
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        return list(pool.map(one, runs))
