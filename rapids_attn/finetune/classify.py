"""Sequence classification fine-tuned with HuggingFace's ``Trainer`` on a label field (issue 37: the companion
material's task). The labels are the examples' ``label`` values, numbered in sorted order and written into the
model's config (``id2label``, ``label2id``), so the saved folder names its classes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rapids_attn.data.example import Example
from rapids_attn.errors import DataError
from rapids_attn.finetune.qa import TrainSettings, run_trainer


def label_names(examples: Sequence[Example]) -> list[str]:
    """The classes, sorted; a one-line error for examples without a label or fewer than two classes."""
    missing = sum(1 for ex in examples if not ex.label)
    if missing:
        raise DataError(
            f"finetune: {missing} of {len(examples)} examples have no label; give data.label_field, or choose "
            "finetune.task: qa"
        )
    names = sorted({ex.label for ex in examples})
    if len(names) < 2:
        raise DataError(f"finetune: every example has the label {names[0]!r}; classification needs two classes")
    return names


def features(tokenizer, examples: Sequence[Example], names: list[str], max_length: int) -> list[dict]:
    index = {n: i for i, n in enumerate(names)}
    pairs = [ex.text_pair for ex in examples]
    enc = tokenizer(
        [ex.text for ex in examples],
        pairs if any(p is not None for p in pairs) else None,
        truncation=True,
        max_length=max_length,
    )
    return [
        {**{k: enc[k][i] for k in enc}, "labels": index[ex.label]} if ex.label in index else {k: enc[k][i] for k in enc}
        for i, ex in enumerate(examples)
    ]


def train_classifier(
    model,
    tokenizer,
    train: Sequence[Example],
    names: list[str],
    max_length: int,
    s: TrainSettings,
    work: Path,
    device: str,
    callbacks=(),
):
    """Fine-tune ``model`` (an ``AutoModelForSequenceClassification`` with ``len(names)`` labels) on ``train``;
    resumable from the last checkpoint in ``work`` (:func:`rapids_attn.finetune.qa.run_trainer`)."""
    model.config.id2label = dict(enumerate(names))
    model.config.label2id = {n: i for i, n in enumerate(names)}
    return run_trainer(model, tokenizer, features(tokenizer, train, names, max_length), s, work, device, callbacks)


def evaluate_classifier(
    model, tokenizer, examples: Sequence[Example], names: list[str], max_length: int, batch_size: int = 32
) -> dict:
    """Accuracy and per-class accuracy on ``examples`` (labels the training never saw count as wrong), and ``right``:
    each example's correctness, in order (for intervals against a baseline on the same examples)."""
    import torch
    from transformers import DataCollatorWithPadding

    feats = [{k: v for k, v in f.items() if k != "labels"} for f in features(tokenizer, examples, names, max_length)]
    collate = DataCollatorWithPadding(tokenizer)
    device = next(model.parameters()).device
    predicted = []
    model.eval()
    with torch.inference_mode():
        for i in range(0, len(feats), batch_size):
            batch = {k: v.to(device) for k, v in collate(feats[i : i + batch_size]).items()}
            predicted += model(**batch).logits.argmax(-1).tolist()
    right = np.asarray([names[p] == ex.label for p, ex in zip(predicted, examples, strict=True)])
    per_class = {
        n: float(right[[ex.label == n for ex in examples]].mean()) for n in sorted({ex.label for ex in examples})
    }
    return {
        "accuracy": float(right.mean()) if len(right) else None,
        "per_class": per_class,
        "total": len(examples),
        "right": right.tolist(),
    }
