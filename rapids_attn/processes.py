"""Process machinery: what the job does to its processes for speed, each piece in one place with why it is kept.

A CPU job is short (the quickstart runs in about 45 s on two cores) and its processes' starts and ends are a
large share of it; a GPU job's workers are dask-cuda's, started by spawn, and of these pieces only the allocator
setting reaches them. Each piece was measured in the whole job and is kept because it pays:
``python -m benchmarks.processes`` runs the quickstart job and the 500-question job with every piece on and with
each one off alone, alternating, two runs each, and prints the wall clock from launch to exit
(docs/decisions/2026-11-27-process-machinery.md, 2026-11-27 on this project's 2-core machine). A piece is turned off by name
(``RAPIDS_ATTN_WITHOUT=fork-server,quick-exit``), for that measurement and for diagnosis; the outputs are the
same either way.

``fork-server``: 12.7 s of both jobs (quickstart 46.2 s with it, 58.9 s without; 500 questions 60.4 s, 73.1 s)
    A local cluster's worker processes fork from a server that imported torch, transformers and the stages'
    worker modules once (:func:`start_worker_server`, :func:`worker_modules`), started as soon as the job is read
    so the imports run beside preflight. Without it each worker spawns afresh and imports them itself, both at
    once, and closing them takes 3 s more.
``malloc-env``: 9.0 s of the quickstart, 18.2 s of the 500 questions
    Local workers start with glibc's own malloc tuning, not distributed's ``MALLOC_TRIM_THRESHOLD_``
    (:func:`worker_allocator_env`): with it, every allocation over 128 KiB is a fresh ``mmap``, and the capture's
    per-layer blocks of scores made the workers' extract and relevance stages about 40% slower.
``server-freeze``: about 2.5 s after each job
    The server's last preloaded module, :mod:`rapids_attn._fork_ready`, collects and freezes what the imports
    left (``gc.freeze``: the forks never walk those objects in a collection nor copy their pages by touching
    them) and makes the server leave without the interpreter's teardown, which otherwise holds the job's output
    streams open after the job: the time outside the stage clocks was 1.0-1.3 s with it and 3.3-4.1 s without.
``quick-exit``: about 3 s after each job
    The job process leaves without the interpreter's teardown once every output is written and closed
    (:func:`exit_without_teardown`): its last collection over torch's and transformers' objects took the time
    outside the stage clocks from 1.0-1.3 s to 3.7-4.3 s.

The last two are smaller than the two jobs' run-to-run spread (up to 7 s in extract), so their wall clocks do
not show them; the time outside the stage clocks (the wall clock less every stage's) does, in every run.

Removed, because the same measurement showed no gain (issue 36): warming the next stage's imports in extract's
tail (the learn stage imported scikit-learn there: learn was 1-2.5 s shorter, extract as much longer, the wall
clock no different), and running KMeans's extra fits on the CPU workers (learn 0.6 s shorter on 500 questions,
0.6 s longer on the quickstart, the wall clock no different); they now run in the job process.

Beside them, and not for speed: :func:`environ_kept_of_workers` puts back the variables distributed's nannies
write into the job process's environment, so a later job in the same process (the API, the tests) sees the
user's environment and its fork server's check (:func:`start_worker_server`) holds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterable, Sequence

from rapids_attn.errors import UserError

log = logging.getLogger(__name__)

#: the environment variable that turns pieces off, by name (comma-separated)
WITHOUT_ENV = "RAPIDS_ATTN_WITHOUT"

#: every piece, by the name :data:`WITHOUT_ENV` turns it off with
PIECES = ("fork-server", "malloc-env", "server-freeze", "quick-exit")


def turned_off() -> frozenset[str]:
    """The pieces :data:`WITHOUT_ENV` turns off; a one-line error for a name that is none of :data:`PIECES`."""
    names = {n.strip() for n in os.environ.get(WITHOUT_ENV, "").split(",") if n.strip()}
    unknown = sorted(names - set(PIECES))
    if unknown:
        raise UserError(
            f"{WITHOUT_ENV}: no piece named {', '.join(unknown)}; the pieces are {', '.join(PIECES)} "
            "(rapids_attn/processes.py)"
        )
    return frozenset(names)


def enabled(piece: str) -> bool:
    """Whether ``piece`` (one of :data:`PIECES`) is on: all are, unless :data:`WITHOUT_ENV` names it."""
    if piece not in PIECES:
        raise ValueError(f"no process piece named {piece!r}")
    return piece not in turned_off()


@contextlib.contextmanager
def worker_allocator_env():
    """Start local worker processes with glibc's own malloc tuning, not distributed's.

    distributed sets ``MALLOC_TRIM_THRESHOLD_=65536`` in every worker it spawns (its
    ``distributed.nanny.pre-spawn-environ``). Setting any of glibc's thresholds turns off its dynamic mmap
    threshold: every allocation over 128 KiB is then a fresh ``mmap`` whose pages fault in on first touch and
    go back on free. The capture allocates blocks of scores of tens of MiB per layer, so a worker ran the
    same forward about 20% slower than a plain process (docs/decisions/2026-11-26-forward-ratio.md). The worker gives its free heap back after each batch itself (``shard.trim_heap``), which is
    what the setting was for. A value the user exported still wins: distributed prefers the environment."""
    import dask

    if not enabled("malloc-env"):
        yield
        return
    with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}):
        yield


@contextlib.contextmanager
def environ_kept_of_workers():
    """This process's environment as it was, on leaving, for the variables distributed sets for its workers.

    A nanny writes its ``distributed.nanny.pre-spawn-environ`` (``OMP_NUM_THREADS=1`` and the like) into the
    job process's own environment before it starts each worker, and leaves them there. A later job in the same
    process would read them as the user's: its workers' environment would differ from the fork server's, so
    they would be spawned, and a process the job starts later would get one OpenMP thread."""
    import dask

    keys = set(dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {}) | {"MALLOC_TRIM_THRESHOLD_"}
    with environ_kept(keys):
        yield


@contextlib.contextmanager
def environ_kept(keys):
    """This process's environment variables ``keys`` as they were, on leaving (set again, or removed)."""
    old = {k: os.environ.get(k) for k in keys}
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def worker_modules(stages: Iterable) -> tuple[str, ...]:
    """What a local worker process imports before its first task can run (about 3 s of a 2-core machine's CPU per
    worker): the fork server imports them once, and every worker forks from it with them in memory.

    ``distributed``, then the :attr:`~rapids_attn.stage.Stage.worker_modules` of ``stages`` (stage classes: the
    registry's, :func:`rapids_attn.registry.worker_modules`) that run on the workers, in their order, each module
    once (torch, transformers' model and tokenizer modules, ``rapids_attn.extract.shard``, ...), and last
    :mod:`rapids_attn._fork_ready`, which freezes what the others imported. The same for every run of a process,
    whichever stages it runs: the server is started once."""
    stage_modules = [m for st in stages if st.runs_on_workers for m in st.worker_modules]
    last = ["rapids_attn._fork_ready"] if enabled("server-freeze") else []
    return tuple(dict.fromkeys(["distributed", *stage_modules, *last]))


