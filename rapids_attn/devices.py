"""The one module that looks at CUDA: where each part of a job runs, decided once, in preflight.

:func:`resolve_devices` turns the job's device settings (``extract.device``, ``model.dtype``,
``embed.precision``, ``runtime.learn_backend``, ``runtime.cluster``) into a frozen
:class:`DevicePlan` before any worker starts. Stages receive the plan and never ask CUDA
themselves:

- **extract**: the device the model and the embedder run on (``cpu``, ``cuda``, or ``worker``:
  each worker of an existing scheduler uses CUDA if it sees a GPU, which only the worker can know),
  the model's dtype and the embedder's precision. Workers resolve ``worker`` through
  :meth:`ExtractDevices.on_this_worker`, which applies the same rules.
- **learn**: cuML on CuPy arrays or scikit-learn on NumPy arrays (:class:`LearnBackend`), and
  whether the fit is spread over several GPU workers (``cuml.dask``).

The rules live here once: ``int8`` embedding runs on the CPU only; ``auto`` precision means float16 on a
GPU and float32 on the CPU; ``model.dtype: auto`` follows the checkpoint on a GPU (:func:`auto_model_dtype`)
and is float32 on the CPU; ``learn_backend: auto`` means cuML when it is
importable and a GPU is visible. Nothing here imports cupy, cuml or dask_cuda unless a GPU backend
is chosen.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from dataclasses import dataclass
from typing import Literal

from rapids_attn.backends.learn import LearnBackend
from rapids_attn.errors import BackendUnavailableError, JobConfigError


def cuda_device_count() -> int:
    """GPUs visible to this process (0 without CUDA or without a working driver)."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no usable CUDA, whatever the reason, is no GPU
        return 0


def missing_cuda_device(index: int | None) -> str | None:
    """Why CUDA device ``index`` (None: the current one) cannot be used here, or None when it can: the API's
    ``device`` argument is checked through this module, the only one that looks at CUDA."""
    n = cuda_device_count()
    if n == 0:
        return "no CUDA device is visible"
    if index is not None and index >= n:
        return f"{n} CUDA device(s) are visible (0..{n - 1})"
    return None


def bf16_supported() -> bool:
    """Whether this process's GPU runs bfloat16 natively (compute capability 8.0 and up: Ampere and later). Older
    GPUs emulate it, more slowly than float32, so they count as not supporting it. False without CUDA."""
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        try:
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:  # a torch without the argument: it does not count emulation either
            return bool(torch.cuda.is_bf16_supported())
    except Exception:  # noqa: BLE001 - a GPU that cannot answer gets float32, which is always right
        return False


#: ``model.dtype: auto`` on a GPU for a checkpoint saved in float32 or naming no dtype: half precision, as before the
#: checkpoint's own dtype was read: a job on such a checkpoint computes what it did
GPU_DEFAULT_DTYPE = "float16"


def auto_model_dtype(checkpoint: str | None, gpu: bool, bf16: bool) -> str:
    """``model.dtype: auto`` for a checkpoint whose config names ``checkpoint`` (its ``dtype``, formerly
    ``torch_dtype``: float32, float16, bfloat16, or None), on a GPU (``gpu``) that does or does not run bfloat16
    natively (``bf16``, :func:`bf16_supported`). A pure function: the table is tested without a GPU.

    - On the CPU: float32, whatever the checkpoint (half precision on the CPU is slow and gains nothing).
    - A bfloat16 checkpoint: bfloat16 where the GPU supports it, else float32. Never float16: weights trained in
      bfloat16 can reach activations past float16's largest value, 65504 (Gemma 2 and 3 do), and the maps are NaN.
    - A float16 checkpoint: float16.
    - A float32 checkpoint, or one naming no dtype: :data:`GPU_DEFAULT_DTYPE` (float16), as before, so those jobs
      compute what they did; the capture refuses a batch whose maps overflow it (set model.dtype then).
    """
    if not gpu:
        return "float32"
    if checkpoint == "bfloat16":
        return "bfloat16" if bf16 else "float32"
    if checkpoint == "float16":
        return "float16"
    return GPU_DEFAULT_DTYPE


def _cuml_available() -> bool:
    return importlib.util.find_spec("cuml") is not None and importlib.util.find_spec("cupy") is not None


def _int8_on(device: str) -> None:
    if device != "cpu":
        raise JobConfigError(
            "embed.precision: int8 runs on the CPU only and extraction would run on a GPU; "
            "use precision: auto (float16 on a GPU) or extract.device: cpu"
        )


