"""Map embedders: turn each attention map into a feature vector.

``pattern-cnn`` (the default) is the attention-pattern CNN shipped with the package; ``pooled`` is
the honest baseline (the area-pooled map, flattened); any torchvision classification model
(``resnet18``, ``resnet50``, ...) gives its penultimate layer. Use :func:`build_embedder`.

The interface is :mod:`rapids_attn.embed.base`, the names are registered in :mod:`rapids_attn.embed.registry`;
neither imports an implementation.
"""

from rapids_attn.embed.base import Embedder, EmbedderFactory, Embedding, ImageEmbedder
from rapids_attn.embed.registry import EMBEDDERS, EmbedderSpec, build_embedder, embedder_spec, register

__all__ = [
    "EMBEDDERS",
    "Embedder",
    "EmbedderFactory",
    "EmbedderSpec",
    "Embedding",
    "ImageEmbedder",
    "build_embedder",
    "embedder_spec",
    "register",
]
