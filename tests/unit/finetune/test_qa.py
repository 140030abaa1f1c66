"""rapids_attn.finetune.qa: SQuAD preprocessing, scoring, and Trainer fine-tuning of a tiny BERT built here:
the folder it writes loads with AutoModelForQuestionAnswering, and a run interrupted after a checkpoint resumes
to the weights of an uninterrupted one."""

import json

import numpy as np
import pytest
import torch
from helpers import tiny_bert_config

from rapids_attn.data.example import Example
from rapids_attn.finetune.qa import (
    QAWindowing,
    TrainSettings,
    eval_features,
    evaluate_qa,
    finish,
    predict_answers,
    squad_v2_scores,
    train_features,
    train_qa,
)

CONTEXT = "The cat sat on the mat. " * 6 + "Paris is the capital of France. " + "The dog ran far away. " * 6


def _examples(n: int = 12) -> list[Example]:
    out = []
    for i in range(n):
        if i % 3 == 2:
            out.append(Example(id=f"q{i}", text="Who flew to the moon?", text_pair=CONTEXT, label="impossible"))
        else:
            out.append(
                Example(
                    id=f"q{i}",
                    text="What is the capital of France?",
                    text_pair=CONTEXT,
                    label="answerable",
                    answers=("Paris", "Paris"),
                )
            )
    return out


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from rapids_attn.extract.model import resolve_model_name

    return AutoTokenizer.from_pretrained(resolve_model_name("minilm-l6"))


def _model(tokenizer):
    from transformers import BertForQuestionAnswering

    torch.manual_seed(0)
    return BertForQuestionAnswering(tiny_bert_config(tokenizer.vocab_size))


def test_windows_point_at_the_answer_or_at_the_no_answer_position(tokenizer):
    w = QAWindowing(max_length=48, doc_stride=16)
    feats = train_features(tokenizer, _examples(3), w)
    assert len(feats) > 3  # the context is cut into overlapping windows
    answered = [f for f in feats if f["start_positions"] > 0]
    assert answered  # some window of each answerable question holds "Paris"
    for f in answered:
        span = f["input_ids"][f["start_positions"] : f["end_positions"] + 1]
        assert tokenizer.decode(span) == "paris"
    # every window of the unanswerable question (the third) points at the first token
    _, meta = eval_features(tokenizer, _examples(3), w)
    third = [f for f, m in zip(feats, meta, strict=True) if m["example"] == 2]
    assert third and all(f["start_positions"] == f["end_positions"] == 0 for f in third)


def test_the_best_span_of_any_window_against_no_answer(tokenizer):
    w = QAWindowing(max_length=48, doc_stride=16)
    exs = _examples(3)
    feats, meta = eval_features(tokenizer, exs, w)
    starts, ends = [], []
    for f, m in zip(feats, meta, strict=True):
        n = len(f["input_ids"])
        s, e = torch.full((n,), -5.0), torch.full((n,), -5.0)
        paris = [i for i in m["context"] if tokenizer.convert_ids_to_tokens(f["input_ids"][i]) == "paris"]
        if m["example"] == 0 and paris:
            s[paris[0]], e[paris[0]] = 4.0, 4.0  # beats the no-answer score 0 + 0 below
        s[0], e[0] = 0.0, 0.0
        starts.append(s.numpy())
        ends.append(e.numpy())
    assert predict_answers(exs, meta, starts, ends) == ["Paris", "", ""]


def test_squad_v2_scores_follow_the_official_rules():
    exs = _examples(3)  # answerable, answerable, impossible
    s = squad_v2_scores(exs, ["the Paris", "London", ""])
    assert s["total"] == 3 and s["HasAns_total"] == 2 and s["NoAns_total"] == 1
    assert s["HasAns_exact"] == 50.0 and s["NoAns_exact"] == 100.0 and s["exact"] == pytest.approx(66.67)
    assert s["f1"] == pytest.approx(66.67)


SETTINGS = TrainSettings(seed=0, max_steps=6, save_steps=2, per_device_train_batch_size=4, logging_steps=100)


