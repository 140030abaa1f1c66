"""SQuAD 2.0's official evaluation rules (the ``evaluate-v2.0.py`` script's normalisation, exact match, F1
and no-answer rule) and the best-span search over start/end logits, for the ``squad`` task metric."""

from __future__ import annotations

import collections
import re
import string

import numpy as np

from rapids_attn.data.example import Example

MAX_ANSWER_TOKENS = 30


def normalize_answer(s: str) -> str:
    """The official SQuAD 2.0 normalisation: lower case, no punctuation, no articles, single spaces."""
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s, flags=re.UNICODE).split())


def exact_score(gold: str, pred: str) -> int:
    return int(normalize_answer(gold) == normalize_answer(pred))


def f1_score(gold: str, pred: str) -> float:
    """The official token F1 (an empty side scores 1 only against an empty side)."""
    g, p = normalize_answer(gold).split(), normalize_answer(pred).split()
    if not g or not p:
        return float(g == p)
    same = sum((collections.Counter(g) & collections.Counter(p)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def gold_answers(ex: Example) -> list[str] | None:
    """The official rule: the answers that normalise to something, or [""] (no answer); None when the
    example says nothing (no answers and not labelled impossible)."""
    if ex.answers:
        return [a for a in ex.answers if normalize_answer(a)] or [""]
    return [""] if ex.label == "impossible" else None


def best_span(start: np.ndarray, end: np.ndarray, context: np.ndarray, max_len: int = MAX_ANSWER_TOKENS):
    """(score, i, j): the highest start[i] + end[j] over context tokens i <= j < i + max_len, first on ties;
    (-inf, -1, -1) without context tokens. ``context`` holds the context's token positions (contiguous)."""
    if context.size == 0:
        return float("-inf"), -1, -1
    c0, c1 = int(context[0]), int(context[-1]) + 1
    total = start[c0:c1, None].astype(np.float64) + end[None, c0:c1].astype(np.float64)
    ones = np.ones(total.shape, dtype=bool)
    total[~(np.triu(ones) & ~np.triu(ones, max_len))] = -np.inf
    i, j = np.unravel_index(int(np.argmax(total)), total.shape)
    return float(total[i, j]), c0 + int(i), c0 + int(j)


def gold_answer_tokens(enc, row: int, span: tuple[int, int] | None) -> tuple[int, int]:
    """Token (start, end) of the gold answer's characters ``span`` (:meth:`Example.answer_span`), else (0, 0):
    [CLS] (no answer, or one cut off by truncation)."""
    if span is None:
        return 0, 0
    c0, c1 = span
    seq, offsets = enc.sequence_ids(row), enc["offset_mapping"][row]
    toks = [t for t, s in enumerate(seq) if s == 1 and offsets[t][1] > c0 and offsets[t][0] < c1]
    if toks and offsets[toks[0]][0] <= c0 and offsets[toks[-1]][1] >= c1:
        return toks[0], toks[-1]
    return 0, 0
