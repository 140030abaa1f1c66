"""Extractive question answering fine-tuned with HuggingFace's ``Trainer`` on SQuAD-format examples (issue 37).

The preprocessing is the standard one (HuggingFace's ``run_qa.py``): question and context tokenized as a pair,
the context cut into windows of ``max_length`` tokens that overlap by ``doc_stride``, each window's offset
mapping kept; a window whose context holds the whole first answer is trained to point at it, any other window
(and an unanswerable question's) at the first token, the no-answer position. At evaluation each example's
windows vote: the best valid span of any window (start and end in the context, end not before start, at most
30 tokens: :func:`rapids_attn.heads.squad_eval.best_span`) against the no-answer score (the first token's start
plus end logits), and the prediction is scored with SQuAD 2.0's official rules (exact, F1, and both split into
HasAns and NoAns).

Training is resumable: ``Trainer`` writes a checkpoint every ``save_steps`` steps (weights, optimizer,
scheduler, RNG states), and :func:`train_qa` resumes from the newest complete one it finds (one cut while it
was written is set aside: :mod:`rapids_attn.finetune.checkpoints`), so a run killed or interrupted ends with the
weights an uninterrupted run gets. The finished model is written into a staging folder and moved into place whole
(:func:`finish`): a folder that exists is complete.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from rapids_attn.data.example import Example
from rapids_attn.heads.squad_eval import best_span, exact_score, f1_score, gold_answers


@dataclass(frozen=True)
class QAWindowing:
    """How a question and its context become the model's inputs."""

    max_length: int = 384
    doc_stride: int = 128


def answer_start(ex: Example) -> int | None:
    """Where the first answer starts in the context (characters), or None for an unanswerable question
    (:meth:`Example.answer_span`: the file's ``answer_start`` where it marks the answer, else its first occurrence)."""
    span = ex.answer_span()
    return None if span is None else span[0]


def _windows(tokenizer, examples: Sequence[Example], w: QAWindowing):
    pad_right = tokenizer.padding_side == "right"
    questions = [ex.text.lstrip() for ex in examples]  # leading spaces only waste the window (run_qa.py)
    contexts = [ex.text_pair or "" for ex in examples]
    return tokenizer(
        questions if pad_right else contexts,
        contexts if pad_right else questions,
        truncation="only_second" if pad_right else "only_first",
        max_length=w.max_length,
        stride=w.doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding=False,
    ), (1 if pad_right else 0)


def train_features(tokenizer, examples: Sequence[Example], w: QAWindowing) -> list[dict]:
    """Each example's windows with ``start_positions`` and ``end_positions``: the first answer's tokens where the
    window's context holds all of it, else the first token (no answer)."""
    enc, ctx_id = _windows(tokenizer, examples, w)
    out = []
    for i, offsets in enumerate(enc["offset_mapping"]):
        ex = examples[enc["overflow_to_sample_mapping"][i]]
        seq = enc.sequence_ids(i)
        ctx = [t for t, s in enumerate(seq) if s == ctx_id]
        start = end = 0
        at = answer_start(ex)
        if at is not None and ctx:
            end_char = at + len(ex.answers[0])
            first, last = ctx[0], ctx[-1]
            if offsets[first][0] <= at and offsets[last][1] >= end_char:
                s = first
                while s <= last and offsets[s][0] <= at:
                    s += 1
                e = last
                while e >= first and offsets[e][1] >= end_char:
                    e -= 1
                start, end = s - 1, e + 1
        feat = {k: enc[k][i] for k in enc if k not in ("offset_mapping", "overflow_to_sample_mapping")}
        feat.update(start_positions=start, end_positions=end)
        out.append(feat)
    return out


def eval_features(tokenizer, examples: Sequence[Example], w: QAWindowing) -> tuple[list[dict], list[dict]]:
    """(model inputs, what scoring needs) for each window: its example's index, its context tokens and their
    character offsets."""
    enc, ctx_id = _windows(tokenizer, examples, w)
    inputs, meta = [], []
    for i, offsets in enumerate(enc["offset_mapping"]):
        seq = enc.sequence_ids(i)
        inputs.append({k: enc[k][i] for k in enc if k not in ("offset_mapping", "overflow_to_sample_mapping")})
        ctx = np.asarray([t for t, s in enumerate(seq) if s == ctx_id], dtype=np.int64)
        meta.append({"example": enc["overflow_to_sample_mapping"][i], "context": ctx, "offsets": offsets})
    return inputs, meta


