"""Example.answer_span: where the gold answer lies in the context, and the stages that mark its tokens
(the relevance stage's answer role, the heads stage's gold span for the gradient importance's loss)."""

from __future__ import annotations

import numpy as np
from transformers import AutoTokenizer

from rapids_attn.data.example import Example
from rapids_attn.heads.squad_eval import gold_answer_tokens
from rapids_attn.relevance.work import answer_tokens

# "Mainz" twice: SQuAD marks the second (the answer to "where was it invented")
CONTEXT = "Mainz had a mint. The printing press was invented in Mainz, by Johannes Gutenberg."
MARKED = CONTEXT.rindex("Mainz")


def test_the_files_answer_start_wins_over_the_first_occurrence():
    ex = Example("a", "Where was the press invented?", CONTEXT, answers=("Mainz",), answer_starts=(MARKED,))
    assert ex.answer_span() == (MARKED, MARKED + 5)
    # no start in the file, or one that does not hold the answer's text: the first occurrence
    assert Example("b", "q", CONTEXT, answers=("Mainz",)).answer_span() == (0, 5)
    assert Example("c", "q", CONTEXT, answers=("Mainz",), answer_starts=(3,)).answer_span() == (0, 5)
    # the first answer found; none
    assert Example("d", "q", CONTEXT, answers=("Paris", "mint")).answer_span() == (12, 16)
    assert Example("e", "q", CONTEXT, answers=()).answer_span() is None
    assert Example("f", "q", None, answers=("Mainz",)).answer_span() is None


def test_the_answer_tokens_are_the_marked_occurrence(tiny_bert_dir):
    tok = AutoTokenizer.from_pretrained(tiny_bert_dir)
    ex = Example("a", "Where was the press invented?", CONTEXT, answers=("Mainz",), answer_starts=(MARKED,))
    enc = tok([ex.text], [CONTEXT], return_offsets_mapping=True)
    seq, offsets = enc.sequence_ids(0), enc["offset_mapping"][0]
    second = [t for t, s in enumerate(seq) if s == 1 and offsets[t][0] >= MARKED and offsets[t][1] <= MARKED + 5]
    assert second and offsets[second[0]][0] == MARKED
    marked = answer_tokens(ex, enc, 0)  # the relevance stage's answer role
    assert np.flatnonzero(marked).tolist() == second
    assert gold_answer_tokens(enc, 0, ex.answer_span()) == (second[0], second[-1])  # the heads stage's gold span
