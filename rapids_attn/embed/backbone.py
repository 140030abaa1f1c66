"""torchvision backbones as map embedders: the penultimate layer of a classification network.

An attention map is a one-channel image with values in [0, 1]. Each map is scaled by its maximum
(so faint broad maps and sharp ones use the same range), resized to ``input_size``, repeated to
three channels and normalised with ImageNet's statistics. Runs batched on the worker's device, in
half precision on a GPU.

``precision: int8`` (CPU only) quantizes the network after training (static, per-channel weights,
oneDNN kernels), calibrated on a fixed seeded set of synthetic attention maps
(:mod:`rapids_attn.patterns.generator`), so every worker builds the same quantized network and
features from different shards are comparable. On the 2-core CPU of docs/benchmarks.md it runs
ResNet-50 at 224 2.4x faster than float32, with features at cosine > 0.999 to float32's.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from rapids_attn.embed.base import ImageEmbedder
from rapids_attn.errors import JobConfigError

log = logging.getLogger(__name__)

_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)


def _known_models() -> list[str]:
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def imagenet_weights(name: str):
    """torchvision's default ImageNet weights enum for ``name``."""
    import torchvision

    return torchvision.models.get_model_weights(name).DEFAULT


def imagenet_cache_path(name: str) -> Path:
    """Where torchvision keeps (or would download) the ImageNet checkpoint of ``name``."""
    url = imagenet_weights(name).url
    return Path(torch.hub.get_dir()) / "checkpoints" / url.rsplit("/", 1)[-1]


def ensure_imagenet_weights(name: str) -> Path:
    """Download into torchvision's cache if missing; offline, fail with how to pass a file instead."""
    path = imagenet_cache_path(name)
    if path.is_file():
        return path
    weights = imagenet_weights(name)
    try:
        weights.get_state_dict(progress=False)
    except Exception as e:  # noqa: BLE001 - URLError, socket errors, HTTP errors: all mean "not reachable"
        raise JobConfigError(
            f"embed.weights: ImageNet weights for {name} are not in torchvision's cache ({path}) and could not be "
            f"downloaded ({type(e).__name__}); fetch {weights.url} on a machine with a network and set "
            f"embed.weights: /path/to/{path.name}, or copy it to {path}, or use embed.weights: random"
        ) from None
    return path


def _build_network(name: str, weights: str):
    import torchvision

    if name not in _known_models():
        import difflib

        from rapids_attn.embed.registry import EMBEDDERS, embedder_names
        from rapids_attn.job import clip

        near = difflib.get_close_matches(name, [*EMBEDDERS, *_known_models()], n=1) if len(name) <= 120 else []
        hint = f"did you mean '{near[0]}'? " if near else ""
        raise JobConfigError(f"embed.name: unknown embedder '{clip(name)}'; {hint}use {embedder_names()}")
    if weights == "random":
        with torch.random.fork_rng(devices=[]):  # a seeded random network: a reproducible control
            torch.manual_seed(0)
            return torchvision.models.get_model(name, weights=None)
    net = torchvision.models.get_model(name, weights=None)
    path = ensure_imagenet_weights(name) if weights == "imagenet" else Path(weights).expanduser()
    if not path.is_file():
        raise JobConfigError(f"embed.weights: no such file: {path}; give a state-dict file, imagenet or random")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
            state = state["state_dict"]
        net.load_state_dict(state)
    except Exception as e:  # noqa: BLE001 - any load failure is the file's fault: one line
        raise JobConfigError(
            f"embed.weights: {path} is not a {name} state dict loadable with weights_only=True ({str(e).splitlines()[0][:160]})"
        ) from None
    return net