def span_predictions(
    examples: Sequence[Example], meta: list[dict], start: list, end: list
) -> tuple[list[str], np.ndarray]:
    """Each example's best valid span of any of its windows (the answer it would give if it had to answer; "" where
    no window has one), and its no-answer margin: the least no-answer score of its windows (first token's start +
    end) minus that span's score (+inf without a span). The official evaluation's ``na_prob``: higher is more
    surely unanswerable."""
    best: dict[int, tuple[float, str]] = {}
    null: dict[int, float] = {}
    for m, s, e in zip(meta, start, end, strict=True):
        s, e = np.asarray(s, dtype=np.float64), np.asarray(e, dtype=np.float64)
        i = m["example"]
        null[i] = min(null.get(i, np.inf), float(s[0] + e[0]))
        score, a, b = best_span(s, e, m["context"])
        if a >= 0 and score > best.get(i, (-np.inf, ""))[0]:
            text = examples[i].text_pair or ""
            best[i] = (score, text[m["offsets"][a][0] : m["offsets"][b][1]])
    spans = [best.get(i, (-np.inf, ""))[1] for i in range(len(examples))]
    margin = np.asarray([null.get(i, -np.inf) - best.get(i, (-np.inf, ""))[0] for i in range(len(examples))])
    return spans, margin


def predict_answers(examples: Sequence[Example], meta: list[dict], start: list, end: list) -> list[str]:
    """Each example's answer from its windows' logits: the best valid span of any window, or "" where the
    no-answer score (first token's start + end) of a window is higher (run_qa.py's rule, threshold 0)."""
    spans, margin = span_predictions(examples, meta, start, end)
    return [text if m < 0 else "" for text, m in zip(spans, margin, strict=True)]


def best_threshold_scores(examples: Sequence[Example], spans: Sequence[str], margin: np.ndarray) -> dict:
    """The official SQuAD 2.0 evaluation's ``best_exact`` and ``best_f1`` (and their thresholds): the scores when
    the no-answer threshold on ``margin`` is the one that scores best on these examples (``find_best_thresh``:
    answer where the margin is at most the threshold). An upper bound a model reaches with its threshold tuned on
    this very set; it shows what its spans are worth apart from its no-answer calibration."""
    rows = []
    for ex, text, m in zip(examples, spans, margin, strict=True):
        gold = gold_answers(ex)
        if gold is None:
            continue
        has = gold != [""]
        rows.append(
            (
                float(m),
                has,
                bool(text),
                max(exact_score(g, text) for g in gold) if has else 0,
                max(f1_score(g, text) for g in gold) if has else 0.0,
            )
        )
    out = {}
    for col, name in ((3, "exact"), (4, "f1")):
        cur = best = float(sum(not r[1] for r in rows))  # every question answered "no answer"
        thresh = 0.0
        for r in sorted(rows, key=lambda r: r[0]):
            cur += r[col] if r[1] else (-1 if r[2] else 0)
            if cur > best:
                best, thresh = cur, r[0]
        out[f"best_{name}"] = round(100.0 * best / max(len(rows), 1), 2)
        out[f"best_{name}_thresh"] = round(float(thresh), 4)
    return out


def example_f1(examples: Sequence[Example], predictions: Sequence[str]) -> np.ndarray:
    """Each scored example's F1 in percent (SQuAD 2.0's rule: the best over its gold answers; an unanswerable
    question scores 100 for "" and 0 otherwise), in order, skipping examples without gold answers as
    :func:`squad_v2_scores` does: its ``f1`` is this array's mean."""
    return np.asarray(
        [
            100.0 * max(f1_score(g, pred) for g in gold)
            for ex, pred in zip(examples, predictions, strict=True)
            if (gold := gold_answers(ex)) is not None
        ],
        dtype=np.float64,
    )


