"""Inputs longer than the model's positions, read as overlapping windows (``model.long_inputs: windows``).

An encoder such as BERT has 512 positions. Instead of cutting a long input there, it is read as windows of
``max_length`` tokens: each window is the input's leading special tokens ([CLS]), a stretch of its content,
and its trailing special tokens ([SEP]); consecutive stretches share ``model.window_overlap`` tokens. The
windows run through the model as one batch, and each query row of the input is taken from exactly one window,
the one that *owns* it:

- bidirectional attention: the window where the token is furthest from an edge, i.e. the overlap between two
  windows is split at its middle, so every owned row has at least ``overlap / 2`` tokens of context on each
  side that a window cut exists on;
- causal attention: the earliest window that holds it after the previous window has ended, so every owned
  row past the first window has at least ``overlap`` tokens of left context;
- the leading special tokens belong to the first window, the trailing ones to the last.

Each owned row is put back at its place in the input: its weights on the window's keys go to those keys'
positions in the whole input, and it has no weight on keys outside its window (it did not see them). The
input's maps are then [T, T] band matrices, and the reducer (:class:`rapids_attn.extract.maps.LayerReducer`)
turns them into images, statistics, profiles and detectors exactly as for any other input; the normalised
entropy divides by the log of the keys a row could see in its window. Compute grows as T x T per head (the
rows are placed into the whole input's width), memory as one block of rows.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from rapids_attn.extract.maps import SinkNeeds
from rapids_attn.extract.signature import SINK_TOKENS


@dataclass
class Window:
    #: the window's input positions in the whole input, in window order: [length]
    positions: torch.Tensor
    #: window-local rows this window owns (its rows' places: ``positions[owned]``)
    owned: torch.Tensor
    #: the input positions [start, end) of the content it holds (its special tokens aside)
    span: tuple[int, int] = (0, 0)


@dataclass
class WindowPlan:
    """How one long input is read: its windows' token ids (and segment ids), and which rows each owns."""

    n_tokens: int
    windows: list[Window]
    input_ids: list[list[int]]
    token_type_ids: list[list[int]] | None


def template_ends(tokenizer) -> tuple[int, int]:
    """The leading and trailing special tokens the tokenizer's template puts around any input ([CLS], [SEP]),
    read off one encoded word, not off an input (whose own text may begin or end with a special token)."""
    return special_ends(tokenizer("a")["input_ids"], set(tokenizer.all_special_ids))


def special_ends(ids: list[int], special: set[int]) -> tuple[int, int]:
    """How many of ``ids``' leading and trailing tokens are special ([CLS] ... [SEP]): kept in every window."""
    p = 0
    while p < len(ids) and ids[p] in special:
        p += 1
    x = 0
    while x < len(ids) - p and ids[len(ids) - 1 - x] in special:
        x += 1
    return p, x


def plan_windows(
    ids: list[int],
    types: list[int] | None,
    max_length: int,
    overlap: int,
    ends: tuple[int, int],
    causal: bool,
) -> WindowPlan:
    """Windows of at most ``max_length`` tokens over ``ids``, consecutive ones sharing ``overlap`` content tokens.
    ``ends``: how many leading and trailing tokens every input has from the tokenizer's template ([CLS] and
    [SEP]: (1, 1); GPT-2: (0, 0)), repeated in every window (:func:`template_ends`).

    Raises ValueError when the special tokens leave no room for content, or the overlap leaves no stride."""
    n = len(ids)
    p, x = ends
    size = max_length - p - x  # content tokens per window
    if size < 1:
        raise ValueError(f"model.max_length: {max_length} leaves no room for content beside {p + x} special tokens")
    if overlap >= size:
        raise ValueError(
            f"model.window_overlap: {overlap} must be less than the {size} content tokens of a window "
            f"(max_length {max_length} less {p + x} special tokens)"
        )
    content = n - p - x
    stride = size - overlap
    starts = list(range(0, max(content - size, 0) + 1, stride))
    if starts[-1] + size < content:  # the last window ends at the content's end
        starts.append(content - size)
    bounds = _ownership(starts, size, content, causal)
    head = list(range(p))
    tail = list(range(n - x, n))
    windows, win_ids, win_types = [], [], []
    for k, (a, (o0, o1)) in enumerate(zip(starts, bounds, strict=True)):
        pos = head + list(range(p + a, p + min(a + size, content))) + tail
        local = {g: i for i, g in enumerate(pos)}
        owned = [local[p + c] for c in range(o0, o1)]
        if k == 0:
            owned = list(range(p)) + owned
        if k == len(starts) - 1:
            owned += [len(pos) - x + i for i in range(x)]
        span = (p + a, p + min(a + size, content))
        windows.append(Window(torch.tensor(pos, dtype=torch.long), torch.tensor(owned, dtype=torch.long), span))
        win_ids.append([ids[g] for g in pos])
        if types is not None:
            win_types.append([types[g] for g in pos])
    return WindowPlan(n, windows, win_ids, win_types if types is not None else None)


