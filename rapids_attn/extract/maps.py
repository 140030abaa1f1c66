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
    "streaming",  # mass on the sink tokens and the recent window, over the rows that see beyond both
    "retrieval",  # induction mass at least RECENT_WINDOW tokens back, over the rows that have such a target
)

#: The long-context head classes' geometry (docs/architecture.md, "Head classes"). A streaming head
#: (Xiao et al. 2024, StreamingLLM and DuoAttention) attends to the first SINK_TOKENS tokens and the last
#: RECENT_WINDOW; its ``streaming`` score is the mass there, averaged over the rows that can see any token
#: outside both (NaN where no row can: a short input). A retrieval head (Wu et al. 2024) copies from far
#: back in the context: its ``retrieval`` score is the induction mass (the token after an earlier copy of
#: the query's token, the position a copying head reads) at distance >= RECENT_WINDOW, over the mass of the
#: rows that have such a target. An attention-sink head (Gu et al. 2025) is read from the ``first`` stat.
SINK_TOKENS = 4
RECENT_WINDOW = 64


def streaming_score(
    a: torch.Tensor, causal: bool, visible: torch.Tensor | None = None, sinks: torch.Tensor | None = None
) -> torch.Tensor:
    """[head, n, n] -> [head]: the plain reference of the ``streaming`` detector. ``visible`` [n, n]: the keys
    each row could see, where not every earlier (causal) or every key (windows: its window's content);
    ``sinks`` [n, SINK_TOKENS]: each row's sink tokens (windows: its window's first tokens; -1 for none),
    where not the input's first."""
    n = a.shape[-1]
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    if sinks is None:
        sink = j < SINK_TOKENS
    else:
        sink = (j[..., None] == sinks[:, None, :]).any(-1)
    near = sink | ((i - j).abs() < RECENT_WINDOW)
    if visible is None:
        visible = (j <= i) if causal else torch.ones(n, n, dtype=torch.bool)
    rows = (visible & ~near).any(-1)
    if not bool(rows.any()):
        return torch.full((a.shape[0],), float("nan"))
    return (a * near).sum(-1)[:, rows].mean(-1)


def retrieval_score(a: torch.Tensor, ids: torch.Tensor, visible: torch.Tensor | None = None) -> torch.Tensor:
    """[head, n, n] maps and their token ids [n] -> [head]: the plain reference of the ``retrieval`` detector;
    ``visible`` as for :func:`streaming_score` (a target the row could not see is no target)."""
    n = a.shape[-1]
    _, ind = repeat_masks(ids)
    far = ind & ((torch.arange(n)[:, None] - torch.arange(n)[None, :]) >= RECENT_WINDOW)
    if visible is not None:
        far = far & visible
    rows = far.any(-1)
    if not bool(rows.any()):
        return torch.full((a.shape[0],), float("nan"))
    return (a * far).sum((-2, -1)) / a[:, rows].sum((-2, -1))


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


@dataclass
class SoftmaxRows:
    """What :meth:`LayerReducer.add_rows` needs to finish a block of softmax numerators ``exp(s_ij - top_i)``
    with ``s_ij = q_i . k_j``: ``top`` [batch, head, rows], the block's ``queries`` [batch, head, rows, d] (scaled
    as the scores are) and the layer's ``keys`` [batch, head, kv, d] (one per reducer head).

    With ``values`` [batch, head, kv, d_v] (the layer's, one per reducer head) and ``out`` [batch, head, q_len,
    d_v], the same product also gives the attention output of the block's rows, written to ``out`` (the
    blocked capture's ``attention_base: capture``); rows past an example's length are left as they are."""

    top: torch.Tensor
    queries: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor | None = None
    out: torch.Tensor | None = None


