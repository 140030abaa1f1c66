"""The Dask cluster a job runs on: a context manager that yields a ``distributed.Client``.

- ``local``: a ``LocalCluster`` (CPU workers; the quickstart and CI).
- ``local-cuda``: a dask-cuda ``LocalCUDACluster``, one worker per GPU (``n_workers`` at most the visible
  GPUs, checked in preflight), with an RMM pool that PyTorch and CuPy allocate from (set up by dask-cuda), so
  the model, the CNN and the fit share one pool per GPU. A single-GPU fit runs on one GPU worker, from its pool
  (:func:`rapids_attn.learn.fit.fit_worker`): the job process would get only what the pools leave of GPU 0.
- ``scheduler``: an existing cluster (``address`` or ``scheduler_file``): multi-node, dask-jobqueue,
  dask-kubernetes, or ``dask scheduler`` + ``dask cuda worker`` by hand.

The dashboard listens on ``runtime.dashboard_address`` (127.0.0.1:8787 by default); when that port
is busy, distributed picks a free one, and the link actually used is reported.

A local cluster with worker processes talks TLS with credentials of its own (:func:`cluster_security`):
its scheduler, nannies and workers listen on 127.0.0.1 and accept only a peer that presents the job's
certificate, so no other process of the machine can connect and run code in the job's workers (issue 33).
The dashboard stays plain HTTP on its loopback address. An external scheduler takes the TLS settings of
the Dask config (``distributed.comm.tls.*``), as every Dask client does (docs/deployment.md).

Failures stay one line (issue 12). Ctrl-C reaches every process of the terminal's process group, so
a local cluster's worker processes start with SIGINT blocked (:func:`sigint_blocked`) and then ignore
it (the :class:`IgnoreSigint` plugin, which restarted workers get too): only the job process is
interrupted, and it closes the cluster. Distributed's own logs in the worker processes
follow the job's: when the job process has quieted distributed (the CLI without ``-v``), the
workers log nothing below CRITICAL, so a task that fails ("Compute Failed") or a worker that stops
mid-task prints nothing beside the job's one line. After an interrupt, the shutdown is silent too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading

from distributed import WorkerPlugin

from rapids_attn.devices import cuda_device_count
from rapids_attn.errors import BackendUnavailableError, JobConfigError
from rapids_attn.processes import environ_kept_of_workers, sigint_blocked, start_worker_server, worker_allocator_env

log = logging.getLogger(__name__)


def default_n_workers(cfg) -> int:
    if cfg.cluster == "local-cuda":
        return max(1, cuda_device_count())
    return max(1, min(8, (os.cpu_count() or 1) // cfg.threads_per_worker))


def check_runtime(cfg) -> None:
    """Checks that can be made before any worker starts."""
    if cfg.cluster == "local-cuda":
        try:
            import dask_cuda  # noqa: F401
        except ImportError:
            raise BackendUnavailableError(
                "runtime.cluster: local-cuda needs dask-cuda; pip install 'rapids_attn[gpu]' or use cluster: local"
            ) from None
        n_gpus = cuda_device_count()
        if n_gpus == 0:
            raise BackendUnavailableError(
                "runtime.cluster: local-cuda but no CUDA device is visible; use cluster: local"
            )
        # dask-cuda refuses more ("Can not scale beyond visible devices") and counts as it does: the entries of
        # CUDA_VISIBLE_DEVICES where it is set (MIG instances included), else the devices
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            n_gpus = len(visible.split(","))
        if cfg.n_workers is not None and cfg.n_workers > n_gpus:
            where = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
            raise JobConfigError(
                f"runtime.n_workers: {cfg.n_workers} workers, but local-cuda runs one worker per GPU and {n_gpus} "
                f"GPU(s) are visible{where}; set runtime.n_workers to at most {n_gpus}, or leave it out for one per GPU"
            )
    if cfg.cluster == "scheduler" and cfg.scheduler_file is not None and not cfg.scheduler_file.is_file():
        raise BackendUnavailableError(f"runtime.scheduler_file: no such file: {cfg.scheduler_file}")
    if cfg.cluster == "scheduler" and cfg.tls is not None:
        from rapids_attn import tls

        problem = tls.problem(cfg.tls)
        if problem:
            raise JobConfigError(f"runtime.tls: {problem}")
    if secured(cfg):
        import importlib.util

        if importlib.util.find_spec("cryptography") is None:
            raise BackendUnavailableError(
                f"runtime.cluster: {cfg.cluster} secures its scheduler and workers with TLS, which needs the "
                "cryptography package; pip install cryptography"
            )


def secured(cfg) -> bool:
    """Whether this job's own cluster listens on the network, and so gets TLS credentials of its own
    (:func:`cluster_security`): ``local`` with worker processes and ``local-cuda``. A ``local`` cluster of
    threads (``processes: false``) talks in-process (``inproc://``) and listens on no port but the
    dashboard's; an external scheduler (``scheduler``) has its own security, from the Dask config."""
    return cfg.cluster == "local-cuda" or (cfg.cluster == "local" and cfg.processes)


def cluster_security(cfg):
    """The TLS credentials of this job's local cluster, or None where it has none (:func:`secured`).

    A private key and a certificate signed with it, made afresh for each cluster (distributed's
    ``Security.temporary``: an RSA key, 20-120 ms on two busy cores) and held in memory: the job process gives them to the scheduler and
    the nannies, the nannies to the worker processes they start (in the worker's arguments, through a pipe
    or the fork server's socket, never through a file or the environment). Every connection between them is
    TLS with a certificate required on both sides, and the certificate is the only one trusted, so a process
    without the key can neither connect to the scheduler nor to a worker or nanny: a plain ``tcp://``
    connection, a TLS one without a certificate and one with a certificate of its own are all refused.
    (distributed writes the key for a moment into a private temporary directory when it makes an SSL context;
    a process of the same user can read the job's memory anyway.)"""
    if not secured(cfg):
        return None
    from distributed.security import Security

    try:
        return Security.temporary()
    except ImportError:  # check_runtime says so first; this is for callers that skipped it
        raise BackendUnavailableError(
            f"runtime.cluster: {cfg.cluster} secures its scheduler and workers with TLS, which needs the "
            "cryptography package; pip install cryptography"
        ) from None


def tls_args(security) -> dict:
    """A local cluster's arguments for its credentials: TLS on every connection, or nothing (none)."""
    return {} if security is None else {"security": security, "protocol": "tls"}


#: the libraries whose GPU allocations dask-cuda routes through each worker's RMM pool
RMM_LIBS = ["torch", "cupy"]


def worker_log_level() -> int:
    """The level of distributed's logs in a local cluster's processes: CRITICAL when this process has
    quieted distributed (``run.configure_process`` without ``-v``: a worker's "Compute Failed" dump is
    then noise before the job's one-line error), otherwise ERROR, as before."""
    return logging.ERROR if logging.getLogger("distributed").isEnabledFor(logging.WARNING) else logging.CRITICAL


#: the thread variables as the user set them, read when this module is first imported: before any local cluster,
#: whose nannies write OMP_NUM_THREADS=1 and the like into this process's own environment while it runs (a
#: library that starts its thread pool then, scikit-learn's OpenMP, would keep one thread in this process)
_USER_THREAD_ENV = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


def job_threads() -> dict[str, int]:
    """Threads for the fits this process runs itself, by threadpoolctl's API names: what the user's environment
    set (``OMP_NUM_THREADS``; ``OPENBLAS_NUM_THREADS`` or ``MKL_NUM_THREADS`` for BLAS), else one per CPU this
    process may run on."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

    def given(*names: str) -> int:
        for name in names:
            v = (_USER_THREAD_ENV.get(name) or "").strip()
            if v.isdigit() and int(v) > 0:
                return int(v)
        return cpus

    return {
        "openmp": given("OMP_NUM_THREADS"),
        "blas": given("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"),
    }


@contextlib.contextmanager
def job_threadpools():
    """The OpenMP and BLAS thread pools of the libraries this process has loaded set to :func:`job_threads`, on
    entering (threadpoolctl), and put back on leaving: a full run's fits then use the threads a run of the learn
    stage alone uses, whatever a running cluster put into the environment when the library was loaded."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=job_threads()):
        yield


class IgnoreSigint(WorkerPlugin):
    """A worker plugin: each worker process of a local cluster, a restarted one too, ignores SIGINT for
    good (a blocked SIGINT could be unblocked by a library; an ignored one is discarded). ``setup`` runs
    on the worker's event loop, which is its process's main thread, where a handler can be set."""

    name = "rapids-attn-ignore-sigint"

    def setup(self, worker) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def local_cluster_args(cfg, n_workers: int, security=None) -> dict:
    """``distributed.LocalCluster``'s arguments for ``runtime.cluster: local``, with TLS on every connection
    when given the cluster's credentials (:func:`cluster_security`)."""
    kw = {
        "n_workers": n_workers,
        "threads_per_worker": cfg.threads_per_worker,
        "processes": cfg.processes,
        "dashboard_address": cfg.dashboard_address,
        "silence_logs": worker_log_level(),
        **tls_args(security),
    }
    if not cfg.processes:  # a thread worker's own HTTP server (/health, /metrics) would bind every interface
        kw["worker_dashboard_address"] = "127.0.0.1:0"
    return kw


def dashboard_link(client, cfg) -> str:
    """The link that opens this cluster's dashboard. distributed builds it from the scheduler's host, which for a
    cluster of threads (``inproc://HOST/...``) is the machine's external address while the dashboard listens on
    ``runtime.dashboard_address`` (loopback by default): the link names the host the dashboard was bound to."""
    link = client.dashboard_link
    if cfg.cluster == "scheduler":
        return link
    host = cfg.dashboard_address.rsplit(":", 1)[0].strip("[]")
    port = client.scheduler_info().get("services", {}).get("dashboard")
    if port is None or host in ("", "0.0.0.0", "::"):  # every interface: the scheduler's host is one of them
        return link
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}/status"


