"""A campaign's runs as tasks: one code path (:func:`run_task`, one run by its index) for every way of executing
them: in sequence on one machine, several at once (``--parallel``), or one task per array index of a batch
scheduler (``run --index $SLURM_ARRAY_TASK_ID``; :mod:`rapids_attn.campaign.scripts`).

A task runs ``python -m rapids_attn.run`` on its run's job in a process of its own, so a model that fails (or
crashes its process) stops nothing else; its output goes to ``logs/<model>/<dataset>.log``, and its record
``tasks/<model>/<dataset>.json`` says when it started and ended, its exit code and, for a failure, the run's one-line error.
The run directory is the run's own, content-keyed as any run's: an interrupted task is resumed by running it
again (finished shards kept), and a task whose record says it finished with the same spec is skipped.

On a shared Dask cluster (``run --dask``; :mod:`rapids_attn.campaign.cluster`) each task is this same
:func:`run_task`, called on a Dask worker with that worker's allotment: ``overrides`` (its share of the worker's
CPUs, or its GPU group's size), ``env`` (``CUDA_VISIBLE_DEVICES``: its GPU group) and ``record`` (the worker).
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


def record_path(c: Campaign, r: Run) -> Path:
    """``tasks/<model>/<dataset>.json``: named by the run's label, not its index, so that a model or dataset added to
    the campaign file (which moves the indices after it) leaves every finished run's record with its run."""
    return c.tasks_dir / f"{r.label}.json"


def log_path(c: Campaign, r: Run) -> Path:
    """``logs/<model>/<dataset>.log``, by label as the record."""
    return c.logs_dir / f"{r.label}.log"


def read_record(c: Campaign, r: Run) -> dict | None:
    try:
        return json.loads(record_path(c, r).read_text())
    except (OSError, ValueError):
        return None


def write_record(c: Campaign, r: Run, rec: dict) -> None:
    path = record_path(c, r)
    path.parent.mkdir(parents=True, exist_ok=True)
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


def run_task(
    c: Campaign,
    r: Run,
    force: bool = False,
    *,
    env: dict[str, str | None] | None = None,
    overrides: tuple[str, ...] | list[str] = (),
    record: dict | None = None,
) -> TaskState:
    """Run one task (skipped when done, unless ``force``); returns its state after.

    ``overrides`` go after the run's own (``--set``: where it runs, not what it is: the run's spec hash is its
    own overrides'), ``env`` into its process's environment (None removes a variable), ``record`` into its task
    record (who ran it); all three are the Dask mode's allotment and are written to the record."""
    before = state_of(c, r)
    if before.state == DONE and not force:
        return before
    if before.state == RUNNING:
        return before
    log = log_path(c, r)
    log.parent.mkdir(parents=True, exist_ok=True)
    rec = {
        "index": r.index,
        "label": r.label,
        "run_dir": str(r.run_dir),
        "spec": r.spec_hash,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "rc": None,
        **(record or {}),
    }
    if overrides:
        rec["overrides_added"] = list(overrides)
    if env:
        rec["env"] = dict(env)
    write_record(c, r, rec)
    cmd = [sys.executable, "-m", "rapids_attn.run", str(c.job)]
    for o in (*r.overrides, *overrides):
        cmd += ["--set", o]
    proc_env = None
    if env:
        proc_env = {**os.environ, **{k: v for k, v in env.items() if v is not None}}
        for k in [k for k, v in env.items() if v is None]:
            proc_env.pop(k, None)
    shown = "".join(f"{k}={v} " for k, v in (env or {}).items() if v is not None)
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as f:
        f.write("$ " + shown + " ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=proc_env, check=False).returncode
    rec.update(
        rc=rc,
        seconds=round(time.perf_counter() - t0, 1),
        finished=time.strftime("%Y-%m-%dT%H:%M:%S"),
        error=_error_line(log) if rc else "",
    )
    write_record(c, r, rec)
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