_server_env: dict[str, str] | None = None  # the environment the fork server of this process was started with
_server_pid: int | None = None  # and its process id: a server started again by another (distributed) is not ours
_server_modules: tuple[str, ...] | None = None  # and what it imported


def worker_env() -> dict[str, str]:
    """The variables distributed sets for a local worker process before it starts: its
    ``distributed.nanny.pre-spawn-environ`` (less ``MALLOC_TRIM_THRESHOLD_``, :func:`worker_allocator_env`), a
    value the user exported winning, and the nanny's ``PYTHONHASHSEED``."""
    import dask

    with worker_allocator_env():  # read inside: dask.config.get returns the live mapping, restored on leaving
        env = {
            k: os.environ.get(k, str(v))
            for k, v in dask.config.get("distributed.nanny.pre-spawn-environ").items()
            if v is not None
        }
    if env.get("PYTHONHASHSEED") in (None, "0"):  # as distributed's Nanny: one seed for every worker
        env["PYTHONHASHSEED"] = "6640"
    return env


@contextlib.contextmanager
def sigint_blocked():
    """Block SIGINT in the calling thread while a local cluster starts.

    The cluster's event-loop thread starts inside and inherits the mask, and so does every worker
    process the nannies spawn from that loop's threads: a worker starts with SIGINT blocked, before
    any Python code of its own runs, so a Ctrl-C while the cluster starts (sent to the whole process
    group) reaches the job process alone; there it stays pending and is raised on leaving.
    multiprocessing's resource tracker unblocks SIGINT in the thread that first starts it, so it is
    started here, before the mask is set. Off the main thread, or without ``pthread_sigmask``, a no-op.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def start_worker_server(cfg, modules: Sequence[str] | None = None) -> bool:
    """Start (or find running) the fork server a local cluster's worker processes fork from; returns whether
    this cluster's workers can fork from it (``runtime.cluster: local`` with processes, where the platform has
    the ``forkserver`` start method).

    A worker spawned afresh imports torch, transformers and the job's modules before its first task (about 3 s
    on two cores, each worker at once). The fork server is a fresh interpreter that imports them once
    (``modules``: :func:`rapids_attn.registry.worker_modules`; None, as a :class:`~rapids_attn.runtime.Runtime`
    asks: those of the server this process started, or ``distributed`` alone when it started none);
    :func:`rapids_attn.pipeline.run_job` starts it before its preflight, so the
    imports run beside the job's checks, and each worker starts as a fork of it with the modules in memory.
    The server starts with the environment a spawned worker would get (:func:`worker_env`: glibc reads its
    malloc settings at a process's start, and a fork keeps them) and with SIGINT blocked
    (:func:`sigint_blocked`), which its forks inherit. A server already running with another environment (a
    later job in this process changed it), or one this function did not start, is left alone: that cluster's
    workers are spawned as before."""
    global _server_env, _server_pid, _server_modules
    import multiprocessing

    if cfg.cluster != "local" or not cfg.processes or "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    if not enabled("fork-server"):
        return False
    from multiprocessing import forkserver

    env = worker_env()
    running = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if (_server_env is not None and _server_env != env) or (running is not None and running != _server_pid):
        return False

    if modules is None:
        modules = _server_modules if _server_modules is not None else worker_modules(())
    multiprocessing.get_context("forkserver").set_forkserver_preload(list(modules))
    try:
        with environ_kept(env), sigint_blocked():
            os.environ.update(env)
            forkserver.ensure_running()  # a no-op while it runs; started (or started again) otherwise
    except (OSError, ValueError) as e:  # the platform refused: spawn, as before
        log.debug("no fork server (%s): local workers are spawned", e)
        return False
    _server_env, _server_pid = env, getattr(forkserver._forkserver, "_forkserver_pid", None)
    _server_modules = tuple(modules)
    return True


def stop_worker_server() -> None:
    """End the fork server this process started (:func:`start_worker_server`), when the job ends early (bad
    input, Ctrl-C, a failure). A server still importing its modules blocks SIGINT and would only notice the job's
    exit once its imports end, seconds later, holding the job's output streams open all that while (a shell
    pipe or ``$(...)`` waits for it); SIGTERM ends it at once. Workers forked from it are separate processes,
    closed with their cluster before this runs."""
    global _server_env, _server_pid, _server_modules
    pid, _server_pid, _server_env, _server_modules = _server_pid, None, None, None
    if pid is None:
        return
    from multiprocessing import forkserver

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)
    if getattr(forkserver._forkserver, "_forkserver_pid", None) == pid:
        # multiprocessing's own stop: closes its end, reaps the server and forgets it (a later job starts anew)
        with contextlib.suppress(Exception):  # a private method: the server is ended either way
            forkserver._forkserver._stop()
            return
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, 0)  # no zombie while this process lives on (tests, the API)


def exit_without_teardown(status: dict) -> None:
    """At exit, after every other handler (the CLI registers it before any of them): when ``main`` returned
    (``status["code"]``), leave with that code without the interpreter's teardown. Every output is written
    and closed by then, the logs are shut down here and the standard streams flushed; what is skipped is the
    last garbage collection over every object the job left (torch's, transformers'): 1.6 s after a
    500-question job, in which the user's shell waits. When ``main`` raised, the interpreter ends as usual;
    so it does with ``quick-exit`` off."""
    try:
        quick = enabled("quick-exit")
    except UserError:  # main reported the bad RAPIDS_ATTN_WITHOUT already (exit 2)
        quick = True
    if "code" not in status or not quick:
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status["code"])
