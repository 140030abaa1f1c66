"""torchvision backbones as map embedders: the penultimate layer of a classification network.

An attention map is a one-channel image with values in [0, 1]. Each map is scaled by its maximum
(so faint broad maps and sharp ones use the same range), resized to ``input_size``, repeated to
three channels and normalised with ImageNet's statistics. Runs batched on the worker's device, in
half precision on a GPU.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.nn.functional as F

from rapids_attn.embed.base import Embedder
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
    except Exception as e:  # URLError, socket errors, HTTP errors: all mean "not reachable"
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

        near = difflib.get_close_matches(name, ["pooled", *_known_models()], n=1)
        hint = f"did you mean '{near[0]}'?" if near else "use pooled, resnet18 or resnet50"
        raise JobConfigError(f"embed.name: unknown embedder '{name}'; {hint}")
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
    except Exception as e:
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
        linears = [m for m in (head.modules() if isinstance(head, torch.nn.Module) else []) if isinstance(m, torch.nn.Linear)]
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


class BackboneEmbedder(Embedder):
    def __init__(self, name: str, weights: str, input_size: int, batch_size: int, device: str = "cpu"):
        net, dim = _strip_head(_build_network(name, weights))
        self.name = name
        self.dim = dim
        self.input_size = input_size
        self.batch_size = batch_size
        self.device = torch.device(device)
        self.dtype = torch.float16 if self.device.type == "cuda" else torch.float32
        # channels-last is oneDNN's and cuDNN's fast layout for convolutions (1.13x for ResNet-50
        # at 224 on the 2-core CPU of docs/benchmarks.md)
        self.net = net.eval().to(self.device, self.dtype, memory_format=torch.channels_last)
        # maps per network call, bounded in pixels: on a CPU, batches of ResNet-50 at 224 past ~16
        # get slower (cache), on a GPU large batches pay; a small input_size allows many per call
        budget = (256 if self.device.type == "cuda" else 16) * 224 * 224
        self.chunk = max(1, min(batch_size, budget // (input_size * input_size)))
        self.mean = torch.tensor(_MEAN, device=self.device, dtype=self.dtype).view(1, 3, 1, 1)
        self.std = torch.tensor(_STD, device=self.device, dtype=self.dtype).view(1, 3, 1, 1)

    @torch.inference_mode()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        # images: [N, S, S] -> [N, dim]
        out = []
        for start in range(0, images.shape[0], self.chunk):
            x = images[start:start + self.chunk].to(self.device, torch.float32)
            x = x / x.amax(dim=(-2, -1), keepdim=True).clamp_min(1e-12)
            x = F.interpolate(x.unsqueeze(1), size=self.input_size, mode="bilinear", align_corners=False)
            x = ((x.expand(-1, 3, -1, -1).to(self.dtype)) - self.mean) / self.std
            out.append(self.net(x.contiguous(memory_format=torch.channels_last)).float())
        return torch.cat(out) if out else torch.zeros(0, self.dim, device=self.device)
