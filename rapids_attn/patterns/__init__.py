"""Attention-pattern CNN: a generator of labelled attention maps, the network trained on them, and
its training and evaluation commands (docs/pattern-cnn.md).

- :mod:`rapids_attn.patterns.generator`: seeded, labelled, row-stochastic maps (``PATTERN_TYPES``)
  and :func:`featurize`, which turns them into the pipeline's (image, profile, stats) triples.
- :mod:`rapids_attn.patterns.cnn`: ``PatternCNN`` and :func:`load_pattern_cnn` (shipped weights).
- ``python -m rapids_attn.patterns.train``: trains the shipped weights.
- ``python -m rapids_attn.patterns.evaluate``: the numbers and the figure of docs/pattern-cnn.md.

The embedder the pipeline uses is :class:`rapids_attn.embed.pattern.PatternEmbedder`.
"""

from rapids_attn.patterns.generator import PATTERN_TYPES, MapSample, featurize, generate

__all__ = ["PATTERN_TYPES", "MapSample", "featurize", "generate"]
