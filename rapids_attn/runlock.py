"""One run per run directory at a time: an OS-level lock held for the whole run.

Two runs writing one store (its shards, its completion flags, ``job.yaml``) can leave it in a state
no later run can use. ``run_lock`` takes an exclusive ``flock`` on ``<run dir>/.rapids_attn.lock``
and writes the holder's pid into it; a second run on the same directory stops at once with one line
naming the directory and that pid. The kernel releases the lock when the holder exits, however it
exits (kill -9 included), so a stale lock file never blocks a later run.
"""

from __future__ import annotations

import contextlib
import errno
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
    path = run_dir / LOCK_NAME
    try:  # never through a link: the pid written below would replace the linked file's contents
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise RunDirBusyError(
            f"output.dir: {path} is a symbolic link; rapids_attn never writes through a link it did not make: "
            "remove the link (its target is kept) and rerun"
        ) from None
    f = os.fdopen(fd, "r+")  # held open for the whole run, closed below
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


def held(run_dir: Path) -> bool:
    """Whether a run holds ``run_dir``'s lock now (another process's :func:`run_lock`); never creates the file."""
    path = Path(run_dir) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases a lock taken here
    return False