def _strip_head(net) -> tuple[torch.nn.Module, int]:
    """Replace the classifier with identity; return the network and its feature width."""
    if hasattr(net, "fc") and isinstance(net.fc, torch.nn.Linear):
        dim = net.fc.in_features
        net.fc = torch.nn.Identity()
        return net, dim
    if hasattr(net, "classifier"):
        head = net.classifier
        linears = [
            m for m in (head.modules() if isinstance(head, torch.nn.Module) else []) if isinstance(m, torch.nn.Linear)
        ]
        if linears:
            dim = linears[0].in_features
            net.classifier = torch.nn.Identity()
            return net, dim
    if hasattr(net, "heads"):
        linears = [m for m in net.heads.modules() if isinstance(m, torch.nn.Linear)]
        if linears:
            dim = linears[0].in_features
            net.heads = torch.nn.Identity()
            return net, dim
    raise JobConfigError(f"embed.name: cannot find the classifier head of {type(net).__name__}; use a resnet")


def _fold_batch_norms(net: torch.nn.Module) -> torch.nn.Module:
    """Fold each eval-mode batch norm into the convolution before it (exact up to rounding), or
    return ``net`` unchanged when torch.fx cannot trace it (models with data-dependent control flow)."""
    from torch.fx.experimental.optimization import fuse

    try:
        return fuse(net)
    except Exception as e:  # noqa: BLE001 - symbolic tracing is not possible for every torchvision model
        log.info("batch norms not folded for %s: %s", type(net).__name__, str(e).splitlines()[0][:120])
        return net


#: synthetic maps the int8 network is calibrated on (seed, count): fixed, so every worker agrees
CALIBRATION = (20240, 16)


def quantize_int8(net: torch.nn.Module, calibration: torch.Tensor, chunk: int = 8) -> torch.nn.Module:
    """Post-training static int8 quantization of ``net`` (eval mode, on the CPU) with oneDNN kernels:
    per-channel symmetric int8 weights, 7-bit activations (0..127: CPUs without VNNI saturate the
    int16 sums of full-range uint8 products), observed over ``calibration`` inputs."""
    try:
        from torch.ao.quantization import QConfig, get_default_qconfig_mapping
        from torch.ao.quantization.observer import HistogramObserver, PerChannelMinMaxObserver
        from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx
    except ImportError:
        raise JobConfigError(
            f"embed.precision: int8 needs torch.ao.quantization, which PyTorch {torch.__version__} does not have; "
            "use precision: float32"
        ) from None
    if "onednn" not in torch.backends.quantized.supported_engines:
        raise JobConfigError(
            f"embed.precision: int8 needs PyTorch's oneDNN quantized engine, which this build lacks "
            f"(engines: {', '.join(torch.backends.quantized.supported_engines)}); use precision: float32"
        )
    qconfig = QConfig(
        activation=HistogramObserver.with_args(dtype=torch.quint8, quant_min=0, quant_max=127),
        weight=PerChannelMinMaxObserver.with_args(dtype=torch.qint8, qscheme=torch.per_channel_symmetric),
    )
    mapping = get_default_qconfig_mapping("onednn").set_global(qconfig)
    with onednn_engine(), _quiet_quantization():
        prepared = prepare_fx(net.eval(), mapping, example_inputs=(calibration[:1],))
        with torch.inference_mode():
            for part in calibration.split(chunk):
                prepared(part)
        return convert_fx(prepared)


@contextlib.contextmanager
def onednn_engine():
    """PyTorch's quantized engine is one process-wide setting: use oneDNN's kernels (the fastest
    here) while quantizing and running the int8 network, and put the caller's engine back after."""
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = "onednn"
    try:
        yield
    finally:
        torch.backends.quantized.engine = before


