"""Attention-pattern CNN: a generator of labelled attention maps and the network trained on them
(docs/pattern-cnn.md).

- :mod:`rapids_attn.patterns.generator`: seeded, labelled, row-stochastic maps (``PATTERN_TYPES``)
  and :func:`featurize`, which turns them into the pipeline's (image, profile, stats) triples.
- :mod:`rapids_attn.patterns.cnn`: ``PatternCNN`` and :func:`load_pattern_cnn` (shipped weights).
- Training and evaluation are not part of the package: ``python -m tools.pattern_cnn.train`` and
  ``python -m tools.pattern_cnn.evaluate``, from the repository root.

The embedder the pipeline uses is :class:`rapids_attn.embed.pattern.PatternEmbedder`.
"""

from rapids_attn.patterns.generator import PATTERN_TYPES, MapSample, featurize, generate

__all__ = ["PATTERN_TYPES", "MapSample", "featurize", "generate"]
