"""Issue 47: a fine-tune says in one line of ours that its task head is new, instead of transformers' ten-line load
report (MISSING / UNEXPECTED keys) on stderr; what is news (weights of the model itself missing, a load that fails)
stays visible."""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace

import pytest
from helpers import make_job, write_squad

from rapids_attn.finetune.taskhead import REPORT_LOGGER, load_for_task, load_note

FINETUNE = {
    "enabled": True,
    "max_steps": 1,
    "save_steps": 1,
    "batch_size": 4,
    "eval_batch_size": 8,
    "max_length": 64,
    "doc_stride": 16,
    "trajectory": False,
}


def _report_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if any(w in line for w in ("LOAD REPORT", "MISSING", "UNEXPECTED"))]


class _Stderr(logging.StreamHandler):
    """Writes each record to what sys.stderr is when the record comes (capfd's, in the test)."""

    def emit(self, record):
        self.stream = sys.stderr
        super().emit(record)


@pytest.fixture
def hf_stderr(capfd, monkeypatch):
    """transformers' log records on this test's stderr, as on a terminal: the library's own handler keeps the stream
    that was sys.stderr when it was made (under pytest, a capture capfd does not see, or one since closed)."""
    import transformers.utils.logging  # noqa: F401 - the library's logger, made as transformers makes it

    monkeypatch.setattr(logging.getLogger("transformers"), "handlers", [_Stderr()])


def test_a_fine_tune_prints_one_line_about_its_new_head_not_the_load_report(tmp_path, tiny_bert_dir, capfd, hf_stderr):
    from transformers import AutoModelForQuestionAnswering

    from rapids_attn.jobfile import load_job
    from rapids_attn.pipeline import run_job

    # what transformers prints on its own for the tiny BERT with a new QA head (so this test sees stderr at all)
    AutoModelForQuestionAnswering.from_pretrained(tiny_bert_dir)
    assert len(_report_lines(capfd.readouterr().err)) >= 3

    raw = make_job(tmp_path, tiny_bert_dir, write_squad(tmp_path / "squad.json"), finetune=FINETUNE)
    raw["data"] = {"path": str(tmp_path / "squad.json")}
    run_job(load_job(None, raw=raw), ("finetune",))
    err = capfd.readouterr().err
    assert not _report_lines(err), err
    ours = [line for line in err.splitlines() if "new task head" in line]
    line = (
        "rapids_attn: finetune: new task head qa_outputs (random weights, trained now); "
        "the checkpoint's pooler.dense not used by the task's model"
    )
    assert ours == [line], err
    assert "warning: finetune" not in err  # nothing of the model itself is missing


def test_a_classifier_head_is_one_line_too(tiny_bert_dir, capfd, hf_stderr):
    from transformers import AutoModelForSequenceClassification

    model = load_for_task(AutoModelForSequenceClassification, str(tiny_bert_dir), num_labels=3)
    assert model.config.num_labels == 3
    err = capfd.readouterr().err
    assert not _report_lines(err), err
    assert [line for line in err.splitlines() if line.startswith("rapids_attn:")] == [
        "rapids_attn: finetune: new task head classifier (random weights, trained now)"
    ]


def test_missing_weights_of_the_model_itself_are_a_warning():
    model = SimpleNamespace(base_model_prefix="bert", bert=object())
    info = {
        "missing_keys": {"qa_outputs.weight", "qa_outputs.bias", "bert.encoder.layer.0.output.dense.weight"},
        "unexpected_keys": set(),
        "mismatched_keys": set(),
    }
    line, warning = load_note(model, info, "/models/x")
    assert line == "rapids_attn: finetune: new task head qa_outputs (random weights, trained now)"
    assert warning.startswith("warning: finetune: 1 weight(s) of the model itself are not in /models/x")
    assert "bert.encoder.layer.0.output.dense.weight" in warning
    nothing = {"missing_keys": set(), "unexpected_keys": set(), "mismatched_keys": set()}
    assert load_note(model, nothing, "/models/x") == (None, None)  # a folder with its head: silent


class _Fails:
    """A model class whose load logs a report and another warning, then fails (a shape mismatch, say)."""

    @staticmethod
    def from_pretrained(source, **kwargs):
        log = logging.getLogger(REPORT_LOGGER)
        log.warning("Thing LOAD REPORT from: %s\nKey | Status\nw | MISMATCH", source)
        log.warning("another warning of transformers")
        raise RuntimeError("For details look at the above report!")


def test_a_load_that_fails_shows_the_report_and_other_warnings_pass(capfd):
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    logger = logging.getLogger(REPORT_LOGGER)
    logger.addHandler(handler)
    try:
        with pytest.raises(RuntimeError, match="above report"):
            load_for_task(_Fails, "somewhere")
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in seen] == ["another warning of transformers"]  # the report held back ...
    assert "Thing LOAD REPORT from: somewhere\nKey | Status\nw | MISMATCH" in capfd.readouterr().err  # ... then shown
    assert not logger.filters  # the filter is gone after the load