def local_cuda_cluster_args(cfg, n_workers: int, security=None) -> dict:
    """``dask_cuda.LocalCUDACluster``'s arguments for ``runtime.cluster: local-cuda``. Its credentials
    (:func:`cluster_security`) as for a LocalCluster: dask-cuda takes ``protocol`` itself and passes
    ``security`` on to LocalCluster.

    With a pool (``rmm_pool_size``: ``auto`` = 80% of each GPU, or a size), dask-cuda makes the pool
    on each worker and points PyTorch and CuPy at it (``rmm_allocator_external_lib_list``), so the
    model, the CNN and a multi-GPU fit share it. ``null`` means no pool, and then PyTorch and CuPy
    keep their own caching allocators: RMM's plain allocator would only make them slower."""
    kw = {
        "n_workers": n_workers,
        "threads_per_worker": cfg.threads_per_worker,
        "dashboard_address": cfg.dashboard_address,
        "silence_logs": worker_log_level(),
        **tls_args(security),
    }
    pool = 0.8 if cfg.rmm_pool_size == "auto" else cfg.rmm_pool_size
    if pool is not None:
        kw["rmm_pool_size"] = pool
        kw["rmm_allocator_external_lib_list"] = list(RMM_LIBS)
    return kw


def worker_allocators() -> str:
    """Run on a worker: which allocators PyTorch and CuPy use there (for summary.json)."""
    out = []
    try:
        import torch

        out.append(f"torch: {torch.cuda.memory.get_allocator_backend()}")
    except Exception as e:  # noqa: BLE001 - a report, not a requirement: say what could not be asked
        out.append(f"torch: {type(e).__name__}")
    try:
        import cupy

        alloc = cupy.cuda.get_allocator()
        out.append(f"cupy: {getattr(alloc, '__qualname__', None) or type(alloc).__name__}")
    except Exception as e:  # noqa: BLE001 - as above
        out.append(f"cupy: {type(e).__name__}")
    return ", ".join(out)


