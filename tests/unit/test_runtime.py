"""The Dask cluster's arguments (runtime.py). The real LocalCUDACluster signature is checked in
tests/contract against the dask-cuda wheel; here, what the project asks for."""

import inspect
import logging
import os
import signal
import time

import pytest
from distributed import LocalCluster

from rapids_attn.job import RuntimeConfig
from rapids_attn.runtime import Runtime, local_cluster_args, local_cuda_cluster_args


def test_local_cluster_arguments_bind_to_distributed():
    kw = local_cluster_args(RuntimeConfig(threads_per_worker=2, processes=False), 3)
    inspect.signature(LocalCluster).bind(**kw)
    assert (kw["n_workers"], kw["threads_per_worker"], kw["processes"]) == (3, 2, False)
    assert kw["dashboard_address"] == "127.0.0.1:8787"


@pytest.mark.parametrize("pool, want", [("auto", 0.8), ("24GB", "24GB"), (0.5, 0.5)])
def test_a_pool_puts_torch_and_cupy_on_it(pool, want):
    kw = local_cuda_cluster_args(RuntimeConfig(cluster="local-cuda", rmm_pool_size=pool), 2)
    assert kw["rmm_pool_size"] == want
    assert kw["rmm_allocator_external_lib_list"] == ["torch", "cupy"]


def test_no_pool_leaves_torch_and_cupy_on_their_own_allocators():
    """rmm_pool_size: null must not move PyTorch onto RMM's plain (uncached) allocator."""
    kw = local_cuda_cluster_args(RuntimeConfig(cluster="local-cuda", rmm_pool_size=None), 2)
    assert "rmm_pool_size" not in kw and "rmm_allocator_external_lib_list" not in kw
    assert kw["n_workers"] == 2


# -- one line per failure (issue 12): quiet workers, Ctrl-C for the job process only ----------------------


def test_worker_logs_follow_the_job_process():
    """Quiet (the CLI without -v): distributed's workers log nothing below CRITICAL, so a failed task's
    "Compute Failed" dump does not precede the job's one line; otherwise errors, as before."""
    log = logging.getLogger("distributed")
    old = log.level
    try:
        log.setLevel(logging.CRITICAL)
        assert local_cluster_args(RuntimeConfig(), 1)["silence_logs"] == logging.CRITICAL
        assert local_cuda_cluster_args(RuntimeConfig(cluster="local-cuda"), 1)["silence_logs"] == logging.CRITICAL
        log.setLevel(logging.INFO)
        assert local_cluster_args(RuntimeConfig(), 1)["silence_logs"] == logging.ERROR
    finally:
        log.setLevel(old)


def test_local_worker_processes_ignore_sigint():
    """Ctrl-C reaches the whole process group; the workers neither see it (blocked from their start) nor
    act on it (ignored), and the job process's own mask and handler are as before."""
    before = (signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, []))
    with Runtime(RuntimeConfig(n_workers=1, processes=True, dashboard_address=":0")) as client:
        (handler,) = client.run(signal.getsignal, signal.SIGINT).values()
        (blocked,) = client.run(signal.pthread_sigmask, signal.SIG_BLOCK, []).values()
        (pid,) = client.run(os.getpid).values()
    assert handler == signal.SIG_IGN
    assert signal.SIGINT in blocked
    assert pid != os.getpid()
    assert (signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, [])) == before


def test_local_workers_keep_glibc_malloc_tuning(monkeypatch):
    """distributed's MALLOC_TRIM_THRESHOLD_ would make every large allocation a fresh mmap in the workers (20%
    slower capture); the job's workers start without it, unless the user exported it, and the job process's
    dask config is as before."""
    import dask

    key = "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"
    before = dask.config.get(key)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    with Runtime(RuntimeConfig(n_workers=1, processes=True, dashboard_address=":0")) as client:
        (value,) = client.run(os.environ.get, "MALLOC_TRIM_THRESHOLD_").values()
    assert value is None
    assert dask.config.get(key) == before
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    with Runtime(RuntimeConfig(n_workers=1, processes=True, dashboard_address=":0")) as client:
        (value,) = client.run(os.environ.get, "MALLOC_TRIM_THRESHOLD_").values()
    assert value == "131072"


def test_the_job_process_environment_is_as_before_once_the_cluster_closed(monkeypatch):
    """distributed writes its workers' variables (OMP_NUM_THREADS=1, ...) into this process's environment; a
    later job here would take them for the user's."""
    import dask

    keys = sorted(dask.config.get("distributed.nanny.pre-spawn-environ"))
    assert "OMP_NUM_THREADS" in keys
    for k in keys:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "3")  # the user's own value stays, and is the workers'
    with Runtime(RuntimeConfig(n_workers=1, processes=True, dashboard_address=":0")) as client:
        (seen,) = client.run(lambda: (os.environ.get("OMP_NUM_THREADS"), os.environ.get("MKL_NUM_THREADS"))).values()
        during = os.environ.get("OMP_NUM_THREADS")
    assert seen == ("1", "3")
    assert during == "1"  # distributed's own doing, while the cluster runs (a restarted worker needs it)
    assert {k: os.environ.get(k) for k in keys} == {k: ("3" if k == "MKL_NUM_THREADS" else None) for k in keys}


