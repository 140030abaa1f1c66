"""The ``finetune`` stage (issue 37): the job's model fine-tuned for the task on HuggingFace's ``Trainer``, before
the later stages analyse it.

Off unless ``finetune.enabled``. It trains on the groups (SQuAD's articles) the seeded split puts on the training
side and scores the held-out ones (:mod:`rapids_attn.finetune.split`): SQuAD 2.0 exact, F1, HasAns and NoAns for
``qa``, accuracy for ``classify``. It writes an ordinary HuggingFace model folder, ``models/finetuned`` in the run
directory (weights, config, tokenizer, training arguments, ``metrics.json``), whole or not at all
(:func:`rapids_attn.finetune.qa.finish`), and the pipeline gives the later stages that folder as ``model.name``
(:func:`analysed_job`). ``Trainer`` checkpoints into ``models/finetune-checkpoints`` every ``save_steps``; a run
interrupted (Ctrl-C, kill -9) resumes from the last one, and the checkpoints are removed once the folder is
written. A folder already complete, made with the same settings over the same file, is kept and not trained again.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from rapids_attn.stage import RunContext, Stage, StageResult

#: under the run directory: the fine-tuned model's folder, and Trainer's checkpoints while it trains
MODELS_DIR = "models"
FINETUNED = "finetuned"
CHECKPOINTS = "finetune-checkpoints"

#: the prior work's result for BERT-base fine-tuned on SQuAD v2 (HuggingFace's run_qa.py, the dev set), shown beside
#: ours in summary.json and the report
PRIOR_WORK = {"exact": 72.96, "f1": 76.29, "HasAns_f1": 78.10, "NoAns_f1": 74.48}


def finetuned_folder(run_dir: Path) -> Path:
    return Path(run_dir) / MODELS_DIR / FINETUNED


def analysed_job(cfg):
    """The job as the stages after ``finetune`` see it: with ``finetune.enabled``, ``model.name`` is the fine-tuned
    folder in the run directory; otherwise the job itself."""
    if not cfg.finetune.enabled:
        return cfg
    model = cfg.model.model_copy(update={"name": str(finetuned_folder(cfg.run_dir)), "revision": None})
    return cfg.model_copy(update={"model": model})


def settings_key(cfg, fingerprint: str) -> dict:
    """What decides the fine-tuned weights: the model it starts from, the finetune section, the seed, the file."""
    return {
        "model": cfg.model.name,
        "revision": cfg.model.revision,
        "finetune": cfg.finetune.model_dump(mode="json"),
        "seed": cfg.runtime.seed,
        "data": str(cfg.data.path),
        "data_content": fingerprint,
    }


def _read_json(path: Path):
    """A JSON file's content, or None where it is absent or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def folder_key(folder: Path) -> dict | None:
    """What a complete fine-tuned folder was made from (its metrics.json's ``made_from``), or None."""
    made = _read_json(folder / "metrics.json")
    return made.get("made_from") if isinstance(made, dict) else None


@dataclass
class FinetuneResult(StageResult):
    task: str = "qa"
    folder: str = ""
    #: the folder was already complete with these settings: not trained again
    reused: bool = False
    resumed_from: str | None = None
    train_examples: int = 0
    eval_examples: int = 0
    train_groups: int = 0
    eval_groups: int = 0
    device: str = "cpu"
    train_seconds: float = 0.0
    train_samples_per_second: float | None = None
    #: qa: SQuAD 2.0 exact, f1, HasAns_* and NoAns_* (percent); classify: accuracy and per-class accuracy
    scores: dict = field(default_factory=dict)
    #: the same scorer with every question predicted unanswerable (qa)
    no_answer_baseline: dict = field(default_factory=dict)
    prior_work: dict = field(default_factory=lambda: dict(PRIOR_WORK))


