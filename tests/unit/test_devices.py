"""The device plan: every CPU/GPU decision made once, in rapids_attn.devices, and nowhere else."""

import ast
from pathlib import Path

import pytest

import rapids_attn
from rapids_attn import devices
from rapids_attn.devices import ExtractDevices, resolve_devices
from rapids_attn.errors import BackendUnavailableError, JobConfigError
from rapids_attn.job import ClusterConfig, EmbedConfig, ExtractConfig, ModelConfig, ReduceConfig, RuntimeConfig

MODEL = ModelConfig(name="minilm-l6")


def plan(
    extract=None,
    embed=None,
    runtime=None,
    model=MODEL,
    stages=("extract", "learn", "explain"),
    reduce=None,
    cluster=None,
):
    return resolve_devices(
        ExtractConfig(**(extract or {})),
        model,
        EmbedConfig(**(embed or {})),
        RuntimeConfig(**(runtime or {})),
        stages,
        ReduceConfig(**(reduce or {})),
        ClusterConfig(**(cluster or {})),
    )


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)


@pytest.fixture
def two_gpus_with_cuml(monkeypatch):
    """A machine that looks like two GPUs and cuML (only the device module is told so)."""
    import types

    monkeypatch.setattr(devices, "cuda_device_count", lambda: 2)
    monkeypatch.setattr(devices, "_cuml_available", lambda: True)
    monkeypatch.setitem(__import__("sys").modules, "cupy", types.ModuleType("cupy"))


def test_cpu_machine_plan(no_gpu):
    p = plan()
    assert p.extract == ExtractDevices("cpu", "auto", "auto")
    assert p.learn.name == "sklearn" and not p.learn.gpu and "no CUDA device" in p.learn.reason
    assert p.multi_gpu_learn is False and p.n_gpus == 0
    w = p.extract.on_this_worker()
    assert (w.device, w.model_dtype, w.embed_precision, w.gpu) == ("cpu", "float32", "float32", False)
    assert plan(stages=("extract",)).learn is None  # no learn stage, no learn backend resolved


def test_gpu_machine_plan(two_gpus_with_cuml):
    p = plan(runtime={"cluster": "local-cuda"})
    assert p.extract.device == "cuda" and p.learn.name == "cuml" and p.multi_gpu_learn is True
    assert plan(runtime={"cluster": "local-cuda", "n_workers": 1}).multi_gpu_learn is False
    assert plan().multi_gpu_learn is False  # a LocalCluster fits on the job process's GPU
    assert plan(runtime={"learn_backend": "cpu"}).learn.name == "sklearn"
    # only KMeans with a fixed k on the PCA output runs on cuml.dask; anything else fits in the job
    # process, so the workers (and their RMM pools) must not be kept for it
    cuda = {"cluster": "local-cuda"}
    assert plan(runtime=cuda, cluster={"method": "dbscan"}).multi_gpu_learn is False
    assert plan(runtime=cuda, cluster={"method": "hdbscan"}).multi_gpu_learn is False
    assert plan(runtime=cuda, cluster={"n_clusters": "auto"}).multi_gpu_learn is False
    assert plan(runtime=cuda, reduce={"umap": {"enabled": True}}).multi_gpu_learn is False


def test_scheduler_workers_decide_their_own_device(no_gpu):
    p = plan(runtime={"cluster": "scheduler", "address": "tcp://10.0.0.1:8786"})
    assert p.extract.device == "worker"
    assert p.extract.on_this_worker().device == "cpu"  # this "worker" sees no GPU


def test_int8_is_refused_wherever_extraction_would_run_on_a_gpu(monkeypatch):
    int8 = {"name": "resnet18", "precision": "int8"}
    with pytest.raises(JobConfigError, match=r"embed\.precision: int8 runs on the CPU only"):
        plan(extract={"device": "cuda"}, embed=int8)
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 1)
    with pytest.raises(JobConfigError, match="int8 runs on the CPU only"):
        plan(embed=int8, stages=("extract",))  # auto would pick the visible GPU
    assert plan(extract={"device": "cpu"}, embed=int8, stages=("extract",)).extract.embed_precision == "int8"
    with pytest.raises(JobConfigError, match="int8 runs on the CPU only"):  # a scheduler's worker with a GPU
        ExtractDevices("worker", "auto", "int8").on_this_worker()


def test_extract_rules_apply_only_when_extracting(no_gpu):
    p = plan(extract={"device": "cuda"}, embed={"name": "resnet18", "precision": "int8"}, stages=("learn", "explain"))
    assert p.learn.name == "sklearn"


def test_cuda_asked_for_but_absent(no_gpu):
    with pytest.raises(BackendUnavailableError, match="extract.device: cuda"):
        plan(extract={"device": "cuda"})
    with pytest.raises(BackendUnavailableError, match="extract.device: cuda, but this worker"):
        ExtractDevices("cuda").on_this_worker()
    with pytest.raises(BackendUnavailableError, match="runtime.learn_backend: gpu requested but no CUDA"):
        plan(runtime={"learn_backend": "gpu"})


def test_explicit_dtypes_are_kept(no_gpu):
    w = plan(model=ModelConfig(name="minilm-l6", dtype="bfloat16"), embed={"precision": "float32"}).extract
    assert w.on_this_worker().model_dtype == "bfloat16"


def _cuda_lookups(path: Path) -> list[str]:
    """Calls that ask the machine about CUDA: torch.cuda.is_available / device_count / current_device,
    and the device module's own cuda_device_count."""
    asked = {"is_available", "device_count", "current_device", "get_device_name", "cuda_device_count"}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in asked:
                found.append(f"{path.name}:{node.lineno} {name}")
    return found


def test_only_the_device_module_looks_at_cuda():
    pkg = Path(rapids_attn.__file__).parent
    allowed = {pkg / "devices.py", pkg / "runtime.py"}  # runtime: local-cuda's worker count (devices' own count)
    offenders = [hit for f in sorted(pkg.rglob("*.py")) if f not in allowed for hit in _cuda_lookups(f)]
    assert offenders == []
    runtime_hits = _cuda_lookups(pkg / "runtime.py")
    assert runtime_hits and all(h.endswith("cuda_device_count") for h in runtime_hits)
