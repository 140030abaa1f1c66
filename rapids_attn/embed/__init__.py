"""Map embedders: turn each attention map into a feature vector.

``pattern-cnn`` (the default) is the attention-pattern CNN shipped with the package; ``pooled`` is
the honest baseline (the area-pooled map, flattened); any torchvision classification model
(``resnet18``, ``resnet50``, ...) gives its penultimate layer. Use :func:`build_embedder`.
"""

from rapids_attn.embed.base import Embedder, Embedding, ImageEmbedder, build_embedder

__all__ = ["Embedder", "Embedding", "ImageEmbedder", "build_embedder"]
