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
    assert plan().multi_gpu_learn is False  # a LocalCluster of CPU workers: a single-GPU fit
    assert plan(runtime={"learn_backend": "cpu"}).learn.name == "sklearn"
    # only KMeans on the PCA output runs on cuml.dask (its k fixed, or picked by the k sweep on one GPU worker);
    # anything else is a single-GPU fit (on a GPU worker: rapids_attn.learn.fit.fit_worker)
    cuda = {"cluster": "local-cuda"}
    assert plan(runtime=cuda, cluster={"method": "dbscan"}).multi_gpu_learn is False
    assert plan(runtime=cuda, cluster={"method": "hdbscan"}).multi_gpu_learn is False
    assert plan(runtime=cuda, cluster={"n_clusters": "auto"}).multi_gpu_learn is True
    assert plan(runtime=cuda, reduce={"umap": {"enabled": True}}).multi_gpu_learn is False


def test_scheduler_workers_decide_their_own_device(no_gpu):
    p = plan(runtime={"cluster": "scheduler", "address": "tls://10.0.0.1:8786"})
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


@pytest.mark.parametrize(
    ("checkpoint", "gpu", "bf16", "want"),
    [
        ("bfloat16", True, True, "bfloat16"),  # Gemma 2/3 and most recent decoders: their own dtype
        ("bfloat16", True, False, "float32"),  # a GPU without native bfloat16: never float16, which overflows
        ("float16", True, True, "float16"),
        ("float16", True, False, "float16"),
        ("float32", True, True, "float16"),  # float32 or unnamed: the GPU default, as before (the stores' keys hold)
        (None, True, True, "float16"),
        (None, True, False, "float16"),
        ("bfloat16", False, False, "float32"),  # the CPU: float32 whatever the checkpoint
        ("float16", False, False, "float32"),
        (None, False, False, "float32"),
    ],
)
def test_auto_model_dtype_follows_the_checkpoint(checkpoint, gpu, bf16, want):
    assert devices.auto_model_dtype(checkpoint, gpu, bf16) == want


def test_a_worker_resolves_auto_from_the_checkpoint_and_its_gpu(monkeypatch):
    """model.dtype: auto is resolved where the model runs: from the checkpoint's dtype and whether that worker's GPU
    runs bfloat16; a dtype set in the job is kept as it is."""
    import torch

    monkeypatch.setattr(devices, "cuda_device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for bf16, want in [(True, "bfloat16"), (False, "float32")]:
        monkeypatch.setattr(devices, "bf16_supported", lambda bf16=bf16: bf16)
        w = ExtractDevices("cuda").on_this_worker("bfloat16")
        assert (w.device, w.model_dtype, w.embed_precision) == ("cuda:0", want, "float16")
    assert ExtractDevices("cuda").on_this_worker(None).model_dtype == "float16"
    assert ExtractDevices("cuda", "float32").on_this_worker("bfloat16").model_dtype == "float32"
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)
    assert ExtractDevices("worker").on_this_worker("bfloat16").model_dtype == "float32"


def test_bf16_support_is_false_without_cuda(no_gpu, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices.bf16_supported() is False
