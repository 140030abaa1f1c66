"""The ``finetune`` stage (issue 37): the job's model fine-tuned for the task on HuggingFace's ``Trainer``, before
the later stages analyse it.

Off unless ``finetune.enabled``. It trains on the groups (SQuAD's articles) the seeded split puts on the training
side and scores the held-out ones (:mod:`rapids_attn.finetune.split`): SQuAD 2.0 exact, F1, HasAns and NoAns for
``qa``, accuracy for ``classify``. It writes an ordinary HuggingFace model folder, ``models/finetuned`` in the run
directory (weights, config, tokenizer, training arguments, ``metrics.json``), whole or not at all
(:func:`rapids_attn.finetune.qa.finish`), and the pipeline gives the later stages that folder as ``model.name``
(:func:`analysed_job`). ``Trainer`` checkpoints into ``models/finetune-checkpoints`` every ``save_steps``; a run
interrupted (Ctrl-C, kill -9) resumes from the newest complete one (one cut mid-write is set aside as
``incomplete-checkpoint-N`` and kept: :mod:`rapids_attn.finetune.checkpoints`), and the checkpoints are removed once
the folder is written. A folder already complete, made with the same settings over the same file, is kept and not trained again.

It trains in the job process, on its GPU 0 where the job runs on GPUs: the card whose pool worker 0 of a ``local-cuda``
cluster then asks for (80% of it by default; a pool that cannot be had is a worker that fails to start). So each
fine-tune's ``Trainer``, model and optimizer state are dropped and torch's cached GPU blocks given back
(:func:`free_training_memory`) before the stage returns, and so before the pipeline starts the cluster. The job
process keeps its CUDA context for its life (what it costs on the card is a check of docs/deployment.md's "The first
GPU run").
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rapids_attn.finetune import checkpoints
from rapids_attn.finetune.config import FinetuneConfig
from rapids_attn.stage import RunContext, Stage, StageResult

#: the heads stage's metric for a fine-tune's task head (``heads.metric: auto`` on the fine-tuned model)
TASK_METRICS = {"qa": "squad", "classify": "accuracy"}

#: under the run directory: the fine-tuned model's folder, and Trainer's checkpoints while it trains
MODELS_DIR = "models"
FINETUNED = "finetuned"
CHECKPOINTS = "finetune-checkpoints"

#: the prior work's result for BERT-base fine-tuned on SQuAD v2 (HuggingFace's run_qa.py, the dev set), shown beside
#: ours in summary.json and the report
PRIOR_WORK = {"exact": 72.96, "f1": 76.29, "HasAns_f1": 78.10, "NoAns_f1": 74.48}


@dataclass(frozen=True)
class FineTune:
    """One fine-tune of the job: the analysed one (``finetuned``) or a control: another training seed
    (``finetuned-seed<N>``) or the training labels shuffled (``finetuned-shuffled``); same data, same schedule."""

    label: str
    seed: int
    shuffled: bool = False

    @property
    def control(self) -> bool:
        return self.label != FINETUNED


def fine_tunes(cfg) -> list[FineTune]:
    """The job's fine-tunes, the analysed one first, then ``finetune.control_seeds`` in order, then the shuffled-label
    control."""
    f = cfg.finetune
    out = [FineTune(FINETUNED, f.seed)]
    out += [FineTune(f"{FINETUNED}-seed{s}", s) for s in f.control_seeds]
    if f.shuffled_labels:
        out.append(FineTune(f"{FINETUNED}-shuffled", f.seed, shuffled=True))
    return out


def free_training_memory() -> None:
    """What a fine-tune left in this process given back: ``Trainer``, the model, the optimizer and accelerate's
    wrappers hold each other in reference cycles, which only the collector frees, and torch keeps freed GPU blocks
    in its cache until told (:func:`rapids_attn.devices.empty_device_cache`: a no-op without CUDA)."""
    import gc

    from rapids_attn.devices import empty_device_cache

    gc.collect()
    empty_device_cache()


def finetuned_folder(run_dir: Path, label: str = FINETUNED) -> Path:
    return Path(run_dir) / MODELS_DIR / label


STEPS = "finetuned-steps"


def steps_folder(run_dir: Path) -> Path:
    """Where the analysed fine-tune's weights at each checkpoint are kept (``finetune.trajectory``)."""
    return Path(run_dir) / MODELS_DIR / STEPS


