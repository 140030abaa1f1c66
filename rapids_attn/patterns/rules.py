"""Pattern labels that never contradict the statistics (docs/pattern-cnn.md, "Abstaining: `other`").

The CNN scores ten types; a map keeps the type it scores highest only if

(a) the type's **defining rule** on the full-resolution statistics holds (``RULES`` below), and
(b) the type's **calibrated probability** (softmax of logits / temperature, the temperature fitted on
    held-out generated maps and stored in ``pattern_cnn.json``) is at least ``MIN_PROB``;

otherwise the map is labelled ``other`` (``OTHER``, index 10 of ``LABELS``).

The rules read the stats (``STAT_NAMES``; row means at full resolution) and the offset profile.
The embedder does not get the token-role shares (how many [SEP] / punctuation tokens a map has),
so the sep and punct thresholds are absolute masses, not multiples of a uniform row's share. They
are set well above what a uniform row gives on the inputs this pipeline sees (a 150-token SQuAD
input with 2-3 separators: [SEP] share 0.013-0.02; punctuation 8-15% of the tokens) and below the
generator's pure-and-mixed maps of that type (1st percentile 0.39 for sep, 0.46 for punct). On
inputs shorter than about 12 tokens a uniform row can reach them.

==========  ==================================================================================
type        defining rule (all thresholds inclusive)
==========  ==================================================================================
self        ``self >= 0.25`` and self >= prev and self >= next
prev        ``prev >= 0.25`` and prev >= self and prev >= next
next        ``next >= 0.25`` and next >= self and next >= prev
first       ``first >= 0.30``
sep         ``sep >= 0.25``
punct       ``punct >= 0.30``
band        near-diagonal mass (sum of the profile, offsets -4..4) ``>= 0.30``, spread over several
            offsets: the largest single offset, any of the nine, is ``< 0.60`` of the near-diagonal
            mass (so a map on one offset other than -1/0/+1, "two back" say, is not band)
broad       ``entropy_norm >= 0.65`` and no stripe (none of the six rules above holds, no shared columns)
block       ``entropy_norm >= 0.45`` and no stripe
hetero      ``max >= 0.25`` (rows put much on a few keys), no stripe, near-diagonal mass ``< 0.30``
==========  ==================================================================================

"No stripe" means: a map whose statistics say "[CLS] column", "[SEP] column", "punctuation
columns" or "one offset" is never called broad, block or hetero, and neither is a map whose image
says "a few shared columns": ``shared_columns`` (the share of the mass, the first token's taken
out, in the two heaviest of 16 column bands of the image) ``< 0.50``. That tells "every row reads
the same few keys" (a stripe on tokens that have no role) from hetero's "each row its own keys",
which no statistic can: the stats are row means. 0.50 is above the 99.5th percentile of the
training generator's hetero, broad and block maps (0.47, 0.49, 0.44 on 4,000 maps of stream 3000).

Version 2 (``RULES_VERSION``): the band rule looks at every offset (version 1: self/prev/next only),
and the shared-columns clause. ``rule_table`` without ``images`` leaves that clause out (a store
without thumbnails).
"""

from __future__ import annotations

import torch

from rapids_attn.extract.maps import area_resize
from rapids_attn.extract.signature import STAT_NAMES
from rapids_attn.patterns.generator import PATTERN_TYPES

OTHER = "other"
#: The labels a map can get: the CNN's ten types, then ``other`` (the store's ``pattern_classes``).
LABELS = (*PATTERN_TYPES, OTHER)
OTHER_INDEX = len(PATTERN_TYPES)

#: Calibrated probability below which the CNN's type is not trusted.
MIN_PROB = 0.5
#: Defining-statistic thresholds (see the module docstring).
POSITIONAL_MIN = 0.25  # self / prev / next
FIRST_MIN = 0.30
SEP_MIN = 0.25
PUNCT_MIN = 0.30
NEAR_BAND_MIN = 0.30  # profile sum for band; hetero must stay below it
BAND_TOP_SHARE_MAX = 0.60  # the largest single offset's share (any of -4..4) of the band's near-diagonal mass
BROAD_ENTROPY_MIN = 0.65
BLOCK_ENTROPY_MIN = 0.45
HETERO_MAX_MIN = 0.25
#: Shared columns: the share of a map's mass (the first token's taken out) in its two heaviest of
#: ``COLUMN_BANDS`` column bands, above which broad, block and hetero do not hold.
COLUMN_BANDS = 16
SHARED_COLUMNS_MAX = 0.50

