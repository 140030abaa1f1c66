"""One run per run directory at a time: an OS-level lock held for the whole run.

Two runs writing one store (its shards, its completion flags, ``job.yaml``) can leave it in a state
no later run can use. ``run_lock`` takes an exclusive ``flock`` on ``<run dir>/.rapids_attn.lock``
and writes the holder's pid into it; a second run on the same directory stops at once with one line
naming the directory and that pid. The kernel releases the lock when the holder exits, however it
exits (kill -9 included), so a stale lock file never blocks a later run.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from rapids_attn.errors import UserError

LOCK_NAME = ".rapids_attn.lock"


class RunDirBusyError(UserError):
    """Another run holds the run directory."""


@contextlib.contextmanager
def run_lock(run_dir: Path):
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    f = open(run_dir / LOCK_NAME, "a+")  # noqa: SIM115 - held open for the whole run, closed below
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            raise RunDirBusyError(
                f"output.dir: {run_dir} is in use by another run (pid {holder}); wait for it to finish, "
                "or set output.dir to another directory"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        yield
    finally:
        f.close()  # closing the file releases the lock