def trajectory_steps(run_dir: Path, key: dict | None = None) -> list[tuple[int, Path]]:
    """(step, folder) of each kept step, in order: complete folders only (``step-<N>`` with a config), and none
    where the folder was made from other settings than ``key``."""
    root = steps_folder(run_dir)
    if key is not None and _read_json(root / "made_from.json") != key:
        return []
    out = []
    for d in root.glob("step-*") if root.is_dir() else ():
        tail = d.name[len("step-") :]
        if tail.isdigit() and (d / "config.json").is_file():
            out.append((int(tail), d))
    return sorted(out)


class KeepSteps:
    """A ``TrainerCallback`` that writes the model and tokenizer as an HF folder at every checkpoint, whole (into a
    staging folder, then renamed): the trajectory the compare stage reads."""

    def __new__(cls, root: Path, tokenizer):
        from transformers import TrainerCallback

        class _Keep(TrainerCallback):
            def on_save(self, args, state, control, model=None, **kwargs):
                if model is None:
                    return
                stage = root / f".step-{state.global_step}.tmp"
                shutil.rmtree(stage, ignore_errors=True)
                model.save_pretrained(str(stage))
                tokenizer.save_pretrained(str(stage))
                final = root / f"step-{state.global_step}"
                shutil.rmtree(final, ignore_errors=True)
                stage.rename(final)

        return _Keep()


def checkpoints_folder(run_dir: Path, label: str = FINETUNED) -> Path:
    """Where ``Trainer`` checkpoints one fine-tune while it trains (``finetune-checkpoints`` for the analysed one)."""
    return Path(run_dir) / MODELS_DIR / (CHECKPOINTS if label == FINETUNED else f"{label}-checkpoints")


def analysed_job(cfg):
    """The job as the stages after ``finetune`` see it (:meth:`FinetuneStage.later_job`): with ``finetune.enabled``,
    ``model.name`` is the fine-tuned folder in the run directory (and ``heads.metric: auto`` its task's metric,
    :data:`TASK_METRICS`); otherwise the job itself. The job as written stays its ``as_written``."""
    if not cfg.finetune.enabled:
        return cfg
    model = cfg.model.model_copy(update={"name": str(finetuned_folder(cfg.run_dir)), "revision": None})
    update = {"model": model}
    heads = getattr(cfg, "heads", None)
    if heads is not None and heads.metric == "auto":  # the fine-tune's task head is scored by the task's metric
        update["heads"] = heads.model_copy(update={"metric": TASK_METRICS[cfg.finetune.task]})
    later = cfg.model_copy(update=update)
    later._as_written = cfg.as_written
    return later


def settings_key(cfg, fingerprint: str, run: FineTune | None = None) -> dict:
    """What decides one fine-tune's weights: the model it starts from, the finetune section (its own training seed;
    not the list of controls), whether its labels were shuffled, the split's seed (``runtime.seed``), the file."""
    from rapids_attn.finetune.config import CONTROL_SETTINGS

    run = run or fine_tunes(cfg)[0]
    f = {k: v for k, v in cfg.finetune.model_dump(mode="json").items() if k not in CONTROL_SETTINGS}
    f["seed"] = run.seed
    key = {
        "model": cfg.model.name,
        "revision": cfg.model.revision,
        "finetune": f,
        "seed": cfg.runtime.seed,
        "data": str(cfg.data.path),
        "data_content": fingerprint,
    }
    if run.shuffled:
        key["shuffled_labels"] = True
    return key


