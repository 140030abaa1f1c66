"""rapids_attn.finetune: the split by article and sequence classification with Trainer on a tiny BERT."""

import pytest
import torch
from helpers import tiny_bert_config

from rapids_attn.data.example import Example
from rapids_attn.errors import DataError
from rapids_attn.finetune.classify import evaluate_classifier, label_names, train_classifier
from rapids_attn.finetune.qa import TrainSettings
from rapids_attn.finetune.split import split_by_group


def _examples(groups: int = 6, per: int = 5) -> list[Example]:
    return [
        Example(
            id=f"{g}-{i}",
            text=f"question {i}",
            text_pair=f"context of article {g}",
            group=f"article {g}",
            label="answerable" if i % 2 else "impossible",
        )
        for g in range(groups)
        for i in range(per)
    ]


def test_the_split_keeps_each_article_on_one_side():
    exs = _examples()
    train, evaluation = split_by_group(exs, 0.3, seed=1)
    assert {e.group for e in train}.isdisjoint({e.group for e in evaluation})
    assert len(train) + len(evaluation) == len(exs) and len(evaluation) >= 0.3 * len(exs)
    assert [e.id for e in train] == [e.id for e in exs if e in train]  # the input's order
    assert split_by_group(exs, 0.3, seed=1) == (train, evaluation)  # seeded
    assert split_by_group(exs, 0.3, seed=2) != (train, evaluation)


def test_a_split_that_cannot_keep_contexts_apart_is_one_line():
    with pytest.raises(DataError, match="holds 1 group"):
        split_by_group(_examples(groups=1), 0.2)
    with pytest.raises(DataError, match="2 of 2 examples have no group"):
        split_by_group([Example(id="a", text="x"), Example(id="b", text="y")], 0.5)


def test_a_classifier_fine_tunes_and_names_its_classes(tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertForSequenceClassification

    from rapids_attn.extract.model import resolve_model_name

    tok = AutoTokenizer.from_pretrained(resolve_model_name("minilm-l6"))
    exs = _examples()
    names = label_names(exs)
    assert names == ["answerable", "impossible"]
    torch.manual_seed(0)
    model = BertForSequenceClassification(tiny_bert_config(tok.vocab_size, num_labels=2))
    s = TrainSettings(max_steps=4, save_steps=2, per_device_train_batch_size=8, learning_rate=1e-3)
    trainer = train_classifier(model, tok, exs, names, 32, s, tmp_path / "work", "cpu")
    trainer.save_model(str(tmp_path / "model"))
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "model")
    assert loaded.config.id2label == {0: "answerable", 1: "impossible"}
    r = evaluate_classifier(loaded, tok, exs, names, 32)
    assert r["total"] == 30 and set(r["per_class"]) == set(names) and 0.0 <= r["accuracy"] <= 1.0
    with pytest.raises(DataError, match="every example has the label 'x'"):
        label_names([Example(id="a", text="t", label="x")])


def test_the_held_out_index_reads_only_held_out_groups_then_samples_them(tmp_path):
    """The later stages' index: the whole file's examples of the held-out groups (a line file's stay records a
    worker reads by seeking), then data.sample over those, seeded; the training side has none of them."""
    from helpers import pair_rows, write_jsonl

    from rapids_attn.finetune.split import held_out_index, job_split
    from rapids_attn.registry import job_model

    JobConfig = job_model()

    rows = pair_rows(30)
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    raw = {
        "data": {"path": str(data), "text_fields": ["question", "context"], "id_field": "id", "group_field": "topic"},
        "model": {"name": "minilm-l6"},
        "finetune": {"enabled": True, "eval_fraction": 0.3},
    }
    cfg = JobConfig.model_validate(raw)
    train, evaluation = job_split(cfg)
    index = held_out_index(cfg)
    assert index.inline == () and len(index.records) == len(evaluation)
    read = index.read(range(len(index)))
    assert [ex.id for ex in read] == [ex.id for ex in evaluation]
    assert not {ex.group for ex in read} & {ex.group for ex in train}
    raw["data"]["sample"] = 4
    sampled = held_out_index(JobConfig.model_validate(raw))
    assert len(sampled) == 4 and {ex.id for ex in sampled.read(range(4))} <= {ex.id for ex in evaluation}
    assert sampled.rows(0, 4).read() == sampled.read(range(4))  # what a worker reads from its task's rows


def test_answerable_training_and_a_held_back_threshold_sample(tmp_path, tiny_bert_dir):
    """train_questions: answerable drops the unanswerable training questions; threshold_examples holds back a
    sample of the training groups (every kind of question) that training never sees; the held-out side is as
    before."""
    from helpers import make_job, write_squad

    from rapids_attn.finetune.split import job_split
    from rapids_attn.jobfile import load_job

    raw = make_job(tmp_path, tiny_bert_dir, write_squad(tmp_path / "squad.json"))
    raw["data"] = {"path": str(tmp_path / "squad.json")}
    plain = job_split(load_job(None, raw={**raw, "finetune": {"enabled": True, "max_length": 64, "doc_stride": 16}}))
    raw["finetune"] = {
        "enabled": True,
        "max_length": 64,
        "doc_stride": 16,
        "train_questions": "answerable",
        "threshold_examples": 3,
    }
    split = job_split(load_job(None, raw=raw))
    assert split.evaluation == plain.evaluation
    assert len(split.tune) == 3 and all(ex in plain.train for ex in split.tune)
    assert not {ex.id for ex in split.tune} & {ex.id for ex in split.train}
    assert split.train and all(ex.answers for ex in split.train)
    assert {ex.id for ex in split.train} == {ex.id for ex in plain.train if ex.answers} - {ex.id for ex in split.tune}
    train, evaluation = split  # the two sides, as before
    assert train == split.train and evaluation == split.evaluation


@pytest.mark.parametrize(
    ("finetune", "message"),
    [
        ({"task": "classify", "threshold_examples": 5}, "settings of finetune.task: qa"),
        ({"shuffled_labels": True}, "shuffled_labels is a control of finetune.task: classify"),
        ({"seed": 3, "control_seeds": [1, 3]}, "must be distinct and differ from finetune.seed"),
        ({"control_seeds": [1, 1]}, "must be distinct"),
    ],
)
def test_control_and_recipe_settings_that_cannot_work_are_refused(tmp_path, tiny_bert_dir, finetune, message):
    from helpers import make_job

    from rapids_attn.errors import JobConfigError
    from rapids_attn.jobfile import load_job

    raw = make_job(tmp_path, tiny_bert_dir, tmp_path / "x.jsonl", finetune={"enabled": True, **finetune})
    with pytest.raises(JobConfigError, match=message):
        load_job(None, raw=raw)
