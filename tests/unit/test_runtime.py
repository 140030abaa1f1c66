"""The Dask cluster's arguments (runtime.py). The real LocalCUDACluster signature is checked in
tests/contract against the dask-cuda wheel; here, what the project asks for."""

import inspect

import pytest
from distributed import LocalCluster

from rapids_attn.job import RuntimeConfig
from rapids_attn.runtime import local_cluster_args, local_cuda_cluster_args


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
