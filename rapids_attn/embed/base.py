"""Embedder interface and factory."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rapids_attn.errors import JobConfigError


class Embedder:
    """Callable on [N, S, S] float maps (any device); returns [N, dim] float32 on the same device."""

    dim: int
    name: str

    def __call__(self, images: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError


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


def build_embedder(cfg, image_size: int, device: str = "cpu") -> Embedder:
    """``cfg`` is the job's EmbedConfig. Raises JobConfigError for an unknown name or bad weights."""
    if cfg.name == "pooled":
        return PooledEmbedder(image_size, cfg.pooled_size)
    from rapids_attn.embed.backbone import BackboneEmbedder

    return BackboneEmbedder(cfg.name, cfg.weights, cfg.input_size, cfg.batch_size, device)
