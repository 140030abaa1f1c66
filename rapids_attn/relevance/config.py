"""The ``relevance`` section of a job: the relevance stage's settings (:class:`RelevanceConfig`), registered with
the stage (:attr:`rapids_attn.relevance.stage.RelevanceStage.settings`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from rapids_attn.settings import Section


class RelevanceConfig(Section):
    """Where information flows and how heads relate (the ``relevance`` stage; docs/stages.md,
    "Where information flows")."""

    #: run the stage by default (it always runs when --stages names it).
    enabled: bool = False
    #: examples evaluated: a seeded sample of the job's examples (runtime.seed), or all of them (null).
    examples: int | None = Field(200, gt=0)
    #: token relevance methods (rapids_attn/relevance/methods.py): the head mean, the raw last layer,
    #: attention rollout, gradient-weighted rollout (for the model's own output), attention flow, and PageRank.
    methods: list[Literal["head_mean", "last_layer", "rollout", "grad_rollout", "flow", "pagerank"]] = Field(
        default_factory=lambda: [
            "head_mean",
            "last_layer",
            "rollout",
            "grad_rollout",
            "flow",
            "pagerank",
        ]
    )
    #: whose relevance: ``auto`` (the first token, [CLS], for encoders; the last token for decoders), ``first``,
    #: ``last``, or ``mean`` (the mean over every token's row; flow then costs T times more).
    query: Literal["auto", "first", "last", "mean"] = "auto"
    #: rollout and flow mix each layer's head-mean attention with the identity: r I + (1 - r) A (Abnar & Zuidema: 0.5).
    residual: float = Field(0.5, ge=0, le=1)
    #: attention flow runs one maximum flow per (query row, token) on (L + 1) T nodes; examples longer than
    #: this get no flow (NaN, counted in summary.json) instead of hours of CPU.
    flow_max_tokens: int = Field(128, gt=1)
    #: PageRank runs on the graph of one layer's heads (-1: the last layer), all of them or the ones listed.
    pagerank_layer: int = -1
    #: distinct head indices (0-based; preflight checks them against the model's heads); null: all heads.
    pagerank_heads: list[int] | None = None
    #: the head atlas: Clark et al.'s distance between heads, embedded in 2-D and clustered into this many groups.
    atlas: bool = True
    atlas_clusters: int = Field(8, ge=1)
    #: "related heads": each head's nearest heads in the atlas.
    related: int = Field(5, ge=1)
    #: examples per forward pass.
    batch_size: int = Field(8, gt=0)
    #: tokens per input; longer inputs are truncated (the model's own limit when null).
    max_length: int | None = Field(None, gt=1)

    @field_validator("pagerank_heads")
    @classmethod
    def _some_distinct_heads(cls, value: list[int] | None) -> list[int] | None:
        """An empty list would average no heads (a uniform PageRank); a repeated head would count twice. The
        upper bound is the model's heads, checked in preflight (the relevance stage's check)."""
        if value is None:
            return value
        if not value:
            raise ValueError("is empty, which ranks every token the same; list heads, or leave it out for all heads")
        if len(set(value)) != len(value) or any(h < 0 for h in value):
            raise ValueError("must be distinct non-negative head indices; list each head once")
        return value