@dataclass(frozen=True)
class ExtractDevices:
    """Where a worker runs the model and the embedder. Small and picklable: it travels with each task."""

    device: Literal["cpu", "cuda", "worker"]
    #: model.dtype as set: ``auto`` follows the checkpoint on a GPU (:func:`auto_model_dtype`), float32 on the CPU
    model_dtype: str = "auto"
    #: embed.precision as set: ``auto`` (float16 on a GPU, float32 on the CPU), ``float32`` or ``int8``
    embed_precision: str = "auto"
    #: model.device_map as set (None: the model runs whole on the worker's one device). Set, the model's layers are
    #: spread over every GPU the worker sees; the worker's ``device`` (its first GPU) still holds the inputs, the
    #: reduced maps and the embedder, and the capture reduces each layer where it runs, its results gathered there
    #: (:class:`rapids_attn.extract.maps.LayerReducer`)
    device_map: str | None = None

    def on_this_worker(self, checkpoint_dtype: str | None = None) -> ResolvedDevices:
        """The concrete device (``cpu`` or ``cuda:N``) and dtypes for the process that calls it; ``checkpoint_dtype``
        (the dtype the model's config names, :func:`rapids_attn.extract.model.checkpoint_dtype`) decides
        ``model.dtype: auto`` on a GPU."""
        gpu = self.device != "cpu" and cuda_device_count() > 0
        if self.device == "cuda" and not gpu:
            raise BackendUnavailableError("extract.device: cuda, but this worker sees no CUDA device; use auto or cpu")
        if self.embed_precision == "int8" and gpu:
            _int8_on("cuda")
        dev = "cpu"
        if gpu:
            import torch

            dev = f"cuda:{torch.cuda.current_device()}"
        model_dtype = self.model_dtype
        if model_dtype == "auto":
            model_dtype = auto_model_dtype(checkpoint_dtype, gpu, gpu and bf16_supported())
        precision = self.embed_precision
        if precision == "auto":
            precision = "float16" if gpu else "float32"
        spans = (dev,)
        if self.device_map is not None and gpu:
            spans = tuple(f"cuda:{i}" for i in range(cuda_device_count()))
        return ResolvedDevices(dev, model_dtype, precision, spans)


@dataclass(frozen=True)
class ResolvedDevices:
    """One process's devices: ``device`` is ``cpu`` or ``cuda:N``; dtypes are torch dtype names."""

    device: str
    model_dtype: str
    #: ``float16``, ``float32`` or ``int8``
    embed_precision: str
    #: the devices the model's layers may run on: ``(device,)``, or with model.device_map every GPU the process sees
    model_devices: tuple[str, ...] = ()

    @property
    def gpu(self) -> bool:
        return self.device.startswith("cuda")


@dataclass(frozen=True)
class DevicePlan:
    """Everything about devices that the stages need, resolved once in preflight."""

    extract: ExtractDevices
    #: None when the job runs no learn stage
    learn: LearnBackend | None
    #: fit PCA and KMeans with cuml.dask across the GPU workers (the learn stage keeps the cluster)
    multi_gpu_learn: bool
    #: GPUs visible to the job process
    n_gpus: int


def resolve_learn_backend(pref: str, n_gpus: int | None = None) -> LearnBackend:
    """``auto``: cuML when it is importable and a GPU is visible, else scikit-learn (saying why)."""
    if pref == "cpu":
        return LearnBackend("sklearn", "runtime.learn_backend is cpu")
    n_gpus = cuda_device_count() if n_gpus is None else n_gpus
    has_cuml = _cuml_available()
    if n_gpus > 0 and has_cuml:
        import cupy

        return LearnBackend("cuml", f"cuML on {n_gpus} visible GPU(s)", xp=cupy)
    if pref == "gpu":
        missing = (
            "no CUDA device is visible" if n_gpus == 0 else "cuML is not installed (pip install 'rapids_attn[gpu]')"
        )
        raise BackendUnavailableError(f"runtime.learn_backend: gpu requested but {missing}; set it to auto or cpu")
    why = "no CUDA device" if n_gpus == 0 else "cuML not installed"
    return LearnBackend("sklearn", f"scikit-learn ({why})")