class FinetuneStage(Stage):
    name = "finetune"
    #: built from the job as written (its model is the one fine-tuning starts from), not :func:`analysed_job`
    reads_base_model = True
    #: the explain stage reports it from the folder's metrics.json (:class:`rapids_attn.compare.report.FinetuneSection`)
    summarised = True

    @classmethod
    def report_section(cls):
        from rapids_attn.compare.report import FinetuneSection

        return FinetuneSection()

    def __init__(self, cfg):
        self.cfg = cfg

    @classmethod
    def from_job(cls, cfg) -> FinetuneStage:
        return cls(cfg)

    @classmethod
    def runs_by_default(cls, cfg) -> bool:
        return cfg.finetune.enabled

    def check(self, ctx: RunContext) -> None:
        from rapids_attn.errors import JobConfigError

        cfg = self.cfg
        if not cfg.finetune.enabled:
            raise JobConfigError(
                "--stages: finetune is named but finetune.enabled is false; set finetune.enabled: true (the later "
                "stages then analyse the fine-tuned model)"
            )
        if cfg.finetune.task == "qa":
            if ctx.data.format != "squad":
                raise JobConfigError(
                    f"finetune.task: qa trains on SQuAD-format data (answers with their character starts), and "
                    f"{cfg.data.path} is read as {ctx.data.format}; use a SQuAD JSON file or finetune.task: classify"
                )
            if cfg.data.squad_unit != "question":
                raise JobConfigError("finetune.task: qa needs data.squad_unit: question (a question and its paragraph)")
        elif not cfg.data.label_field and ctx.data.format != "squad":
            raise JobConfigError("finetune.task: classify trains on labels; set data.label_field")
        if cfg.finetune.max_length > (ctx.model.positions or cfg.finetune.max_length):
            raise JobConfigError(
                f"finetune.max_length: {cfg.finetune.max_length} exceeds the model's {ctx.model.positions} positions; "
                f"set it to {ctx.model.positions} or less"
            )

    def run(self, ctx: RunContext, client=None) -> FinetuneResult:
        import torch

        from rapids_attn.extract.model import load_config, load_tokenizer
        from rapids_attn.finetune import classify, qa
        from rapids_attn.finetune.split import job_split

        cfg, f = self.cfg, self.cfg.finetune
        folder = finetuned_folder(ctx.run_dir)
        key = settings_key(cfg, ctx.data.fingerprint)
        made = _read_json(folder / "metrics.json")
        if isinstance(made, dict) and made.get("made_from") == key:
            print(
                f"rapids_attn: finetune: {folder} is complete with these settings; not trained again", file=sys.stderr
            )
            return FinetuneResult(**{**made.get("result", {}), "reused": True, "folder": str(folder)})
        # the device plan's, as a worker would resolve it here: one GPU where the job runs on GPUs (multi-GPU
        # training is launched with accelerate or torchrun: docs/deployment.md)
        device = "cpu" if ctx.devices.extract.on_this_worker().device == "cpu" else "cuda"
        train, evaluation = job_split(cfg)
        source, _ = load_config(cfg.model)
        tokenizer = load_tokenizer(cfg.model)
        settings = qa.TrainSettings(
            seed=cfg.runtime.seed,
            learning_rate=f.learning_rate,
            num_train_epochs=f.epochs,
            max_steps=f.max_steps,
            per_device_train_batch_size=f.batch_size,
            per_device_eval_batch_size=f.eval_batch_size,
            weight_decay=f.weight_decay,
            warmup_ratio=f.warmup_ratio,
            save_steps=f.save_steps,
        )
        work = ctx.run_dir / MODELS_DIR / CHECKPOINTS
        if folder.exists():  # made with other settings (or another file): trained again, from scratch
            shutil.rmtree(folder)
        resumed = qa.last_checkpoint(work) if _read_json(work / "made_from.json") == key else None
        if resumed is None and work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True, exist_ok=True)
        (work / "made_from.json").write_text(json.dumps(key))
        if resumed:
            print(f"rapids_attn: finetune: resuming from {resumed}", file=sys.stderr)
        torch.manual_seed(cfg.runtime.seed)
        common = {"revision": cfg.model.revision, "trust_remote_code": cfg.model.trust_remote_code}
        if f.task == "qa":
            from transformers import AutoModelForQuestionAnswering

            w = qa.QAWindowing(max_length=f.max_length, doc_stride=f.doc_stride)
            model = AutoModelForQuestionAnswering.from_pretrained(source, **common)
            trainer = qa.train_qa(model, tokenizer, train, w, settings, work, device)
            scores = qa.evaluate_qa(trainer.model, tokenizer, evaluation, w, f.eval_batch_size)["scores"]
            baseline = qa.squad_v2_scores(evaluation, [""] * len(evaluation))
        else:
            from transformers import AutoModelForSequenceClassification

            w, baseline = None, {}
            names = classify.label_names(train)
            model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=len(names), **common)
            trainer = classify.train_classifier(model, tokenizer, train, names, f.max_length, settings, work, device)
            scores = classify.evaluate_classifier(
                trainer.model, tokenizer, evaluation, names, f.max_length, f.eval_batch_size
            )
        log = trainer.state.log_history
        train_log = next((e for e in reversed(log) if "train_runtime" in e), {})
        result = FinetuneResult(
            task=f.task,
            folder=str(folder),
            resumed_from=resumed,
            train_examples=len(train),
            eval_examples=len(evaluation),
            train_groups=len({ex.group for ex in train}),
            eval_groups=len({ex.group for ex in evaluation}),
            device=device,
            train_seconds=float(train_log.get("train_runtime", 0.0)),
            train_samples_per_second=train_log.get("train_samples_per_second"),
            scores=scores,
            no_answer_baseline=baseline,
        )
        qa.finish(trainer, tokenizer, folder, scores, settings, w, {"made_from": key, "result": result.to_dict()})
        shutil.rmtree(work, ignore_errors=True)
        return result
