"""Train and evaluation examples split by group (SQuAD: by article), so no context is in both (issue 37)."""

from __future__ import annotations

from collections.abc import Sequence

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