def resolve_devices(extract, model, embed, runtime, stages: tuple[str, ...], reduce=None, cluster=None) -> DevicePlan:
    """The job's sections -> a :class:`DevicePlan`; a setting this machine cannot honour is a
    one-line error here, before any worker starts. The extraction rules apply only when the extract
    stage runs (a store extracted on a GPU node can be clustered on a CPU machine); ``reduce`` and
    ``cluster`` (the learn stage's sections) decide whether the fit can be spread over GPUs."""
    n_gpus = cuda_device_count()
    if extract.device == "cpu":
        device = "cpu"
    elif runtime.cluster == "scheduler" and extract.device == "auto":
        device = "worker"  # workers of another machine: only they know whether they see a GPU
    elif extract.device == "cuda" or n_gpus > 0 or runtime.cluster == "local-cuda":
        device = "cuda"
    else:
        device = "cpu"
    if "extract" in stages:
        if embed.precision == "int8" and device == "cuda":
            _int8_on("cuda")
        if extract.device == "cuda" and runtime.cluster != "scheduler" and n_gpus == 0:
            raise BackendUnavailableError("extract.device: cuda, but no CUDA device is visible; use auto or cpu")
        device_map = getattr(model, "device_map", None)
        if device_map is not None:
            check_device_map(device_map, extract.device, device, runtime)
    learn = resolve_learn_backend(runtime.learn_backend, n_gpus) if "learn" in stages else None
    multi = False
    if learn is not None and learn.gpu and _multi_gpu_fit(reduce, cluster):
        if runtime.cluster == "local-cuda":
            multi = (runtime.n_workers or n_gpus) > 1
        elif runtime.cluster == "scheduler":
            multi = True  # decided again at fit time from the GPU workers that joined
    extract_devices = ExtractDevices(device, model.dtype, embed.precision, getattr(model, "device_map", None))
    return DevicePlan(extract_devices, learn, multi, n_gpus)


def check_device_map(device_map: str, asked: str, device: str, runtime) -> None:
    """``model.device_map`` spreads one model over every GPU its worker sees, so one worker must hold it: a
    ``local-cuda`` cluster runs one worker (dask-cuda shows it every visible GPU), and so does a ``local`` one
    extracting on GPUs (each of its workers sees every GPU of the machine and would load the model whole over them).
    An external scheduler's workers are the user's to start one per node (docs/deployment.md, "A model larger than
    one GPU"). ``extract.device: cpu`` asks for no GPU at all. Each refusal is a one-line JobConfigError (exit 2).
    On a machine without a GPU (``device`` resolved to cpu from auto) the setting holds the model on the CPU."""
    if asked == "cpu":
        raise JobConfigError(
            f"model.device_map: {device_map} spreads the model's layers over the GPUs, and extract.device is cpu; "
            "leave model.device_map out, or set extract.device: auto"
        )
    if runtime.cluster == "local-cuda" and runtime.n_workers != 1:
        raise JobConfigError(
            f"runtime.n_workers: model.device_map ({device_map}) spreads one model over the node's GPUs, so "
            "cluster local-cuda must run one worker, which then sees every visible GPU; set runtime.n_workers: 1"
        )
    if runtime.cluster == "local" and device == "cuda" and runtime.n_workers != 1:
        raise JobConfigError(
            f"runtime.n_workers: model.device_map ({device_map}) spreads one model over this machine's GPUs, and "
            "every local worker would load it whole over them; set runtime.n_workers: 1 (or cluster: local-cuda "
            "with n_workers: 1)"
        )


def _multi_gpu_fit(reduce, cluster) -> bool:
    return reduce is not None and cluster is not None and supports_multi_gpu(reduce, cluster)


def supports_multi_gpu(reduce, cluster) -> bool:
    """Whether this fit can run on cuml.dask across GPU workers: KMeans on the PCA output (its k fixed, or
    picked by the k sweep, which runs on one GPU worker over the sweep's sample). UMAP, DBSCAN and HDBSCAN
    have no cuml.dask form here: they fit on one GPU, on a worker (:func:`rapids_attn.learn.fit.fit_worker`)."""
    return cluster.method == "kmeans" and not reduce.umap.enabled


def one_worker_per_gpu(ids: dict[str, str | None]) -> list[str]:
    """The workers the spread fit uses: one per distinct GPU (by UUID), none without a GPU. cuml.dask
    starts one NCCL rank per worker holding parts, and NCCL refuses two ranks on one device."""
    first: dict[str, str] = {}
    for addr in sorted(ids):
        if ids[addr] is not None:
            first.setdefault(ids[addr], addr)
    return sorted(first.values())


def mig_workers(ids: dict[str, str | None]) -> list[str]:
    """The workers whose GPU is a MIG slice (named ``MIG-...`` by :func:`worker_gpu_id`). Slices of one card have
    UUIDs of their own, so they count as distinct GPUs; but NCCL, which cuml.dask's spread fit runs on, does not run
    across MIG slices: with any of them among the workers the fit is not spread
    (:func:`rapids_attn.learn.fit.fit_store`)."""
    return sorted(a for a, g in ids.items() if g and g.startswith("MIG-"))


