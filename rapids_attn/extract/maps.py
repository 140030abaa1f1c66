"""Per-map reductions: crop to the real tokens, scalar signature at full resolution, area-resize.

Every map is cropped to ``[:n, :n]`` (n = the example's real token count, right padding) before
anything else, so padding never enters a map, its image or its stats. The stats are computed on
the full-resolution crop because area-resizing erases one-token structure: with n = 200 and S = 32
a previous-token head and a self head are the same picture (see docs/architecture.md).
"""

from __future__ import annotations

import functools
import unicodedata
from dataclasses import dataclass

import torch

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
)


def repeat_masks(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The duplicate-token and induction patterns of one example's token ids [n] (TransformerLens).

    dup[i, j] = 1 where j < i and ids[j] == ids[i]; induction[i, j] = 1 where j <= i and
    ids[j - 1] == ids[i] with j - 1 < i (the token after an earlier occurrence of the current one).
    """
    same = ids[:, None] == ids[None, :]
    dup = torch.tril(same, diagonal=-1)
    ind = torch.zeros_like(dup)
    ind[:, 1:] = dup[:, :-1]
    return dup, torch.tril(ind)


def previous_token_pattern(n: int, device=None) -> torch.Tensor:
    """[n, n] bool: key i - 1 for every row i >= 1 (TransformerLens's previous-token pattern)."""
    return torch.ones(n - 1, dtype=torch.bool, device=device).diag(-1) if n > 1 else torch.zeros(n, n, dtype=torch.bool)


def detector_score(a: torch.Tensor, pattern: torch.Tensor, conditional: bool = False) -> torch.Tensor:
    """[head, n, n] maps, [n, n] bool pattern -> [head], the plain reference definition.

    TransformerLens (``conditional=False``): the mass on the pattern's positions over the map's whole
    mass; a pure pattern that every row has scores 1, a uniform map about 1/n, a map whose pattern
    has no position 0. ``conditional``: over the mass of the rows where the pattern has a position
    (TransformerLens's score divided by the share of those rows); NaN when no row has one.
    """
    hit = (a * pattern).sum((-2, -1))
    if not conditional:
        return hit / a.sum((-2, -1))
    rows = pattern.any(-1)
    if not bool(rows.any()):
        return torch.full((a.shape[0],), float("nan"), device=a.device)
    return hit / a[:, rows].sum((-2, -1))


#: Relative offsets j - i of the offset profile: mean attention from each query i to key i + o.
PROFILE_OFFSETS = tuple(range(-4, 5))


def offset_profile(a: torch.Tensor, offsets=PROFILE_OFFSETS) -> torch.Tensor:
    """[head, n, n] -> [head, len(offsets)]: mean over the rows that have key i + o of a[i, i + o].

    This keeps the one-token structure (self, previous, next, two back ...) that area-resizing
    erases; with it, a previous-token head and a self head are told apart at any length.
    """
    h, n, _ = a.shape
    cols = []
    for o in offsets:
        cols.append(
            a.diagonal(offset=o, dim1=-2, dim2=-1).float().mean(-1) if abs(o) < n else torch.zeros(h, device=a.device)
        )
    return torch.stack(cols, dim=-1)


def punctuation_ids(tokenizer) -> torch.Tensor:
    """Vocabulary ids whose surface form is only punctuation.

    The surface form is the token decoded by the tokenizer itself (so byte-level BPE pieces such as
    "âĢĻ" read as "’", and a lone byte of a multi-byte letter reads as "�", not as punctuation),
    with a WordPiece continuation prefix "##" removed once.
    """
    ids = []
    for token, idx in tokenizer.get_vocab().items():
        s = tokenizer.convert_tokens_to_string([token]).strip()
        if s.startswith("##") and len(s) > 2:
            s = s[2:]
        if s and all(unicodedata.category(c).startswith("P") for c in s):
            ids.append(idx)
    return torch.tensor(sorted(ids), dtype=torch.long)


def separator_ids(tokenizer) -> torch.Tensor:
    ids = {tokenizer.sep_token_id, tokenizer.eos_token_id}
    return torch.tensor(sorted(i for i in ids if i is not None), dtype=torch.long)


@dataclass
class TokenMasks:
    """Boolean masks over a batch's positions: [batch, seq]."""

    sep: torch.Tensor
    punct: torch.Tensor
    ids: torch.Tensor

    @classmethod
    def from_ids(cls, input_ids: torch.Tensor, sep_ids: torch.Tensor, punct_ids: torch.Tensor) -> TokenMasks:
        sep = torch.isin(input_ids, sep_ids.to(input_ids.device))
        sep[:, 0] = False  # position 0 is counted as "first", never twice
        punct = torch.isin(input_ids, punct_ids.to(input_ids.device))
        return cls(sep=sep, punct=punct, ids=input_ids)


#: statistics that weigh each key j the same in every row: the map times a [n, 4] matrix
_KEY_COLS = ("first", "sep", "punct", "mass")
_K = {name: k for k, name in enumerate(_KEY_COLS)}

_DISTANCE: dict[str, torch.Tensor] = {}  # device -> |i - j| for the longest n seen there


def _distance(n: int, device: torch.device) -> torch.Tensor:
    """[n, n, 1] float32 |i - j|: a view of one matrix per device, grown when a longer map comes."""
    d = _DISTANCE.get(str(device))
    if d is None or d.shape[0] < n:
        size = max(n, 2 * (0 if d is None else d.shape[0]))  # grow geometrically: few rebuilds
        idx = torch.arange(size, device=device, dtype=torch.float32)
        d = _DISTANCE[str(device)] = (idx[None, :] - idx[:, None]).abs().unsqueeze(-1)
    return d[:n, :n]


@dataclass
class SignatureWeights:
    """What one example's maps are reduced against, built once and shared by every layer and head.

    Most of the signature is linear in the map. The mass on the first token, on separators and on
    punctuation, and each row's total mass, weigh key j alike in every row: one matmul with
    ``key_cols`` gives them all. The distance weighs (i, j) by |i - j|: one batched matmul with a
    shared distance matrix. The detectors' patterns are sparse: their hits are gathered at the
    pattern's positions. So a map is read once per group, never once per statistic, and nothing
    [n, n]-sized is kept per example.
    """

    key_cols: torch.Tensor  # [n, 4] float32 (_KEY_COLS)
    log_seen: torch.Tensor  # [n - first_valid] log(number of keys row i can see), rows first_valid..n-1
    #: the first row that sees more than one key (normalised entropy): 1 when causal, else 0; n when none
    first_valid: int
    #: per detector (DETECTOR_NAMES): (query rows, key columns) of the pattern's positions and the
    #: rows that have a position (indices); None without token ids
    patterns: tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], ...] | None

    @classmethod
    def build(
        cls, sep: torch.Tensor, punct: torch.Tensor, causal: bool, ids: torch.Tensor | None = None
    ) -> SignatureWeights:
        """sep, punct: [n] bool masks of the example's tokens; ids: its token ids (detectors)."""
        n, dev = sep.shape[0], sep.device
        key_cols = torch.zeros(n, len(_KEY_COLS), device=dev, dtype=torch.float32)
        key_cols[0, _K["first"]] = 1.0
        key_cols[:, _K["sep"]] = sep.float()
        key_cols[:, _K["punct"]] = punct.float()
        key_cols[:, _K["mass"]] = 1.0
        patterns = None
        if ids is not None:
            patterns = tuple(
                (*pattern.nonzero(as_tuple=True), pattern.any(-1).nonzero()[:, 0]) for pattern in repeat_masks(ids)
            )
        first_valid = (1 if causal else 0) if n > 1 else n
        seen = (
            torch.arange(first_valid + 1, n + 1, device=dev, dtype=torch.float32)
            if causal
            else torch.full((n - first_valid,), float(n), device=dev, dtype=torch.float32)
        )
        return cls(key_cols=key_cols, log_seen=torch.log(seen), first_valid=first_valid, patterns=patterns)