def test_a_fine_tune_writes_a_folder_that_loads_and_scores(tmp_path, tokenizer):
    from transformers import AutoModelForQuestionAnswering

    w = QAWindowing(max_length=64, doc_stride=32)
    trainer = train_qa(_model(tokenizer), tokenizer, _examples(), w, SETTINGS, tmp_path / "work", "cpu")
    metrics = evaluate_qa(trainer.model, tokenizer, _examples(6), w)
    folder = finish(trainer, tokenizer, tmp_path / "model", metrics["scores"], SETTINGS, w)
    loaded = AutoModelForQuestionAnswering.from_pretrained(folder)
    for a, b in zip(loaded.state_dict().values(), trainer.model.state_dict().values(), strict=True):
        assert torch.equal(a.cpu(), b.cpu())
    saved = json.loads((folder / "metrics.json").read_text())
    assert saved["metrics"]["total"] == 6 and saved["settings"]["max_steps"] == 6
    assert (folder / "training_args.bin").is_file() and (folder / "tokenizer.json").is_file()
    assert not (tmp_path / "model.tmp").exists()


def test_an_interrupted_fine_tune_resumes_to_the_same_weights(tmp_path, tokenizer):
    from transformers import TrainerCallback

    w = QAWindowing(max_length=64, doc_stride=32)
    whole = train_qa(_model(tokenizer), tokenizer, _examples(), w, SETTINGS, tmp_path / "whole", "cpu").model

    class Interrupt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:  # after checkpoint-2 was written, before checkpoint-4
                raise KeyboardInterrupt

    work = tmp_path / "struck"
    with pytest.raises(KeyboardInterrupt):
        train_qa(_model(tokenizer), tokenizer, _examples(), w, SETTINGS, work, "cpu", callbacks=[Interrupt()])
    assert sorted(p.name for p in work.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-2"]
    resumed = train_qa(_model(tokenizer), tokenizer, _examples(), w, SETTINGS, work, "cpu").model
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)


def test_the_best_threshold_follows_the_official_find_best_thresh():
    """SQuAD 2.0's official evaluation: answered where the no-answer margin is at most the threshold, the threshold
    chosen where the score is highest (the first such, scanning margins upwards from all-no-answer)."""
    from rapids_attn.finetune.qa import best_threshold_scores

    exs = [
        Example(id="a", text="q", text_pair="c", label="answerable", answers=("Paris",)),
        Example(id="b", text="q", text_pair="c", label="impossible"),
        Example(id="c", text="q", text_pair="c", label="answerable", answers=("Rome",)),
    ]
    out = best_threshold_scores(exs, ["Paris", "x", "Rome"], np.asarray([-1.0, 1.0, 2.0]))
    # all null: 1 of 3; answering a: 2; then b (wrong): 1; then c: 2 again, not higher
    assert out == {"best_exact": 66.67, "best_exact_thresh": -1.0, "best_f1": 66.67, "best_f1_thresh": -1.0}
    nothing = best_threshold_scores(exs, ["Berlin", "x", "Oslo"], np.asarray([-1.0, 1.0, 2.0]))
    assert nothing["best_exact"] == 33.33 and nothing["best_exact_thresh"] == 0.0  # no answer beats it


def test_the_overlap_baseline_answers_with_the_sentence_sharing_most_words():
    from rapids_attn.data.example import Example
    from rapids_attn.finetune.qa import example_f1, overlap_sentence_answers

    context = "The press was built in Mainz. Gutenberg printed a Bible there! The ink was oil based."
    examples = [
        Example("a", "Which Bible did Gutenberg print?", context, answers=("a Bible",)),
        Example("b", "What was the ink?", context, answers=("oil based",)),
        Example("c", "Where was the press built?", context, answers=("Mainz",)),
    ]
    assert overlap_sentence_answers(examples) == [
        "Gutenberg printed a Bible there!",
        "The ink was oil based.",
        "The press was built in Mainz.",
    ]
    f1 = example_f1(examples, overlap_sentence_answers(examples))
    assert f1.shape == (3,) and (f1 > 0).all() and (f1 < 100).all()  # the answer inside a longer sentence
