"""Map embedders: turn [N, S, S] attention images into [N, dim] feature vectors.

``pooled`` is the honest baseline (the area-pooled map, flattened). Any torchvision classification
model (``resnet18``, ``resnet50``, ...) gives its penultimate layer. Use :func:`build_embedder`.
"""

from rapids_attn.embed.base import Embedder, build_embedder

__all__ = ["Embedder", "build_embedder"]
