"""The embedder interface and factory.

An embedder turns each map into a feature vector. Every embedder implements one method,
:meth:`Embedder.embed`, which receives all three things the pipeline keeps for a map (the
area-resized image, the full-resolution offset profile and the scalar stats) and returns an
:class:`Embedding`: the features, plus any extra per-map outputs it declares in ``outputs``
(name -> store dtype, each an array of :mod:`rapids_attn.store.schema`), e.g. the pattern CNN's
predicted type. Embedders that read only the image derive from :class:`ImageEmbedder` and implement
``__call__(images)``.

Where an embedder runs and at which precision is decided by :mod:`rapids_attn.devices`;
:func:`build_embedder` receives the result.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

import torch
import torch.nn.functional as F

from rapids_attn.errors import JobConfigError


class Embedding(NamedTuple):
    features: torch.Tensor  # [N, dim] float32, on the device of the images
    extras: dict[str, torch.Tensor]  # name -> [N], one per entry of Embedder.outputs


class Embedder(ABC):
    """Maps -> features. Subclasses set ``name`` and ``dim`` in ``__init__``."""

    name: str
    dim: int

    def __init__(self) -> None:
        #: extra per-map outputs (schema array name -> store dtype), e.g. pattern and pattern_prob
        self.outputs: dict[str, str] = {}
        #: root attributes the embedder records in the store (e.g. the pattern class names)
        self.store_attrs: dict = {}

    @abstractmethod
    def embed(self, images: torch.Tensor, profile: torch.Tensor, stats: torch.Tensor) -> Embedding:
        """images [N, S, S], profile [N, P], stats [N, K] -> :class:`Embedding`."""


class ImageEmbedder(Embedder):
    """An embedder that reads the image only: ``self(images)`` -> [N, dim] features."""

    @abstractmethod
    def __call__(self, images: torch.Tensor) -> torch.Tensor: ...

    def embed(self, images: torch.Tensor, profile: torch.Tensor, stats: torch.Tensor) -> Embedding:
        return Embedding(self(images), {})


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


def build_embedder(
    cfg, image_size: int, device: str = "cpu", precision: str = "float32", prepare: bool = True
) -> Embedder:
    """``cfg`` is the job's EmbedConfig; ``device`` and ``precision`` (``float32``, ``float16`` or
    ``int8``) come from the device plan. Raises JobConfigError for an unknown name or bad weights.
    ``prepare=False`` (preflight) loads and checks without the one-off int8 calibration."""
    if cfg.name == "pooled":
        return PooledEmbedder(image_size, cfg.pooled_size)
    if cfg.name == "pattern-cnn":
        from rapids_attn.embed.pattern import PatternCNNEmbedder

        return PatternCNNEmbedder(device, cfg.batch_size, precision)
    from rapids_attn.embed.backbone import BackboneEmbedder

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