#: words too common to tell sentences apart (the overlap baseline leaves them out)
_COMMON = frozenset(
    [
        "the",
        "of",
        "and",
        "to",
        "in",
        "is",
        "was",
        "what",
        "which",
        "who",
        "whom",
        "whose",
        "when",
        "where",
        "why",
        "how",
        "did",
        "does",
        "do",
        "a",
        "an",
        "that",
        "this",
        "for",
        "on",
        "by",
        "with",
        "as",
        "at",
        "from",
        "are",
        "were",
        "be",
        "been",
        "it",
        "its",
        "his",
        "her",
        "their",
        "they",
        "he",
        "she",
        "or",
        "not",
    ]
)


def overlap_sentence_answers(examples: Sequence[Example]) -> list[str]:
    """A trivial baseline that answers: for each question, the context sentence sharing the most words with it
    (normalised as SQuAD's scorer does, common words left out; the first on ties). After the sliding-window
    baseline of Rajpurkar et al. 2016, at the sentence."""
    import re

    from rapids_attn.heads.squad_eval import normalize_answer

    out = []
    for ex in examples:
        words = set(normalize_answer(ex.text).split()) - _COMMON
        sentences = [t for t in re.split(r"(?<=[.!?])\s+", ex.text_pair or "") if t.strip()] or [""]
        shared = [len(words & set(normalize_answer(t).split())) for t in sentences]
        out.append(sentences[int(np.argmax(shared))])
    return out


def squad_v2_scores(examples: Sequence[Example], predictions: Sequence[str]) -> dict:
    """SQuAD 2.0's official numbers, in percent: exact and F1 over every question with gold answers, and each
    over the answerable (HasAns) and unanswerable (NoAns) ones, with their counts."""
    rows = []
    for ex, pred in zip(examples, predictions, strict=True):
        gold = gold_answers(ex)
        if gold is None:
            continue
        rows.append((gold != [""], max(exact_score(g, pred) for g in gold), max(f1_score(g, pred) for g in gold)))

    def pct(sel, col):
        vals = [r[col] for r in rows if sel(r)]
        return round(100.0 * float(np.mean(vals)), 2) if vals else None

    return {
        "exact": pct(lambda r: True, 1),
        "f1": pct(lambda r: True, 2),
        "total": len(rows),
        "HasAns_exact": pct(lambda r: r[0], 1),
        "HasAns_f1": pct(lambda r: r[0], 2),
        "HasAns_total": sum(r[0] for r in rows),
        "NoAns_exact": pct(lambda r: not r[0], 1),
        "NoAns_f1": pct(lambda r: not r[0], 2),
        "NoAns_total": sum(not r[0] for r in rows),
    }


@dataclass(frozen=True)
class TrainSettings:
    """What ``Trainer`` is given, beside the data (``TrainingArguments`` names)."""

    seed: int = 0
    learning_rate: float = 5e-5
    num_train_epochs: float = 2.0
    max_steps: int = -1
    per_device_train_batch_size: int = 16
    per_device_eval_batch_size: int = 32
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    save_steps: int = 100
    logging_steps: int = 50


def training_arguments(out: Path, s: TrainSettings, device: str):
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(out),
        seed=s.seed,
        data_seed=s.seed,
        learning_rate=s.learning_rate,
        num_train_epochs=s.num_train_epochs,
        max_steps=s.max_steps,
        per_device_train_batch_size=s.per_device_train_batch_size,
        per_device_eval_batch_size=s.per_device_eval_batch_size,
        weight_decay=s.weight_decay,
        warmup_steps=s.warmup_ratio,  # a ratio below 1 (transformers 5 took warmup_ratio into warmup_steps)
        save_strategy="steps",
        save_steps=s.save_steps,
        save_total_limit=2,
        logging_steps=s.logging_steps,
        report_to="none",
        use_cpu=device == "cpu",
        dataloader_num_workers=0,
    )


