"""Importance losses: per-example gates give each example's own gradient (batching changes nothing), the
gradient is the loss's derivative on the gate, and SQuAD's gold answer lands on its tokens."""

import numpy as np
import pytest
import torch
from helpers import tiny_bert_config
from transformers import (
    AutoTokenizer,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertModel,
    GPT2Config,
    GPT2LMHeadModel,
)

from rapids_attn.data.example import Example
from rapids_attn.heads import losses as L
from rapids_attn.heads import metrics as M
from rapids_attn.heads.hooks import HeadIntervention, head_sites
from rapids_attn.heads.squad_eval import gold_answer_tokens

CONTEXT = "The printing press was invented in the fifteenth century, in Mainz, by Johannes Gutenberg."
EXAMPLES = [
    Example("a", "Where was the printing press invented?", CONTEXT, label="yes", answers=("Mainz",)),
    Example("b", "Who invented it?", CONTEXT, label="no", answers=("Johannes Gutenberg",)),
    Example("c", "Who painted the ceiling?", "The chapel ceiling is from 1512, a long time ago.", label="yes"),
    Example("d", "When was the press invented, and where, and by whom?", CONTEXT, label="no", answers=("x",)),
]


@pytest.fixture(scope="module")
def tok(tiny_bert_dir):
    return AutoTokenizer.from_pretrained(tiny_bert_dir)


def bert(cls, tok, **kw):
    torch.manual_seed(0)
    return cls(tiny_bert_config(tok.vocab_size, **kw)).eval().requires_grad_(False)


def models(tok, tiny_gpt2_dir):
    gpt_tok = AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    torch.manual_seed(0)
    gpt = GPT2LMHeadModel(GPT2Config(vocab_size=len(gpt_tok), n_positions=128, n_embd=32, n_layer=2, n_head=2))
    gpt_tok.pad_token = gpt_tok.eos_token
    return {
        "squad": (bert(BertForQuestionAnswering, tok), tok),
        "accuracy": (
            bert(
                BertForSequenceClassification,
                tok,
                num_labels=2,
                label2id={"yes": 0, "no": 1},
                id2label={0: "yes", 1: "no"},
            ),
            tok,
        ),
        "lm": (gpt.eval().requires_grad_(False), gpt_tok),
    }


@pytest.mark.parametrize("name", ["squad", "accuracy", "lm"])
def test_per_example_importance_does_not_depend_on_the_batch(name, tok, tiny_gpt2_dir):
    model, t = models(tok, tiny_gpt2_dir)[name]
    metric, sites = M.metric_for(name), head_sites(model)
    together, n = L.importance_sums(metric, model, t, sites, EXAMPLES, "cpu", 64, batch_size=4)
    alone = sum(L.importance_sums(metric, model, t, sites, [e], "cpu", 64, batch_size=1)[0] for e in EXAMPLES)
    assert n == 4 and np.all(together > 0)
    np.testing.assert_allclose(together, alone, rtol=1e-4, atol=1e-7)  # padding and batch-mates change nothing


@pytest.mark.parametrize("name", ["squad", "accuracy"])
def test_importance_is_the_gate_derivative(name, tok, tiny_gpt2_dir):
    model, t = models(tok, tiny_gpt2_dir)[name]
    model = model.double()
    metric, sites = M.metric_for(name), head_sites(model)
    ex = EXAMPLES[:1]
    fn = {"squad": L._squad_losses, "accuracy": L._accuracy_losses}[name]

    def loss_at(g):
        with HeadIntervention(model, sites, gates=g), torch.no_grad():
            return float(fn(metric, model, t, ex, "cpu", 64).sum())

    eps = 1e-4
    sums, _ = L.importance_sums(metric, model, t, sites, ex, "cpu", 64, batch_size=1)
    for layer, head in [(0, 1), (1, 0)]:
        up, down = torch.ones(2, 2, dtype=torch.float64), torch.ones(2, 2, dtype=torch.float64)
        up[layer, head] += eps
        down[layer, head] -= eps
        fd = abs(loss_at(up) - loss_at(down)) / (2 * eps)
        assert sums[layer, head] == pytest.approx(fd, rel=1e-3)


def test_squad_gold_answer_tokens(tok):
    metric = M.metric_for("squad")
    encoded = metric._encode(tok, EXAMPLES, 64)
    enc, row = encoded[0]
    s, e = gold_answer_tokens(enc, row, EXAMPLES[0].answer_span())
    ids = enc["input_ids"][row][s : e + 1]
    assert tok.decode(ids).strip().lower() == "mainz"
    assert gold_answer_tokens(enc, row, None) == (0, 0)  # unanswerable: [CLS]
    assert EXAMPLES[3].answer_span() is None  # "x" is nowhere in the context
    assert gold_answer_tokens(enc, row, (len(CONTEXT) + 5, len(CONTEXT) + 9)) == (0, 0)  # cut off: [CLS]


def test_retrieval_importance_is_per_batch(tok):
    model = bert(BertModel, tok)
    metric, sites = M.metric_for("retrieval"), head_sites(model)
    sums, units = L.importance_sums(metric, model, tok, sites, EXAMPLES, "cpu", 64, batch_size=2)
    assert units == 2 and sums.shape == (2, 2) and np.all(np.isfinite(sums)) and np.all(sums > 0)


def test_lm_losses_equal_each_examples_own_model_loss(tok, tiny_gpt2_dir):
    """The labels are built on the host and copied once per batch (issue 34): each example's mean token loss
    in a padded batch is still the model's own loss on that example alone."""
    model, t = models(tok, tiny_gpt2_dir)["lm"]
    got = L._lm_losses(M.metric_for("lm"), model, t, EXAMPLES, "cpu", 64)
    for i, e in enumerate(EXAMPLES):
        ids = torch.tensor([t(e.text, e.text_pair, truncation=True, max_length=64)["input_ids"]])
        with torch.no_grad():
            ref = model(input_ids=ids, labels=ids).loss
        assert float(got[i]) == pytest.approx(float(ref), rel=1e-5)