@contextlib.contextmanager
def _quiet_quantization():
    """torch.ao.quantization and quantized tensors carry deprecation notices (their successor,
    torchao's PT2E flow, does not run on this PyTorch's exported ResNets): known, not the user's
    concern, so they are silenced here only, not for the process."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.ao\.quantization is deprecated.*")
        warnings.filterwarnings("ignore", message=r".*quantized tensor creation functions.*deprecated.*")
        warnings.filterwarnings("ignore", message=r".*reduce_range of false.*")  # the default's; ours is 7-bit
        yield


class BackboneEmbedder(ImageEmbedder):
    def __init__(
        self,
        name: str,
        weights: str,
        input_size: int,
        batch_size: int,
        device: str = "cpu",
        precision: str = "float32",
        image_size: int = 32,
        prepare: bool = True,
    ):
        """``precision``: float32, float16 or int8, as the device plan resolved it (int8 only ever
        on the CPU: :mod:`rapids_attn.devices` refuses it on a GPU before any worker starts).
        ``image_size`` is the side of the maps it will be given (int8 calibrates at it);
        ``prepare=False`` skips the int8 calibration (preflight only checks that the network loads)."""
        super().__init__()
        net, dim = _strip_head(_build_network(name, weights))
        self.name = name
        self.dim = dim
        self.input_size = input_size
        self.batch_size = batch_size
        self.device = torch.device(device)
        self.int8 = precision == "int8"
        self.dtype = torch.float16 if precision == "float16" else torch.float32
        net = net.eval()
        if not self.int8:  # (int8 folds batch norms itself while quantizing)
            net = _fold_batch_norms(net)
        # channels-last is oneDNN's and cuDNN's fast layout for convolutions (`python -m
        # benchmarks.cnn`: ResNet-50 at 224 on 2 CPU cores, 14.3 -> 17.2 maps/s; with the
        # batch norms folded, 18.4)
        self.net = net.to(self.device, self.dtype, memory_format=torch.channels_last)
        # maps per network call, bounded in pixels: on a CPU, batches of ResNet-50 at 224 past ~8
        # get slower (cache: 16.4 maps/s at 8, 14.5 at 16), on a GPU large batches pay; a small
        # input_size allows many per call
        budget = (256 if self.device.type == "cuda" else 8) * 224 * 224
        self.chunk = max(1, min(batch_size, budget // (input_size * input_size)))
        self.mean = torch.tensor(_MEAN, device=self.device, dtype=self.dtype).view(1, 3, 1, 1)
        self.std = torch.tensor(_STD, device=self.device, dtype=self.dtype).view(1, 3, 1, 1)
        if self.int8 and prepare:
            from rapids_attn.patterns.generator import generate_features

            seed, count = CALIBRATION
            maps = generate_features(seed, count, image_size=image_size)[0]
            self.net = quantize_int8(self.net, self._prepare(maps), self.chunk)

    def _prepare(self, images: torch.Tensor) -> torch.Tensor:
        """[n, S, S] maps -> the network's [n, 3, input_size, input_size] input (channels-last)."""
        x = images.to(self.device, torch.float32)
        x = x / x.amax(dim=(-2, -1), keepdim=True).clamp_min(1e-12)
        x = F.interpolate(x.unsqueeze(1), size=self.input_size, mode="bilinear", align_corners=False)
        x = ((x.expand(-1, 3, -1, -1).to(self.dtype)) - self.mean) / self.std
        return x.contiguous(memory_format=torch.channels_last)

    @torch.inference_mode()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        # images: [N, S, S] -> [N, dim]
        # flatten: some heads (ConvNeXt's) hold the flatten that turns [N, C, 1, 1] into [N, C]
        with contextlib.ExitStack() as scope:
            if self.int8:
                scope.enter_context(onednn_engine())
                scope.enter_context(_quiet_quantization())
            out = [
                self.net(self._prepare(images[start : start + self.chunk])).float().flatten(1)
                for start in range(0, images.shape[0], self.chunk)
            ]
        return torch.cat(out) if out else torch.zeros(0, self.dim, device=self.device)


def from_config(cfg, image_size: int, *, device: str, precision: str, prepare: bool) -> BackboneEmbedder:
    """The :class:`~rapids_attn.embed.base.EmbedderFactory` of every name the registry does not list: ``embed.name``
    is a torchvision classification model (an unknown one is refused with the names torchvision has)."""
    return BackboneEmbedder(
        cfg.name,
        cfg.weights,
        cfg.input_size,
        cfg.batch_size,
        device,
        precision=precision,
        image_size=image_size,
        prepare=prepare,
    )