def map_signature(
    a: torch.Tensor, sw: SignatureWeights, keys: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[head, n, n] row-stochastic maps of one example -> (stats [head, len(STAT_NAMES)] float32,
    detectors [head, len(DETECTOR_NAMES)] or None when ``sw`` was built without token ids).

    ``keys``: ``a @ sw.key_cols`` when the caller has it already (the reducer gets it from the same
    matmul as the image's resize).

    Every statistic is a mean over the map's query rows. The matmuls run in float32; with TF32
    matmuls enabled on a GPU (PyTorch's default is off) the linear stats would lose digits."""
    a = a.float()
    h, n, _ = a.shape
    if keys is None:
        keys = torch.matmul(a, sw.key_cols)  # [head, n, 4]
    # [n_i, head, n_j] @ [n_i, n_j, 1]: row i of every head against |i - j|
    distance = torch.bmm(a.transpose(0, 1), _distance(n, a.device)).mean(0).squeeze(-1)  # [head]
    ent_rows = -(a * torch.log(a.clamp_min(1e-30))).sum(-1)  # [head, n]
    zeros = torch.zeros(h, device=a.device, dtype=torch.float32)
    undefined = torch.full((h,), float("nan"), device=a.device, dtype=torch.float32)
    # no row sees two keys (n = 1): the normalised entropy is 0/0, undefined
    ent_norm = (ent_rows[:, sw.first_valid :] / sw.log_seen).mean(-1) if sw.first_valid < n else undefined

    def diagonal(offset: int) -> torch.Tensor:  # no row has key i + offset (prev, next at n = 1): undefined
        return a.diagonal(offset=offset, dim1=-2, dim2=-1).mean(-1) if abs(offset) < n else undefined

    mean = keys.mean(1)  # [head, 4]
    stats = torch.stack(
        [
            ent_rows.mean(-1),
            ent_norm,
            mean[:, _K["first"]],
            mean[:, _K["sep"]],
            mean[:, _K["punct"]],
            diagonal(0),
            diagonal(-1),
            diagonal(1),
            distance,
            a.amax(-1).mean(-1),
        ],
        dim=-1,
    )
    if sw.patterns is None:
        return stats, None
    total = keys[..., _K["mass"]].sum(-1)  # [head]: the map's whole mass (n for row-stochastic rows)
    prev_hit = a.diagonal(offset=-1, dim1=-2, dim2=-1).sum(-1) if n > 1 else zeros
    hits = [a[:, qi, kj].sum(-1) for qi, kj, _ in sw.patterns]  # mass on each repeat pattern
    cond = []
    for hit, (qi, _, rows) in zip(hits, sw.patterns):
        if qi.numel() == 0:  # no row has a target: undefined
            cond.append(torch.full((h,), float("nan"), device=a.device, dtype=torch.float32))
        else:  # mass on the pattern / mass of the rows that have a position in it
            cond.append(hit / keys[:, rows, _K["mass"]].sum(-1))
    return stats, torch.stack([prev_hit / total, *(hit / total for hit in hits), *cond], dim=-1)


def map_stats(a: torch.Tensor, sep: torch.Tensor, punct: torch.Tensor, causal: bool) -> torch.Tensor:
    """Scalar signature of cropped maps.

    a: [head, n, n] row-stochastic maps of one example; sep, punct: [n] bool.
    Returns [head, len(STAT_NAMES)] float32.
    """
    return map_signature(a, SignatureWeights.build(sep.to(a.device), punct.to(a.device), causal))[0]


def detector_scores(a: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """[head, n, n] maps and their token ids [n] -> [head, len(DETECTOR_NAMES)] (``detector_score`` of the
    previous-token, duplicate-token and induction patterns, then the last two conditional)."""
    n = a.shape[-1]
    none = torch.zeros(n, dtype=torch.bool, device=a.device)
    return map_signature(a, SignatureWeights.build(none, none, False, ids.to(a.device)))[1]


@functools.lru_cache(maxsize=4096)
def _area_weights(n: int, size: int, device: str) -> torch.Tensor:
    """[size, n]: R[i, j] = overlap of input cell [j, j+1) with output cell [i n/S, (i+1) n/S), times S/n.

    Each row sums to 1 (an output pixel is the exact area average of what it covers, fractional
    cells included), so ``R @ a @ R.T`` preserves the map's mean. torch's adaptive pooling instead
    uses overlapping integer windows that count border cells twice when S does not divide n.
    """
    edges = torch.arange(size + 1, dtype=torch.float64) * (n / size)
    j = torch.arange(n, dtype=torch.float64)
    lo = torch.maximum(edges[:-1, None], j[None, :])
    hi = torch.minimum(edges[1:, None], j[None, :] + 1)
    return ((hi - lo).clamp_min(0) * (size / n)).to(device=device, dtype=torch.float32)


def area_resize(a: torch.Tensor, size: int) -> torch.Tensor:
    """[..., n, n] -> [..., size, size] by exact area averaging (replication when upsampling)."""
    n = a.shape[-1]
    r = _area_weights(n, size, str(a.device))  # [S, n]
    return r @ a.float() @ r.T


class LayerReducer:
    """Turns one layer's batch of attention weights into images, thumbnails and stats.

    Preallocates [batch, layers, heads, ...] outputs; ``__call__(layer, weights)`` fills one layer.
    """

    def __init__(
        self,
        lengths: list[int],
        masks: TokenMasks,
        layers: list[int],
        heads: list[int],
        image_size: int,
        thumb_size: int,
        causal: bool,
        device,
    ):
        b = len(lengths)
        self.lengths = lengths
        self.masks = masks
        self.layer_pos = {layer: i for i, layer in enumerate(layers)}
        self.heads = torch.tensor(heads, dtype=torch.long, device=device)
        #: heads 0..k-1 (the default: all of them) are a view of a layer's weights; index_select
        #: would copy the whole [batch, head, T, T] tensor (13% of a long batch's time on the CPU)
        self.head_prefix = len(heads) if list(heads) == list(range(len(heads))) else None
        self.image_size = image_size
        self.thumb_size = thumb_size
        self.causal = causal
        shape = (b, len(layers), len(heads))
        self.images = torch.zeros(*shape, image_size, image_size, device=device)  # [batch, layer, head, S, S]
        self.thumbs = torch.zeros(*shape, thumb_size, thumb_size, device=device) if thumb_size else None
        self.stats = torch.zeros(*shape, len(STAT_NAMES), device=device)
        self.profile = torch.zeros(*shape, len(PROFILE_OFFSETS), device=device)
        self.detectors = torch.zeros(*shape, len(DETECTOR_NAMES), device=device)
        #: example -> its SignatureWeights and [n, S + 4] right-hand side (the resize's R.T beside
        #: the signature's key columns): the same for every layer, built once
        self._weights: dict[int, tuple[SignatureWeights, torch.Tensor]] = {}

    def __call__(self, layer: int, weights: torch.Tensor) -> None:
        pos = self.layer_pos.get(layer)
        if pos is None:
            return
        # weights: [batch, head, q, k]
        if self.head_prefix is not None:
            w = weights[:, : self.head_prefix]
        else:
            w = weights.index_select(1, self.heads.to(weights.device))
        s = self.image_size
        for b, n in enumerate(self.lengths):
            crop = w[b, :, :n, :n].float()  # [head, n, n]: padding never enters a map
            cached = self._weights.get(b)
            if cached is None:
                sw = SignatureWeights.build(
                    self.masks.sep[b, :n], self.masks.punct[b, :n], self.causal, self.masks.ids[b, :n]
                )
                r = _area_weights(n, s, str(crop.device))
                cached = self._weights[b] = (sw, torch.cat([r.T, sw.key_cols], dim=1))
            sw, right = cached
            # one pass over the maps for the resize's first product and the signature's key columns
            both = crop @ right  # [head, n, S + 4]
            self.stats[b, pos], self.detectors[b, pos] = map_signature(crop, sw, keys=both[..., s:])
            self.profile[b, pos] = offset_profile(crop)
            # area_resize(crop) = R @ crop @ R.T, with R.T and crop @ R.T the first S columns
            img = right[:, :s].T @ both[..., :s]
            self.images[b, pos] = img
            if self.thumbs is not None:
                self.thumbs[b, pos] = area_resize(img, self.thumb_size)
