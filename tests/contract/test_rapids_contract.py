"""The contract tier: the project's GPU calls against the real RAPIDS wheels, without a GPU.

Runs in its own environment (``bash tests/contract/run.sh``) with the wheels the ``gpu`` extra pins
(the release docker/Dockerfile uses). There, cuML, cuml.dask, dask-cuda, RMM and CuPy import,
signatures bind and estimators construct; only fitting needs a GPU. Every estimator the learn stage
can build is built here through the project's own code (so with exactly its arguments), for every
``cluster.method``, UMAP on and off, one GPU and several; so is every cluster object, with
``LocalCUDACluster``'s arguments bound to its signature. In the main test environment (no RAPIDS)
this module skips.
"""

import importlib.util
import inspect
import pickle
import re
from pathlib import Path

import pytest
import tomllib

if importlib.util.find_spec("cuml") is None:
    pytest.skip("the contract tier runs in its own environment: bash tests/contract/run.sh", allow_module_level=True)

import cuml
import cupy

from rapids_attn import devices
from rapids_attn.backends.learn import KMEANS_N_INIT, LearnBackend
from rapids_attn.devices import supports_multi_gpu
from rapids_attn.job import ClusterConfig, ReduceConfig, RuntimeConfig
from rapids_attn.learn import MapClusterer
from rapids_attn.runtime import RMM_LIBS, local_cluster_args, local_cuda_cluster_args

REPO = Path(__file__).resolve().parents[2]
DIM = 64  # the features' width; any value above pca_components
GPU = LearnBackend("cuml", "contract tier", xp=cupy)

METHODS = {
    "kmeans": {"method": "kmeans", "n_clusters": 8},
    "kmeans-auto": {"method": "kmeans", "n_clusters": "auto", "k_sweep": [2, 6]},
    "dbscan": {"method": "dbscan", "eps": 0.5, "min_samples": 5},
    "hdbscan": {"method": "hdbscan", "min_cluster_size": 10, "min_samples": 3},
}


def sections(method: str, umap: bool):
    reduce = ReduceConfig.model_validate({"pca_components": 16, "umap": {"enabled": umap}})
    return reduce, ClusterConfig.model_validate(METHODS[method])


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0")
    with cluster, Client(cluster) as c:
        yield c


# -- the release ------------------------------------------------------------------------------------


def test_installed_rapids_is_the_release_the_image_and_the_gpu_extra_name():
    image = re.search(r"RAPIDS_IMAGE=rapidsai/base:(\d+\.\d+)-", (REPO / "docker" / "Dockerfile").read_text())
    release = image.group(1)
    gpu_extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    for package in ("cuml-cu13[dask]", "dask-cuda", "rmm-cu13"):
        assert f"{package}=={release}.*" in gpu_extra, (package, gpu_extra)
    import dask_cuda
    import rmm

    for module in (cuml, dask_cuda, rmm):
        assert module.__version__.startswith(release), (module.__name__, module.__version__)
    # cuml.dask's own needs, which the [dask] extra brings
    for module in ("raft_dask", "dask_cudf", "cuml.dask.cluster", "cuml.dask.decomposition"):
        assert importlib.util.find_spec(module) is not None, module


# -- estimators, one GPU (the job process) ----------------------------------------------------------


@pytest.mark.parametrize("umap", [False, True], ids=["pca", "pca+umap"])
@pytest.mark.parametrize("method", list(METHODS))
def test_every_single_gpu_estimator_constructs(method, umap):
    reduce, cluster = sections(method, umap)
    model = MapClusterer.from_config(reduce, cluster, random_state=7, backend=GPU)
    pca, umap_ = model.reducers(DIM)  # PCA (and UMAP) as the fit builds them
    assert isinstance(pca, cuml.decomposition.PCA)
    assert pca.n_components == 16
    if umap:
        assert isinstance(umap_, cuml.manifold.UMAP)
        assert (umap_.n_components, umap_.random_state) == (reduce.umap.n_components, 7)
    else:
        assert umap_ is None
    k = 3 if cluster.n_clusters == "auto" else None  # the k sweep's pick, then each k it tries
    clusterer = model.make_clusterer(k)
    want = {"kmeans": cuml.cluster.KMeans, "dbscan": cuml.cluster.DBSCAN, "hdbscan": cuml.cluster.HDBSCAN}
    assert isinstance(clusterer, want[cluster.method])
    if cluster.method == "kmeans":
        assert (clusterer.n_clusters, clusterer.random_state) == (k or 8, 7)
        for k_try in range(cluster.k_sweep[0], cluster.k_sweep[1] + 1) if cluster.k_sweep else ():
            assert isinstance(GPU.kmeans(k_try, 7), cuml.cluster.KMeans)
    if cluster.method == "hdbscan":  # nothing predicts with it: maps outside the sample take a neighbour's label
        assert clusterer.prediction_data is False
    assert isinstance(GPU.nearest_neighbors(), cuml.neighbors.NearestNeighbors)  # density methods' assignment