def test_an_interrupted_start_closes_what_it_started(monkeypatch):
    from distributed import Client

    started = []

    def interrupted(self):
        started.append(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(Client, "scheduler_info", interrupted)
    rt = Runtime(RuntimeConfig(n_workers=1, processes=False, dashboard_address=":0"))
    with pytest.raises(KeyboardInterrupt):
        rt.__enter__()
    (client,) = started
    assert rt.client is None and rt.cluster is None
    assert client.status == "closed" and client.cluster.status.name == "closed"


def test_logging_is_off_while_an_interrupted_cluster_closes():
    seen = []

    class Fake:
        def close(self):
            seen.append(logging.root.manager.disable)

    for exc, want in [(KeyboardInterrupt, logging.CRITICAL), (ValueError, logging.NOTSET), (None, logging.NOTSET)]:
        rt = Runtime(RuntimeConfig())
        rt.client, rt.cluster = Fake(), Fake()
        before = logging.root.manager.disable
        rt.__exit__(exc, exc() if exc else None, None)
        assert seen[-2:] == [want, want] and logging.root.manager.disable == before


def test_the_worker_modules_exist():
    """The fork server skips a module it cannot import without a word: a renamed one would quietly cost
    every worker its imports again."""
    import importlib.util

    from rapids_attn.registry import worker_modules

    for name in worker_modules():
        assert importlib.util.find_spec(name) is not None, name


def test_the_worker_modules_are_the_worker_stages_own():
    """The fork server's modules come from the registered stages that run on the workers (extract, heads,
    relevance, compare), in the registry's order, each once, between distributed and the freezing module."""
    from rapids_attn.registry import worker_modules, worker_stages

    assert worker_stages() == {"extract", "heads", "relevance", "compare"}
    assert worker_modules() == (
        "distributed",
        "torch",
        "transformers.modeling_utils",
        "transformers.models.auto.modeling_auto",
        "transformers.models.auto.tokenization_auto",
        "rapids_attn.extract.shard",
        "rapids_attn.heads.work",
        "rapids_attn.relevance.work",
        "rapids_attn.compare.work",
        "rapids_attn._fork_ready",
    )


def test_local_workers_fork_from_a_server_that_imported_their_modules(monkeypatch):
    """Workers start as forks of one server that imported torch, transformers and the job's modules and froze
    their objects out of garbage collection, with the environment a spawned worker gets (no
    MALLOC_TRIM_THRESHOLD_, one BLAS thread) and SIGINT blocked."""
    import gc
    import sys
    from multiprocessing import forkserver

    import rapids_attn.processes as rt_mod
    from rapids_attn.registry import worker_modules

    modules = worker_modules()

    # the user's own value would win, and be the server's
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    forkserver._forkserver._stop()  # whatever an earlier test left running: a server of this test's start
    rt_mod._server_env = rt_mod._server_pid = rt_mod._server_modules = None

    def probe():
        with open(f"/proc/{os.getpid()}/environ") as f:
            env = dict(x.split("=", 1) for x in f.read().split("\0") if "=" in x)
        return (
            [m for m in modules if m not in sys.modules],
            os.getppid(),
            env.get("MALLOC_TRIM_THRESHOLD_"),
            env.get("OMP_NUM_THREADS"),
            signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []),
            gc.get_freeze_count(),
        )

    cfg = RuntimeConfig(n_workers=2, processes=True, dashboard_address=":0")
    assert rt_mod.start_worker_server(cfg, modules)  # as run_job starts it, with the registry's modules
    rt = Runtime(cfg)  # the cluster forks from the server that runs: its modules, not the bare default
    with rt as client:
        got = list(client.run(probe).values())
    assert rt.description["worker_start"] == "forkserver"
    assert len(got) == 2
    for missing, parent, trim, omp, blocked, frozen in got:
        assert missing == [] and frozen > 100_000  # torch's and transformers' objects, at least
        assert parent == forkserver._forkserver._forkserver_pid  # not this process: the server's fork
        assert trim is None and omp == "1" and blocked


