"""The ``compare`` stage (issue 37): the job's model and one or more other models compared head by head over the
same examples.

Off unless ``compare.enabled``. The models compared with the job's are ``compare.models``, or, with
``finetune.enabled``, the model fine-tuning started from (then the job's model is the fine-tune). For each:

1. **Extraction into the same run.** It is extracted over the job's examples, with the job's extract, embed and
   store settings, into ``models/<label>/store.zarr`` of the run directory, by the extract stage's own tasks on the
   job's workers (resumable as any extraction; a store of other settings is refused as ever).
2. **Map to map** (:mod:`rapids_attn.compare.pairwise`), over a seeded sample of ``compare.examples`` examples:
   both models run on the same batch on a worker, and each head's cosine (Kovaleva et al.) and mean row
   Jensen-Shannon divergence (Clark et al.'s smoothing-free form) is summed block by block, never holding a map.
   Models whose tokenizers differ are compared on their statistics only (the reason is kept for the report).
3. **Every per-map statistic and detector**: the job's model's value minus the compared model's, per example,
   from the two stores.
4. Each head's (and each layer's) mean over examples with a percentile bootstrap interval
   (:func:`rapids_attn.compare.intervals.head_intervals`).
5. **One clustering of all models' maps** (the learn stage's estimator and settings, fitted on a seeded sample of
   each model's features, then every map assigned), so a cluster means the same in every model; per head, the
   share of examples whose map stays in its cluster, and the transitions.

Everything goes into the job's store (``compare_*`` arrays, the ``compare`` attribute); the explain stage reports it
("What changed between models").
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rapids_attn.compare.config import CompareConfig
from rapids_attn.stage import ReportSection, RunContext, Stage, StageResult
from rapids_attn.stagekit import MODEL_WORKER_MODULES
from rapids_attn.store import schema as S

MAP_MEASURES = ("cosine", "jsd")
BOUNDS = ("mean", "low", "high")
#: heads listed as the most changed, per compared model
TOP = 10


@dataclass(frozen=True)
class Compared:
    """A model compared with the job's: its label (its folder under ``models/``) and its model section."""

    label: str
    model: object  # ModelConfig


def _label(name: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(str(name).rstrip("/")).name or str(name)).strip("-.") or "model"
    label, i = base, 2
    while label in taken:
        label, i = f"{base}-{i}", i + 1
    taken.add(label)
    return label


def model_identity(name: str) -> str:
    """What a model name stands for: a folder's resolved path (so ``./m``, ``m/`` and a link to it are one model), a
    preset's package folder, or a hub id as written; the name itself where it resolves to nothing (preflight names
    that)."""
    from rapids_attn.errors import UserError
    from rapids_attn.extract.model import resolve_model_name

    try:
        return resolve_model_name(str(name))
    except (UserError, OSError):
        return str(name)


def check_compared_names(cfg) -> None:
    """Refuse, naming ``compare.models[i]``, an entry that names the job's own model where the job has no fine-tune
    (a model compared with itself: every head unchanged by construction), or the model an earlier entry names (each
    written differently: ``./m`` and ``m/``). With ``finetune.enabled`` the job's model is the fine-tune, and the
    model it starts from (``model.name``) is the base it is compared with: listing it is how the base is compared
    beside other models, not a repeat."""
    from rapids_attn.errors import JobConfigError
    from rapids_attn.settings import show

    job = model_identity(cfg.model.name)
    seen: dict[str, int] = {}
    for i, name in enumerate(cfg.compare.models):
        me = model_identity(name)
        if me == job and not cfg.finetune.enabled:
            raise JobConfigError(
                f"compare.models[{i}]: {show(name)} is the job's own model (model.name {show(cfg.model.name)}), "
                "and a model compared with itself changes nothing; list other models (or, to compare a fine-tune "
                "with this model, enable finetune and leave compare.models empty)"
            )
        if me in seen:
            j = seen[me]
            raise JobConfigError(
                f"compare.models[{i}]: {show(name)} is the model compare.models[{j}] ({show(cfg.compare.models[j])}) "
                "names already; list each model once"
            )
        seen[me] = i