def last_checkpoint(out: Path) -> str | None:
    """The newest complete ``checkpoint-N`` folder ``Trainer`` left in ``out``, or None; newer incomplete ones are
    set aside, in one line each (:func:`rapids_attn.finetune.checkpoints.last_complete_checkpoint`)."""
    from rapids_attn.finetune.checkpoints import last_complete_checkpoint

    return last_complete_checkpoint(out)


def run_trainer(model, tokenizer, features: list[dict], s: TrainSettings, work: Path, device: str, callbacks=()):
    """``Trainer`` on ``features`` (padded per batch), its checkpoints in ``work``; a run finds and resumes from the
    last one. Returns the trainer (its model is trained). Both tasks train through it."""
    from transformers import DataCollatorWithPadding, Trainer

    trainer = Trainer(
        model=model,
        args=training_arguments(work, s, device),
        train_dataset=features,
        data_collator=DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
        callbacks=list(callbacks),
    )
    trainer.train(resume_from_checkpoint=last_checkpoint(work))
    return trainer


def train_qa(
    model, tokenizer, train: Sequence[Example], w: QAWindowing, s: TrainSettings, work: Path, device: str, callbacks=()
):
    """Fine-tune ``model`` (an ``AutoModelForQuestionAnswering``) on ``train``'s windows (:func:`run_trainer`)."""
    return run_trainer(model, tokenizer, train_features(tokenizer, train, w), s, work, device, callbacks)


def evaluate_qa(model, tokenizer, examples: Sequence[Example], w: QAWindowing, batch_size: int = 32) -> dict:
    """SQuAD 2.0 scores of ``model`` on ``examples`` (:func:`squad_v2_scores`), with its predictions by id."""
    import torch
    from transformers import DataCollatorWithPadding

    inputs, meta = eval_features(tokenizer, examples, w)
    collate = DataCollatorWithPadding(tokenizer)
    device = next(model.parameters()).device
    starts, ends = [], []
    model.eval()
    with torch.inference_mode():
        for i in range(0, len(inputs), batch_size):
            batch = {k: v.to(device) for k, v in collate(inputs[i : i + batch_size]).items()}
            out = model(**batch)
            n = batch["attention_mask"].sum(-1).tolist()
            for b, t in enumerate(n):
                starts.append(out.start_logits[b, :t].float().cpu().numpy())
                ends.append(out.end_logits[b, :t].float().cpu().numpy())
    spans, margin = span_predictions(examples, meta, starts, ends)
    predictions = [text if m < 0 else "" for text, m in zip(spans, margin, strict=True)]
    return {
        "scores": {**squad_v2_scores(examples, predictions), **best_threshold_scores(examples, spans, margin)},
        "predictions": {ex.id: p for ex, p in zip(examples, predictions, strict=True)},
        # each example's best span and no-answer margin: what a threshold tuned elsewhere is applied to
        "spans": spans,
        "margin": margin,
    }


def thresholded(spans: Sequence[str], margin: np.ndarray, threshold: float) -> list[str]:
    """The answers with the no-answer threshold ``threshold`` on the margin (answer where the margin is at most
    it; the official evaluation's rule, as :func:`best_threshold_scores` tunes it)."""
    return [text if m <= threshold else "" for text, m in zip(spans, margin, strict=True)]


def finish(
    trainer,
    tokenizer,
    folder: Path,
    metrics: dict,
    settings: TrainSettings,
    w: QAWindowing | None,
    extra: dict | None = None,
) -> Path:
    """Write the fine-tuned model as an ordinary HuggingFace folder (weights, config, tokenizer, training
    arguments, ``metrics.json``) into ``folder``, whole: into a staging folder beside it, then renamed, so a
    ``folder`` that exists is complete."""
    folder = Path(folder)
    stage = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(stage, ignore_errors=True)
    trainer.save_model(str(stage))  # weights, config, training_args.bin; the tokenizer (processing_class)
    tokenizer.save_pretrained(str(stage))
    (stage / "metrics.json").write_text(
        json.dumps(
            {
                "metrics": metrics,
                "settings": asdict(settings),
                "windowing": asdict(w) if w is not None else None,
                **(extra or {}),
            },
            indent=1,
        )
    )
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(stage, folder)
    return folder