def test_a_server_started_with_another_environment_is_not_used(monkeypatch):
    import rapids_attn.processes as rt_mod
    from rapids_attn.processes import start_worker_server

    monkeypatch.setattr(rt_mod, "_server_env", {"OMP_NUM_THREADS": "7"})
    assert start_worker_server(RuntimeConfig(processes=True)) is False
    monkeypatch.setattr(rt_mod, "_server_env", None)
    monkeypatch.setattr(rt_mod, "_server_pid", -1)  # a running server this process's runtime did not start
    if getattr(__import__("multiprocessing.forkserver").forkserver._forkserver, "_forkserver_pid", None) is not None:
        assert start_worker_server(RuntimeConfig(processes=True)) is False
    assert start_worker_server(RuntimeConfig(processes=False)) is False  # threads: nothing to fork


def _blocked_in_sync(frame) -> bool:
    """True when ``frame`` (a thread's innermost) is inside ``threading`` and below it, in its chain, the ``wait``
    that distributed's ``sync`` defines, called from ``sync`` itself: that thread is waiting for the loop, and a
    KeyboardInterrupt raised there is the one ``sync`` answers by scheduling ``cancel``."""
    if frame is None or frame.f_globals.get("__name__") != "threading":
        return False
    while frame is not None:
        up = frame.f_back
        if (
            frame.f_globals.get("__name__") == "distributed.utils"
            and frame.f_code.co_name == "wait"
            and up is not None
            and up.f_code.co_name == "sync"
            and up.f_globals.get("__name__") == "distributed.utils"
        ):
            return True
        frame = up
    return False


def _interrupt_sync_before_its_coroutine_starts() -> None:
    """Ctrl-C in distributed's ``sync`` before the loop ran its coroutine: the loop is held busy while
    SIGINT reaches the main thread, so the ``cancel`` that ``sync`` schedules runs before the future
    exists (the race CI hit: tornado then logs a NameError traceback from distributed's utils.py).

    Ordered by state, not by time: SIGINT is sent once the main thread is seen waiting inside ``sync``, and
    the loop is known to have run ``sync``'s coroutine step and ``cancel`` once a callback queued after them
    (the loop runs its callbacks first in, first out) has run."""
    import sys
    import threading

    from distributed.utils import LoopRunner, sync

    runner = LoopRunner(asynchronous=False)
    runner.start()
    release, drained = threading.Event(), threading.Event()
    try:
        runner.loop.add_callback(release.wait, 120)  # the loop thread waits here: no coroutine starts

        async def work():
            return 1

        main = threading.get_ident()

        def interrupt_once_waiting():
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not release.is_set():
                if _blocked_in_sync(sys._current_frames().get(main)):
                    signal.pthread_kill(main, signal.SIGINT)
                    return
                time.sleep(0.005)

        watcher = threading.Thread(target=interrupt_once_waiting, daemon=True)
        watcher.start()
        with pytest.raises(KeyboardInterrupt):
            sync(runner.loop, work)
        watcher.join()
        release.set()
        runner.loop.add_callback(drained.set)  # queued after ``sync``'s coroutine and its ``cancel``
        assert drained.wait(120), "the loop did not run its queued callbacks"
        assert sync(runner.loop, work) == 1  # and is still serving
    finally:
        release.set()
        runner.stop()


def test_ctrl_c_before_syncs_coroutine_started_logs_nothing(caplog):
    from rapids_attn.runtime import sync_cancel_race_quiet

    caplog.set_level(logging.ERROR, logger="tornado.application")
    _interrupt_sync_before_its_coroutine_starts()
    raced = [r for r in caplog.records if r.name == "tornado.application" and r.exc_info]
    # the race is reproduced (with distributed's code as it is): without the filter tornado logs it
    assert raced and raced[0].exc_info[0] is NameError, [r.getMessage() for r in caplog.records]
    caplog.clear()
    with sync_cancel_race_quiet():
        _interrupt_sync_before_its_coroutine_starts()
    assert not [r for r in caplog.records if r.name == "tornado.application"]


def test_the_sync_race_filter_passes_every_other_record():
    from rapids_attn.runtime import SyncCancelRace

    def cancel():
        return undefined_name  # noqa: F821 - a NameError in a function named cancel, not distributed's

    try:
        cancel()
    except NameError:
        import sys

        exc = sys.exc_info()
    other = logging.LogRecord("tornado.application", logging.ERROR, __file__, 1, "x", None, exc)
    plain = logging.LogRecord("tornado.application", logging.ERROR, __file__, 1, "x", None, None)
    assert SyncCancelRace().filter(other) and SyncCancelRace().filter(plain)


def test_the_sync_race_filter_is_on_while_the_cluster_is_used():
    from rapids_attn.runtime import SyncCancelRace

    def on():
        return any(isinstance(f, SyncCancelRace) for f in logging.getLogger("tornado.application").filters)

    with Runtime(RuntimeConfig(processes=False, n_workers=1, dashboard_address=":0")):
        assert on()
    assert not on()
