"""The embedder interface: what every embedder is, and what builds one.

An embedder turns each map into a feature vector. Every embedder implements one method,
:meth:`Embedder.embed`, which receives all three things the pipeline keeps for a map (the
area-resized image, the full-resolution offset profile and the scalar stats) and returns an
:class:`Embedding`: the features, plus any extra per-map outputs it declares in ``outputs``
(name -> store dtype, each an array of :mod:`rapids_attn.store.schema`), e.g. the pattern CNN's
predicted type. Embedders that read only the image derive from :class:`ImageEmbedder` and implement
``__call__(images)``.

Each embedder module also has an :class:`EmbedderFactory` (by convention ``from_config``), which builds
it from the job's ``embed`` section; :mod:`rapids_attn.embed.registry` maps each ``embed.name`` to one.
This module names no implementation and imports none (docs/architecture.md, "Adding an embedder").

Where an embedder runs and at which precision is decided by :mod:`rapids_attn.devices`; the factory
receives the result and decides nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:  # the interface itself needs no torch: the registry and the job schema import it cheaply
    import torch

    from rapids_attn.job import EmbedConfig


class Embedding(NamedTuple):
    features: torch.Tensor  # [N, dim] float32, on the device of the images
    extras: dict[str, torch.Tensor]  # name -> [N], one per entry of Embedder.outputs


class Embedder(ABC):
    """Maps -> features. Subclasses set ``name`` (the ``embed.name`` that built it) and ``dim`` (the
    feature size) in ``__init__``, after ``super().__init__()``; they may fill ``outputs`` and
    ``store_attrs``. The store layout reads ``dim``, ``outputs`` and ``store_attrs`` once in preflight,
    from an embedder built there with ``prepare=False``, so they must not depend on the device."""

    name: str
    dim: int

    def __init__(self) -> None:
        #: extra per-map outputs (schema array name -> store dtype), e.g. pattern and pattern_prob
        self.outputs: dict[str, str] = {}
        #: root attributes the embedder records in the store (e.g. the pattern class names)
        self.store_attrs: dict = {}

    @abstractmethod
    def embed(self, images: torch.Tensor, profile: torch.Tensor, stats: torch.Tensor) -> Embedding:
        """images [N, S, S], profile [N, P], stats [N, K] -> :class:`Embedding`: ``features`` [N, dim]
        float32 on the device of ``images``, and one [N] tensor per entry of ``outputs``."""


class ImageEmbedder(Embedder):
    """An embedder that reads the image only: ``self(images)`` -> [N, dim] features."""

    @abstractmethod
    def __call__(self, images: torch.Tensor) -> torch.Tensor: ...

    def embed(self, images: torch.Tensor, profile: torch.Tensor, stats: torch.Tensor) -> Embedding:
        return Embedding(self(images), {})


class EmbedderFactory(Protocol):
    """Builds an embedder from the job's ``embed`` section (``cfg``) and the side of the maps it will be given
    (``image_size``, ``extract.image_size``). ``device`` and ``precision`` (``float32``, ``float16`` or ``int8``)
    come from the device plan. ``prepare=False`` (preflight) loads and checks without one-off work such as the
    int8 calibration. Raises :class:`~rapids_attn.errors.JobConfigError` for settings it cannot honour."""

    def __call__(
        self, cfg: EmbedConfig, image_size: int, *, device: str, precision: str, prepare: bool
    ) -> Embedder: ...
