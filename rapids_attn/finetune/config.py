"""The ``finetune`` section of a job: the finetune stage's settings (:class:`FinetuneConfig`), registered with the
stage (:attr:`rapids_attn.finetune.stage.FinetuneStage.settings`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rapids_attn.settings import Section

#: the finetune settings that add control fine-tunes or keep its steps, and leave the analysed one as it is
CONTROL_SETTINGS = ("control_seeds", "shuffled_labels", "trajectory")


class FinetuneConfig(Section):
    """Fine-tune the model for the task before its heads are analysed (the ``finetune`` stage, issue 37), on
    HuggingFace's ``Trainer``. When enabled, the job's later stages analyse the fine-tuned model (the folder
    ``models/finetuned`` in the run directory), over the examples of the held-out groups only."""

    #: run the stage by default (it always runs when --stages names it).
    enabled: bool = False
    #: ``qa``: extractive question answering on SQuAD-format data; ``classify``: sequence classification on
    #: data.label_field.
    task: Literal["qa", "classify"] = "qa"
    #: share of the file's examples held out for evaluation, as whole groups (data.group_field; SQuAD: articles),
    #: so no context is on both sides. The later stages analyse the held-out examples (then data.sample/limit).
    eval_fraction: float = Field(0.5, gt=0, lt=1)
    #: at most this many training examples: a seeded sample of the training groups' (null: all of them).
    train_examples: int | None = Field(None, gt=0)
    #: at most this many held-out examples scored after training: a seeded sample (null: all of them).
    eval_examples: int | None = Field(None, gt=0)
    #: qa: train on every question (``all``) or on the answerable ones only (``answerable``: SQuAD 1.1's recipe;
    #: the no-answer decision then rests on the threshold, threshold_examples).
    train_questions: Literal["all", "answerable"] = "all"
    #: qa: the no-answer threshold on the margin (no-answer score minus best span score). 0: run_qa.py's rule,
    #: threshold 0. N > 0: N questions of the training groups are held back from training (a seeded sample, every
    #: kind of question) and the threshold is the one that scores best on them (SQuAD 2.0's best F1), then applied
    #: unchanged to the held-out groups.
    threshold_examples: int = Field(0, ge=0)
    #: tokens per training window (question and context); longer contexts are read in overlapping windows.
    max_length: int = Field(384, gt=16)
    #: tokens two consecutive windows of one context share (qa).
    doc_stride: int = Field(128, gt=0)
    learning_rate: float = Field(5e-5, gt=0)
    epochs: float = Field(2.0, gt=0)
    #: stop after this many optimizer steps (-1: run the epochs).
    max_steps: int = Field(-1, ge=-1)
    batch_size: int = Field(16, gt=0)
    eval_batch_size: int = Field(32, gt=0)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    weight_decay: float = Field(0.01, ge=0)
    #: a checkpoint (weights, optimizer, scheduler, RNG) every this many steps: an interrupted run resumes there.
    save_steps: int = Field(100, gt=0)
    #: the training seed of the analysed fine-tune: the new head's initial weights, the order of the batches,
    #: dropout. Apart from runtime.seed, which draws the split of groups and the samples, so another training seed
    #: trains on the same examples.
    seed: int = 0
    #: further fine-tunes with these training seeds, the same data and schedule (``models/finetuned-seed<N>``): the
    #: compare stage measures seed-to-seed change beside base-to-fine-tune change, and calls a head changed only
    #: above that floor. At least two give the floor intervals over seeds (three fine-tunes in all).
    control_seeds: list[int] = Field(default_factory=list)
    #: classify: one more fine-tune (training seed ``seed``) on the training labels shuffled among the examples
    #: (``models/finetuned-shuffled``): what training alone changes, without the task.
    shuffled_labels: bool = False
    #: keep the analysed fine-tune's weights at every checkpoint (``models/finetuned-steps/step-<N>``, every
    #: save_steps): the compare stage compares each with the base and with the final model, so the findings say
    #: when each change appears.
    trajectory: bool = False

    @classmethod
    def store_settings(cls, key: str, section: dict) -> dict:
        """Enabled, the store holds the fine-tune's maps over the held-out examples: the analysed fine-tune's settings
        are part of its key; its controls (other seeds, shuffled labels) are other models and are not."""
        if not section.get("enabled"):
            return {}
        return {key: {k: v for k, v in section.items() if k not in CONTROL_SETTINGS}}

    @model_validator(mode="after")
    def _controls(self) -> FinetuneConfig:
        if len(set(self.control_seeds)) != len(self.control_seeds) or self.seed in self.control_seeds:
            raise ValueError(
                f"control_seeds {self.control_seeds} must be distinct and differ from finetune.seed ({self.seed}): "
                "each names one more fine-tune"
            )
        if self.task != "qa" and (self.train_questions != "all" or self.threshold_examples):
            raise ValueError(
                "train_questions and threshold_examples are settings of finetune.task: qa; leave them at all and 0"
            )
        if self.shuffled_labels and self.task != "classify":
            raise ValueError(
                "shuffled_labels is a control of finetune.task: classify (labels shuffled among the training "
                "examples); set finetune.shuffled_labels: false, or use control_seeds for qa"
            )
        return self

    @model_validator(mode="after")
    def _stride_in_window(self) -> FinetuneConfig:
        if self.doc_stride >= self.max_length // 2:
            raise ValueError(
                f"doc_stride ({self.doc_stride}) must be under half of max_length ({self.max_length}), or the "
                "question and the overlap leave no new context per window; lower finetune.doc_stride"
            )
        return self