def _ownership(starts: list[int], size: int, content: int, causal: bool) -> list[tuple[int, int]]:
    """Each window's owned content range [o0, o1) (content coordinates): they tile 0 .. content."""
    cuts = []
    for k in range(len(starts) - 1):
        end_k, start_next = min(starts[k] + size, content), starts[k + 1]
        # causal: the next window owns what this one does not hold; bidirectional: the overlap's middle
        cuts.append(end_k if causal else (start_next + end_k + 1) // 2)
    lo = [0, *cuts]
    hi = [*cuts, content]
    return list(zip(lo, hi, strict=True))


class WindowSink:
    """Feeds a one-example :class:`~rapids_attn.extract.maps.LayerReducer` from the capture of a batch of
    windows: each window's owned rows, placed at their positions in the whole input."""

    #: the blocked capture hands this sink normalised weights (with each row's entropy and maximum)
    needs = SinkNeeds(rows=True)

    def __init__(self, reducer, plan: WindowPlan, causal: bool):
        self.reducer = reducer
        #: the windows of the forward under way (a long input's windows may take several forwards) and
        #: whether it is the last: the reducer finishes a layer after the last forward only
        self.chunk = range(len(plan.windows))
        self.last = True
        self.plan = plan
        self.block_bytes = reducer.block_bytes
        self.head_list = reducer.head_list
        self.n = plan.n_tokens
        dev = self._device = torch.device(reducer.device)
        self._windows = [(w.positions.to(dev), w.owned.to(dev)) for w in plan.windows]
        # the content each window's rows saw, and the window's first tokens (what the model read as its start:
        # [CLS] and the first content tokens, or the first content tokens alone): the streaming and retrieval
        # detectors count a row only where its window shows it keys beyond those and the recent window
        self._spans, self._sinks = [], []
        for w in plan.windows:
            first = w.positions[:SINK_TOKENS].tolist()
            past = max(w.span[0], max(first) + 1) if len(first) == SINK_TOKENS else w.span[1]
            self._spans.append(torch.tensor([[w.span[0], w.span[1], past]], dtype=torch.long, device=dev))
            self._sinks.append(torch.tensor([first + [-1] * (SINK_TOKENS - len(first))], dtype=torch.long, device=dev))
        # log of the keys each window-local row sees: the window's length, or its place + 1 when causal. A row
        # that sees one key (a causal window's first row, owned when windows do not overlap) has entropy 0;
        # its normalised entropy counts as 0 (log 2 keeps 0 / 0 out)
        self._log_seen = [
            torch.log(w.owned.double() + 1.0).clamp_min(math.log(2.0)).float().to(dev)
            if causal
            else torch.full((len(w.owned),), math.log(len(w.positions)), device=dev)
            for w in plan.windows
        ]

    def wants(self, layer: int) -> bool:
        return self.reducer.wants(layer)

    def __call__(self, layer: int, weights: torch.Tensor) -> None:  # the eager capture: whole maps
        if not self.reducer.wants(layer):
            return
        self.add_rows(layer, self.reducer.select_heads(weights), 0, selected=True)
        self.end_layer(layer)

    def add_rows(
        self,
        layer: int,
        block: torch.Tensor,
        first_row: int,
        selected: bool = False,
        row_entropy: torch.Tensor | None = None,
        row_max: torch.Tensor | None = None,
        **_,
    ) -> None:
        if not self.reducer.wants(layer):
            return
        w = block if selected else self.reducer.select_heads(block)
        if w.device != self._device:  # a layer on another GPU (model.device_map): its rows to the reducer's
            w = w.to(self._device)
            row_entropy = None if row_entropy is None else row_entropy.to(self._device)
            row_max = None if row_max is None else row_max.to(self._device)
        rows = w.shape[2]
        for j, k in enumerate(self.chunk):
            pos, owned = self._windows[k]
            here = (owned >= first_row) & (owned < first_row + rows)
            if not bool(here.any()):
                continue
            local = owned[here] - first_row  # rows of the block
            places = pos[owned[here]]  # their rows in the whole input
            # a causal block holds the window's keys up to its last row only: the rest weigh nothing
            kw = min(len(pos), w.shape[3])
            dense = w.new_zeros(1, w.shape[1], len(local), self.n, dtype=torch.float32)
            dense[0, :, :, pos[:kw]] = w[j, :, local, :kw].float()
            ent = None if row_entropy is None else row_entropy[j, :, local][None]
            top = None if row_max is None else row_max[j, :, local][None]
            seen = self._log_seen[k][here]
            spans = self._spans[k].expand(len(local), 3)
            sinks = self._sinks[k].expand(len(local), SINK_TOKENS)
            # owned rows are contiguous in the whole input except where the special tokens join them
            for a, b in _runs(places):
                self.reducer.add_rows(
                    layer,
                    dense[:, :, a:b],
                    int(places[a]),
                    selected=True,
                    row_entropy=None if ent is None else ent[:, :, a:b],
                    row_max=None if top is None else top[:, :, a:b],
                    example=0,
                    log_seen=seen[a:b],
                    spans=spans[a:b],
                    sinks=sinks[a:b],
                )

    def end_layer(self, layer: int) -> None:
        if self.last:
            self.reducer.end_layer(layer)


def _runs(places: torch.Tensor) -> list[tuple[int, int]]:
    """[a, b) index ranges of ``places`` over which it counts up by one."""
    if len(places) == 0:
        return []
    breaks = (torch.nonzero(places[1:] != places[:-1] + 1)[:, 0] + 1).tolist()
    edges = [0, *breaks, len(places)]
    return list(itertools.pairwise(edges))