#: For the docs and the store attrs: the version of the rules above.
RULES_VERSION = 2

_S = {n: i for i, n in enumerate(STAT_NAMES)}


def shared_columns(images: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """images [N, S, S] (the area-resized maps, any scale, any S), first [N] (the ``first`` stat) ->
    [N]: the share of each map's mass in its two heaviest of ``COLUMN_BANDS`` column bands, after
    taking the first token's mass out of the first band. High when every row reads the same few keys
    (a stripe on tokens that are no [CLS], [SEP] or punctuation); low when each row has its own."""
    c = area_resize(images.float(), COLUMN_BANDS).sum(1)  # [N, 16]: mass per band of keys
    c = c / c.sum(1, keepdim=True).clamp_min(1e-12)
    c[:, 0] = (c[:, 0] - torch.nan_to_num(first.float(), nan=0.0)).clamp_min(0.0)
    return c.topk(min(2, c.shape[1]), dim=1).values.sum(1)


def rule_table(stats: torch.Tensor, profile: torch.Tensor, images: torch.Tensor | None = None) -> torch.Tensor:
    """stats [N, 10], profile [N, 9], images [N, S, S] -> [N, 10] bool: does the map satisfy each type's
    defining rule (columns in the order of ``PATTERN_TYPES``). NaN statistics (one-token maps) satisfy
    nothing. Without ``images`` the shared-columns clause is not checked (a store without thumbnails)."""
    s = stats.float()
    col = {name: s[:, i] for name, i in _S.items()}
    prof = profile.float()
    near = prof.sum(1)
    pos = torch.stack([col["self"], col["prev"], col["next"]], 1)
    top = pos.max(1).values
    positional = {t: (col[t] >= POSITIONAL_MIN) & (col[t] >= top) for t in ("self", "prev", "next")}
    first = col["first"] >= FIRST_MIN
    sep = col["sep"] >= SEP_MIN
    punct = col["punct"] >= PUNCT_MIN
    no_pos = top < POSITIONAL_MIN
    no_stripe = no_pos & ~first & ~sep & ~punct
    if images is not None:
        no_stripe = no_stripe & (shared_columns(images, col["first"]) < SHARED_COLUMNS_MAX)
    ent = col["entropy_norm"]
    rules = {
        **positional,
        "first": first,
        "sep": sep,
        "punct": punct,
        "band": (near >= NEAR_BAND_MIN) & (prof.max(1).values < BAND_TOP_SHARE_MAX * near),
        "broad": (ent >= BROAD_ENTROPY_MIN) & no_stripe,
        "block": (ent >= BLOCK_ENTROPY_MIN) & no_stripe,
        "hetero": (col["max"] >= HETERO_MAX_MIN) & no_stripe & (near < NEAR_BAND_MIN),
    }
    return torch.stack([rules[t] for t in PATTERN_TYPES], 1)


def agrees(
    pattern: torch.Tensor, stats: torch.Tensor, profile: torch.Tensor, images: torch.Tensor | None = None
) -> torch.Tensor:
    """[N] bool: does each map's type (index into ``LABELS``) agree with its defining rule?
    ``other`` always agrees (it claims nothing)."""
    table = rule_table(stats, profile, images)
    named = pattern < OTHER_INDEX
    idx = pattern.clamp(max=OTHER_INDEX - 1).long()
    ok = table.gather(1, idx[:, None])[:, 0]
    return ok | ~named


def label(
    logits: torch.Tensor,
    stats: torch.Tensor,
    profile: torch.Tensor,
    temperature: float = 1.0,
    images: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [N, 10] -> (pattern [N] int64 index into ``LABELS``, prob [N] float32).

    ``prob`` is the calibrated probability of the CNN's top type, also for maps labelled ``other``
    (where it says how sure the CNN was of the type it was overruled on)."""
    prob = torch.softmax(logits.float() / temperature, dim=1)
    top, idx = prob.max(dim=1)
    keep = (top >= MIN_PROB) & rule_table(stats, profile, images).gather(1, idx[:, None])[:, 0]
    return torch.where(keep, idx, torch.full_like(idx, OTHER_INDEX)), top