def compared_models(cfg) -> tuple[str, list[Compared]]:
    """(the job's model's label, the models compared with it): ``compare.models``, or with ``finetune.enabled`` the
    model it starts from (``base``; the job's model is then ``finetuned``)."""
    taken: set[str] = set()
    if cfg.finetune.enabled:
        job_label = "finetuned"
        taken.add(job_label)
    else:
        job_label = _label(cfg.model.name, taken)
    names = list(cfg.compare.models) or ([cfg.model.name] if cfg.finetune.enabled else [])
    out = []
    if cfg.finetune.enabled:  # the control fine-tunes' labels are their folders' names: taken first
        from rapids_attn.finetune.stage import fine_tunes

        controls = [r.label for r in fine_tunes(cfg)[1:]]
        taken.update(controls)
    job_model = model_identity(cfg.model.name) if names else None
    for n in names:
        is_job_model = n == cfg.model.name or model_identity(n) == job_model  # as written, or another spelling
        if cfg.finetune.enabled and is_job_model and "base" not in taken:
            label = "base"
            taken.add(label)
        else:
            label = _label(n, taken)
        revision = cfg.model.revision if is_job_model else None
        out.append(Compared(label, cfg.model.model_copy(update={"name": n, "revision": revision})))
    if cfg.finetune.enabled:
        from rapids_attn.finetune.stage import finetuned_folder

        for label in controls:
            folder = str(finetuned_folder(cfg.run_dir, label))
            out.append(Compared(label, cfg.model.model_copy(update={"name": folder, "revision": None})))
    return job_label, out


def floor_plan(cfg, job_label: str, others: list[Compared]) -> tuple[str, list[str], str | None] | None:
    """(the base's label, the fine-tunes' labels, the shuffled control's label or None) where the job has control
    seeds (the noise floor, :mod:`rapids_attn.compare.floor`), else None."""
    if not (cfg.finetune.enabled and cfg.finetune.control_seeds):
        return None
    from rapids_attn.finetune.stage import fine_tunes

    runs = fine_tunes(cfg)
    labels = {o.label for o in others}
    if "base" not in labels:  # compare.models named others and not the base: no change to measure a floor under
        return None
    tunes = [job_label, *(r.label for r in runs[1:] if not r.shuffled)]
    control = next((r.label for r in runs if r.shuffled), None)
    return "base", tunes, control


@dataclass
class CompareResult(StageResult):
    models: list[str] = field(default_factory=list)
    examples_compared: int = 0
    examples: int = 0
    extracted: dict = field(default_factory=dict)