#: how long joining an external scheduler keeps trying (distributed retries a refused connection until then)
JOIN_TIMEOUT = "20s"


def scheduler_address(cfg) -> str:
    """The address ``runtime.cluster: scheduler`` joins: ``runtime.address``, or the one its scheduler file names,
    refused in one line where it is plain TCP and ``runtime.plain_tcp`` does not say so."""
    import json

    from rapids_attn import tls

    if cfg.address:
        return cfg.address  # checked where the job was read
    try:
        address = json.loads(cfg.scheduler_file.read_text())["address"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BackendUnavailableError(
            f"runtime.scheduler_file: cannot read a scheduler's address from {cfg.scheduler_file} ({type(e).__name__}); "
            "point it at the file dask scheduler --scheduler-file writes"
        ) from None
    if not isinstance(address, str):
        raise BackendUnavailableError(f"runtime.scheduler_file: {cfg.scheduler_file} names no address")
    if tls.plain_address(address) and not cfg.plain_tcp:
        raise JobConfigError(f"runtime.scheduler_file: {cfg.scheduler_file} names {address}, " + tls.plain_refusal())
    return address


def join_scheduler(cfg):
    """A client of the existing cluster of ``runtime.cluster: scheduler``, or a one-line error.

    Its TLS credentials are ``runtime.tls``'s folder (:mod:`rapids_attn.tls`) where given, else the Dask config's
    (``distributed.comm.tls.*``), as any Dask client takes them. A plain TCP scheduler is joined only with
    ``runtime.plain_tcp: true`` (:func:`scheduler_address`).

    The error is raised after the failed client is collected: a ``Client`` whose start failed is left in a
    reference cycle, and its ``__del__`` stops its event loop under a lock that distributed's loop runners share
    (``LoopRunner._lock``, not reentrant). Collected later, at whatever moment the garbage collector picks, it
    could run while another client of this process starts its loop and holds that lock: that start then waits
    for ever (seen in tests that tried several schedulers in one process)."""
    import gc

    from distributed import Client
    from distributed.comm.core import FatalCommClosedError

    from rapids_attn import tls

    address = scheduler_address(cfg)
    field, where = (
        ("runtime.address", f"at {address}")
        if cfg.address
        else ("runtime.scheduler_file", f"at {address} (of {cfg.scheduler_file})")
    )
    security = tls.security(cfg.tls) if cfg.tls is not None else None
    credentials = f"runtime.tls ({cfg.tls})" if cfg.tls is not None else "distributed.comm.tls.* in the Dask config"
    try:
        return Client(address, security=security, timeout=JOIN_TIMEOUT)
    except TypeError as e:  # distributed's words for a tls:// address and no TLS settings
        if "ssl_context" not in str(e):
            raise
        failure = (
            f"{field}: the Dask scheduler {where} speaks TLS and this process has no TLS credentials; give "
            "runtime.tls: the folder python -m rapids_attn.tls made for the cluster (or set "
            "distributed.comm.tls.ca-file, .client.cert and .client.key in the Dask config; docs/deployment.md, "
            "'Securing the cluster')"
        )
    except FatalCommClosedError:  # an OSError: the TLS handshake failed, the address was reached
        failure = (
            f"{field}: the Dask scheduler {where} and this process do not accept each other's TLS certificates; "
            f"check {credentials}: it must hold the key the scheduler was started with (docs/deployment.md, "
            "'Securing the cluster')"
        )
    except (OSError, TimeoutError) as e:
        failure = (
            f"{field}: cannot reach the Dask scheduler {where} ({type(e).__name__}); "
            "start it (dask scheduler) or fix the address"
        )
    gc.collect()  # outside the except clause: the failed client is unreferenced now (see above)
    raise BackendUnavailableError(failure)


def reach_scheduler(cfg) -> None:
    """Join ``runtime.cluster: scheduler``'s scheduler and leave it: preflight (and ``--check``) find an address
    that does not answer, or credentials it does not take, before a stage runs (the fine-tune runs before the
    cluster is joined)."""
    join_scheduler(cfg).close()


class Runtime:
    """``with Runtime(job.runtime) as client: ...`` starts (or joins) the cluster and closes it after.

    If the start itself fails or is interrupted, what was started is closed before the error goes on.
    Leaving on an interrupt (Ctrl-C, or SIGTERM turned into one by the CLI), distributed's loggers are
    silenced while the cluster closes: the workers that stop mid-task are expected, not news.
    """

    def __init__(self, cfg):
        self.cfg = cfg
        self.cluster = None
        self.client = None
        self.description: dict = {}
        self.security = None  # a local cluster's TLS credentials (cluster_security), while it runs
        self._scope = contextlib.ExitStack()  # settings that last as long as the cluster

    def __enter__(self):
        try:
            return self._start()
        except BaseException as e:
            self.__exit__(type(e), e, e.__traceback__)
            raise

    def _start(self):
        from distributed import Client

        cfg = self.cfg
        check_runtime(cfg)
        self._scope.enter_context(sync_cancel_race_quiet())
        n = cfg.n_workers or default_n_workers(cfg)
        if cfg.cluster in ("local", "local-cuda"):
            self._scope.enter_context(environ_kept_of_workers())
            self.security = cluster_security(cfg)
        if cfg.cluster == "local":
            import dask
            from distributed import LocalCluster

            if start_worker_server(cfg):  # for the cluster's life: a worker restarted later forks too
                self._scope.enter_context(dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"}))
                self.description["worker_start"] = "forkserver"
            with sigint_blocked() if cfg.processes else contextlib.nullcontext(), worker_allocator_env():
                self.cluster = LocalCluster(**local_cluster_args(cfg, n, self.security))
            self.client = Client(self.cluster)  # with the cluster's own credentials (its .security)
            if cfg.processes:
                self.client.register_plugin(IgnoreSigint())
        elif cfg.cluster == "local-cuda":
            from dask_cuda import LocalCUDACluster

            kw = local_cuda_cluster_args(cfg, n, self.security)
            with sigint_blocked(), worker_allocator_env():
                self.cluster = LocalCUDACluster(**kw)
            self.client = Client(self.cluster)
            self.client.register_plugin(IgnoreSigint())
            self.description["rmm_pool_size"] = kw.get("rmm_pool_size")
            self.description["rmm"] = sorted(set(self.client.run(worker_allocators).values()))
        else:
            self.client = join_scheduler(cfg)
        workers = self.client.scheduler_info()["workers"]
        if not workers and cfg.cluster == "scheduler":
            self.client.wait_for_workers(1, timeout=120)
            workers = self.client.scheduler_info()["workers"]
        self.description.update(
            {
                "cluster": cfg.cluster,
                "n_workers": len(workers),
                "threads_per_worker": cfg.threads_per_worker,
                "dashboard": dashboard_link(self.client, cfg),
                # tls: every connection authenticated (a local cluster's own credentials, or the config's)
                "protocol": self.client.scheduler.address.split("://", 1)[0],
            }
        )
        return self.client

    def __exit__(self, exc_type=None, exc=None, tb=None):
        interrupted = exc_type is not None and issubclass(exc_type, KeyboardInterrupt)
        with logging_off() if interrupted else contextlib.nullcontext():
            client, cluster, self.client, self.cluster = self.client, self.cluster, None, None
            self.security = None
            if client is not None:
                client.close()
            if cluster is not None:
                cluster.close()
            self._scope.close()
        return False


class SyncCancelRace(logging.Filter):
    """Drops the one record distributed's ``sync`` logs when Ctrl-C lands before its coroutine started.

    ``distributed.utils.sync`` answers a KeyboardInterrupt by scheduling ``cancel`` on the event loop;
    when the interrupt came before the coroutine had made its future, ``cancel`` raises NameError
    (``future`` unbound) in the loop thread, and tornado logs that as "Exception in callback" with a
    traceback, at any moment while the interrupted job unwinds (seen in CI with distributed 2026.8.0).
    The interrupt itself is handled (the job exits 130 with its one line); only that record goes.
    A record is dropped only if its exception is a NameError raised in a function named ``cancel`` in
    distributed's ``utils.py``: every other record passes.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info
        if not exc or exc[0] is not NameError or exc[2] is None:
            return True
        tb = exc[2]
        while tb.tb_next is not None:
            tb = tb.tb_next
        code = tb.tb_frame.f_code
        where = code.co_filename.replace(os.sep, "/")
        return not (code.co_name == "cancel" and where.endswith("distributed/utils.py"))


@contextlib.contextmanager
def sync_cancel_race_quiet():
    """:class:`SyncCancelRace` on tornado's callback logger for as long as the cluster is used."""
    logger, quiet = logging.getLogger("tornado.application"), SyncCancelRace()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


@contextlib.contextmanager
def logging_off():
    """Every logger off inside (distributed's scheduler, nannies and client log from several threads
    while an interrupted cluster closes), the previous threshold restored after."""
    old = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(old)
