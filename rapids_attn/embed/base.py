"""Embedder interface and factory."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from rapids_attn.errors import JobConfigError


class Embedder:
    """Callable on [N, S, S] float maps (any device); returns [N, dim] float32 on the same device.

    ``embed`` is what the pipeline calls: it also receives each map's full-resolution offset
    profile [N, P] and stats [N, K], and returns extra per-map outputs named in ``outputs``
    (name -> store dtype), e.g. a predicted pattern type and its probability.
    """

    dim: int
    name: str
    outputs: dict[str, str] = {}
    #: attributes recorded in the store (e.g. the class names of a predicted pattern).
    store_attrs: dict = {}

    def __call__(self, images: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def embed(self, images: torch.Tensor, profile: torch.Tensor, stats: torch.Tensor):
        return self(images), {}


class PooledEmbedder(Embedder):
    """The area-pooled map, flattened: dim = pooled_size ** 2. No learned weights at all."""

    def __init__(self, image_size: int, pooled_size: int):
        if pooled_size > image_size:
            raise JobConfigError(
                f"embed.pooled_size: {pooled_size} is larger than extract.image_size {image_size}; set it to {image_size} or less"
            )
        self.name = "pooled"
        self.pooled_size = pooled_size
        self.dim = pooled_size * pooled_size

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        # images: [N, S, S] -> [N, P*P]
        pooled = F.adaptive_avg_pool2d(images.float().unsqueeze(1), self.pooled_size)
        return pooled.flatten(1)


class PatternCNNEmbedder(Embedder):
    """The attention-pattern CNN shipped with the package (``embed.name: pattern-cnn``): its
    penultimate layer as features, plus the predicted pattern type and its probability per map."""

    def __init__(self, device: str = "cpu", batch_size: int = 4096, precision: str = "auto"):
        import hashlib

        from rapids_attn.embed.pattern import PatternEmbedder
        from rapids_attn.patterns.cnn import WEIGHTS_DIR

        try:
            self.net = PatternEmbedder(device=device, batch_size=batch_size,
                                       dtype=torch.float32 if precision == "float32" else None)
        except FileNotFoundError as e:
            raise JobConfigError(
                f"embed.name: pattern-cnn weights are missing ({e}); reinstall rapids_attn or retrain them with "
                "python -m rapids_attn.patterns.train"
            ) from None
        self.name = "pattern-cnn"
        self.dim = self.net.dim
        self.outputs = {"pattern": "int8", "pattern_prob": "float16"}
        weights = Path(WEIGHTS_DIR) / "pattern_cnn.safetensors"
        # the weights' hash is part of the store's layout: new weights make a different store
        self.store_attrs = {"pattern_classes": list(self.net.classes),
                            "pattern_cnn_sha256": hashlib.sha256(weights.read_bytes()).hexdigest()[:16]}

    def embed(self, images, profile, stats):
        feats, pattern, prob = self.net(images, profile, stats)
        return feats, {"pattern": pattern, "pattern_prob": prob}


def build_embedder(cfg, image_size: int, device: str = "cpu", prepare: bool = True) -> Embedder:
    """``cfg`` is the job's EmbedConfig. Raises JobConfigError for an unknown name or bad weights.
    ``prepare=False`` (preflight) loads and checks without the one-off int8 calibration."""
    if cfg.name == "pooled":
        return PooledEmbedder(image_size, cfg.pooled_size)
    if cfg.name == "pattern-cnn":
        return PatternCNNEmbedder(device, cfg.batch_size, cfg.precision)
    from rapids_attn.embed.backbone import BackboneEmbedder

    return BackboneEmbedder(cfg.name, cfg.weights, cfg.input_size, cfg.batch_size, device,
                            precision=cfg.precision, image_size=image_size, prepare=prepare)