class CompareStage(Stage):
    name = "compare"
    requires = (S.FEATURES, S.STATS, S.DETECTORS)
    provides = S.arrays_of("compare")
    runs_on_workers = True
    worker_modules = (
        *MODEL_WORKER_MODULES,
        "rapids_attn.extract.shard",
        "rapids_attn.compare.work",
        "rapids_attn.heads.work",  # compare.heads: the heads stage's tasks on a compared model
    )
    summarised = True
    settings = CompareConfig

    def __init__(self, cfg):
        from rapids_attn.finetune.stage import analysed_job

        self.cfg = cfg
        self.job = analysed_job(cfg)
        self.job_label, self.others = compared_models(cfg)
        self.controls: set[str] = set()
        if cfg.finetune.enabled:
            from rapids_attn.finetune.stage import fine_tunes

            self.controls = {r.label for r in fine_tunes(cfg)[1:]}

    @classmethod
    def from_job(cls, cfg) -> CompareStage:
        return cls(cfg.as_written)  # the job as written: the model fine-tuning starts from is one it compares

    @classmethod
    def runs_by_default(cls, cfg) -> bool:
        return cfg.compare.enabled

    @classmethod
    def report_section(cls) -> ReportSection:
        from rapids_attn.compare.report import CompareSection

        return CompareSection()

    def uses_cluster(self, ctx: RunContext) -> bool:
        return True

    # -- preflight -------------------------------------------------------------------------------------
    def _job_model_now(self):
        """The job's model section to read a tokenizer or config from now: the fine-tune's folder once made, else
        the model it starts from (the same tokenizer, layers and heads)."""
        from rapids_attn.finetune.stage import folder_key

        if self.cfg.finetune.enabled and folder_key(Path(self.job.model.name)) is None:
            return self.cfg.model
        return self.job.model

    def _model_now(self, other: Compared):
        """A compared model's section to read now: a control fine-tune's folder once the finetune stage has made it,
        until then the model it starts from (the same tokenizer, layers and heads)."""
        from rapids_attn.finetune.stage import folder_key

        if other.label in self.controls and folder_key(Path(other.model.name)) is None:
            return self.cfg.model
        return other.model

    def check(self, ctx: RunContext) -> None:
        from rapids_attn.errors import JobConfigError

        if not self.cfg.compare.enabled:
            raise JobConfigError(
                "--stages: compare is named but compare.enabled is false; set compare.enabled: true and list "
                "compare.models (or enable finetune to compare the fine-tune with its base)"
            )
        if not self.others:
            raise JobConfigError(
                "compare.models: no model to compare the job's model with; list one or more (a folder, a hub id or "
                "a preset), or enable finetune to compare the fine-tune with the model it started from"
            )
        check_compared_names(self.cfg)
        if self.cfg.compare.heads:
            from rapids_attn.heads.stage import HeadsStage

            if not self.job.heads.enabled:
                raise JobConfigError(
                    "compare.heads: runs the heads stage on each compared model with the job's heads settings; set "
                    "heads.enabled: true (and its metric and examples), or compare.heads: false"
                )
            self._heads_metric = HeadsStage.from_job(self.job).metric_name(ctx)  # the same metric for every model
        self.plans = {o.label: self._planned(ctx, o) for o in self.others}

    def _field(self, other: Compared) -> str | None:
        """``compare.models[i]`` where the user listed this model, else None (the base a fine-tune is compared with
        by default is model.name; a control fine-tune is the finetune stage's)."""
        models = self.cfg.compare.models
        return f"compare.models[{models.index(other.model.name)}]" if other.model.name in models else None

    def _planned(self, ctx: RunContext, other: Compared) -> dict:
        """:meth:`_plan`, its refusal naming the field the user wrote: a compared model's own problem (its folder,
        config, tokenizer or weights; ``model.name: ...`` as the checks shared with the job's model say it) is
        ``compare.models[i]: ...``, and a job setting it fails (``model.max_length: ...``) says which model."""
        from rapids_attn.errors import UserError
        from rapids_attn.settings import show

        try:
            return self._plan(ctx, other)
        except UserError as e:
            field, line = self._field(other), str(e)
            if field is None or line.startswith("compare."):  # the stage's own lines name the model already
                raise
            if line.startswith("model.name: "):
                line = f"{field}: {line.removeprefix('model.name: ')}"
            else:
                line = f"{field} ({show(other.model.name)}): {line}"
            raise type(e)(line) from None

    def _plan(self, ctx: RunContext, other: Compared) -> dict:
        """Everything about one compared model preflight can settle: its shape against the job's, whether its
        tokens are the job's (map measures) and its extraction's context (checked as the extract stage checks)."""
        from rapids_attn.compare.pairwise import check_same_tokens
        from rapids_attn.errors import JobConfigError, ModelError
        from rapids_attn.extract.model import describe_model, load_config, load_tokenizer, resolve_attention

        now = self._model_now(other)
        info = describe_model(now, check_files=True, attention=self.job.extract.attention)
        mine = ctx.model
        if (info.n_layers, info.n_heads) != (mine.n_layers, mine.n_heads):
            raise JobConfigError(
                f"{self._field(other) or 'compare.models'}: '{other.model.name}' has {info.n_layers} layers x "
                f"{info.n_heads} heads and the job's "
                f"model {mine.n_layers} x {mine.n_heads}; head-by-head comparison needs the same layers and heads: "
                "list models of one shape"
            )
        texts = [
            [ex.text, ex.text_pair] if ex.text_pair is not None else ex.text
            for ex in ctx.data.read(range(min(32, len(ctx.data))))
        ]
        why = None
        try:
            check_same_tokens(
                other.label, load_tokenizer(now), self.job_label, load_tokenizer(self._job_model_now()), texts
            )
            for m in (now, self._job_model_now()):
                resolve_attention("blocked", load_config(m)[1], m.name)
        except ModelError as e:
            why = str(e)
        from rapids_attn.errors import UserError
        from rapids_attn.stagekit import stages_for

        sub = self._sub_context(ctx, other, info)
        for st in stages_for(self._sub_job(ctx, other), self._sub_stages()):
            try:
                st.check(sub)
            except UserError as e:
                if st.name == "extract":  # the compared model's own problem: named by _planned
                    raise
                raise JobConfigError(f"compare.{st.name}: model '{other.label}' ({other.model.name}): {e}") from None
        return {"maps": why is None, "why": why, "context": sub}

    def _sub_stages(self) -> tuple[type[Stage], ...]:
        """The stages run on each compared model: extract, and heads with ``compare.heads``."""
        from rapids_attn.extract.stage import ExtractStage
        from rapids_attn.heads.stage import HeadsStage

        return (ExtractStage, HeadsStage) if self.cfg.compare.heads else (ExtractStage,)

    def _sub_job(self, ctx: RunContext, other: Compared):
        from rapids_attn.compare.config import CompareConfig
        from rapids_attn.finetune.config import FinetuneConfig
        from rapids_attn.job import OutputConfig

        update = {
            "model": other.model,
            "finetune": FinetuneConfig(),
            "compare": CompareConfig(),
            "output": OutputConfig(dir=ctx.run_dir / "models" / other.label),
        }
        if self.cfg.compare.heads:  # single-head ablation with the job's metric, examples and ablation mode only
            h = self.job.heads
            update["heads"] = h.model_copy(
                update={
                    "metric": getattr(self, "_heads_metric", h.metric),
                    "single": True,
                    "sets": [],  # the compared model has no clustering of its own (the shared one is the compare's)
                    "importance": False,
                    "pruning": h.pruning.model_copy(update={"orders": []}),
                    "probing": h.probing.model_copy(update={"enabled": False}),
                }
            )
        return self.job.model_copy(update=update)

    def _sub_context(self, ctx: RunContext, other: Compared, info) -> RunContext:
        """The compared model's extraction: the job's examples and settings, its own model, layout and store in
        ``models/<label>``; its key also holds the job's (so a change of the job's examples re-extracts it)."""
        from rapids_attn.extract.stage import plan_layout

        sub_job = self._sub_job(ctx, other)
        e = self.job
        layout = plan_layout(e.extract, e.embed, e.store, len(ctx.data), info.n_layers, info.n_heads, other.model.name)
        layout = dataclasses.replace(layout, shard_size=ctx.layout.shard_size)  # the job's shards, row for row
        own = sub_job.extraction_key(ctx.data.fingerprint, layout.shard_size)
        return dataclasses.replace(
            ctx,
            run_dir=ctx.run_dir / "models" / other.label,
            job=sub_job.to_dict(),
            model=info,
            layout=layout,
            key=hashlib.sha256((own + ctx.key).encode()).hexdigest()[:16],
            stages=("extract",),
            results={},
            timings={},
        )

    # -- the run ---------------------------------------------------------------------------------------
    def run(self, ctx: RunContext, client=None) -> CompareResult:
        import zarr

        from rapids_attn.compare.work import MapsTask, compare_maps
        from rapids_attn.stagekit import map_tasks, open_for_run, run_stages, sample_positions, shards_of, stages_for
        from rapids_attn.store.zarr_store import consolidate, mark_complete

        if not hasattr(self, "plans"):
            self.check(ctx)
        extracted = {}
        for o in self.others:  # each compared model's maps, statistics and features, into models/<label>
            sub = self.plans[o.label]["context"]
            sub.run_dir.mkdir(parents=True, exist_ok=True)
            todo = stages_for(self._sub_job(ctx, o), self._sub_stages())
            print(
                f"rapids_attn: compare: {' and '.join(st.name for st in todo)} on {o.model.name} into {sub.run_dir}",
                file=sys.stderr,
                flush=True,
            )
            r = run_stages(todo, sub, client)["extract"]
            extracted[o.label] = {"store": str(sub.store_path), "resumed": r.resumed, "shards_run": r.shards_run}
            if self.cfg.compare.heads:
                extracted[o.label]["heads"] = self._heads_of(sub)
        from rapids_attn.extract.shard import release_worker_cache

        client.run(release_worker_cache)  # the workers' extraction models, before each loads two more
        g = open_for_run(self, ctx)
        groups = [str(x) for x in g[S.EXAMPLE_GROUP][:]]
        every = sample_positions(len(groups), groups, None, ctx.seed)  # all examples but the probes
        pos = sample_positions(len(groups), groups, self.cfg.compare.examples, ctx.seed)
        examples = ctx.data.read(pos)
        n_layers, n_heads = ctx.model.n_layers, ctx.model.n_heads
        maps = np.full((len(self.others), len(pos), n_layers, n_heads, len(MAP_MEASURES)), np.nan)
        # the floor's pairs the job's comparisons do not already hold (base against each control seed, the control
        # seeds against each other, the base against the shuffled-label control)
        pairs = self._extra_pairs()
        models = {self.job_label: self.job.model, **{o.label: o.model for o in self.others}}
        steps = self._steps(ctx)  # finetune.trajectory: each kept step against the base and the final model
        for step, folder in steps:
            models[f"step-{step}"] = self.cfg.model.model_copy(update={"name": str(folder), "revision": None})
            pairs += [("base", f"step-{step}"), (f"step-{step}", self.job_label)]
        pair_maps = np.full((len(pairs), *maps.shape[1:]), np.nan)
        todo = [(maps, i, o.label, self.job_label) for i, o in enumerate(self.others) if self.plans[o.label]["maps"]]
        todo += [(pair_maps, i, a, b) for i, (a, b) in enumerate(pairs)]
        tasks, where = [], []
        x = self.job.extract
        for out, i, a, b in todo:
            start = 0
            for part in shards_of(examples, ctx):
                tasks.append(
                    MapsTask(
                        models[a],
                        models[b],
                        ctx.devices.extract,
                        self.job.runtime.threads_per_worker,
                        tuple(part),
                        ctx.model.max_length,
                        self.cfg.compare.batch_size,
                        x.attention_base,
                        int(x.attention_block_mb) << 20,
                    )
                )
                where.append((out, i, start, start + len(part)))
                start += len(part)
        for (out, i, a, b), (cos, jsd) in zip(where, map_tasks(client, compare_maps, tasks, "compare"), strict=True):
            out[i, a:b, ..., 0], out[i, a:b, ..., 1] = cos, jsd
        if tasks:
            from rapids_attn.compare.work import release_models

            client.run(release_models)
        stores = [g] + [zarr.open_group(str(self.plans[o.label]["context"].store_path), mode="r") for o in self.others]
        made = self._write(ctx, g, stores, pos, every, maps)
        if pairs:
            S.create_array(
                g,
                S.COMPARE_PAIR_MAPS,
                pair_maps.shape,
                attributes={"measures": list(MAP_MEASURES), "pairs": [list(p) for p in pairs]},
                data=pair_maps,
            )
        info = self._summary(g, made, pos, every, extracted)
        floor = self._floor(ctx, maps, pairs, pair_maps)
        if floor:
            info["floor"] = floor
        if steps:
            info["trajectory"] = self._trajectory(ctx, maps, pairs, pair_maps, [s for s, _ in steps], floor)
        mark_complete(g, self.name, True, info)
        consolidate(ctx.store_path)
        return CompareResult(
            models=[self.job_label, *(o.label for o in self.others)],
            examples_compared=len(pos),
            examples=len(every),
            extracted=extracted,
        )

    def _extra_pairs(self) -> list[tuple[str, str]]:
        """The noise floor's pairs of models (:func:`rapids_attn.compare.floor.floor_pairs`) not among the job's
        comparisons, whose maps the stage compares as well; none without control seeds."""
        from rapids_attn.compare.floor import floor_pairs

        plan = floor_plan(self.cfg, self.job_label, self.others)
        if plan is None:
            return []
        have = {frozenset((self.job_label, o.label)) for o in self.others if self.plans[o.label]["maps"]}
        return [p for p in floor_pairs(*plan) if frozenset(p) not in have]

    def _steps(self, ctx: RunContext) -> list:
        """(step, folder) of the analysed fine-tune's kept steps (``finetune.trajectory``), where the base is
        compared; else none."""
        from rapids_attn.finetune.stage import settings_key, trajectory_steps

        if not (self.cfg.finetune.enabled and self.cfg.finetune.trajectory):
            return []
        if "base" not in {o.label for o in self.others}:
            return []
        steps = trajectory_steps(ctx.run_dir, settings_key(self.cfg, ctx.data.fingerprint))
        if not steps:
            print(
                "rapids_attn: compare: finetune.trajectory is set but no step of this fine-tune was kept (it was made "
                "without it): no trajectory; run the finetune stage again with --overwrite to keep its steps",
                file=sys.stderr,
            )
        return steps

    def _trajectory(self, ctx, maps, pairs, pair_maps, steps: list[int], floor: dict | None) -> dict:
        """Each kept step against the base and against the final model: per layer the mean divergence with its
        interval over examples, per head the mean; and for each head the first step whose divergence from the base
        reaches half of the final model's (when its change appears)."""
        from rapids_attn.compare.intervals import head_intervals

        c = self.cfg.compare
        boot = {"level": c.level, "n_resamples": c.resamples, "seed": ctx.seed}
        where = {tuple(p): i for i, p in enumerate(pairs)}
        base = next(i for i, o in enumerate(self.others) if o.label == "base")
        final = maps[base, ..., 1]  # [examples, layers, heads]: the final fine-tune against the base
        rows = []
        for step in steps:
            row = {"step": step}
            for name, pair in (("to_base", ("base", f"step-{step}")), ("to_final", (f"step-{step}", self.job_label))):
                v = pair_maps[where[pair], ..., 1]
                lay = head_intervals(v.mean(-1, keepdims=True), **boot)
                row[name] = {
                    "layers": np.stack([lay.mean[:, 0], lay.low[:, 0], lay.high[:, 0]], -1).tolist(),
                    "heads": v.mean(0).tolist(),
                }
            rows.append(row)
        to_base = np.asarray([r["to_base"]["heads"] for r in rows])  # [steps, layers, heads]
        half = final.mean(0) / 2
        reached = to_base >= half[None]
        first = np.where(reached.any(0), np.asarray(steps)[reached.argmax(0)], -1)
        return {
            "steps": steps,
            "measure": "jsd",
            "final": final.mean(0).tolist(),
            "rows": rows,
            # -1: not reached by any kept step (the change came after the last one)
            "half_change_step": first.tolist(),
        }

    def _floor(self, ctx: RunContext, maps: np.ndarray, pairs: list, pair_maps: np.ndarray) -> dict | None:
        """The noise-floor analysis (:func:`rapids_attn.compare.floor.noise_floor`) for each distance, or None
        without control seeds or map measures."""
        from rapids_attn.compare.floor import DISTANCES, noise_floor

        plan = floor_plan(self.cfg, self.job_label, self.others)
        if plan is None or maps.shape[1] < 2:
            return None
        c = self.cfg.compare
        out = {}
        for m, measure in enumerate(MAP_MEASURES):
            dist = DISTANCES[measure]
            values = {(self.job_label, o.label): dist(maps[i, ..., m]) for i, o in enumerate(self.others)}
            values.update({tuple(p): dist(pair_maps[i, ..., m]) for i, p in enumerate(pairs)})
            if not all(np.isfinite(v).all() for v in values.values()):
                return None  # a pair compared on statistics only (another tokenizer): no map distance to floor
            print(f"rapids_attn: compare: noise floor ({measure})", file=sys.stderr, flush=True)
            out[measure] = noise_floor(
                values, *plan, level=c.level, fdr=c.fdr, resamples=c.resamples, seed=ctx.seed, measure=measure
            )
        return out

    def _heads_of(self, sub: RunContext) -> dict:
        """What the heads stage's single-head ablation on a compared model (over the job's heads examples, run by
        :meth:`run`) left in its store: the metric, the examples, the whole model's score and each head's cost
        [layer][head]."""
        import zarr

        from rapids_attn.explain.heads import stored_result

        info = stored_result(zarr.open_group(str(sub.store_path), mode="r")) or {}
        keep = ("metric", "examples", "ablation", "headline", "base", "cost")
        return {k: info[k] for k in keep if k in info}

    def _write(self, ctx: RunContext, g, stores: list, pos: np.ndarray, every: np.ndarray, maps: np.ndarray) -> dict:
        from rapids_attn.compare.intervals import head_intervals
        from rapids_attn.extract.signature import DETECTOR_NAMES, STAT_NAMES

        c = self.cfg.compare
        boot = {"level": c.level, "n_resamples": c.resamples, "seed": ctx.seed}
        n_other = len(self.others)
        labels = [self.job_label, *(o.label for o in self.others)]
        S.create_array(g, S.COMPARE_MODEL, (len(labels),), data=np.asarray(labels))
        S.create_array(g, S.COMPARE_EXAMPLE, (len(pos),), data=pos.astype(np.int32))
        S.create_array(g, S.COMPARE_MAPS, maps.shape, attributes={"measures": list(MAP_MEASURES)}, data=maps)
        heads = np.full((n_other, len(MAP_MEASURES), *maps.shape[2:4], 3), np.nan, np.float32)
        layers = np.full((n_other, len(MAP_MEASURES), maps.shape[2], 3), np.nan, np.float32)
        for i in range(n_other):
            for m in range(len(MAP_MEASURES)):
                v = maps[i, ..., m]
                if len(pos) == 0 or not np.isfinite(v).all():
                    continue
                h = head_intervals(v, **boot)
                heads[i, m] = np.stack([h.mean, h.low, h.high], -1)
                lay = head_intervals(v.mean(-1, keepdims=True), **boot)  # each example's layer mean over heads
                layers[i, m] = np.stack([lay.mean[:, 0], lay.low[:, 0], lay.high[:, 0]], -1)
        S.create_array(g, S.COMPARE_MAP_HEADS, heads.shape, attributes={"measures": list(MAP_MEASURES)}, data=heads)
        S.create_array(g, S.COMPARE_MAP_LAYERS, layers.shape, attributes={"measures": list(MAP_MEASURES)}, data=layers)
        names = [*STAT_NAMES, *DETECTOR_NAMES]
        own = np.concatenate([g[S.STATS][:], g[S.DETECTORS][:]], -1)[every].astype(np.float64)
        stat = np.full((n_other, len(names), *own.shape[1:3], 3), np.nan, np.float32)
        for i, st in enumerate(stores[1:]):
            theirs = np.concatenate([st[S.STATS][:], st[S.DETECTORS][:]], -1)[every].astype(np.float64)
            delta = own - theirs
            for s in range(len(names)):
                d = delta[..., s]
                keep = np.isfinite(d).all(axis=(1, 2))  # examples where every head has the value (the *_cond ones)
                if keep.sum() < 1:
                    continue
                h = head_intervals(d[keep], **boot)
                stat[i, s] = np.stack([h.mean, h.low, h.high], -1)
        S.create_array(g, S.COMPARE_STAT_HEADS, stat.shape, attributes={"names": names}, data=stat)
        clusters, xy = self._clusters(ctx, stores, every)
        S.create_array(g, S.COMPARE_CLUSTER, clusters.shape, data=clusters)
        S.create_array(g, S.COMPARE_COORDS, xy.shape, data=xy)
        return {"map_heads": heads, "map_layers": layers, "stat_heads": stat, "names": names, "clusters": clusters}

    def _clusters(self, ctx: RunContext, stores: list, every: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each model's maps (the examples ``every``) in one clustering: the learn stage's estimator and settings,
        fitted on a seeded sample of ``compare.fit_sample`` maps per model, then every map assigned. Returns the
        labels [model, example, layer, head] and the maps' 2-D coordinates in the clustered space (the explorer's)."""
        from rapids_attn.backends import LearnBackend
        from rapids_attn.learn.estimator import MapClusterer

        backend = ctx.devices.learn or LearnBackend("sklearn", "scikit-learn")  # the job may run no learn stage
        feats = [st[S.FEATURES] for st in stores]
        shape = (len(every), *feats[0].shape[1:3])
        per_example = shape[1] * shape[2]
        # whole examples, a seeded sample of them, about fit_sample maps per model
        k = max(1, min(len(every), self.cfg.compare.fit_sample // per_example))
        sample = np.sort(np.random.default_rng(ctx.seed).choice(every, size=k, replace=False))
        fit = np.concatenate([f.get_orthogonal_selection((sample,)).reshape(-1, f.shape[-1]) for f in feats])
        est = MapClusterer.from_config(self.job.reduce, self.job.cluster, ctx.seed, backend)
        est.fit(backend.asarray(fit))
        b = est.backend_
        n_all = feats[0].shape[0]  # the store's examples: the probes (not in ``every``) stay -1 and NaN
        out = np.full((len(stores), n_all, *shape[1:]), -1, np.int32)
        xy = np.full((len(stores), n_all, *shape[1:], 2), np.nan, np.float32)
        step = max(1, 65536 // (shape[1] * shape[2]))
        for m, f in enumerate(feats):
            for s in range(0, len(every), step):
                sel = every[s : s + step]
                x = f.get_orthogonal_selection((sel,)).astype(np.float32)
                z = est.transform(b.asarray(x.reshape(-1, x.shape[-1])))
                lab = b.to_numpy(est.predict_embedding(z))
                out[m, sel] = lab.reshape(len(sel), shape[1], shape[2])
                xy[m, sel] = b.to_numpy(z)[:, :2].reshape(len(sel), shape[1], shape[2], -1)
        self.n_clusters_ = int(est.n_clusters_) if est.n_clusters_ is not None else int(out.max() + 1)
        return out, xy

    def _summary(self, g, made: dict, pos: np.ndarray, every: np.ndarray, extracted: dict) -> dict:
        """The stage's result, kept in the store (the ``compare`` attribute): what the report and summary.json read."""
        from rapids_attn.stagekit import json_safe

        layers = [int(v) for v in g[S.LAYER][:]]
        heads = [int(v) for v in g[S.HEAD][:]]
        stat_heads, names, clusters = made["stat_heads"], made["names"], made["clusters"]
        map_heads, map_layers = made["map_heads"], made["map_layers"]
        out = {
            "job_model": self.job_label,
            "job_model_name": self.job.model.name,
            "examples_compared": len(pos),
            "examples": len(every),
            "level": self.cfg.compare.level,
            "n_clusters": getattr(self, "n_clusters_", None),
            "compared": [],
        }
        for i, o in enumerate(self.others):
            plan = self.plans[o.label]
            stay = (clusters[0][every] == clusters[i + 1][every]).mean(0)  # [layers, heads]
            entry = {
                "label": o.label,
                "name": o.model.name,
                "maps": plan["maps"],
                "maps_refused": plan["why"],
                # another fine-tune of the job (a training seed, or shuffled labels): a control, not a comparison
                "control": o.label in self.controls,
                "store": extracted[o.label]["store"],
                "per_layer": [
                    {
                        "layer": layer,
                        **{m: [float(v) for v in map_layers[i, k, layer]] for k, m in enumerate(MAP_MEASURES)},
                    }
                    for layer in range(map_layers.shape[2])
                ]
                if plan["maps"]
                else [],
                "cluster_stay": float(stay.mean()),
            }
            theirs = extracted[o.label].get("heads")
            their_cost = np.asarray(theirs["cost"], np.float64) if theirs and theirs.get("cost") is not None else None
            if theirs:
                entry["heads"] = theirs
            if plan["maps"]:
                jsd = map_heads[i, 1, ..., 0]
                order = np.argsort(-jsd, axis=None, kind="stable")[:TOP]
                entry["most_changed"] = []
                for flat in order:
                    lh = np.unravel_index(flat, jsd.shape)
                    layer, head = int(lh[0]), int(lh[1])
                    row = {
                        "layer": layer,
                        "head": head,
                        **{m: [float(v) for v in map_heads[i, k, layer, head]] for k, m in enumerate(MAP_MEASURES)},
                    }
                    if layer in layers and head in heads:
                        li, hi = layers.index(layer), heads.index(head)
                        row["cluster_stay"] = float(stay[li, hi])
                        row["stats"] = _largest_changes(stat_heads[i, :, li, hi], names)
                    if their_cost is not None:  # the job's model's own cost joins in the report (its heads stage)
                        row["compared_ablation_cost"] = float(their_cost[layer, head])
                    entry["most_changed"].append(row)
            else:  # statistics only: no map measure to rank heads by (each head's changes: compare_stat_heads)
                entry["most_changed"] = []
            entry["transitions"] = _transitions(clusters[0][every], clusters[i + 1][every])
            out["compared"].append(entry)
        return json_safe(out)