def test_pca_takes_no_seed_on_cuml():
    """cuML removed PCA's random_state (its solvers are deterministic); passing one is a TypeError."""
    assert "random_state" not in inspect.signature(cuml.decomposition.PCA).parameters
    with pytest.raises(TypeError):
        cuml.decomposition.PCA(n_components=2, random_state=0)
    assert isinstance(GPU.pca(4, seed=0), cuml.decomposition.PCA)


# -- estimators spread over GPU workers (cuml.dask) -------------------------------------------------


def test_multi_gpu_estimators_construct_and_their_arguments_reach_cuml(client):
    """cuml.dask passes its keyword arguments on to the multi-GPU estimators it builds on each worker
    (``KMeansMG(handle=..., output_type=..., **kwargs)``, likewise ``PCAMG``): build those, as cuml.dask
    would, with the arguments the project passes, and check KMeans's own fit-time validation."""
    import cuml.dask.cluster
    import cuml.dask.decomposition
    from cuml.cluster.kmeans_mg import KMeansMG
    from cuml.decomposition.pca_mg import PCAMG

    pca = GPU.dask_pca(client, 16)
    kmeans = GPU.dask_kmeans(client, 8, 7)
    assert isinstance(pca, cuml.dask.decomposition.PCA) and isinstance(kmeans, cuml.dask.cluster.KMeans)
    local_pca = PCAMG(handle=None, output_type="cupy", **pca.kwargs)
    assert local_pca.n_components == 16
    local = KMeansMG(handle=None, output_type="cupy", **kmeans.kwargs)
    assert (local.n_clusters, local.random_state, local.n_init) == (8, 7, KMEANS_N_INIT)
    local._validate_fit_params()  # what KMeansMG.fit checks first (the MG path needs a seed, among others)


def test_only_fits_with_a_cuml_dask_form_are_spread(client, monkeypatch):
    """KMeans on the PCA output is spread, its k fixed or picked by the k sweep (n_clusters: auto: the sweep
    runs on one GPU worker over its sample, then cuml.dask fits the k it picked); DBSCAN, HDBSCAN and UMAP
    fit on one GPU. cuml.dask's KMeans itself takes no sweep: the project refuses a non-integer k before
    any KMeans is built."""
    for method in METHODS:
        for umap in (False, True):
            reduce, cluster = sections(method, umap)
            assert supports_multi_gpu(reduce, cluster) == (cluster.method == "kmeans" and not umap)
    with pytest.raises(TypeError):
        GPU.dask_kmeans(client, "auto", 0)
    # the device plan, on a machine that (as stubbed) has two GPUs and cuML
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 2)
    cuda = RuntimeConfig(cluster="local-cuda")
    from rapids_attn.job import EmbedConfig, ExtractConfig, ModelConfig

    def plan(method, umap=False):
        reduce, cluster = sections(method, umap)
        return devices.resolve_devices(
            ExtractConfig(), ModelConfig(name="m"), EmbedConfig(), cuda, ("learn",), reduce, cluster
        )

    for method in ("kmeans", "kmeans-auto"):
        assert plan(method).learn.name == "cuml" and plan(method).multi_gpu_learn is True, method
        assert plan(method, umap=True).multi_gpu_learn is False, method
    for method in ("dbscan", "hdbscan"):
        assert plan(method).multi_gpu_learn is False, method


def test_backend_pickles_to_the_workers_with_cupy():
    back = pickle.loads(pickle.dumps(GPU))
    assert back.gpu and back.xp is cupy


# -- the cluster, RMM and zarr ----------------------------------------------------------------------


def _bind_local_cuda_cluster(kwargs: dict) -> None:
    """Bind to LocalCUDACluster's signature; what it passes on in **kwargs must bind to LocalCluster's."""
    from dask_cuda import LocalCUDACluster
    from distributed import LocalCluster

    sig = inspect.signature(LocalCUDACluster)
    named = {k: v for k, v in kwargs.items() if k in sig.parameters}
    rest = {k: v for k, v in kwargs.items() if k not in sig.parameters}
    sig.bind(**named)
    inspect.signature(LocalCluster).bind(**rest)


@pytest.mark.parametrize("pool", ["auto", "24GB", 0.5, None])
def test_local_cuda_cluster_arguments_bind(pool):
    cfg = RuntimeConfig(cluster="local-cuda", rmm_pool_size=pool)
    kwargs = local_cuda_cluster_args(cfg, 2)
    _bind_local_cuda_cluster(kwargs)
    if pool is None:  # no pool: PyTorch and CuPy keep their own caching allocators
        assert "rmm_pool_size" not in kwargs and "rmm_allocator_external_lib_list" not in kwargs
    else:
        assert kwargs["rmm_pool_size"] == (0.8 if pool == "auto" else pool)
        assert kwargs["rmm_allocator_external_lib_list"] == ["torch", "cupy"]
        if isinstance(pool, str) and pool != "auto":  # a size: parsed as dask-cuda parses it
            from dask_cuda.utils import parse_device_bytes

            assert parse_device_bytes(kwargs["rmm_pool_size"]) == 24 * 10**9


