"""Task metrics (issue 14): SQuAD 2.0 EM/F1 by the official rules, span decoding, LM loss, retrieval ranks,
accuracy, the head checks and ``auto``; tiny models built in the tests."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import tiny_bert_config
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertModel,
    GPT2Config,
    GPT2LMHeadModel,
)

from rapids_attn.data.example import Example
from rapids_attn.data.readers import read_examples
from rapids_attn.errors import JobConfigError
from rapids_attn.heads import metrics as M
from rapids_attn.heads import squad_eval as S

CONTEXT = "The printing press was invented in the fifteenth century, in Mainz, by Johannes Gutenberg."


def bert_config(tok, **kw):
    return tiny_bert_config(tok.vocab_size, **kw)


@pytest.fixture(scope="module")
def tok(tiny_bert_dir):
    return AutoTokenizer.from_pretrained(tiny_bert_dir)


def tiny(cls, tok, **kw):
    torch.manual_seed(0)
    return cls(bert_config(tok, **kw)).eval()


# ---------------------------------------------------------------------------------------- squad rules


@pytest.mark.parametrize(
    ("raw", "norm"),
    [("The  Eiffel Tower!", "eiffel tower"), ("an apple, a pear", "apple pear"), ("Theatre", "theatre"), ("", "")],
)
def test_official_normalisation(raw, norm):
    assert S.normalize_answer(raw) == norm


def test_exact_and_f1_hand_computed():
    assert S.exact_score("the Eiffel Tower", "Eiffel tower.") == 1
    assert S.f1_score("Denver Broncos", "the Broncos") == pytest.approx(2 / 3)  # p = 1, r = 1/2
    assert S.f1_score("w x y z", "y z v") == pytest.approx(2 * (2 / 3) * (2 / 4) / (2 / 3 + 2 / 4))
    assert S.f1_score("a b c d", "c d e") == pytest.approx(2 / 3)  # "a" is an article: gold is b c d
    assert S.f1_score("", "") == 1.0 and S.f1_score("", "Mainz") == 0.0 and S.f1_score("Mainz", "") == 0.0


def test_scores_max_over_references_and_no_answer_rule():
    metric = M.SquadMetric()
    examples = [
        Example("a", "q", "Denver Broncos won.", label="answerable", answers=("Denver Broncos", "Broncos")),
        Example("b", "q", "Denver Broncos won.", label="impossible"),  # empty prediction matches
        Example("c", "q", "Denver Broncos won.", label="impossible"),  # any answer fails
        Example("d", "q", "Denver Broncos won.", label="answerable", answers=("the",)),  # gold normalises to ""
        Example("e", "q", "Denver Broncos won.", label=""),  # no gold: NaN
    ]
    # predictions by character span: "Broncos", null, "Denver", null, "won"
    partials = {
        "start_char": np.array([7, 0, 0, 0, 15]),
        "end_char": np.array([14, 0, 6, 0, 18]),
        "span_score": np.array([1.0, 0.0, 2.0, 0.0, 1.0]),
        "null_score": np.array([0.0, 1.0, 1.0, 1.0, 0.0]),
    }
    assert metric.predictions(partials, examples) == ["Broncos", "", "Denver", "", "won"]
    s = metric.scores(partials, examples)
    np.testing.assert_array_equal(s["exact"], [1, 1, 0, 1, np.nan])
    np.testing.assert_array_equal(s["f1"], [1, 1, 0, 1, np.nan])


def test_best_span_respects_context_order_and_length():
    start = np.zeros(50)
    end = np.zeros(50)
    start[[0, 5, 10]] = [9, 3, 2]  # 0 is outside the context
    end[[4, 8, 45]] = [9, 2, 5]  # 4 is before every good start, 45 is too far from 10
    assert S.best_span(start, end, np.arange(5, 49)) == (5.0, 5, 8)
    assert S.best_span(start, end, np.arange(5, 49), max_len=60) == (8.0, 5, 45)
    assert S.best_span(start, end, np.arange(0))[0] == float("-inf")


def squad_examples():
    return [
        Example(
            "m", "Where was the printing press invented?", CONTEXT, label="answerable", answers=("Mainz", "in Mainz")
        ),
        Example("n", "Who painted the ceiling?", "The chapel ceiling is from 1512.", label="impossible"),
        Example("w", "When? " * 60, CONTEXT, label="answerable", answers=("fifteenth century",)),  # too long to keep
    ]


def test_span_decoding_on_a_tiny_qa_bert(tok):
    """The qa_outputs layer's logits are forced: start and end on "mainz" where the context has it (m), else
    on [CLS] (n, whose context lacks it)."""
    model = tiny(BertForQuestionAnswering, tok)
    mainz = tok.convert_tokens_to_ids("mainz")
    state = {}
    model.register_forward_pre_hook(lambda m, args, kw: state.update(ids=kw["input_ids"]), with_kwargs=True)

    def force(module, args, out):
        ids = state["ids"]
        logits = torch.zeros_like(out)
        logits[..., :][ids == mainz] = 5.0
        logits[:, 0, :] = torch.where((ids == mainz).any(1), -5.0, 9.0)[:, None]
        return logits

    model.qa_outputs.register_forward_hook(force)
    metric = M.SquadMetric()
    examples = squad_examples()
    parts = metric.partials(model, tok, examples[:2], "cpu", max_length=64)
    assert metric.predictions(parts, examples[:2]) == ["Mainz", ""]
    np.testing.assert_array_equal(metric.scores(parts, examples[:2])["exact"], [1, 1])


def test_span_decoding_matches_brute_force(tok):
    """Random weights: the vectorised search equals a loop over every allowed span, and a question that leaves
    no room for the context under max_length is cut rather than failing."""
    model = tiny(BertForQuestionAnswering, tok)
    metric = M.SquadMetric()
    examples = squad_examples()
    parts = metric.partials(model, tok, examples, "cpu", max_length=40)
    for i, ex in enumerate(examples):
        strategy = "only_second" if i < 2 else "longest_first"
        enc = tok(ex.text, ex.text_pair, truncation=strategy, max_length=40, return_offsets_mapping=True)
        with torch.inference_mode():
            out = model(**{k: torch.tensor([enc[k]]) for k in ("input_ids", "token_type_ids", "attention_mask")})
        s, e = out.start_logits[0].double().numpy(), out.end_logits[0].double().numpy()
        ctx = [t for t, sid in enumerate(enc.sequence_ids()) if sid == 1]
        best = max((s[a] + e[b], a, b) for a in ctx for b in ctx if a <= b < a + 30)
        assert parts["span_score"][i] == pytest.approx(best[0], abs=1e-4)
        assert parts["start_char"][i] == enc["offset_mapping"][best[1]][0]
        assert parts["null_score"][i] == pytest.approx(s[0] + e[0], abs=1e-4)
    again = metric.partials(model, tok, examples[::-1], "cpu", max_length=40)
    np.testing.assert_array_equal(again["start_char"][::-1], parts["start_char"])


def test_gold_logprob_is_the_negative_qa_training_loss(tok):
    """gold_logprob, per example in a padded batch of mixed lengths, equals minus HF's own QA loss (the mean of
    start and end cross-entropy) of that example alone, with the gold tokens as labels ([CLS] for no answer)."""
    model = tiny(BertForQuestionAnswering, tok)
    metric = M.SquadMetric()
    examples = squad_examples()[:2]
    parts = metric.partials(model, tok, examples, "cpu", max_length=64)
    scores = metric.scores(parts, examples)
    assert metric.headline == "gold_logprob"
    for i, ex in enumerate(examples):
        enc = tok(ex.text, ex.text_pair, truncation="only_second", max_length=64, return_offsets_mapping=True)
        words = [tok.decode([t]).strip() for t in enc["input_ids"]]
        s = e = 0
        if ex.answers:  # "mainz": one token
            s = e = words.index("mainz")
        inputs = {k: torch.tensor([enc[k]]) for k in ("input_ids", "token_type_ids", "attention_mask")}
        with torch.inference_mode():
            loss = model(**inputs, start_positions=torch.tensor([s]), end_positions=torch.tensor([e])).loss
        assert scores["gold_logprob"][i] == pytest.approx(-float(loss), abs=1e-5)


def test_checks_name_heads_metric_and_the_fix(tiny_bert_dir, tok):
    with pytest.raises(
        JobConfigError, match=r"heads.metric: squad needs a question-answering head.*BertModel.*retrieval"
    ):
        M.metric_for("squad").check(BertModel.from_pretrained(tiny_bert_dir).config, tok, "tiny")
    with pytest.raises(JobConfigError, match="heads.metric: squad needs a question-answering head"):
        M.metric_for("squad").load_model(tiny_bert_dir)  # would build a random QA head on a bare encoder
    with pytest.raises(JobConfigError, match="heads.metric: lm needs .*BertModel"):
        M.metric_for("lm").load_model(tiny_bert_dir)
    with pytest.raises(JobConfigError, match="heads.metric: unknown metric 'bleu'"):
        M.metric_for("bleu")
    M.metric_for("retrieval").check(BertModel.from_pretrained(tiny_bert_dir), tok, "tiny")


@pytest.mark.parametrize(
    ("arch", "fmt", "metric"),
    [
        ("BertForQuestionAnswering", "squad", "squad"),
        ("BertForMaskedLM", "jsonl", "lm"),
        ("GPT2LMHeadModel", "text", "lm"),
        ("LlamaForCausalLM", "text", "lm"),
        ("BertForSequenceClassification", "csv", "accuracy"),
        ("BertModel", "squad", "retrieval"),
    ],
)
def test_auto_metric(arch, fmt, metric):
    assert M.auto_metric(BertConfig(architectures=[arch]), fmt) == metric


def test_auto_metric_refuses_a_bare_encoder_off_squad():
    with pytest.raises(JobConfigError, match="heads.metric: auto .*BertModel.*set heads.metric"):
        M.auto_metric(BertConfig(architectures=["BertModel"]), "jsonl")


# ----------------------------------------------------------------------------------------------- lm

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Honeybees dance to tell the hive where the flowers are.",
    "Tide pools hold anemones, crabs and small fish between the rocks, and more crabs.",
]


def test_causal_lm_loss_equals_the_models_own(tiny_gpt2_dir):
    tok = AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    tok.pad_token = tok.eos_token
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=128, n_embd=32, n_layer=2, n_head=2)).eval()
    metric = M.metric_for("lm")
    examples = [Example(f"e{i}", t) for i, t in enumerate(TEXTS)]
    parts = metric.partials(model, tok, examples, "cpu", max_length=64, token_budget=40)  # several batches
    for i, text in enumerate(TEXTS):
        ids = torch.tensor([tok(text)["input_ids"]])
        with torch.inference_mode():
            ref = model(input_ids=ids, labels=ids).loss.item()
        assert parts["n_tokens"][i] == ids.shape[1] - 1
        assert parts["loss_sum"][i] / parts["n_tokens"][i] == pytest.approx(ref, rel=1e-5)
    scores = metric.scores(parts, examples)
    summary = metric.summary(parts, scores)
    assert metric.higher_is_better is False
    assert summary["corpus_loss"] == pytest.approx(parts["loss_sum"].sum() / parts["n_tokens"].sum())
    assert summary["loss"] == pytest.approx(scores["loss"].mean())


def test_the_lm_metric_copies_no_logits_to_the_host(tiny_gpt2_dir, monkeypatch):
    """The loss runs where the logits are (issue 34's a2a82f3, checked for issue 35): a batch's [B, T, vocab] logits
    never go to the host; only the per-example sums and counts come back, in one copy each per call however many
    batches it ran."""
    tok = AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    tok.pad_token = tok.eos_token
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=128, n_embd=32, n_layer=2, n_head=2)).eval()
    copied = []
    for name in ("cpu", "numpy", "tolist"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor,
            name,
            lambda self, *a, _real=real, _n=name, **k: copied.append((_n, tuple(self.shape))) or _real(self, *a, **k),
        )
    batches = []
    real_batches = M._batches
    monkeypatch.setattr(M, "_batches", lambda *a, **k: (batches.append(b) or b for b in real_batches(*a, **k)))
    examples = [Example(f"e{i}", t) for i, t in enumerate(TEXTS)]
    M.metric_for("lm").partials(model, tok, examples, "cpu", max_length=64, token_budget=40)
    assert len(batches) > 1
    assert not [c for c in copied if c[1] and c[1][-1] == len(tok)], copied  # no logits
    assert sorted(name for name, _ in copied) == ["cpu", "cpu", "numpy", "numpy"], copied


def test_masked_lm_masks_by_example_id(tok):
    model = tiny(BertForMaskedLM, tok)
    metric = M.metric_for("lm")
    examples = [Example(f"e{i}", t) for i, t in enumerate(TEXTS)]
    parts = metric.partials(model, tok, examples, "cpu", max_length=64)
    alone = metric.partials(model, tok, examples[2:], "cpu", max_length=64)
    assert alone["loss_sum"][0] == pytest.approx(parts["loss_sum"][2], rel=1e-5)
    for i, ex in enumerate(examples):
        enc = tok(ex.text, return_special_tokens_mask=True)
        ids = torch.tensor([enc["input_ids"]])
        where = M.mask_positions(np.flatnonzero(np.array(enc["special_tokens_mask"]) == 0), ex.id)
        assert len(where) == round(0.15 * (ids.shape[1] - 2)) == parts["n_tokens"][i]
        labels = torch.full_like(ids, -100)
        labels[0, where] = ids[0, where]
        masked = ids.clone()
        masked[0, where] = tok.mask_token_id
        with torch.inference_mode():
            ref = model(input_ids=masked, labels=labels).loss.item()
        assert parts["loss_sum"][i] / parts["n_tokens"][i] == pytest.approx(ref, rel=1e-5)


# ----------------------------------------------------------------------------------------- retrieval

PARAS = ["Bees dance in the hive.", "Crabs hide in tide pools.", "Foxes jump over dogs."]


def test_retrieval_ranks_with_known_answers(tiny_bert_dir, tok):
    """A question worded exactly as its own paragraph ranks it first (cosine 1); one worded as another
    paragraph cannot rank its own first."""
    model = BertModel.from_pretrained(tiny_bert_dir).eval()
    metric = M.metric_for("retrieval")
    examples = [
        Example("q0", PARAS[0], PARAS[0]),
        Example("q1", PARAS[1], PARAS[1]),
        Example("q2", PARAS[0], PARAS[2]),  # worded as paragraph 0
        Example("q3", PARAS[2], PARAS[2]),
    ]
    rows = []
    model.register_forward_pre_hook(lambda m, a, kw: rows.append(kw["input_ids"].shape[0]), with_kwargs=True)
    shards = [
        metric.partials(model, tok, examples[:2], "cpu", 64),
        metric.partials(model, tok, examples[2:], "cpu", 64),
    ]
    assert sum(rows) == 4 + 3  # questions, and each shard's distinct paragraphs once
    parts = {k: np.concatenate([s[k] for s in shards]) for k in shards[0]}
    s = metric.scores(parts, examples)
    assert s["recall@1"][[0, 1, 3]].tolist() == [1, 1, 1] and s["recall@1"][2] == 0

    # against a plain per-text embedding and a brute-force rank
    def emb(text):
        with torch.inference_mode():
            h = model(**tok(text, return_tensors="pt")).last_hidden_state[0].mean(0)
        return (h / h.norm()).numpy()

    P = np.stack([emb(p) for p in PARAS])
    for i, ex in enumerate(examples):
        sim = P @ emb(ex.text)
        own = PARAS.index(ex.text_pair)
        assert s["rr"][i] == pytest.approx(1 / (sim >= sim[own] - 1e-6).sum())
    np.testing.assert_allclose(parts["p_emb"][2], P[2], atol=1e-5)


def test_retrieval_ties_count_against():
    metric = M.RetrievalMetric()
    examples = [Example("a", "q", "P one"), Example("b", "q", "P two"), Example("c", "q", "P one")]
    e = np.eye(2, dtype=np.float32)
    parts = {"q_emb": e[[0, 0, 1]], "p_emb": e[[0, 0, 0]]}  # both paragraphs embed alike: a tie
    s = metric.scores(parts, examples)
    np.testing.assert_array_equal(s["rr"], [0.5, 0.5, 0.5])
    np.testing.assert_array_equal(s["recall@1"], [0, 0, 0])
    with pytest.raises(JobConfigError, match="heads.metric: retrieval needs question/paragraph pairs"):
        metric.scores(parts, [Example("x", "q")] * 3)
    # the candidates are the scored sample's distinct paragraphs, and the stage's JSON says so
    assert metric.scope(examples) == {
        "candidates": 2,
        "pool": "the 2 distinct paragraphs of the scored sample (heads.examples), not the whole data",
    }
    assert M.metric_for("accuracy").scope(examples) is None


# ------------------------------------------------------------------------------------------ accuracy


def test_accuracy_against_label2id(tok):
    model = tiny(
        BertForSequenceClassification, tok, num_labels=2, label2id={"yes": 0, "no": 1}, id2label={0: "yes", 1: "no"}
    )
    metric = M.metric_for("accuracy")
    examples = [Example(f"e{i}", t, label=["yes", "No"][i % 2]) for i, t in enumerate(TEXTS)]
    parts = metric.partials(model, tok, examples, "cpu", 64)
    with torch.inference_mode():
        logits = [model(**tok(t, return_tensors="pt")).logits[0] for t in TEXTS]
    ref = [int(x.argmax()) for x in logits]
    np.testing.assert_array_equal(parts["pred"], ref)
    scores = metric.scores(parts, examples)
    np.testing.assert_array_equal(scores["accuracy"], np.equal(ref, [0, 1, 0]))
    # the margin: the label's logit minus the other's, above 0 exactly where the prediction is right
    want = [float(x[t] - x[1 - t]) for x, t in zip(logits, [0, 1, 0], strict=True)]
    np.testing.assert_allclose(scores["margin"], want, rtol=1e-5, atol=1e-6)
    assert ((scores["margin"] > 0) == (scores["accuracy"] == 1)).all()
    assert metric.headline == "margin"
    with pytest.raises(JobConfigError, match=r"label 'maybe' is not one of the model's labels \['no', 'yes'\]"):
        metric.partials(model, tok, [Example("x", "t", label="maybe")], "cpu", 64)


# ---------------------------------------------------------------------------------------------- misc


def test_mean_ci_is_the_t_interval():
    from scipy import stats

    x = np.array([0.0, 1.0, 1.0, 0.5, np.nan, 0.25])
    mean, lo, hi = M.mean_ci(x)
    ref = stats.t.interval(0.95, 4, loc=np.nanmean(x), scale=stats.sem(x[~np.isnan(x)]))
    assert mean == pytest.approx(0.55) and (lo, hi) == pytest.approx(ref)
    assert np.isnan(M.mean_ci(np.array([1.0]))[1])


def test_squad_reader_keeps_every_answer(tmp_path):
    qa = {"id": "q", "question": "Where?", "answers": [{"text": "Mainz", "answer_start": 0}, {"text": "in Mainz"}]}
    doc = {"data": [{"title": "T", "paragraphs": [{"context": CONTEXT, "qas": [qa]}]}]}
    (tmp_path / "d.json").write_text(json.dumps(doc))
    (ex,) = read_examples(tmp_path / "d.json", format="squad")
    assert ex.answers == ("Mainz", "in Mainz") and ex.label == "answerable"


def test_cpu_batches_do_not_pad_short_inputs_to_a_long_one(tok, monkeypatch):
    """On the CPU the metrics' forwards take the extractor's least-cost batches: one long input with many short
    ones goes alone (greedy packing, as on a GPU, pads the short ones to its length), and each input's output
    is the same either way."""
    model = tiny(BertModel, tok)
    texts = ["word " * 120] + ["a short one"] * 20
    enc = tok(texts, truncation=True, max_length=128)
    features = [M.encoded_features(enc, i) for i in range(len(texts))]

    def run(device):
        got = {}
        for idx, batch, out in M._batches(model, tok, features, device, token_budget=8192):
            for j, i in enumerate(idx):
                n = int(batch["attention_mask"][j].sum())
                got[i] = (sorted(idx), out.last_hidden_state[j, :n])
        return got

    cpu = run("cpu")
    assert cpu[0][0] == [0]  # the long input alone
    greedy_plan = M.length_batches([len(f["input_ids"]) for f in features], 8192, M.MAX_BATCH)
    assert [0] not in greedy_plan  # greedy puts it with the short ones
    assert len(cpu) == len(texts)
    # the GPU's plan (greedy), run on the CPU: the same outputs
    monkeypatch.setattr(M.BatchCost, "for_model", classmethod(lambda cls, hidden, device: None))
    greedy = run("cpu")
    assert greedy[0][0] != [0]
    for i in range(len(texts)):
        torch.testing.assert_close(cpu[i][1], greedy[i][1], rtol=1e-4, atol=1e-5)
