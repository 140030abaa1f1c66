"""Tokenize a shard's examples and group them into length-bucketed batches under a token budget.

Examples are sorted by length and grouped so that ``batch size x longest input in the batch`` stays
within ``token_budget``: short inputs share big batches, long ones small batches, and no batch is
padded to the longest input of the dataset. Given a :class:`BatchCost`, the grouping is the one
that costs least, padding included (the extractor's); without, greedy packing (fewest batches).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rapids_attn.data.example import Example


@dataclass
class Tokenized:
    input_ids: list[list[int]]  # per example, truncated to max_length
    truncated: list[bool]  # True where the input was longer than max_length
    #: segment ids (BERT-style text pairs: 0 for the first text, 1 for the second), if the
    #: tokenizer makes them; models trained with segments need them to read a pair correctly.
    token_type_ids: list[list[int]] | None = None

    @property
    def lengths(self) -> list[int]:
        return [len(ids) for ids in self.input_ids]

    def batch(self, idx: list[int]) -> dict[str, list[list[int]]]:
        """The model inputs of examples ``idx``, unpadded (pad with ``tokenizer.pad``)."""
        out = {"input_ids": [self.input_ids[i] for i in idx]}
        if self.token_type_ids is not None:
            out["token_type_ids"] = [self.token_type_ids[i] for i in idx]
        return out


def _encode(tokenizer, examples: list[Example], truncation: bool, max_length: int | None):
    texts = [e.text for e in examples]
    pairs = [e.text_pair for e in examples]
    kwargs = {"truncation": "longest_first" if truncation else False, "max_length": max_length if truncation else None}
    if any(p is not None for p in pairs):
        if not all(p is not None for p in pairs):
            raise ValueError("a shard mixes single texts and text pairs")
        enc = tokenizer(texts, pairs, **kwargs)
    else:
        enc = tokenizer(texts, **kwargs)
    return enc["input_ids"], enc.get("token_type_ids")


def tokenize(tokenizer, examples: list[Example], max_length: int, windows: bool = False) -> Tokenized:
    """Tokenize with the model's special tokens; inputs over ``max_length`` are truncated (longest
    segment first, so a SQuAD context is cut before its question) and flagged, or with ``windows`` kept
    whole (the extractor reads them as overlapping windows: :mod:`rapids_attn.extract.windows`)."""
    full, types = _encode(tokenizer, examples, truncation=False, max_length=None)
    if windows:
        return Tokenized(input_ids=full, truncated=[False] * len(full), token_type_ids=types)
    long = [i for i, ids in enumerate(full) if len(ids) > max_length]
    if long:
        cut, cut_types = _encode(tokenizer, [examples[i] for i in long], truncation=True, max_length=max_length)
        for j, i in enumerate(long):
            full[i] = cut[j]
            if types is not None:
                types[i] = cut_types[j]
    truncated = [False] * len(full)
    for i in long:
        truncated[i] = True
    return Tokenized(input_ids=full, truncated=truncated, token_type_ids=types)


#: a batch's fixed cost (:class:`BatchCost`) in tokens' worth of their own work, by device. On the CPU, 64: over
#: 256 SQuAD questions in shards of 128 on MiniLM (one thread, the blocked capture; token = 768), the least-cost
#: grouping ran in 14.8 s with no fixed cost (256 batches), 15.2-15.9 s at 130 tokens (27 batches), 16.9 s at 390
#: (16 batches), and greedy packing in 21.0 s (9 batches; 45% more padded attention than none). On a GPU, where
#: launches weigh more and nothing was measured, the extractor keeps greedy packing (:meth:`BatchCost.for_model`).
CPU_OVERHEAD_TOKENS = 64


@dataclass(frozen=True)
class BatchCost:
    """What a forward of ``b`` inputs padded to ``T`` tokens costs, in units of one query-key pair's work:
    ``b T (token + T) + batch``. ``token``: one position's own work (projections, MLP) in pairs' worth, about
    twice the hidden size (12 h^2 multiply-adds against some 6 h a pair, the capture's reductions included);
    ``batch``: a batch's fixed cost (Python, kernel launches, the per-batch calls), in the same units."""

    token: float
    batch: float

    @classmethod
    def for_model(cls, hidden_size: int, device: str) -> BatchCost | None:
        """The CPU's cost for a model of this hidden size; None (greedy packing) on a GPU."""
        if str(device).startswith("cuda"):
            return None
        token = 2.0 * hidden_size
        return cls(token=token, batch=CPU_OVERHEAD_TOKENS * token)

    def __call__(self, b: int, longest: int) -> float:
        return b * longest * (self.token + longest) + self.batch


def length_batches(
    lengths: list[int],
    token_budget: int,
    max_batch_size: int,
    attention_budget: int | None = None,
    cost: BatchCost | None = None,
) -> list[list[int]]:
    """Indices grouped so that len(batch) * max(length in batch) <= token_budget and, when given,
    len(batch) * max(length)^2 <= attention_budget (one layer's attention entries per head), so a
    batch's attention memory is bounded whatever the longest input; an input over a budget still
    gets a batch of its own.

    With ``cost``, the grouping of the sorted lengths into consecutive runs that minimises the summed
    :class:`BatchCost` (dynamic programming, O(n x max_batch_size)); a long input then no longer pads a
    batch of short ones just because the token budget has room. Without, greedy packing."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    if cost is not None:
        return _least_cost(lengths, order, token_budget, max_batch_size, attention_budget, cost)
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        longest = lengths[cur[0]] if cur else lengths[i]
        over_attention = attention_budget is not None and (len(cur) + 1) * longest * longest > attention_budget
        if cur and ((len(cur) + 1) * longest > token_budget or over_attention or len(cur) >= max_batch_size):
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def _least_cost(lengths, order, token_budget, max_batch_size, attention_budget, cost: BatchCost) -> list[list[int]]:
    """``best[j]``: the least cost of the first j inputs (longest first); the last batch is ``order[i:j]``,
    padded to ``lengths[order[i]]``. Widening it only lengthens its longest input, so the first budget it
    breaks ends the search (a batch of one is always allowed)."""
    sl = [lengths[i] for i in order]
    n = len(sl)
    best = [0.0] + [math.inf] * n
    start = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j - 1, max(-1, j - 1 - max_batch_size), -1):
            b, longest = j - i, sl[i]
            over = b * longest > token_budget or (
                attention_budget is not None and b * longest * longest > attention_budget
            )
            if b > 1 and over:
                break
            c = best[i] + cost(b, longest)
            if c < best[j]:
                best[j], start[j] = c, i
    batches: list[list[int]] = []
    j = n
    while j > 0:
        batches.append(order[start[j] : j])
        j = start[j]
    return batches[::-1]
