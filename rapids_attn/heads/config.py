"""The ``heads`` section of a job: the heads stage's settings (:class:`HeadsConfig`), registered with the stage
(:attr:`rapids_attn.heads.stage.HeadsStage.settings`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rapids_attn.settings import Section


class PruningConfig(Section):
    #: heads are removed cumulatively in each order; ``importance`` (least important first, by the gradient
    #: importance), ``ablation`` (smallest single-head ablation cost first) and ``random`` (the control).
    orders: list[Literal["importance", "ablation", "random"]] = Field(
        default_factory=lambda: ["importance", "ablation", "random"]
    )
    #: random orders drawn (seeded by runtime.seed), each a curve; the report shows their mean and range.
    random_orders: int = Field(2, ge=1, le=20)
    #: points on each curve (heads removed at each point spaced evenly from 0 to all but one head).
    steps: int = Field(24, ge=2, le=1000)


class ProbingConfig(Section):
    enabled: bool = True
    #: built-in tasks: ``label`` (the data's label_field; SQuAD: answerable / impossible), ``wh_word``
    #: (question type from its wh-word), ``length`` (SentEval's Length: token counts in 6 equal-frequency bins).
    tasks: list[Literal["label", "wh_word", "length"]] = Field(default_factory=lambda: ["label", "wh_word", "length"])
    #: stratified cross-validation folds per head.
    folds: int = Field(5, ge=2, le=20)
    #: the "best heads" representation: these many heads, chosen inside each training fold.
    top_k: int = Field(8, ge=1)


class HeadsConfig(Section):
    """Which heads matter (the ``heads`` stage; docs/stages.md, "Which heads matter")."""

    #: run the stage by default (it always runs when --stages names it).
    enabled: bool = False
    #: the task metric: ``squad`` (a question-answering head: SQuAD 2.0 exact match / F1), ``lm`` (a causal
    #: or masked LM head: loss), ``retrieval`` (a sentence-embedding model: question-to-paragraph recall@1
    #: and MRR), ``accuracy`` (a sequence classifier against label_field), or ``auto`` (by the model's head).
    metric: Literal["auto", "squad", "lm", "retrieval", "accuracy"] = "auto"
    #: examples evaluated: a seeded sample of the job's examples (runtime.seed), or all of them (null).
    examples: int | None = Field(1000, gt=0)
    #: how an ablated head's output is replaced: ``zero``, or ``mean`` (its mean output over the examples).
    ablation: Literal["zero", "mean"] = "zero"
    #: ablate every head alone (layers x heads runs over the examples).
    single: bool = True
    #: head sets ablated together: each ``layer``'s heads, each ``cluster``'s dominant heads (learn stage).
    sets: list[Literal["layer", "cluster"]] = Field(default_factory=lambda: ["layer", "cluster"])
    #: a head is one of a cluster's dominant heads when at least this share of its maps are in the cluster.
    cluster_share: float = Field(0.5, gt=0, le=1)
    #: Michel et al. (2019) importance: |dL/dgate| per head, accumulated over the examples.
    importance: bool = True
    pruning: PruningConfig = PruningConfig()
    probing: ProbingConfig = ProbingConfig()
    #: examples per forward pass.
    batch_size: int = Field(32, gt=0)
    #: tokens per input; longer inputs are truncated (the model's own limit when null).
    max_length: int | None = Field(None, gt=1)
