"""Training and evaluation of the attention-pattern CNN (docs/pattern-cnn.md), run from the repository root.

- ``python -m tools.pattern_cnn.train``: trains the weights shipped in ``rapids_attn/patterns/weights``.
- ``python -m tools.pattern_cnn.evaluate``: the numbers and the figure of docs/pattern-cnn.md.
- ``python -m tools.pattern_cnn.real_maps RUN_DIR``: real maps of a run by predicted type.

They live beside the package, not in it: the package needs only the network, its weights and the
generator at run time, and these write into the checkout (docs/img, the weights folder).
"""
