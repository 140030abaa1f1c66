"""Tokenize a shard's examples and group them into length-bucketed batches under a token budget.

Examples are sorted by length and packed greedily so that ``batch size x longest input in the
batch`` stays within ``token_budget``: short inputs share big batches, long ones small batches,
and no batch is padded to the longest input of the dataset.
"""

from __future__ import annotations

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


def length_batches(
    lengths: list[int], token_budget: int, max_batch_size: int, attention_budget: int | None = None
) -> list[list[int]]:
    """Indices grouped so that len(batch) * max(length in batch) <= token_budget and, when given,
    len(batch) * max(length)^2 <= attention_budget (one layer's attention entries per head), so a
    batch's attention memory is bounded whatever the longest input; an input over a budget still
    gets a batch of its own."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
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