def shuffled(examples: list, seed: int) -> list:
    """``examples`` with their labels permuted among them (seeded): the same texts and the same class balance, no
    relation between a text and its label."""
    import dataclasses

    import numpy as np

    labels = [ex.label for ex in examples]
    order = np.random.default_rng(seed).permutation(len(labels))
    return [dataclasses.replace(ex, label=labels[i]) for ex, i in zip(examples, order, strict=True)]


def paired_difference(mine, theirs, level: float = 0.95, resamples: int = 2000, seed: int = 0) -> dict:
    """The mean of ``mine - theirs`` (per example, paired) with a percentile bootstrap interval over the examples
    (the compare stage's :func:`rapids_attn.compare.intervals.head_intervals`): whether a fine-tune beats a baseline
    on the same held-out examples, and by how much."""
    import numpy as np

    from rapids_attn.compare.intervals import head_intervals

    d = np.asarray(mine, dtype=np.float64) - np.asarray(theirs, dtype=np.float64)
    if d.size == 0:
        return {"mean": None, "ci": [None, None], "level": level, "examples": 0}
    h = head_intervals(d.reshape(-1, 1, 1), level=level, n_resamples=resamples, seed=seed)
    return {
        "mean": float(h.mean[0, 0]),
        "ci": [float(h.low[0, 0]), float(h.high[0, 0])],
        "level": level,
        "examples": int(d.size),
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


def _record_controls(folder: Path, controls: list) -> None:
    """The analysed fine-tune's ``metrics.json`` with this run's controls in its result (what the report reads),
    replaced whole."""
    made = _read_json(folder / "metrics.json")
    if not isinstance(made, dict) or made.get("result", {}).get("controls") == controls:
        return
    made.setdefault("result", {})["controls"] = controls
    tmp = folder / "metrics.json.tmp"
    tmp.write_text(json.dumps(made, indent=1))
    tmp.replace(folder / "metrics.json")


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
    #: the trivial baseline on the same held-out examples (qa: no answer, always; classify: the training side's
    #: majority class), its score, and the fine-tune's per-example gain over it with a bootstrap interval
    baseline: dict = field(default_factory=dict)
    prior_work: dict = field(default_factory=lambda: dict(PRIOR_WORK))
    #: its training seed (finetune.seed)
    seed: int = 0
    #: the control fine-tunes (finetune.control_seeds, shuffled_labels): label, seed, shuffled, folder, reused,
    #: train_seconds, scores and baseline, as above
    controls: list = field(default_factory=list)


class FinetuneStage(Stage):
    name = "finetune"
    settings = FinetuneConfig
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

    @classmethod
    def later_job(cls, cfg):
        """Enabled, the later stages analyse the fine-tuned folder (:func:`analysed_job`)."""
        return analysed_job(cfg)

    @classmethod
    def later_index(cls, cfg):
        """Enabled, the later stages read the held-out groups' examples only, the ones training never saw
        (:func:`rapids_attn.finetune.split.held_out_index`)."""
        if not cfg.finetune.enabled:
            return None
        from rapids_attn.finetune.split import held_out_index

        return held_out_index(cfg)

    @classmethod
    def later_ready(cls, cfg) -> bool:
        """The fine-tuned folder is complete (its metrics.json says what it was made from)."""
        return not cfg.finetune.enabled or folder_key(finetuned_folder(cfg.run_dir)) is not None

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
        analysed = cfg.model.max_length or ctx.model.positions
        if analysed and analysed > cfg.finetune.max_length:
            print(
                f"rapids_attn: finetune: the later stages read up to {analysed} tokens of a model trained on windows of "
                f"{cfg.finetune.max_length}; set model.max_length: {cfg.finetune.max_length} to analyse it at the length "
                "it was trained at",
                file=sys.stderr,
            )
        if cfg.finetune.max_length > (ctx.model.positions or cfg.finetune.max_length):
            raise JobConfigError(
                f"finetune.max_length: {cfg.finetune.max_length} exceeds the model's {ctx.model.positions} positions; "
                f"set it to {ctx.model.positions} or less"
            )

    def run(self, ctx: RunContext, client=None) -> FinetuneResult:
        from rapids_attn.finetune.split import job_split

        split = job_split(self.cfg)
        runs = fine_tunes(self.cfg)
        results = []
        for i, run in enumerate(runs):
            if len(runs) > 1:
                print(
                    f"rapids_attn: finetune: {run.label} ({i + 1} of {len(runs)}: training seed {run.seed}"
                    f"{', labels shuffled' if run.shuffled else ''})",
                    file=sys.stderr,
                    flush=True,
                )
            results.append(self._one(ctx, run, split))
            free_training_memory()  # before the next fine-tune, and before the pipeline starts a cluster
        main = results[0]
        main.controls = [
            {
                "label": run.label,
                "seed": run.seed,
                "shuffled": run.shuffled,
                **{k: getattr(r, k) for k in ("folder", "reused", "train_seconds", "scores", "baseline")},
            }
            for run, r in zip(runs[1:], results[1:], strict=True)
        ]
        _record_controls(Path(main.folder), main.controls)
        return main

    def _one(self, ctx: RunContext, run: FineTune, split) -> FinetuneResult:
        """One fine-tune: trained (or resumed, or its complete folder kept) and scored on the held-out examples."""
        import torch

        from rapids_attn.extract.model import load_config, load_tokenizer
        from rapids_attn.finetune import classify, qa
        from rapids_attn.finetune.taskhead import load_for_task

        cfg, f = self.cfg, self.cfg.finetune
        folder = finetuned_folder(ctx.run_dir, run.label)
        key = settings_key(cfg, ctx.data.fingerprint, run)
        made = _read_json(folder / "metrics.json")
        if isinstance(made, dict) and made.get("made_from") == key:
            print(
                f"rapids_attn: finetune: {folder} is complete with these settings; not trained again", file=sys.stderr
            )
            return FinetuneResult(**{**made.get("result", {}), "reused": True, "folder": str(folder)})
        # the device plan's, as a worker would resolve it here: one GPU where the job runs on GPUs (multi-GPU
        # training is launched with accelerate or torchrun: docs/deployment.md)
        device = "cpu" if ctx.devices.extract.on_this_worker().device == "cpu" else "cuda"
        train, evaluation = split.train, split.evaluation
        if run.shuffled:
            train = shuffled(train, run.seed)
        source, _ = load_config(cfg.model)
        tokenizer = load_tokenizer(cfg.model)
        settings = qa.TrainSettings(
            seed=run.seed,
            learning_rate=f.learning_rate,
            num_train_epochs=f.epochs,
            max_steps=f.max_steps,
            per_device_train_batch_size=f.batch_size,
            per_device_eval_batch_size=f.eval_batch_size,
            weight_decay=f.weight_decay,
            warmup_ratio=f.warmup_ratio,
            save_steps=f.save_steps,
        )
        work = checkpoints_folder(ctx.run_dir, run.label)
        if folder.exists():  # made with other settings (or another file): trained again, from scratch
            shutil.rmtree(folder)
        resumed = qa.last_checkpoint(work) if _read_json(work / "made_from.json") == key else None
        if resumed is None:
            checkpoints.clear(work)  # another job's (or none); a set-aside incomplete checkpoint is kept
        work.mkdir(parents=True, exist_ok=True)
        (work / "made_from.json").write_text(json.dumps(key))
        if resumed:
            print(f"rapids_attn: finetune: resuming from {resumed}", file=sys.stderr)
        torch.manual_seed(run.seed)
        common = {"revision": cfg.model.revision, "trust_remote_code": cfg.model.trust_remote_code}
        callbacks = []
        if f.trajectory and not run.control:
            root = steps_folder(ctx.run_dir)
            if _read_json(root / "made_from.json") != key or resumed is None:
                shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True, exist_ok=True)
            (root / "made_from.json").write_text(json.dumps(key))
            callbacks.append(KeepSteps(root, tokenizer))
        if f.task == "qa":
            from transformers import AutoModelForQuestionAnswering

            w = qa.QAWindowing(max_length=f.max_length, doc_stride=f.doc_stride)
            model = load_for_task(AutoModelForQuestionAnswering, source, **common)  # our line, not the load report
            trainer = qa.train_qa(model, tokenizer, train, w, settings, work, device, callbacks)
            scored = qa.evaluate_qa(trainer.model, tokenizer, evaluation, w, f.eval_batch_size)
            scores = scored["scores"]
            predictions = [scored["predictions"][ex.id] for ex in evaluation]
            if split.tune:  # the threshold that scores best on held-back training questions, applied as it is
                tuned = qa.evaluate_qa(trainer.model, tokenizer, split.tune, w, f.eval_batch_size)["scores"]
                abstaining = qa.squad_v2_scores(split.tune, [""] * len(split.tune))["f1"]
                # where no threshold beats abstaining on them, none is answered (the official search then
                # reports threshold 0, which would answer wherever the span outscores no-answer)
                threshold = float(tuned["best_f1_thresh"]) if tuned["best_f1"] > abstaining else float("-inf")
                predictions = qa.thresholded(scored["spans"], scored["margin"], threshold)
                scores = {
                    **qa.squad_v2_scores(evaluation, predictions),
                    "threshold": threshold if np.isfinite(threshold) else None,  # None: no question answered
                    "threshold_from": len(split.tune),
                    "threshold_zero": {k: scores[k] for k in ("exact", "f1", "HasAns_f1", "NoAns_f1")},
                    **{k: scores[k] for k in scores if k.startswith("best_")},
                }
            abstain = [""] * len(evaluation)
            no_answer = qa.squad_v2_scores(evaluation, abstain)
            baseline = {
                "name": "no answer, always",
                "score": "f1",
                "questions": "every held-out question (SQuAD 2.0's rules)",
                "value": no_answer["f1"],
                "gain": paired_difference(
                    qa.example_f1(evaluation, predictions), qa.example_f1(evaluation, abstain), seed=run.seed
                ),
            }
            if f.train_questions == "answerable":  # the task it was trained on: answer, on the answerable questions
                answerable = [ex for ex in evaluation if ex.answers]
                forced = [scored["spans"][i] for i, ex in enumerate(evaluation) if ex.answers]
                overlap = qa.overlap_sentence_answers(answerable)
                mine, theirs = qa.example_f1(answerable, forced), qa.example_f1(answerable, overlap)
                scores["answerable_forced"] = {
                    "f1": float(mine.mean()),
                    "exact": qa.squad_v2_scores(answerable, forced)["exact"],
                    "total": len(answerable),
                }
                baseline = {
                    "name": "the context sentence sharing the most words with the question",
                    "score": "f1",
                    "questions": "the held-out answerable questions, every one answered",
                    "value": float(theirs.mean()),
                    "gain": paired_difference(mine, theirs, seed=run.seed),
                    "also": baseline,  # SQuAD 2.0's rules against abstaining
                }
        else:
            from transformers import AutoModelForSequenceClassification

            w, no_answer = None, {}
            names = classify.label_names(train)
            model = load_for_task(AutoModelForSequenceClassification, source, num_labels=len(names), **common)
            trainer = classify.train_classifier(
                model, tokenizer, train, names, f.max_length, settings, work, device, callbacks
            )
            scores = classify.evaluate_classifier(
                trainer.model, tokenizer, evaluation, names, f.max_length, f.eval_batch_size
            )
            right = scores.pop("right")
            majority = max(names, key=lambda n: (sum(ex.label == n for ex in train), n))
            always = [ex.label == majority for ex in evaluation]
            baseline = {
                "name": f"the training side's majority class, always ({majority})",
                "score": "accuracy",
                "value": float(sum(always) / max(len(always), 1)),
                "gain": paired_difference(right, always, seed=run.seed),
            }
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
            no_answer_baseline=no_answer,
            baseline=baseline,
            seed=run.seed,
        )
        qa.finish(trainer, tokenizer, folder, scores, settings, w, {"made_from": key, "result": result.to_dict()})
        checkpoints.clear(work)
        return result
