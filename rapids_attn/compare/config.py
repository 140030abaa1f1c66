"""The ``compare`` section of a job: the compare stage's settings (:class:`CompareConfig`), registered with the
stage (:attr:`rapids_attn.compare.stage.CompareStage.settings`)."""

from __future__ import annotations

from pydantic import Field, field_validator

from rapids_attn.settings import Section, show


class CompareConfig(Section):
    """Models compared head by head over the same inputs (the ``compare`` stage, issue 37)."""

    #: run the stage by default (it always runs when --stages names it).
    enabled: bool = False
    #: the models compared with the job's: local folders, hub ids or presets, each extracted over the job's examples
    #: into ``models/<label>`` of the run directory. Empty with finetune enabled: the model it started from.
    models: list[str] = Field(default_factory=list)
    #: examples whose maps are compared map to map (a seeded sample of the run's examples; null: all of them).
    examples: int | None = Field(500, gt=0)
    #: examples per forward pass of each model.
    batch_size: int = Field(16, gt=0)
    #: bootstrap resamples of the examples behind each interval.
    resamples: int = Field(1000, ge=100)
    #: the intervals' confidence level.
    level: float = Field(0.95, gt=0.5, lt=1)
    #: with finetune.control_seeds: the false-discovery rate across heads at which a head is called changed beyond
    #: the seed-to-seed floor (Benjamini-Hochberg).
    fdr: float = Field(0.05, gt=0, lt=1)
    #: maps per model the shared clustering is fitted on (a seeded sample; every map is then assigned).
    fit_sample: int = Field(20000, gt=0)
    #: also run the heads stage on each compared model (the job's heads settings and metric, over the same
    #: examples), so each head's change is shown beside its ablation cost in both models. Needs heads.enabled and a
    #: metric every compared model can be scored on (a base model without the fine-tune's task head cannot).
    heads: bool = False

    @field_validator("models")
    @classmethod
    def _distinct_models(cls, value: list[str]) -> list[str]:
        """Each entry names a model, and a model once. The message names the entry (``compare.models[1]: ...``),
        which the job loader shows in place of the field. The same model written two ways (``./m``, ``m/``), and
        the job's own model, are refused in preflight (rapids_attn.compare.stage.check_compared_names)."""
        for i, v in enumerate(value):
            if not str(v).strip():
                raise ValueError(f"compare.models[{i}]: is empty; name a model (a folder, a hub id or a preset)")
            if v in value[:i]:
                j = value.index(v)
                raise ValueError(f"compare.models[{i}]: {show(v)} is compare.models[{j}] again; list each model once")
        return value