def test_rmm_allocator_hooks_exist_for_every_library_named():
    """dask-cuda points each named library at the worker's pool through RMM's allocator hooks."""
    import dask_cuda.plugins
    import rmm.allocators.cupy
    import rmm.allocators.torch

    source = inspect.getsource(dask_cuda.plugins.enable_rmm_memory_for_library)
    for lib in RMM_LIBS:
        assert f'"{lib}"' in source, f"dask-cuda no longer supports RMM for {lib}"
    assert callable(rmm.allocators.cupy.rmm_cupy_allocator)
    # rmm.allocators.torch builds its hook only where torch imports and sees a GPU (RMM 26.10 checks
    # torch.cuda.is_available(); None otherwise); this environment has neither, so only the name is checked
    assert hasattr(rmm.allocators.torch, "rmm_torch_allocator")


def test_local_cluster_arguments_bind():
    from distributed import LocalCluster

    inspect.signature(LocalCluster).bind(**local_cluster_args(RuntimeConfig(), 2))


def test_zarr_gpu_reads_bind_as_the_backend_reads():
    """LearnBackend.read hands zarr's GPU buffer prototype to the one read (``backends.learn.gpu_read``), leaving
    the process's zarr configuration alone (issue 35): the prototype must resolve to zarr's CuPy-backed buffers
    in the zarr this project installs, and the read must take it."""
    import zarr
    from zarr.core.buffer.gpu import buffer_prototype

    assert buffer_prototype.buffer.__module__.endswith("buffer.gpu")
    assert buffer_prototype.buffer.__name__ == "Buffer" and buffer_prototype.nd_buffer.__name__ == "NDBuffer"
    inspect.signature(zarr.Array.get_basic_selection).bind(None, slice(0, 1), prototype=buffer_prototype)
    inspect.signature(zarr.open_array).bind(store=None, path="features", mode="r")


def test_the_spread_fit_calls_bind_to_cuml_dask():
    """What the spread fit calls on cuml.dask's estimators beyond fit (issue 35: its stability refits read each
    fit's labels with ``predict``; the workers apply the combined single-GPU models)."""
    import cuml.dask.cluster
    import cuml.dask.decomposition

    inspect.signature(cuml.dask.cluster.KMeans.predict).bind(None, None)
    inspect.signature(cuml.dask.cluster.KMeans.predict).bind(None, None, delayed=True)
    inspect.signature(cuml.dask.decomposition.PCA.transform).bind(None, None)
    for cls in (cuml.dask.cluster.KMeans, cuml.dask.decomposition.PCA):
        assert callable(getattr(cls, "get_combined_model", None)), cls
    assert hasattr(cuml.cluster.KMeans(n_clusters=3), "n_clusters")  # the stability refits' k, off the combined model


def test_the_mig_check_calls_bind_to_nvml():
    """A worker on a MIG slice is told apart through NVML (``devices.nvidia_gpu_name``, issue 47): the calls exist in
    the nvidia-ml-py dask-cuda brings, and without a driver (here) the check answers "whole GPU", not an error."""
    import pynvml

    for name in ("nvmlInit", "nvmlShutdown", "nvmlDeviceGetHandleByUUID", "nvmlDeviceIsMigDeviceHandle"):
        assert callable(getattr(pynvml, name)), name
    assert callable(pynvml.nvmlDeviceGetMigMode) and issubclass(pynvml.NVMLError, Exception)
    assert devices.nvidia_gpu_name("0aa5d7b3-1111-2222-3333-444455556666", "0", pynvml).startswith("GPU-")
    assert devices.nvidia_gpu_name("0aa5d7b3-1111-2222-3333-444455556666", "MIG-0aa5", pynvml).startswith("MIG-")


def test_what_the_docs_say_of_cuml_holds_in_the_wheel():
    """docs/deployment.md ("The first GPU run") states three things of cuML 26.10 that no CPU test can run; they are
    read off the wheel here, so a release that changes them fails this test before the docs go stale:

    - cuml.dask's ``KMeans.fit`` pulls the first worker's fitted model into the calling (job) process;
    - UMAP's ``build_algo`` is ``auto``, which builds the KNN graph with NN Descent above 50K rows, and a set
      ``random_state`` costs training speed and memory;
    - HDBSCAN keeps no prediction data unless asked (the project does not ask: nothing predicts with it)."""
    import cuml.dask.cluster

    assert "kmeans_fit[0].result()" in inspect.getsource(cuml.dask.cluster.KMeans.fit)
    umap_params = inspect.signature(cuml.manifold.UMAP).parameters
    assert umap_params["build_algo"].default == "auto"
    doc = " ".join(cuml.manifold.UMAP.__doc__.split())
    assert "smaller than or equal to 50K. Otherwise, runs with nn descent" in doc
    assert "at the cost of slower training and increased memory usage" in doc
    assert inspect.signature(cuml.cluster.HDBSCAN).parameters["prediction_data"].default is False
