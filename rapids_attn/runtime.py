"""The Dask cluster a job runs on: a context manager that yields a ``distributed.Client``.

- ``local``: a ``LocalCluster`` (CPU workers; the quickstart and CI).
- ``local-cuda``: a dask-cuda ``LocalCUDACluster``, one worker per GPU, with an RMM pool that
  PyTorch and CuPy allocate from, so the model, the CNN and cuML share one pool per GPU.
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


def _use_rmm_everywhere() -> str:
    """Run on each CUDA worker: route PyTorch and CuPy allocations through RMM's pool."""
    out = []
    try:
        import rmm.allocators.torch
        import torch

        torch.cuda.memory.change_current_allocator(rmm.allocators.torch.rmm_torch_allocator)
        out.append("torch")
    except Exception as e:  # noqa: BLE001 - already-initialised torch allocator, or no rmm: keep going, say so
        out.append(f"torch: {type(e).__name__}")
    try:
        import cupy
        import rmm.allocators.cupy

        cupy.cuda.set_allocator(rmm.allocators.cupy.rmm_cupy_allocator)
        out.append("cupy")
    except Exception as e:  # noqa: BLE001 - as above: report which allocator failed and go on
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

            self.cluster = LocalCluster(
                n_workers=n,
                threads_per_worker=cfg.threads_per_worker,
                processes=cfg.processes,
                dashboard_address=cfg.dashboard_address,
                silence_logs=logging.ERROR,
            )
            self.client = Client(self.cluster)
        elif cfg.cluster == "local-cuda":
            from dask_cuda import LocalCUDACluster

            pool = 0.8 if cfg.rmm_pool_size == "auto" else cfg.rmm_pool_size  # 0.8: a fraction of each GPU
            kw = {} if pool is None else {"rmm_pool_size": pool}
            self.cluster = LocalCUDACluster(
                n_workers=n,
                threads_per_worker=cfg.threads_per_worker,
                dashboard_address=cfg.dashboard_address,
                silence_logs=logging.ERROR,
                **kw,
            )
            self.client = Client(self.cluster)
            self.description["rmm"] = sorted(set(self.client.run(_use_rmm_everywhere).values()))
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
