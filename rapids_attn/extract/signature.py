"""The signature's schema: the names of what the pipeline keeps for every map, and what each one means.

Each map is described at full resolution by three vectors besides its area-resized image: the scalar stats
(:data:`STAT_NAMES`, the store's ``stats`` array and ``maps.parquet``'s columns), the head detectors
(:data:`DETECTOR_NAMES`, the ``detectors`` array) and the offset profile (:data:`PROFILE_OFFSETS`, the ``profile``
array). This module names them and defines them in words; :mod:`rapids_attn.extract.maps` computes them (the
capture's kernel and the plain references it is held to). It imports neither torch nor the kernel, so the
store, the explain stage and the tools read the schema without either.
"""

from __future__ import annotations

import numpy as np

#: Scalar signature of one map, each a mean over the map's query rows (Clark et al. 2019).
STAT_NAMES = (
    "entropy",  # -sum p log p of a row
    "entropy_norm",  # entropy / log(number of keys the row can see); 0 = one-hot, 1 = uniform; NaN at n = 1
    "first",  # mass on the first token ([CLS] / BOS)
    "sep",  # mass on separator / end tokens ([SEP] / EOS) after the first position
    "punct",  # mass on punctuation tokens
    "self",  # mass on the query's own position
    "prev",  # mass on the previous token (rows 1..n-1; NaN at n = 1, where no row has one)
    "next",  # mass on the next token (rows 0..n-2; NaN at n = 1)
    "distance",  # mean |i - j| in tokens
    "max",  # row maximum
)

#: The statistics every map has, whatever its length (the others are NaN where undefined: n = 1, no target). A map
#: with a NaN or inf weight on a real row has a NaN or inf entropy (a sum over every key of the row), so these say,
#: on the host, whether a batch's maps were finite (:func:`first_not_finite`), with no work on the device.
ALWAYS_DEFINED = ("entropy", "first", "self", "distance", "max")


def first_not_finite(stats: np.ndarray) -> tuple[int, np.ndarray] | None:
    """A batch's statistics [example, layer, head, stat] (as copied to the host) -> the first layer position whose
    maps are not finite, with the examples (batch positions) where; None when every map is finite."""
    cols = [STAT_NAMES.index(name) for name in ALWAYS_DEFINED]
    bad = ~np.isfinite(stats[..., cols]).all(-1)  # [example, layer, head]
    if not bad.any():
        return None
    pos = int(np.argmax(bad.any(axis=(0, 2))))
    return pos, np.flatnonzero(bad[:, pos].any(-1))


#: Head detectors of TransformerLens (``transformer_lens.head_detector``), computed per map from the token
#: ids. The first three are TransformerLens's own score, under its names: the attention mass on the
#: pattern's positions divided by the map's whole mass (``error_measure="mul"``, nothing excluded), so
#: rows without a target count as 0 and a head's score is the mean of the map scores. The ``_cond``
#: scores divide by the mass of the rows that have a target instead (TransformerLens's score divided by
#: the share of such rows): they say how a head attends where the pattern is possible, and are NaN where
#: no row has a target (an example without a repeated token).
DETECTOR_NAMES = (
    "previous_token_head",  # key i - 1
    "duplicate_token_head",  # earlier copies of the query's token
    "induction_head",  # the token after an earlier copy of the query's token
    "duplicate_token_cond",  # duplicate-token, over the rows that have an earlier copy
    "induction_cond",  # induction, over the rows that have an earlier copy with a successor
    "streaming",  # mass on the sink tokens and the recent window, over the rows that see beyond both
    "retrieval",  # induction mass at least RECENT_WINDOW tokens back, over the rows that have such a target
)

#: The long-context head classes' geometry (docs/stages.md, "Head classes for long contexts"). A streaming head
#: (Xiao et al. 2024, StreamingLLM and DuoAttention) attends to the first SINK_TOKENS tokens and the last
#: RECENT_WINDOW; its ``streaming`` score is the mass there, averaged over the rows that can see any token
#: outside both (NaN where no row can: a short input). A retrieval head (Wu et al. 2024) copies from far
#: back in the context: its ``retrieval`` score is the induction mass (the token after an earlier copy of
#: the query's token, the position a copying head reads) at distance >= RECENT_WINDOW, over the mass of the
#: rows that have such a target. An attention-sink head (Gu et al. 2025) is read from the ``first`` stat.
SINK_TOKENS = 4
RECENT_WINDOW = 64

#: Relative offsets j - i of the offset profile: mean attention from each query i to key i + o.
PROFILE_OFFSETS = tuple(range(-4, 5))
