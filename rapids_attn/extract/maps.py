"""Per-map reductions: crop to the real tokens, scalar signature at full resolution, area-resize.

Every map is cropped to ``[:n, :n]`` (n = the example's real token count, right padding) before
anything else, so padding never enters a map, its image or its stats. The stats are computed on
the full-resolution crop because area-resizing erases one-token structure: with n = 200 and S = 32
a previous-token head and a self head are the same picture (see docs/architecture.md).

What each stat, detector and profile column is, is named and defined in :mod:`rapids_attn.extract.signature`;
this module computes them: the plain references (:func:`map_signature`, :func:`offset_profile`,
:func:`area_resize`) and the capture's kernel, :class:`LayerReducer`, which the tests hold to them (the
detectors' own references, used only there, are in ``tests/detector_reference.py``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import unicodedata
from dataclasses import dataclass

import numpy as np
import torch

from rapids_attn.extract.signature import DETECTOR_NAMES, PROFILE_OFFSETS, RECENT_WINDOW, SINK_TOKENS, STAT_NAMES


@dataclass(frozen=True)
class SinkNeeds:
    """What a sink takes from a layer, one value instead of flags across classes:

    - ``rows``: blocks of attention weights, ``add_rows(layer, block, first_row, ...)``;
    - ``numerators``: ``add_rows`` also takes a block of softmax numerators with their
      :class:`~rapids_attn.extract.maps.SoftmaxRows` (the blocked path's fast path);
    - ``sums``: a fused kernel's sums over rows, ``add_sums(layer, sums, pair_weights)``, with
      ``kernel_inputs()`` (what the kernel reduces against) and ``heads_only`` (LayerReducer on a batch);
    - ``qk``: the layer's scaled queries and keys instead of its rows, ``add_qk(layer, LayerQK)``
      (:mod:`rapids_attn.compare`)."""

    rows: bool = True
    numerators: bool = False
    sums: bool = False
    qk: bool = False


def block_rows(batch: int, heads: int, kv_len: int, budget_bytes: int) -> int:
    """Query rows per block so that a block's float32 scores and weights fit in ``budget_bytes``."""
    # scores, mask and weights (the reducer's one-pass temporaries, a block each, reuse that room), and the |i - j|
    # and band rows the reducer caches for the block's rows
    per_row = max(batch * heads * kv_len * 4 * 3 + kv_len * 4 * 6, 1)
    return max(1, int(budget_bytes // per_row))


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


#: from how many keys a block reads the recent band as a strided view (LayerReducer._band_mass); below, most rows
#: of a block are at its edges and one pass against the rows' band is cheaper
BAND_VIEW_KEYS = 8 * RECENT_WINDOW


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
    #: the ids on the host, where the caller has them (the reducer lists the repeat patterns there; without them
    #: it copies ``ids`` from the device once)
    host_ids: torch.Tensor | None = None

    @classmethod
    def from_ids(
        cls, input_ids: torch.Tensor, sep_ids: torch.Tensor, punct_ids: torch.Tensor, host_ids=None
    ) -> TokenMasks:
        sep = torch.isin(input_ids, sep_ids.to(input_ids.device))
        sep[:, 0] = False  # position 0 is counted as "first", never twice
        punct = torch.isin(input_ids, punct_ids.to(input_ids.device))
        return cls(sep=sep, punct=punct, ids=input_ids, host_ids=host_ids)


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

    The reduction is shaped for a GPU (issue 34): a block is reduced for the whole batch at once, its ragged
    examples handled by length masks on the padded tensors, so the operations per block (90-110, and 57 per layer
    to finish it) do not depend on the batch size or the length, and nothing in :meth:`add_rows` or
    :meth:`end_layer` waits for the device
    (no ``.item()``, no data-dependent shape). What depends on the token ids (the duplicate-token and induction
    pattern positions, the rows that have a target) is worked out on the host from the ids when the reducer is
    built, before the forward, and moved to the device once (:class:`_Patterns`); each block reads its slice.

    A model spread over several GPUs (``model.device_map``) hands each layer's weights over on the GPU the layer runs
    on: such a layer is reduced there, by a view of the reducer whose batch weights were copied to that GPU once
    (:meth:`on`), and :meth:`end_layer` gathers its finished means to the reducer's own device, the outputs'. One
    copy per GPU a batch, one of each finished layer: no block of weights crosses GPUs, and nothing waits for them.
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
        self.lengths = [int(n) for n in lengths]
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
        self._sums: dict[int, _RowSums] = {}  # layer -> the sums of the rows seen so far
        self._offsets = torch.tensor(PROFILE_OFFSETS, device=device)
        #: (keys, first row, rows, band) -> |i - j| or the recent band of those rows, while they fit in block_bytes
        self._dist: dict[tuple[int, int, int], torch.Tensor] = {}
        self._dist_bytes = 0
        self._n_host = np.asarray(self.lengths, dtype=np.int64)
        self.batch = BatchWeights.build(self._n_host, masks, image_size, causal, device)
        host_ids = masks.host_ids if masks.host_ids is not None else masks.ids.cpu()
        self.patterns = _Patterns(np.asarray(host_ids), self._n_host, device)
        self._kernel_inputs = None  # kernel_inputs(), built on first use
        self._row_counts: torch.Tensor | None = None
        self._views: dict[torch.device, LayerReducer] = {}  # on(): device -> this reducer's view there

    def on(self, device) -> LayerReducer:
        """The reducer that reduces a layer whose weights are on ``device``: this one where its batch weights are
        there, else its view on that device (:meth:`view_on`, made on the batch's first layer there, then kept)."""
        device = torch.device(device)
        if device == self.batch.n_long.device:
            return self
        view = self._views.get(device)
        if view is None:
            view = self._views[device] = self.view_on(device)
        return view

    def view_on(self, device) -> LayerReducer:
        """A view of this reducer on ``device``: the same outputs and per-layer sums (``_sums``: each layer's on the
        device its rows came from), with the batch weights, pattern positions and offsets copied there (device to
        device copies: the host does not wait for them), and caches of its own."""
        device = torch.device(device)
        view = copy.copy(self)
        view.device = device
        view.heads = self.heads.to(device)
        view._offsets = self._offsets.to(device)
        view.batch = self.batch.to(device)
        view.patterns = self.patterns.to(device)
        view._dist, view._dist_bytes = {}, 0
        view._kernel_inputs = view._row_counts = None
        view._views = {}
        return view

    #: add_rows takes blocks of weights, or of softmax numerators with SoftmaxRows (the blocked capture's fast
    #: path); add_sums takes a fused kernel's sums over rows (rapids_attn.extract.kernels)
    needs = SinkNeeds(rows=True, numerators=True, sums=True)

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

    def kernel_inputs(self, device=None):
        """What a fused kernel reduces this batch's maps against (:class:`rapids_attn.extract.fused.KernelInputs`),
        built once per batch from :class:`BatchWeights` with a fixed number of operations: the key columns (first,
        sep, punct, a real token, j), each example's ``R^T`` padded to a power of two, and the rows' weights (a real
        row, 1 / log(keys seen), beyond the streaming set, the three repeat targets). ``device``: the layer's
        (model.device_map), where they are built from the view there (:meth:`on`)."""
        if device is not None and (here := self.on(device)) is not self:
            return here.kernel_inputs()
        if self._kernel_inputs is None:
            from rapids_attn.extract.fused import KEY_FEATURES, ROW_WEIGHTS, KernelInputs, pow2

            bw = self.batch
            t = bw.row_ok.shape[1]
            s = self.image_size
            right = bw.right_rt
            features = torch.nn.functional.pad(right[..., :5], (0, KEY_FEATURES - 5))
            rt = torch.nn.functional.pad(right[..., 5:], (0, pow2(s) - s))
            n = bw.n_long[:, None]
            i = torch.arange(t, device=right.device)[None, :]
            w = RECENT_WINDOW
            beyond = i >= SINK_TOKENS + w
            if not self.causal:
                beyond = beyond | (i + w <= n - 1)
            beyond = beyond & bw.row_ok
            flags = self.patterns.row_flags  # [b, T, 3]
            rows = torch.cat(
                [bw.row_ok.float()[..., None], bw.inv_log_seen[..., None], beyond.float()[..., None], flags], dim=-1
            )
            rows = torch.nn.functional.pad(rows, (0, ROW_WEIGHTS - rows.shape[-1]))
            self._row_counts = torch.cat([flags.sum(1), beyond.sum(-1, keepdim=True).float()], dim=-1).long()
            self._kernel_inputs = KernelInputs(features.contiguous(), rt.contiguous(), rows.contiguous(), s)
        return self._kernel_inputs

    def add_sums(self, layer: int, sums, pair_weights) -> None:
        """Add a fused kernel's sums over every query row of one layer (:class:`rapids_attn.extract.fused.LayerSums`
        of the reducer's heads), then the repeat detectors' hits: the weights of the batch's listed duplicate-token,
        induction and far-induction positions, ``pair_weights(example, row, key) -> [P, head]`` (the kernel's
        log-sum-exp gathers), added to their example's sums by one ``index_add_``. The layer is finished by
        :meth:`end_layer` as after :meth:`add_rows`."""
        from rapids_attn.extract.fused import SUMS

        pos = self.layer_pos.get(layer)
        if pos is None:
            return
        if (here := self.on(sums.sums.device)) is not self:  # a layer on another GPU (model.device_map)
            return here.add_sums(layer, sums, pair_weights)
        self.kernel_inputs()
        x = sums.sums
        b, h = x.shape[0], x.shape[1]
        acc = self._sums.get(layer)
        if acc is None:
            acc = self._sums[layer] = _RowSums(b, h, self.image_size, x.device)
        diag0 = SUMS[f"diag{PROFILE_OFFSETS[0]:+d}"]
        pm0 = SUMS["pattern_mass0"]
        acc.keys += x[..., : SUMS["mass"] + 1]
        acc.entropy += x[..., SUMS["entropy"]]
        acc.entropy_norm += x[..., SUMS["entropy_norm"]]
        acc.row_max += x[..., SUMS["row_max"]]
        acc.distance += x[..., SUMS["distance"]]
        acc.stream += x[..., SUMS["stream"]]
        acc.diagonal += x[..., diag0 : diag0 + len(PROFILE_OFFSETS)]
        acc.pattern_mass += x[..., pm0 : pm0 + 3]
        acc.image += sums.image
        acc.rows += self._row_counts
        t = self.batch.width
        # every row at once where the batch's positions are on the device; else (a long repetitive input) a
        # blocked path's block of rows at a time, listed on the host as they come
        step = t if self.patterns.kept else block_rows(b, h, t, self.block_bytes)
        for r0 in range(0, t, step):
            entries = self.patterns.block(r0, min(step, t - r0), slice(None))
            if entries is None:
                continue
            eb, ei, ek, slot = entries
            got = pair_weights(eb, ei + r0, ek)  # [P, head]
            acc.hits.reshape(b * 3, -1).index_add_(0, slot, got)

    def _distance_rows(self, n: int, r0: int, m: int, device, band: bool = False) -> torch.Tensor:
        """[m, n]: |i - j| for rows r0 .. r0 + m - 1 against keys 0 .. n - 1 (bidirectional maps; causal ones use a
        closed form), or with ``band`` 1 where |i - j| < RECENT_WINDOW. Cached while they fit in block_bytes; the
        same for every example with these rows and keys."""
        key = (n, r0, m, band)
        d = self._dist.get(key)
        if d is None:
            i = torch.arange(r0, r0 + m, device=device, dtype=torch.float32)[:, None]
            d = (torch.arange(n, device=device, dtype=torch.float32)[None, :] - i).abs()
            if band:
                d = (d < RECENT_WINDOW).float()
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
        past it never count (masked, in one pass), so padding never enters a map. ``K`` may stop short of the
        batch's length: the keys after it have no weight (a causal block of rows reads the keys up to its last
        row only). ``row_entropy`` and ``row_max`` [batch, head, rows], when the caller has them from its softmax,
        spare a pass over the block each.

        With ``softmax`` (:class:`SoftmaxRows`), ``block`` holds the softmax's numerators ``exp(s_ij - top_i)``,
        not yet divided by their row sums ``z_i``: the one product over the block that the signature needs also
        gives ``z_i`` (the key columns' mass) and ``sum_j exp(s_ij - top_i) k_j``, hence each row's entropy
        ``log z_i + top_i - q_i . sum_j p_ij k_j``, and every sum is scaled by ``1 / z_i`` after. That spares
        the caller three passes over the block (the row sums, the division, the entropy's product). The keys past
        an example's length must be hidden by the model's mask (they are: it is the padding mask).

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
        if (here := self.on(block.device)) is not self:  # a layer on another GPU (model.device_map)
            return here.add_rows(
                layer, block, first_row, selected, row_entropy, row_max, softmax, example, log_seen, spans, sinks
            )
        w = block if selected else self.select_heads(block)
        bs = slice(None) if example is None else slice(example, example + 1)
        n_host = self._n_host[bs]
        r0 = first_row
        m = min(w.shape[2], int(n_host.max()) - r0)  # rows past every example's length are nobody's
        if m <= 0:
            return
        kw = min(w.shape[3], self.batch.width)
        acc = self._sums.get(layer)
        if acc is None:
            acc = self._sums[layer] = _RowSums(len(self.lengths), w.shape[1], self.image_size, w.device)
        bw = self.batch
        dev = w.device
        row_ok = bw.row_ok[bs, r0 : r0 + m]  # [b, m] bool: rows an example has
        s = self.image_size
        nb = self._image_rows(bs, r0, m)
        # the image's S columns of R.T ride in the block's one product where the block reaches half the image's
        # rows or more (short maps: every row); else (a long map's block reaches one or two) R's rows go first
        merged = 2 * nb >= s
        inv = cr = None
        if softmax is None:
            # the rows and keys an example has, the rest 0: one pass, and every sum below reads a plain map
            c = torch.where(
                row_ok[:, None, :, None] & bw.row_ok[bs, None, None, :kw], w[:, :, :m, :kw].float(), 0.0
            )  # [b, head, m, kw]
            # [b, head, m, 5 (+ S)]: key columns, sum_j a_ij j (and the rows times R.T)
            prod = _rows_times(c, bw.right_rt[bs, :kw] if merged else bw.right_rt[bs, :kw, :5])
            both, cr = prod[..., :5], prod[..., 5:] if merged else None
        else:  # numerators: the same product with each head's keys beside, then divided by the row sums
            c = w[:, :, :m, :kw]
            right = acc.right_with_keys(bw.right_rt, bw.row_ok, softmax.keys, softmax.values)
            width = right.shape[-1] - (0 if merged else s)
            full = torch.matmul(c, right[:, :, :kw, :width])  # [b, head, m, 5 + d (+ d_v) (+ S)]
            if merged:
                cr = full[..., width - s :]
            z = full[..., _K["mass"]]
            inv = torch.where(row_ok[:, None, :], 1.0 / z.clamp_min(1e-30), 0.0)  # [b, head, m]; 0: not a row
            d = softmax.queries.shape[-1]
            dot = (full[..., 5 : 5 + d] * softmax.queries[:, :, :m].float()).sum(-1) * inv  # sum_j p_ij s_ij
            if softmax.values is not None:  # the rows' attention output: sum_j p_ij v_j (0 past a length)
                softmax.out[:, :, r0 : r0 + m] = full[..., 5 + d : width - (s if merged else 0)] * inv[..., None]
            row_entropy = torch.log(z.clamp_min(1e-30)) + softmax.top[:, :, :m].float() - dot  # masked below
            row_max = inv
            both = full[..., :5] * inv[..., None]
        keys = both[..., :4]  # a fresh product's columns: changed in place below
        if sinks is not None:  # windows: a row's first token is its window's, what the model read as its start
            start = sinks[:m, 0].to(dev)
            on_start = self._on_window_start(c, start, inv)
            keys[..., _K["first"]] = on_start
            # counted as first, never twice (TokenMasks leaves position 0 out of sep for the same reason)
            sep_start = bw.right[bs, :, _K["sep"]].gather(1, start.clamp(0, kw - 1)[None].expand(c.shape[0], -1))
            keys[..., _K["sep"]] -= on_start * (sep_start * (start > 0))[:, None, :]
        acc.keys[bs] += keys.sum(2)
        self._add_image(acc.image[bs], c, cr, bw.right_rt[bs, :, 5:], bs, r0, m, kw, nb, inv)
        if row_entropy is None:
            ent = -(c * torch.log(c.clamp_min(1e-30))).sum(-1)  # [b, head, m]: 0 on rows an example lacks
        else:
            ent = torch.where(row_ok[:, None, :], row_entropy[:, :, :m].float(), 0.0)
        acc.entropy[bs] += ent.sum(-1)
        if log_seen is None:
            inv_log = bw.inv_log_seen[bs, r0 : r0 + m]  # [b, m]
        else:  # windows: each row's own keys; rows before the first that sees two keys do not count
            n0 = int(n_host[0])  # host arithmetic, as SignatureWeights.first_valid
            first_valid = (1 if self.causal else 0) if n0 > 1 else n0
            at = torch.arange(r0, r0 + m, device=dev)
            inv_log = torch.where(at >= first_valid, 1.0 / log_seen[:m].to(dev), 0.0)[None]
        acc.entropy_norm[bs] += (ent * inv_log[:, None, :]).sum(-1)
        if row_max is None:
            rm = c.amax(-1)
        else:
            rm = torch.where(row_ok[:, None, :], row_max[:, :, :m].float(), 0.0)
        acc.row_max[bs] += rm.sum(-1)
        rows = torch.arange(r0, r0 + m, device=dev)
        # a[i, i + o] for every offset of the profile (self, prev and next among them)
        at = rows[:, None] + self._offsets.to(dev)[None, :]  # [m, offsets]
        seen = (at[None] >= 0) & (at[None] < bw.n_long[bs, None, None]) & (at[None] < kw)  # [b, m, offsets]
        got = c.gather(-1, at.clamp(0, kw - 1).expand(*c.shape[:2], -1, -1))  # [b, head, m, offsets]
        if inv is not None:
            got = got * inv[..., None]
        acc.diagonal[bs] += (got * seen[:, None]).sum(2)
        mass = keys[..., _K["mass"]]  # [b, head, m]: each row's mass (0 on rows an example lacks)
        if self.causal:  # sum_j a_ij |i - j| = i * mass_i - sum_j a_ij j when nothing is above the diagonal
            acc.distance[bs] += (rows.float() * mass - both[..., 4]).sum(-1)
        else:  # sum_j a_ij |i - j|: one pass against the rows' |i - j| (a product per row would be slower: N = 1)
            d = (c * self._distance_rows(kw, r0, m, dev)).sum(-1)
            acc.distance[bs] += (d if inv is None else d * inv).sum(-1)
        self._streaming(acc, bs, c, r0, rows, mass, inv, spans, sinks)
        self._repeats(acc, bs, c, r0, m, mass, inv, spans)

    @staticmethod
    def _on_window_start(c: torch.Tensor, start: torch.Tensor, inv=None) -> torch.Tensor:
        """[b, head, rows]: each row's weight on its window's first token (``start`` [rows], a position of the
        whole input; -1 or one past the block's keys for none). On BERT that is the repeated [CLS], position 0 for
        every window; on a tokenizer without a leading special token (GPT-2) the window's first content token."""
        kw = c.shape[-1]
        seen = ((start >= 0) & (start < kw)).to(c.dtype)
        idx = start.clamp(0, kw - 1)[None, None, :, None].expand(*c.shape[:2], -1, 1)
        got = c.gather(-1, idx)[..., 0] * seen
        return got if inv is None else got * inv

    def _image_rows(self, bs, r0: int, m: int) -> int:
        """How many of the image's S rows the block's rows r0 .. r0 + m - 1 reach in any example (host arithmetic on
        the lengths): from ``floor(r0 S / n)`` to ``ceil(min(r0 + m, n) S / n)``, exclusive."""
        s, n = self.image_size, self._n_host[bs]
        n = n[n > r0]  # examples with rows in this block
        lo = (r0 * s) // n
        hi = -(-(np.minimum(r0 + m, n) * s) // n)
        return min(int((hi - lo).max()), s)

    def _add_image(self, image, c, cr, rt, bs, r0: int, m: int, kw: int, nb: int, inv) -> None:
        """Add rows r0 .. r0 + m - 1 of the batch's maps to their images R @ a @ R.T (``image`` [b, head, S, S],
        ``rt`` [b, T, S] each example's R.T, 0 past its length; ``cr`` [b, head, m, S] the rows times R.T where
        the block's product gave them). A block of rows reaches only the ``nb`` output rows whose area it overlaps
        (one or two of S for a long map), so the product starts there: each example's first such row is
        ``floor(r0 S / n)``, worked out on the device; those columns of R.T are gathered, multiplied through, and
        added back at their rows."""
        s = self.image_size
        b, h = c.shape[0], c.shape[1]
        if nb >= s:  # every output row: R's rows as they are
            left = rt[:, r0 : r0 + m].transpose(1, 2)[:, None]  # [b, 1, S, m]
            idx = None
        else:
            first = torch.div(r0 * s, self.batch.n_long[bs], rounding_mode="floor")  # [b]
            idx = first[:, None] + torch.arange(nb, device=c.device)[None, :]  # [b, nb]
            inside = idx < s
            idx = idx.clamp(max=s - 1)
            left = rt[:, r0 : r0 + m].gather(2, idx[:, None, :].expand(-1, m, -1)) * inside[:, None, :]  # [b, m, nb]
            left = left.transpose(1, 2)[:, None]  # [b, 1, nb, m]
        if inv is not None:  # numerators: / z
            left = left * inv[:, :, None, :]
        if cr is not None:
            part = torch.matmul(left, cr)  # [b, head, nb, S]
        else:
            part = torch.matmul(left, c)  # [b, head, nb, kw]
            part = torch.bmm(part.reshape(b, h * nb, kw), rt[:, :kw]).view(b, h, nb, s)
        if idx is None:
            image += part
        else:
            image.scatter_add_(2, idx[:, None, :, None].expand(-1, h, -1, s), part)

    def _streaming(self, acc, bs, c, r0: int, rows, mass, inv=None, spans=None, sinks=None) -> None:
        """The streaming detector's sums: each row's mass on the recent window |i - j| < RECENT_WINDOW
        (:meth:`_band_mass`) and on the sink tokens outside it, over the rows that see beyond both (``spans``:
        within their window's content, :meth:`add_rows`)."""
        w = RECENT_WINDOW
        m, kw = c.shape[2], c.shape[3]
        n_max = int(self._n_host[bs].max())
        if spans is None and r0 + m - 1 < SINK_TOKENS + w and (self.causal or n_max - 1 - w < r0):
            return  # no row of this block can see beyond the sink and the recent window: known on the host
        n = self.batch.n_long[bs, None]  # [b, 1]
        i = rows[None, :]  # [1, m]
        if spans is not None:  # a content key past the window's sink tokens with |i - j| >= w, among those seen
            sp = spans[:m].to(c.device)
            lo = sp[:, 2]
            hi = torch.minimum(sp[:, 1], rows + 1) if self.causal else sp[:, 1]  # exclusive
            beyond = lo <= torch.minimum(rows - w, hi - 1)
            if not self.causal:
                beyond |= torch.maximum(rows + w, lo) <= hi - 1
            beyond = beyond[None]
        elif self.causal:
            beyond = i >= SINK_TOKENS + w
        else:
            beyond = (i >= SINK_TOKENS + w) | (i + w <= n - 1)
        beyond = beyond & (i < n)  # [b, m]
        near = self._band_mass(c, r0)  # [b, head, m]
        ii = rows[:, None]
        if sinks is None:  # the input's first tokens
            sink_cols = torch.arange(min(SINK_TOKENS, kw), device=c.device)[None, :]
            got = c[..., : sink_cols.shape[1]]
        else:  # each row's window's first tokens
            sink_cols = sinks[:m].to(c.device)
            got = c.gather(-1, sink_cols.clamp(0, kw - 1).expand(*c.shape[:2], -1, -1))
        # sink tokens outside the window (inside it they count once)
        far_sink = ((sink_cols >= 0) & (sink_cols < kw) & ((ii - sink_cols).abs() >= w)).float()
        near = near + (got * far_sink).sum(-1)
        if inv is not None:  # the block holds numerators: divide by the row sums
            near = near * inv
        acc.stream[bs] += (near * beyond[:, None, :]).sum(-1)
        acc.rows[bs, 3] += beyond.sum(-1)

    def _band_mass(self, c: torch.Tensor, r0: int) -> torch.Tensor:
        """[b, head, rows]: each row's mass on the keys within RECENT_WINDOW of it (``|i - j| < W``; ``i - W < j <=
        i`` when causal, the keys after a row weighing nothing), for rows r0.. of a block ``c`` [b, head, rows, K].
        The rows whose band lies inside the block's keys read it as a strided view (row i's band starts one
        element further along than row i - 1's: a stride of the row's plus one), no index and no copy; only
        the rows at the edges gather theirs. Up to 8 x RECENT_WINDOW keys, where most rows are edge rows, one pass
        against the rows' band is cheaper."""
        w = RECENT_WINDOW
        nb, h, m, kw = c.shape
        if kw <= BAND_VIEW_KEYS:
            return (c * self._distance_rows(kw, r0, m, c.device, band=True)).sum(-1)
        lo, hi = -(w - 1), 0 if self.causal else w - 1  # the band's first and last key, from the diagonal
        a = min(max(0, -(r0 + lo)), m)  # rows a .. b - 1: those whose band is inside [0, kw)
        b = max(a, min(m, kw - hi - r0))
        if c.stride(-1) != 1:
            a = b = 0
        out = c.new_empty(nb, h, m)
        if a < b:
            band = c.as_strided(
                (nb, h, b - a, hi - lo + 1),
                (c.stride(0), c.stride(1), c.stride(2) + 1, 1),
                c.storage_offset() + a * (c.stride(2) + 1) + r0 + lo,
            )
            out[..., a:b] = band.sum(-1)
        if a > 0 or b < m:  # the rows at the edges: 0 .. a - 1 and b .. m - 1
            e = torch.cat([torch.arange(a, device=c.device), torch.arange(b, m, device=c.device)])
            cols = (e + r0)[:, None] + torch.arange(lo, hi + 1, device=c.device)[None, :]  # [edge rows, band]
            inside = (cols >= 0) & (cols < kw)
            got = c[:, :, e].gather(-1, cols.clamp(0, kw - 1).expand(nb, h, -1, -1))
            out[..., e] = (got * inside).sum(-1)
        return out

    def _repeats(self, acc, bs, c, r0: int, m: int, mass, inv=None, spans=None) -> None:
        """The duplicate-token, induction and far-induction sums of a block: each pattern position's weight,
        gathered at once for the whole batch (:class:`_Patterns`) and added to its example's sums; the mass of
        the rows that have a position in each."""
        entries = self.patterns.block(r0, m, bs)
        b = c.shape[0]
        flags = self.patterns.row_flags[bs, r0 : r0 + m]  # [b, m, 3]
        if entries is not None:
            eb, ei, ek, slot = entries  # each [P]: example (within bs), row (block-local), key, sum slot
            got = c[eb, :, ei, ek]  # [P, head]
            if inv is not None:  # numerators: divide by their rows' sums
                got = got * inv[eb, :, ei]
            if spans is not None:  # windows: a far target counts where the row's window holds it
                far = slot % 3 == 2
                held = ek >= spans[:m, 0].to(c.device)[ei]
                got = got * (~far | held)[:, None]
                far_held = (far & held).float()  # added up by row: no boolean selection (a sync)
                far_rows = torch.zeros(b, m, device=c.device).index_put_((eb, ei), far_held, accumulate=True)
                flags = torch.cat([flags[..., :2], (far_rows > 0).float()[..., None]], dim=-1)
            hits = acc.hits[bs].reshape(b * 3, -1)  # [b x 3, head]: a view (hits is [batch, 3, head])
            hits.index_add_(0, slot, got)
        elif spans is not None:
            flags = torch.cat([flags[..., :2], torch.zeros_like(flags[..., 2:])], dim=-1)
        acc.pattern_mass[bs] += torch.matmul(mass, flags)  # [b, head, 3]
        acc.rows[bs, :3] += flags.sum(1).long()

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
        lengths = self.batch.n.to(dev)
        n = lengths[:, None]  # [batch, 1]: broadcast over heads
        nan = torch.tensor(float("nan"), device=dev)
        first_valid = self.batch.first_valid.to(dev)[:, None]  # SignatureWeights.first_valid
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
        o = self._offsets.to(dev).abs().float()  # [offsets]
        seen = lengths[:, None, None] > o  # an offset the map has a diagonal at
        self.profile[:, pos] = torch.where(seen, diag / torch.where(seen, lengths[:, None, None] - o, 1.0), 0.0).to(
            self.profile.device
        )
        total = keys[..., _K["mass"]]
        prev_hit = torch.where(more, diag[..., zero - 1], 0.0)
        hits, rows, pm = acc.hits.transpose(1, 2), acc.rows[:, None, :], acc.pattern_mass
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


def _rows_times(c: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """[b, head, m, K] @ [b, K, X] -> [b, head, m, X]: the heads' rows stacked into one product per example (a
    right-hand side broadcast over the heads would be copied once per head)."""
    b, h, m, k = c.shape
    return torch.bmm(c.reshape(b, h * m, k), right).view(b, h, m, right.shape[-1])


@dataclass
class BatchWeights:
    """What a batch's maps are reduced against, the same for every layer and head, built once per batch on the
    device with a fixed number of operations: each example's length, the key columns and positions ``right``
    [batch, T, 5] (first, sep, punct, mass, j; 0 past the length) beside the area resize's R.T [batch, T, S] in
    ``right_rt``,
    the rows it has ``row_ok`` [batch, T], and ``inv_log_seen`` [batch, T], one over the log of the keys each row
    sees, 0 on the rows the normalised entropy leaves out (the first of a causal map, every row at n = 1)."""

    width: int  # T
    n: torch.Tensor  # [batch] float32
    n_long: torch.Tensor  # [batch] int64
    first_valid: torch.Tensor  # [batch] float32: SignatureWeights.first_valid of each example
    row_ok: torch.Tensor
    right_rt: torch.Tensor  # [batch, T, 5 + S]: right, then rt
    inv_log_seen: torch.Tensor

    @property
    def right(self) -> torch.Tensor:
        return self.right_rt[..., :5]

    def to(self, device) -> BatchWeights:
        """The same weights on ``device`` (:meth:`LayerReducer.on`)."""
        moved = {f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self) if f.name != "width"}
        return dataclasses.replace(self, **moved)

    @classmethod
    def build(cls, lengths: np.ndarray, masks: TokenMasks, size: int, causal: bool, device) -> BatchWeights:
        t = masks.sep.shape[1]
        n_long = torch.as_tensor(lengths, dtype=torch.long).to(device)
        n = n_long.float()
        j = torch.arange(t, device=device)
        row_ok = j[None, :] < n_long[:, None]  # [b, T]
        ok = row_ok.float()
        right = torch.stack(
            [
                (j == 0).float().expand(len(lengths), -1),
                masks.sep.to(device).float() * ok,
                masks.punct.to(device).float() * ok,
                ok,
                j.float()[None, :] * ok,
            ],
            dim=-1,
        )
        # R[b, i, j] = overlap of input cell [j, j + 1) with output cell [i n/S, (i + 1) n/S), times S/n (_area_weights)
        n64 = n_long.double()[:, None, None]
        edges = torch.arange(size + 1, device=device, dtype=torch.float64)[None, :, None] * (n64 / size)
        jj = j.double()[None, None, :]
        lo = torch.maximum(edges[:, :-1], jj)
        hi = torch.minimum(edges[:, 1:], jj + 1)
        rt = ((hi - lo).clamp_min(0) * (size / n64)).float().transpose(1, 2)  # [b, T, S]
        more = n_long > 1
        first_valid = torch.where(more, 1 if causal else 0, n_long)
        if causal:
            seen = j.float()[None, :] + 1.0  # row i sees i + 1 keys
        else:
            seen = n[:, None].expand(-1, t)
        counted = row_ok & (j[None, :] >= first_valid[:, None]) & more[:, None]
        inv_log_seen = torch.where(counted, 1.0 / torch.log(seen.clamp_min(2.0)), 0.0)
        right_rt = torch.cat([right, rt], dim=-1)
        return cls(t, n, n_long, first_valid.float(), row_ok, right_rt, inv_log_seen)


#: the most bytes of pattern positions a batch keeps on the device for every layer (:class:`_Patterns`): past it (a
#: repetitive 32k-token document lists millions) each block's are worked out on the host again, each layer
PAIRS_CACHE_BYTES = 32 << 20


class _Patterns:
    """The duplicate-token, induction and far-induction pattern positions of a batch, for the detectors without an
    n x n pattern, worked out on the host from the token ids (numpy, vectorised over the batch) when the reducer is
    built: the same for every layer, so no layer waits for them.

    Positions are sorted by row, rows across the batch (row 0 of every example, then row 1 ...), so a block of rows
    ``r0 .. r0 + m - 1`` is one slice, found on the host by :func:`numpy.searchsorted`. Each entry is (example, row,
    key, slot): ``slot`` = example x 3 + kind, the sum it adds to (0: an earlier copy of the row's token, 1: the
    token after one, 2: that token at least RECENT_WINDOW back). Where the whole batch's entries fit in
    :data:`PAIRS_CACHE_BYTES` they are moved to the device once; otherwise each block's are listed on the host when
    it comes (and kept, while that budget lasts). ``row_flags`` [batch, T, 3]: the rows that have a position of
    each kind (the conditional scores' denominators)."""

    def __init__(self, ids: np.ndarray, lengths: np.ndarray, device):
        self.device = device
        b, t = ids.shape
        self.n_examples = b
        valid = np.arange(t)[None, :] < lengths[:, None]
        ii, bb = np.nonzero(valid.T)  # every position, row-major across the batch
        tok = ids[bb, ii]
        order = np.lexsort((ii, tok, bb))  # by example, then token, then position: a token's copies in order
        sb, st = bb[order], tok[order]
        first = np.ones(len(order), dtype=bool)
        first[1:] = (sb[1:] != sb[:-1]) | (st[1:] != st[:-1])
        start = np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
        self._rank = np.empty(len(order), dtype=np.int64)  # how many earlier copies each position has
        self._rank[order] = np.arange(len(order)) - start
        self._start = np.empty(len(order), dtype=np.int64)  # where its token's copies start in ``order``
        self._start[order] = start
        self._copies = ii[order]  # positions of each token's copies, in order
        self._bb, self._ii = bb, ii
        self._ptr = np.searchsorted(ii, np.arange(t + 1))  # row r's positions: _ptr[r] .. _ptr[r + 1]
        flags = np.zeros((b, t, 3), dtype=np.float32)
        has = self._rank > 0
        flags[bb[has], ii[has], 0] = 1.0
        flags[bb[has], ii[has], 1] = 1.0
        # a far target: the token after the first copy is at least RECENT_WINDOW back
        firstpos = self._copies[self._start]
        flags[bb, ii, 2] = (has & (ii - (firstpos + 1) >= RECENT_WINDOW)).astype(np.float32)
        self.row_flags = torch.from_numpy(flags).to(device)
        total = int(self._rank.sum())
        self._row_of_entries = None
        self._held: dict[tuple[int, int], tuple | None] = {}
        self._budget = PAIRS_CACHE_BYTES
        #: whether the whole batch's entries are on the device (else listed per block)
        self.kept = total > 0 and 3 * total * 4 * 8 <= self._budget
        if self.kept:
            rows, entries = self._entries(0, len(ii))
            self._row_of_entries = rows
            self._all = tuple(torch.from_numpy(e).to(device) for e in entries)

    def to(self, device) -> _Patterns:
        """The same positions for a reducer on ``device`` (:meth:`LayerReducer.on`): the host arrays shared, the
        device tensors copied there, and a cache of listed blocks of its own."""
        other = copy.copy(self)
        other.device = device
        other.row_flags = self.row_flags.to(device)
        if self.kept:
            other._all = tuple(e.to(device) for e in self._all)
        other._held, other._budget = {}, PAIRS_CACHE_BYTES
        return other

    def _entries(self, p0: int, p1: int):
        """The entries of positions p0 .. p1 - 1 (row-major), sorted by row: (their rows, (example, row, key,
        slot) arrays)."""
        rank = self._rank[p0:p1]
        total = int(rank.sum())
        pos = np.repeat(np.arange(p0, p1), rank)  # each earlier copy's query position
        offset = np.arange(total) - np.repeat(np.cumsum(rank) - rank, rank)
        k = self._copies[np.repeat(self._start[p0:p1], rank) + offset]  # the earlier copy
        eb, ei = self._bb[pos], self._ii[pos]
        far = ei - (k + 1) >= RECENT_WINDOW
        ex = np.concatenate([eb, eb, eb[far]])
        rows = np.concatenate([ei, ei, ei[far]])
        keys = np.concatenate([k, k + 1, (k + 1)[far]])
        kind = np.concatenate([np.zeros(total, np.int64), np.ones(total, np.int64), np.full(int(far.sum()), 2)])
        o = np.argsort(rows, kind="stable")
        ex, rows, keys, kind = ex[o], rows[o], keys[o], kind[o]
        return rows, (ex, rows, keys, ex * 3 + kind)

    def block(self, r0: int, m: int, bs: slice):
        """The entries of rows r0 .. r0 + m - 1 as device tensors (example within ``bs``, block row, key, slot
        within ``bs``), or None where the block has none."""
        if self.kept:
            a, z = np.searchsorted(self._row_of_entries, [r0, r0 + m])
            if a == z:
                return None
            eb, ei, ek, slot = (e[a:z] for e in self._all)
        else:
            key = (r0, m)
            if key in self._held:
                got = self._held[key]
            else:
                p0, p1 = int(self._ptr[min(r0, len(self._ptr) - 1)]), int(self._ptr[min(r0 + m, len(self._ptr) - 1)])
                _, entries = self._entries(p0, p1)
                got = None if len(entries[0]) == 0 else tuple(torch.from_numpy(e).to(self.device) for e in entries)
                size = 0 if got is None else sum(e.numel() * e.element_size() for e in got)
                if size <= self._budget:
                    self._held[key] = got
                    self._budget -= size
            if got is None:
                return None
            eb, ei, ek, slot = got
        ei = ei - r0
        if bs.start is not None and self.n_examples > 1:  # one example's block of a batch: its own entries
            # (a boolean selection, a sync; the windows' reducer holds one example and never comes here)
            eb_host = bs.start
            keep = eb == eb_host
            eb, ei, ek, slot = eb[keep] - eb_host, ei[keep], ek[keep], slot[keep] - 3 * eb_host
        return eb, ei, ek, slot


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
        self.hits = z(batch, 3, heads)  # duplicate-token, induction, far induction (kind-major: index_add's rows)
        self.pattern_mass = z(batch, heads, 3)  # the mass of the rows that have a position in each
        self.stream = z(batch, heads)  # mass on the sink tokens and the recent window, rows that see beyond
        #: rows with a duplicate, induction, far-induction target; rows that see beyond the streaming set
        self.rows = torch.zeros(batch, 4, device=device, dtype=torch.int64)
        self._right: torch.Tensor | None = None

    def right_with_keys(
        self, right_rt: torch.Tensor, row_ok: torch.Tensor, keys: torch.Tensor, values: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[batch, head, T, 5 + d (+ d_v) + S]: the key columns and positions, each head's keys [batch, head, T, d]
        (and values), and R.T (``right_rt`` [batch, T, 5 + S]), 0 past each example's length, built once a layer
        (the keys are the layer's)."""
        if self._right is None:
            h, t = keys.shape[1], keys.shape[2]
            each = right_rt[:, :t, None].expand(-1, -1, h, -1).transpose(1, 2)  # [b, head, T, 5 + S]
            parts = [each[..., :5], keys.float()] + ([] if values is None else [values.float()]) + [each[..., 5:]]
            full = torch.cat(parts, dim=-1)
            self._right = torch.where(row_ok[:, None, :t, None], full, 0.0)
        return self._right
