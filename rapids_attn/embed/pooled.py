"""The honest baseline (``embed.name: pooled``): the area-pooled map, flattened. No learned weights at all."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rapids_attn.embed.base import ImageEmbedder
from rapids_attn.errors import JobConfigError


class PooledEmbedder(ImageEmbedder):
    """The area-pooled map, flattened: dim = pooled_size ** 2. No learned weights at all."""

    def __init__(self, image_size: int, pooled_size: int):
        super().__init__()
        if pooled_size > image_size:
            raise JobConfigError(
                f"embed.pooled_size: {pooled_size} is larger than extract.image_size {image_size}; "
                f"set it to {image_size} or less"
            )
        self.name = "pooled"
        self.pooled_size = pooled_size
        self.dim = pooled_size * pooled_size

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        # images: [N, S, S] -> [N, P*P]
        pooled = F.adaptive_avg_pool2d(images.float().unsqueeze(1), self.pooled_size)
        return pooled.flatten(1)


def from_config(cfg, image_size: int, *, device: str, precision: str, prepare: bool) -> PooledEmbedder:
    """The :class:`~rapids_attn.embed.base.EmbedderFactory` of ``pooled``: reads ``embed.pooled_size``; runs
    wherever its maps are, at float32."""
    return PooledEmbedder(image_size, cfg.pooled_size)