def nvidia_gpu_name(uuid: str, visible: str | None = None, nvml=None) -> str:
    """NVIDIA's name for the GPU torch calls ``uuid`` (torch prints the bare 8-4-4-4-12 hex): ``MIG-<uuid>`` where
    the process runs on a MIG slice, ``GPU-<uuid>`` on a whole GPU. A slice is known by ``visible``, the process's
    CUDA_VISIBLE_DEVICES entry for its device (dask-cuda lists MIG devices as ``MIG-<uuid>``), naming one, or through
    NVML (``nvml``: the pynvml module, None without it) by the UUID resolving to a MIG device or to a GPU in MIG mode.
    Without either sign it is a whole GPU: a slice that neither shows is taken for one (docs/deployment.md, "The
    first GPU run")."""
    if uuid.startswith(("GPU-", "MIG-")):
        return uuid
    if (visible or "").strip().startswith("MIG-") or (nvml is not None and _nvml_says_mig(nvml, uuid)):
        return f"MIG-{uuid}"
    return f"GPU-{uuid}"


def _nvml_says_mig(nvml, uuid: str) -> bool:
    """Whether NVML knows ``uuid`` as a MIG device, or as a GPU in MIG mode (CUDA then runs on its slices only)."""
    try:
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVML (no driver library): no answer
        return False
    try:
        for name in (f"MIG-{uuid}", f"GPU-{uuid}"):
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(name.encode())
            except nvml.NVMLError:
                continue
            if nvml.nvmlDeviceIsMigDeviceHandle(handle):
                return True
            return bool(nvml.nvmlDeviceGetMigMode(handle)[0])  # (current, pending); NotSupported without MIG
        return False
    except Exception:  # noqa: BLE001 - a GPU without MIG support (NVMLError_NotSupported) or an older NVML
        return False
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def worker_gpu_id() -> str | None:
    """NVIDIA's name of the GPU this process runs on (None without CUDA), ``GPU-<uuid>`` or, on a MIG slice,
    ``MIG-<uuid>`` (:func:`nvidia_gpu_name`); run on each worker."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        i = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(i)
        uuid = getattr(props, "uuid", None)  # no index fallback: every dask-cuda worker sees its GPU as 0
        if not uuid:
            return None
        entries = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
        try:
            import pynvml  # nvidia-ml-py, which dask-cuda depends on
        except ImportError:
            pynvml = None
        return nvidia_gpu_name(str(uuid), entries[i] if i < len(entries) else None, pynvml)
    except Exception:  # noqa: BLE001 - a worker whose CUDA cannot answer has no GPU to give
        return None


def gpu_ids(client) -> dict[str, str | None]:
    """Each Dask worker's address -> the name of its GPU, ``GPU-<uuid>`` or ``MIG-<uuid>`` (None for a worker
    without one; :func:`worker_gpu_id`)."""
    if client is None:
        return {}
    try:
        return dict(client.run(worker_gpu_id))
    except Exception:  # noqa: BLE001 - workers that cannot answer have no GPU to give the fit
        return {}


def visible_gpu_names() -> list[str]:
    """This machine's GPUs as ``CUDA_VISIBLE_DEVICES`` names them (its entries where set, else 0..n-1): what a
    campaign's ``--dask local --gpus G`` deals out in groups (rapids_attn.campaign.cluster)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [v.strip() for v in visible.split(",") if v.strip()]
    return [str(i) for i in range(cuda_device_count())]


def launching_on(tensor):
    """A context under which kernels launched by hand (Triton's, which launch on the current CUDA device) run on the
    GPU that holds ``tensor``: a layer of a model spread over GPUs (``model.device_map``) on a GPU other than the
    process's current one. Nothing (a null context) where the tensor is on the current GPU, or not on a GPU."""
    import torch

    if not tensor.is_cuda or tensor.device.index in (None, torch.cuda.current_device()):
        return contextlib.nullcontext()
    return torch.cuda.device(tensor.device)


def empty_device_cache() -> None:
    """Give PyTorch's cached GPU blocks back (a no-op without CUDA), e.g. after a worker drops its model."""
    with contextlib.suppress(ImportError, RuntimeError):
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def machine_description() -> dict:
    """The job process's host, Python, PyTorch and GPUs, for summary.json."""
    import platform

    info = {"host": platform.node(), "python": platform.python_version(), "cpu_count": os.cpu_count()}
    with contextlib.suppress(ImportError, RuntimeError):
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info
