"""The Dask cluster a job runs on: a context manager that yields a ``distributed.Client``.

- ``local``: a ``LocalCluster`` (CPU workers; the quickstart and CI).
- ``local-cuda``: a dask-cuda ``LocalCUDACluster``, one worker per GPU, with an RMM pool that
  PyTorch and CuPy allocate from (set up by dask-cuda), so the model, the CNN and a multi-GPU fit
  share one pool per GPU. A single-GPU fit runs in the job process, after the cluster is closed.
- ``scheduler``: an existing cluster (``address`` or ``scheduler_file``): multi-node, dask-jobqueue,
  dask-kubernetes, or ``dask scheduler`` + ``dask cuda worker`` by hand.

The dashboard listens on ``runtime.dashboard_address`` (127.0.0.1:8787 by default); when that port
is busy, distributed picks a free one, and the link actually used is reported.
"""

from __future__ import annotations

import logging
import os

from rapids_attn.devices import cuda_device_count
from rapids_attn.errors import BackendUnavailableError

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
        if cuda_device_count() == 0:
            raise BackendUnavailableError(
                "runtime.cluster: local-cuda but no CUDA device is visible; use cluster: local"
            )
    if cfg.cluster == "scheduler" and cfg.scheduler_file is not None and not cfg.scheduler_file.is_file():
        raise BackendUnavailableError(f"runtime.scheduler_file: no such file: {cfg.scheduler_file}")


#: the libraries whose GPU allocations dask-cuda routes through each worker's RMM pool
RMM_LIBS = ["torch", "cupy"]


def local_cluster_args(cfg, n_workers: int) -> dict:
    """``distributed.LocalCluster``'s arguments for ``runtime.cluster: local``."""
    return {
        "n_workers": n_workers,
        "threads_per_worker": cfg.threads_per_worker,
        "processes": cfg.processes,
        "dashboard_address": cfg.dashboard_address,
        "silence_logs": logging.ERROR,
    }


def local_cuda_cluster_args(cfg, n_workers: int) -> dict:
    """``dask_cuda.LocalCUDACluster``'s arguments for ``runtime.cluster: local-cuda``.

    With a pool (``rmm_pool_size``: ``auto`` = 80% of each GPU, or a size), dask-cuda makes the pool
    on each worker and points PyTorch and CuPy at it (``rmm_allocator_external_lib_list``), so the
    model, the CNN and a multi-GPU fit share it. ``null`` means no pool, and then PyTorch and CuPy
    keep their own caching allocators: RMM's plain allocator would only make them slower."""
    kw = {
        "n_workers": n_workers,
        "threads_per_worker": cfg.threads_per_worker,
        "dashboard_address": cfg.dashboard_address,
        "silence_logs": logging.ERROR,
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


class Runtime:
    """``with Runtime(job.runtime) as client: ...`` starts (or joins) the cluster and closes it after."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.cluster = None
        self.client = None
        self.description: dict = {}

    def __enter__(self):
        from distributed import Client

        cfg = self.cfg
        check_runtime(cfg)
        n = cfg.n_workers or default_n_workers(cfg)
        if cfg.cluster == "local":
            from distributed import LocalCluster

            self.cluster = LocalCluster(**local_cluster_args(cfg, n))
            self.client = Client(self.cluster)
        elif cfg.cluster == "local-cuda":
            from dask_cuda import LocalCUDACluster

            kw = local_cuda_cluster_args(cfg, n)
            self.cluster = LocalCUDACluster(**kw)
            self.client = Client(self.cluster)
            self.description["rmm_pool_size"] = kw.get("rmm_pool_size")
            self.description["rmm"] = sorted(set(self.client.run(worker_allocators).values()))
        else:
            try:
                if cfg.scheduler_file is not None:
                    self.client = Client(scheduler_file=str(cfg.scheduler_file), timeout="20s")
                else:
                    self.client = Client(cfg.address, timeout="20s")
            except (OSError, TimeoutError) as e:
                target = cfg.address or cfg.scheduler_file
                raise BackendUnavailableError(
                    f"runtime.address: cannot reach the Dask scheduler at {target} ({type(e).__name__}); "
                    "start it (dask scheduler) or fix the address"
                ) from None
        workers = self.client.scheduler_info()["workers"]
        if not workers and cfg.cluster == "scheduler":
            self.client.wait_for_workers(1, timeout=120)
            workers = self.client.scheduler_info()["workers"]
        self.description.update(
            {
                "cluster": cfg.cluster,
                "n_workers": len(workers),
                "threads_per_worker": cfg.threads_per_worker,
                "dashboard": self.client.dashboard_link,
            }
        )
        return self.client

    def __exit__(self, *exc):
        if self.client is not None:
            self.client.close()
        if self.cluster is not None:
            self.cluster.close()
        return False