def _largest_changes(values: np.ndarray, names: list[str], k: int = 3) -> list[dict]:
    """A head's ``k`` largest changes (by |mean|) among the statistics whose interval excludes 0."""
    mean, low, high = values[:, 0], values[:, 1], values[:, 2]
    sig = np.isfinite(mean) & ((low > 0) | (high < 0))
    order = [int(s) for s in np.argsort(-np.abs(np.where(sig, mean, 0.0)), kind="stable") if sig[s]][:k]
    return [{"stat": names[s], "change": float(mean[s]), "ci": [float(low[s]), float(high[s])]} for s in order]


def _transitions(a: np.ndarray, b: np.ndarray) -> dict:
    """Where the maps moved between two models' clusterings (same examples, layers, heads): the matrix of counts
    (rows: the job's model's cluster; columns: the compared model's) and the share that stays."""
    ka = int(max(a.max(), b.max())) + 2  # -1 (noise) goes last
    ia, ib = np.where(a < 0, ka - 1, a), np.where(b < 0, ka - 1, b)
    counts = np.bincount((ia * ka + ib).ravel(), minlength=ka * ka).reshape(ka, ka)
    labels = [*range(ka - 1), -1]
    keep = [i for i in range(ka) if counts[i].any() or counts[:, i].any()]
    return {
        "clusters": [labels[i] for i in keep],
        "counts": counts[np.ix_(keep, keep)].tolist(),
        "stay": float(np.trace(counts) / max(counts.sum(), 1)),
    }
