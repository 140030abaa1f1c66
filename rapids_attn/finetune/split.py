"""Train and evaluation examples split by group (SQuAD: by article), so no context is in both (issue 37)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rapids_attn.data.example import Example
from rapids_attn.errors import DataError


def split_by_group(
    examples: Sequence[Example], eval_fraction: float, seed: int = 0
) -> tuple[list[Example], list[Example]]:
    """(train, eval): whole groups (``Example.group``; SQuAD's article titles) go to one side or the other, the
    groups shuffled with ``seed`` and dealt to evaluation until it holds at least ``eval_fraction`` of the
    examples; each side keeps the input's order. A one-line error where the split cannot keep groups apart: fewer
    than two groups, or examples without one."""
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must lie between 0 and 1, got {eval_fraction}")
    missing = sum(1 for ex in examples if not ex.group)
    if missing:
        raise DataError(
            f"finetune: {missing} of {len(examples)} examples have no group (SQuAD: the article title), so the "
            "evaluation split cannot keep contexts apart from training; give data.group_field"
        )
    groups = sorted({ex.group for ex in examples})
    if len(groups) < 2:
        raise DataError(
            f"finetune: the data holds {len(groups)} group(s) ({', '.join(groups)[:80]}); a split that keeps "
            "contexts apart needs at least two (SQuAD: two articles)"
        )
    sizes = {g: 0 for g in groups}
    for ex in examples:
        sizes[ex.group] += 1
    order = [groups[i] for i in np.random.default_rng(seed).permutation(len(groups))]
    want, held = eval_fraction * len(examples), set()
    for g in order[:-1]:  # the last group always trains
        if sum(sizes[h] for h in held) >= want:
            break
        held.add(g)
    train = [ex for ex in examples if ex.group not in held]
    evaluation = [ex for ex in examples if ex.group in held]
    return train, evaluation


def job_examples(cfg):
    """(the index, every example) of the job's whole file (``data``'s reading settings without its ``sample`` and
    ``limit``: the split is made on the whole file, so a sample of the analysed examples never moves an article
    across it)."""
    from rapids_attn.data.readers import index_for

    index = index_for(cfg.data, whole=True)
    return index, index.read(range(len(index)))


@dataclass(frozen=True)
class JobSplit:
    """The finetune stage's examples: ``train`` (training groups), ``evaluation`` (held-out groups) and ``tune``
    (training groups' questions held back from training, where the qa no-answer threshold is tuned; else empty)."""

    train: list[Example]
    evaluation: list[Example]
    tune: list[Example]

    def __iter__(self):  # (train, evaluation), as the split was before it had a tuning part
        return iter((self.train, self.evaluation))


def job_split(cfg) -> JobSplit:
    """The job's whole file split for ``finetune``: by group (:func:`split_by_group`, seeded with ``runtime.seed``);
    then ``finetune.threshold_examples`` of the training side held back (seeded: every kind of question); then,
    with ``train_questions: answerable``, the unanswerable ones dropped; then each side sampled down to
    ``finetune.train_examples`` / ``eval_examples`` (seeded)."""
    from rapids_attn.data.index import select_positions

    f = cfg.finetune
    _, examples = job_examples(cfg)
    train, evaluation = split_by_group(examples, f.eval_fraction, cfg.runtime.seed)
    tune: list[Example] = []
    if f.threshold_examples:
        if f.threshold_examples >= len(train):
            raise DataError(
                f"finetune.threshold_examples: {f.threshold_examples} of the training groups' {len(train)} questions "
                "would leave none to train on; hold back fewer"
            )
        held = set(select_positions(len(train), sample=f.threshold_examples, seed=cfg.runtime.seed + 1))
        tune = [ex for i, ex in enumerate(train) if i in held]
        train = [ex for i, ex in enumerate(train) if i not in held]
    if f.train_questions == "answerable":
        train = [ex for ex in train if ex.answers]
        if not train:
            raise DataError(
                "finetune.train_questions: answerable, and no training question has an answer; use all, or data with "
                "answers"
            )
    train = [train[i] for i in select_positions(len(train), sample=f.train_examples, seed=cfg.runtime.seed)]
    evaluation = [
        evaluation[i] for i in select_positions(len(evaluation), sample=f.eval_examples, seed=cfg.runtime.seed)
    ]
    return JobSplit(train, evaluation, tune)


def held_out_index(cfg):
    """The job's data index for the stages after ``finetune``: the whole file's examples of the held-out groups
    (the ones training never saw), then ``data.sample`` and ``data.limit`` applied to those (seeded with
    ``data.seed``)."""
    from rapids_attn.data.index import select_positions

    index, examples = job_examples(cfg)
    _, evaluation = split_by_group(examples, cfg.finetune.eval_fraction, cfg.runtime.seed)
    held = {ex.group for ex in evaluation}
    positions = np.flatnonzero([ex.group in held for ex in examples])
    d = cfg.data
    keep = select_positions(len(positions), limit=d.limit, sample=d.sample, seed=d.seed)
    return index.subset(positions[np.asarray(keep, dtype=np.int64)])