class LayerReducer:
    """Turns one layer's batch of attention weights into images, thumbnails and stats.

    Preallocates [batch, layers, heads, ...] outputs. A layer's weights arrive either whole,
    ``__call__(layer, weights [batch, head, T, T])``, or as blocks of query rows,
    ``add_rows(layer, block [batch, head, rows, T], first_row)`` for each block in any order, then
    ``end_layer(layer)``: the blocked capture (:mod:`rapids_attn.extract.blocked`) never holds a whole map.
    Both go through the same accumulation: every output is a sum over query rows (the image is
    ``R @ a @ R.T``, linear in the rows; each statistic a mean over rows), finished once the layer's
    rows are in. :func:`map_signature`, :func:`offset_profile` and :func:`area_resize` are the plain
    references the tests hold it to.
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
        block_bytes: int = 64 << 20,
    ):
        b = len(lengths)
        #: the blocked capture's budget for one block of rows' scores and weights
        self.block_bytes = block_bytes
        self.lengths = lengths
        self.masks = masks
        self.layers = list(layers)
        self.layer_pos = {layer: i for i, layer in enumerate(layers)}
        self.head_list = list(heads)
        self.heads = torch.tensor(heads, dtype=torch.long, device=device)
        #: heads 0..k-1 (the default: all of them) are a view of a layer's weights; index_select
        #: would copy the whole [batch, head, T, T] tensor (13% of a long batch's time on the CPU)
        self.head_prefix = len(heads) if list(heads) == list(range(len(heads))) else None
        self.image_size = image_size
        self.thumb_size = thumb_size
        self.causal = causal
        self.device = device
        shape = (b, len(layers), len(heads))
        self.images = torch.zeros(*shape, image_size, image_size, device=device)  # [batch, layer, head, S, S]
        self.thumbs = torch.zeros(*shape, thumb_size, thumb_size, device=device) if thumb_size else None
        self.stats = torch.zeros(*shape, len(STAT_NAMES), device=device)
        self.profile = torch.zeros(*shape, len(PROFILE_OFFSETS), device=device)
        self.detectors = torch.zeros(*shape, len(DETECTOR_NAMES), device=device)
        #: example -> its SignatureWeights and [n, S + 4] right-hand side (the resize's R.T beside
        #: the signature's key columns): the same for every layer, built once
        self._weights: dict[int, tuple[SignatureWeights, torch.Tensor]] = {}
        self._sums: dict[int, _RowSums] = {}  # layer -> the sums of the rows seen so far
        self._offsets = torch.tensor(PROFILE_OFFSETS, device=device)
        #: example -> its token groups (_Repeats), built once
        self._repeats: dict[int, _Repeats] = {}
        #: bytes the examples' _Repeats may still keep of their blocks' pairs, shared by the batch
        self._pairs_budget = [PAIRS_CACHE_BYTES]
        #: (keys, first row, rows) -> |i - j| and the recent band of those rows (encoders), while they fit in block_bytes
        self._dist: dict[tuple[int, int, int], torch.Tensor] = {}
        self._dist_bytes = 0

    #: add_rows takes a block of softmax numerators with SoftmaxRows (the blocked capture's fast path)
    takes_numerators = True

    def wants(self, layer: int) -> bool:
        return layer in self.layer_pos

    def select_heads(self, weights: torch.Tensor) -> torch.Tensor:
        """The reducer's heads of [batch, head, ...] weights (a view when they are heads 0..k-1)."""
        if self.head_prefix is not None:
            return weights[:, : self.head_prefix]
        return weights.index_select(1, self.heads.to(weights.device))

    def __call__(self, layer: int, weights: torch.Tensor) -> None:
        if layer not in self.layer_pos:
            return
        self.add_rows(layer, self.select_heads(weights), 0, selected=True)
        self.end_layer(layer)

    def _example(self, b: int, n: int, device) -> tuple[SignatureWeights, torch.Tensor]:
        """Example b's SignatureWeights and the right-hand side of its rows' one matmul: [n, S + 5], the
        resize's R.T, the four key columns (first, sep, punct, mass) and each key's position j."""
        cached = self._weights.get(b)
        if cached is None:
            sw = SignatureWeights.build(
                self.masks.sep[b, :n].to(device), self.masks.punct[b, :n].to(device), self.causal
            )
            r = _area_weights(n, self.image_size, str(device))
            pos = torch.arange(n, device=device, dtype=torch.float32)[:, None]
            cached = self._weights[b] = (sw, torch.cat([r.T, sw.key_cols, pos], dim=1))
        return cached

    def _distance_rows(self, n: int, r0: int, m: int, device) -> torch.Tensor:
        """[m, n, 2] for rows r0 .. r0 + m - 1 against keys 0 .. n - 1 (bidirectional maps; causal ones use a
        closed form): |i - j|, and 1 where |i - j| < RECENT_WINDOW (the streaming detector's band), so one
        batched product gives each row's mean distance and its band's mass. Cached while they fit in
        block_bytes; the same for every example with these rows and keys."""
        key = (n, r0, m)
        d = self._dist.get(key)
        if d is None:
            i = torch.arange(r0, r0 + m, device=device, dtype=torch.float32)[:, None]
            dist = (torch.arange(n, device=device, dtype=torch.float32)[None, :] - i).abs()
            d = torch.stack([dist, (dist < RECENT_WINDOW).float()], dim=-1)
            if self._dist_bytes + d.numel() * 4 <= self.block_bytes:
                self._dist[key] = d
                self._dist_bytes += d.numel() * 4
        return d

    def add_rows(
        self,
        layer: int,
        block: torch.Tensor,
        first_row: int,
        selected: bool = False,
        row_entropy: torch.Tensor | None = None,
        row_max: torch.Tensor | None = None,
        softmax: SoftmaxRows | None = None,
        example: int | None = None,
        log_seen: torch.Tensor | None = None,
        spans: torch.Tensor | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        """Add query rows ``first_row .. first_row + rows - 1`` of one layer: ``block`` [batch, head, rows, K]
        (the reducer's heads only when ``selected``, else every head). Rows past an example's length and keys
        past it are never read, so padding never enters a map. ``K`` may stop short of the batch's length:
        the keys after it have no weight (a causal block of rows reads the keys up to its last row only).
        ``row_entropy`` and ``row_max`` [batch, head, rows], when the caller has them from its softmax, spare
        a pass over the block each.

        With ``softmax`` (:class:`SoftmaxRows`), ``block`` holds the softmax's numerators ``exp(s_ij - top_i)``,
        not yet divided by their row sums ``z_i``: the one product over the block that the image needs also
        gives ``z_i`` (the key columns' mass) and ``sum_j exp(s_ij - top_i) k_j``, hence each row's entropy
        ``log z_i + top_i - q_i . sum_j p_ij k_j``, and every sum is scaled by ``1 / z_i`` after. That spares
        the caller three passes over the block (the row sums, the division, the entropy's product).

        With ``example``, the block [1, head, rows, K] holds that example's rows alone (a long input's windows,
        :mod:`rapids_attn.extract.windows`), and ``log_seen`` [rows], when given, is the log of the keys each
        row could see (its window's, not the whole input's): the normalised entropy's denominator; ``spans``
        [rows, 3], when given, the input positions [c0, c1) of the content each row's window holds and the first
        content position past the window's sink tokens, with ``sinks`` [rows, SINK_TOKENS] those tokens' positions
        (the window's first, which the model read as its start; -1 for none): the streaming and retrieval
        detectors then count a row only where its window shows it a key beyond its sink and the recent window
        (a far target), not where the whole input would, and the ``first`` statistic reads each row's weight on
        its window's first token."""
        pos = self.layer_pos.get(layer)
        if pos is None:
            return
        w = block if selected else self.select_heads(block)
        acc = self._sums.get(layer)
        if acc is None:
            acc = self._sums[layer] = _RowSums(len(self.lengths), w.shape[1], self.image_size, w.device)
        s, r0 = self.image_size, first_row
        # (example, its length, its index in the block)
        targets = enumerate(self.lengths) if example is None else [(example, self.lengths[example])]
        for wb, (b, n) in enumerate(targets):
            m = min(r0 + w.shape[2], n) - r0
            if m <= 0:
                continue
            kw = min(w.shape[3], n)  # the keys the block holds; any after them have no weight
            c = w[wb, :, :m, :kw].float()  # [head, m, kw]: rows r0 .. r0 + m - 1 of the cropped map
            dev = c.device
            sw, right = self._example(b, n, dev)
            inv = None
            if softmax is None:
                # [head, m, 5]: the key columns and sum_j a_ij j. A batched product over heads (the right-hand
                # side broadcast) runs about twice as fast on the CPU as one [head x m, kw] x [kw, 5] product
                both = torch.bmm(c, right[:kw, s:].expand(c.shape[0], -1, -1))
            else:  # numerators: the same product with each head's keys beside, then divided by the row sums
                vals = None if softmax.values is None else softmax.values[wb, :, :n]
                full = torch.bmm(c, acc.right_with_keys(b, right[:, s:], softmax.keys[wb, :, :n], vals)[:, :kw])
                z = full[..., _K["mass"]]  # [head, m]
                inv = 1.0 / z
                d = softmax.queries.shape[-1]
                dot = (full[..., 5 : 5 + d] * softmax.queries[wb, :, :m].float()).sum(-1) * inv  # sum_j p_ij s_ij
                if vals is not None:  # the rows' attention output: sum_j p_ij v_j
                    softmax.out[wb, :, r0 : r0 + m] = full[..., 5 + d :] * inv[..., None]
                row_entropy = (torch.log(z) + softmax.top[wb, :, :m].float() - dot)[None]
                row_max = inv[None]
                both = full[..., :5] * inv[..., None]
            keys = both[..., :4]  # a fresh product's columns: changed in place below
            sp = None if spans is None else spans[:m].to(dev)
            sk = None if sinks is None else sinks[:m].to(dev)
            if sk is not None:  # windows: a row's first token is its window's, what the model read as its start
                start = sk[:, 0]
                on_start = self._on_window_start(c, start, inv)
                keys[..., _K["first"]] = on_start
                # counted as first, never twice (TokenMasks leaves position 0 out of sep for the same reason)
                sep_start = sw.key_cols[start.clamp(0, n - 1), _K["sep"]] * (start > 0)
                keys[..., _K["sep"]] -= on_start * sep_start
            acc.keys[b] += keys.sum(1)
            self._add_image(acc.image[b], c, right, r0, m, kw, inv)
            bi = wb if softmax is None else 0
            if row_entropy is None:
                ent = -(c * torch.log(c.clamp_min(1e-30))).sum(-1)  # [head, m]
            else:
                ent = row_entropy[bi, :, :m].float()
            acc.entropy[b] += ent.sum(-1)
            lo = max(sw.first_valid - r0, 0)  # rows that see more than one key: normalised entropy
            if lo < m:
                if log_seen is not None:
                    seen = log_seen[lo:m].to(ent.device)
                else:
                    seen = sw.log_seen[r0 + lo - sw.first_valid : r0 + m - sw.first_valid]
                acc.entropy_norm[b] += (ent[:, lo:] / seen).sum(-1)
            acc.row_max[b] += (c.amax(-1) if row_max is None else row_max[bi, :, :m].float()).sum(-1)
            rows = torch.arange(r0, r0 + m, device=dev)
            # a[i, i + o] for every offset of the profile (self, prev and next among them)
            at = rows[:, None] + self._offsets.to(dev)[None, :]  # [m, offsets]
            valid = (at >= 0) & (at < kw)
            got = c.gather(-1, at.clamp(0, kw - 1).expand(c.shape[0], -1, -1))  # [head, m, offsets]
            if inv is not None:
                got = got * inv[..., None]
            acc.diagonal[b] += (got * valid).sum(1)
            mass = keys[..., _K["mass"]]  # [head, m]: each row's mass
            band = None
            if self.causal:  # sum_j a_ij |i - j| = i * mass_i - sum_j a_ij j when nothing is above the diagonal
                acc.distance[b] += (rows.float() * mass - both[..., 4]).sum(-1)
            else:  # [m, head, 2]: sum_j a_ij |i - j| and the mass on the recent band, one product
                db = torch.bmm(c.transpose(0, 1), self._distance_rows(kw, r0, m, dev))
                d = db[..., 0]
                acc.distance[b] += (d if inv is None else d * inv.T).sum(0)
                band = db[..., 1].T
            self._streaming(acc, b, c, r0, rows, n, mass, inv, sp, sk, band)
            self._repeats_of(b, n, dev).add(acc, b, c, r0, m, mass, inv, sp)

    @staticmethod
    def _on_window_start(c: torch.Tensor, start: torch.Tensor, inv=None) -> torch.Tensor:
        """[head, rows]: each row's weight on its window's first token (``start`` [rows], a position of the whole
        input; -1 or one past the block's keys for none). On BERT that is the repeated [CLS], position 0 for every
        window; on a tokenizer without a leading special token (GPT-2) the window's first content token."""
        kw = c.shape[-1]
        seen = ((start >= 0) & (start < kw)).to(c.dtype)
        got = c.gather(-1, start.clamp(0, kw - 1)[None, :, None].expand(c.shape[0], -1, 1))[..., 0] * seen
        return got if inv is None else got * inv

    def _add_image(self, image, c, right, r0: int, m: int, kw: int, inv) -> None:
        """Add rows r0 .. r0 + m - 1 of a map to its image R @ a @ R.T ([head, S, S]). The rows reach only the
        output rows whose area they overlap (a block of rows: one or two of S), so the product starts there:
        (R's columns r0.. restricted to those rows) @ c, a pass over the block instead of an S-wide product."""
        s = self.image_size
        rt = right[r0 : r0 + m, :s]  # [m, S]: R.T's rows for these rows
        cols = rt.abs().sum(0).nonzero()[:, 0]  # the output rows they reach
        left = rt[:, cols].T  # [nb, m]
        left = left.expand(c.shape[0], -1, -1) if inv is None else left[None] * inv[:, None, :]  # numerators: / z
        part = torch.bmm(torch.bmm(left, c), right[:kw, :s].expand(c.shape[0], -1, -1))  # [head, nb, S]
        image[:, cols] += part

    def _streaming(
        self,
        acc,
        b: int,
        c: torch.Tensor,
        r0: int,
        rows: torch.Tensor,
        n: int,
        mass: torch.Tensor,
        inv=None,
        spans=None,
        sinks=None,
        band=None,
    ) -> None:
        """The streaming detector's sums: each row's mass on the recent window |i - j| < RECENT_WINDOW
        (``band`` [head, rows] where the caller has it, else :meth:`_band_mass`) and on the sink tokens outside
        it, over the rows that see beyond both (``spans``: within their window's content, :meth:`add_rows`)."""
        w = RECENT_WINDOW
        if spans is not None:  # a content key past the window's sink tokens with |i - j| >= w, among those seen
            lo = spans[:, 2]
            hi = torch.minimum(spans[:, 1], rows + 1) if self.causal else spans[:, 1]  # exclusive
            beyond = lo <= torch.minimum(rows - w, hi - 1)
            if not self.causal:
                beyond |= torch.maximum(rows + w, lo) <= hi - 1
        elif self.causal:
            beyond = rows >= SINK_TOKENS + w
        else:
            beyond = (rows >= SINK_TOKENS + w) | (rows + w <= n - 1)
        n_beyond = int(beyond.sum())
        if n_beyond == 0:
            return
        near = self._band_mass(c, r0) if band is None else band  # [head, rows]
        kw = c.shape[-1]  # the block's keys (n, or fewer for a causal block: the rest weigh nothing)
        i = rows[:, None]
        if sinks is None:  # the input's first tokens
            sink_cols = torch.arange(min(SINK_TOKENS, kw), device=c.device)[None, :]
            got = c[:, :, : sink_cols.shape[1]]
        else:  # each row's window's first tokens
            sink_cols = sinks
            got = c.gather(-1, sinks.clamp(0, kw - 1).expand(c.shape[0], -1, -1))
        # sink tokens outside the window (inside it they count once)
        far_sink = ((sink_cols >= 0) & (sink_cols < kw) & ((i - sink_cols).abs() >= w)).float()
        if n_beyond < len(rows):
            sel = beyond.nonzero()[:, 0]
            near, got, far_sink = near[:, sel], got[:, sel], far_sink[sel]
            inv = None if inv is None else inv[:, sel]
        near = near + (got * far_sink).sum(-1)
        if inv is not None:  # the block holds numerators: divide by the row sums
            near = near * inv
        acc.stream[b] += near.sum(-1)
        acc.rows[b, 3] += n_beyond

    def _band_mass(self, c: torch.Tensor, r0: int) -> torch.Tensor:
        """[head, rows]: each row's mass on the keys within RECENT_WINDOW of it (``|i - j| < W``; ``i - W < j <=
        i`` when causal, the keys after a row weighing nothing), for rows r0.. of a block ``c`` [head, rows, K].
        The rows whose band lies inside the block's keys read it as a strided view (row i's band starts one
        element further along than row i - 1's: a stride of the row's plus one), no index and no copy; only
        the rows at the edges gather theirs."""
        w = RECENT_WINDOW
        h, m, kw = c.shape
        lo, hi = -(w - 1), 0 if self.causal else w - 1  # the band's first and last key, from the diagonal
        a = min(max(0, -(r0 + lo)), m)  # rows a .. b - 1: those whose band is inside [0, kw)
        b = max(a, min(m, kw - hi - r0))
        if c.stride(-1) != 1:
            a = b = 0
        out = c.new_empty(h, m)
        if a < b:
            band = c.as_strided(
                (h, b - a, hi - lo + 1),
                (c.stride(0), c.stride(1) + 1, 1),
                c.storage_offset() + a * (c.stride(1) + 1) + r0 + lo,
            )
            out[:, a:b] = band.sum(-1)
        edge = torch.cat([torch.arange(0, a, device=c.device), torch.arange(b, m, device=c.device)])
        if len(edge):
            cols = (edge + r0)[:, None] + torch.arange(lo, hi + 1, device=c.device)[None, :]  # [edge rows, band]
            inside = (cols >= 0) & (cols < kw)
            got = c[:, edge].gather(-1, cols.clamp(0, kw - 1).expand(h, -1, -1))
            out[:, edge] = (got * inside).sum(-1)
        return out

    def _repeats_of(self, b: int, n: int, device) -> _Repeats:
        r = self._repeats.get(b)
        if r is None:
            r = self._repeats[b] = _Repeats(self.masks.ids[b, :n].to(device), self._pairs_budget)
        return r

    def end_layer(self, layer: int) -> None:
        """Finish a layer whose rows have all been added: means, detectors, the thumbnail, for every example at
        once (each divided by its own length; NaN where a statistic is undefined for it)."""
        pos = self.layer_pos.get(layer)
        acc = self._sums.pop(layer, None)
        if pos is None or acc is None:
            return
        offsets = PROFILE_OFFSETS
        zero = offsets.index(0)
        dev = acc.image.device
        lengths = torch.tensor(self.lengths, dtype=torch.float32, device=dev)
        n = lengths[:, None]  # [batch, 1]: broadcast over heads
        nan = torch.tensor(float("nan"), device=dev)
        first_valid = torch.where(n > 1, 1.0 if self.causal else 0.0, n)  # SignatureWeights.first_valid
        diag = acc.diagonal  # [batch, head, offsets]
        keys = acc.keys

        def per(x, d, defined):  # x / d where defined, else NaN
            return torch.where(defined, x / torch.where(defined, d, 1.0), nan)

        more = n > 1
        self.stats[:, pos] = torch.stack(
            [
                acc.entropy / n,
                per(acc.entropy_norm, n - first_valid, first_valid < n),
                keys[..., _K["first"]] / n,
                keys[..., _K["sep"]] / n,
                keys[..., _K["punct"]] / n,
                diag[..., zero] / n,
                per(diag[..., zero - 1], n - 1, more),
                per(diag[..., zero + 1], n - 1, more),
                acc.distance / n,
                acc.row_max / n,
            ],
            dim=-1,
        ).to(self.stats.device)
        o = torch.tensor([abs(x) for x in offsets], dtype=torch.float32, device=dev)  # [offsets]
        seen = lengths[:, None, None] > o  # an offset the map has a diagonal at
        self.profile[:, pos] = torch.where(seen, diag / torch.where(seen, lengths[:, None, None] - o, 1.0), 0.0).to(
            self.profile.device
        )
        total = keys[..., _K["mass"]]
        prev_hit = torch.where(more, diag[..., zero - 1], 0.0)
        hits, rows, pm = acc.hits, acc.rows[:, None, :], acc.pattern_mass
        self.detectors[:, pos] = torch.stack(
            [
                prev_hit / total,
                hits[..., 0] / total,
                hits[..., 1] / total,
                per(hits[..., 0], pm[..., 0], rows[..., 0] > 0),
                per(hits[..., 1], pm[..., 1], rows[..., 1] > 0),
                per(acc.stream, rows[..., 3].float(), rows[..., 3] > 0),
                per(hits[..., 2], pm[..., 2], rows[..., 2] > 0),
            ],
            dim=-1,
        ).to(self.detectors.device)
        self.images[:, pos] = acc.image.to(self.images.device)
        if self.thumbs is not None:
            self.thumbs[:, pos] = area_resize(acc.image, self.thumb_size).to(self.thumbs.device)


#: the most bytes of pattern positions a batch's _Repeats keep for the next layers, all examples together (a
#: long input's blocks past it find theirs again each layer: a repetitive 32k-token document lists millions)
PAIRS_CACHE_BYTES = 32 << 20


class _Repeats:
    """One example's repeated tokens, for the duplicate-token, induction and retrieval detectors without an
    n x n pattern: positions sorted by token (stably, so a token's copies stay in order), each position's
    rank among its token's copies and where its token's group starts. A block of query rows lists its pattern
    positions from these, O(its pairs): row i's earlier copies are its group's first rank(i) positions."""

    def __init__(self, ids: torch.Tensor, budget: list[int]):
        """``budget``: a one-item list of the bytes this example may still keep of its blocks' pairs, shared
        with the batch's other examples (the reducer's)."""
        self.order = torch.argsort(ids, stable=True)  # sorted index -> position
        sorted_ids = ids[self.order]
        n = len(ids)
        starts = torch.ones(n, dtype=torch.bool, device=ids.device)
        starts[1:] = sorted_ids[1:] != sorted_ids[:-1]
        group_start = torch.cummax(torch.where(starts, torch.arange(n, device=ids.device), 0), 0).values
        self.rank = torch.empty(n, dtype=torch.long, device=ids.device)
        self.rank[self.order] = torch.arange(n, device=ids.device) - group_start
        self.start = torch.empty(n, dtype=torch.long, device=ids.device)  # position -> its group's sorted start
        self.start[self.order] = group_start
        self.first = self.order[self.start]  # position -> the first position of its token
        self._cache: dict[tuple[int, int], tuple | None] = {}  # (first row, rows) -> _pairs, for every layer
        self._budget = budget

    def _pairs(self, r0: int, m: int, device, spans=None):
        """The pattern positions of rows r0 .. r0 + m - 1, the same for every layer (cached, but for windows'
        ``spans``): (``local`` [2P] block rows then ``keys`` [2P] keys of the duplicate-token pairs followed by
        the induction pairs, ``far`` [F] the indices of the induction pairs at least RECENT_WINDOW back, ``has``
        [m] rows with an earlier copy, ``far_rows`` [m] rows with a far target, and those two rows' counts);
        None where no row has an earlier copy."""
        key = (r0, m)
        if spans is None and key in self._cache:
            return self._cache[key]
        rank = self.rank[r0 : r0 + m]
        has = rank > 0  # rows with an earlier copy: a duplicate-token and an induction target
        if not bool(has.any()):
            out = None
        else:
            rows = torch.arange(r0, r0 + m, device=device)
            far_rows = has & (self.first[r0 : r0 + m] <= rows - RECENT_WINDOW - 1)
            count = rank.clamp_min(0)
            total = int(count.sum())
            local = torch.repeat_interleave(torch.arange(m, device=device), count)  # the pair's row, block-local
            skip = torch.repeat_interleave(torch.cumsum(count, 0) - count, count)
            k = self.order[
                torch.repeat_interleave(self.start[r0 : r0 + m], count) + torch.arange(total, device=device) - skip
            ]
            far = (local + r0) - (k + 1) >= RECENT_WINDOW  # the token after each earlier copy (k + 1 <= i)
            if spans is not None:  # windows: a far target counts where the row's window holds it
                far = far & (k + 1 >= spans[local, 0])
                far_rows = torch.zeros_like(far_rows)
                far_rows[local[far]] = True
            out = (
                torch.cat([local, local]),
                torch.cat([k, k + 1]),
                far.nonzero()[:, 0] + total,
                has,
                far_rows,
                int(has.sum()),
                int(far_rows.sum()),
            )
        size = 0 if out is None else sum(t.numel() * t.element_size() for t in out[:5])
        if spans is None and size <= self._budget[0]:  # a long input's blocks: while the batch's budget lasts
            self._cache[key] = out
            self._budget[0] -= size
        return out

    def add(self, acc, b: int, c: torch.Tensor, r0: int, m: int, mass: torch.Tensor, inv=None, spans=None) -> None:
        pairs = self._pairs(r0, m, c.device, spans)
        if pairs is None:
            return
        local, keys, far, has, far_rows, n_has, n_far = pairs
        got = c[:, local, keys]  # [head, 2P]: each row's weight on an earlier copy of its token, then on the next
        if inv is not None:  # numerators: divide by their rows' sums
            got = got * inv[:, local]
        half = got.shape[1] // 2
        acc.hits[b, :, 0] += got[:, :half].sum(-1)  # earlier copies
        acc.hits[b, :, 1] += got[:, half:].sum(-1)
        acc.hits[b, :, 2] += got[:, far].sum(-1)
        has_mass = mass[:, has].sum(-1)
        acc.pattern_mass[b, :, 0] += has_mass
        acc.pattern_mass[b, :, 1] += has_mass
        acc.pattern_mass[b, :, 2] += mass[:, far_rows].sum(-1)
        acc.rows[b, 0] += n_has
        acc.rows[b, 1] += n_has
        acc.rows[b, 2] += n_far


class _RowSums:
    """One layer's sums over the query rows seen so far, per example and head (float32)."""

    def __init__(self, batch: int, heads: int, image_size: int, device):
        z = functools.partial(torch.zeros, device=device, dtype=torch.float32)
        self.keys = z(batch, heads, len(_KEY_COLS))  # first, sep, punct, each row's mass
        self.image = z(batch, heads, image_size, image_size)
        self.entropy = z(batch, heads)
        self.entropy_norm = z(batch, heads)
        self.distance = z(batch, heads)
        self.row_max = z(batch, heads)
        self.diagonal = z(batch, heads, len(PROFILE_OFFSETS))
        self.hits = z(batch, heads, 3)  # duplicate-token, induction, far induction
        self.pattern_mass = z(batch, heads, 3)  # the mass of the rows that have a position in each
        self.stream = z(batch, heads)  # mass on the sink tokens and the recent window, rows that see beyond
        #: rows with a duplicate, induction, far-induction target; rows that see beyond the streaming set
        self.rows = torch.zeros(batch, 4, device=device, dtype=torch.int64)
        self._right: dict[int, torch.Tensor] = {}

    def right_with_keys(
        self, b: int, right: torch.Tensor, keys: torch.Tensor, values: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[head, n, 5 + d (+ d_v)]: example b's key columns and positions beside each head's keys [head, n, d]
        (and values), built once a layer (the keys are the layer's)."""
        r = self._right.get(b)
        if r is None:
            h, n = keys.shape[0], keys.shape[1]
            parts = [right[:n].expand(h, -1, -1), keys.float()] + ([] if values is None else [values.float()])
            r = self._right[b] = torch.cat(parts, dim=-1)
        return r
