"""The heads stage: which heads the model's task needs, and what they encode (issue 14).

Over a seeded sample of the job's examples (``heads.examples``; the probes are left out) it measures

1. the task metric (:mod:`rapids_attn.heads.metrics`) of the whole model, of the model with each head
   ablated alone, with each layer's heads, and with each cluster's dominant heads ablated together
   (:mod:`rapids_attn.heads.hooks`: the head's output before the attention output projection is zeroed
   or replaced by its mean);
2. Michel et al.'s importance, |dL/dgate| per head, one batched backward pass per batch;
3. pruning curves: heads removed cumulatively in order of importance, of single-ablation cost and in
   random orders (the control);
4. head-wise probes (:mod:`rapids_attn.heads.probe`): each head's output mean-pooled per example, a
   cross-validated linear probe per head and task, and the top-k heads against the last layer.

Every forward pass is a Dask task (a chunk of conditions x a shard of examples), so single-head
ablation of every head is a map over (head, shard) tasks. Per-example scores of every condition are
stored (``heads_scores``), so any interval or test can be recomputed from the store.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np

from rapids_attn.extract.model import DEFAULT_MAX_LENGTH_CAP
from rapids_attn.heads.config import HeadsConfig
from rapids_attn.stage import ReportSection, RunContext, Stage, StageResult
from rapids_attn.stagekit import (
    MODEL_WORKER_MODULES,
    evaluated_positions,
    json_safe,
    map_tasks,
    open_for_run,
    shards_of,
)
from rapids_attn.store import schema as S

#: conditions per task (each condition is one pass over the task's examples)
CONDITIONS_PER_TASK = 8


@dataclass
class HeadsStageResult(StageResult):
    info: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {**self.info, "seconds": round(self.seconds, 3)}


def dominant_heads(cluster: np.ndarray, layers: list[int], heads: list[int], share: float) -> dict[int, list]:
    """cluster [E, l, h] (kept layers and heads) -> {cluster: [(layer, head), ...]}: the heads with at least
    ``share`` of their (non-noise) maps in the cluster."""
    out: dict[int, list] = {}
    for li, layer in enumerate(layers):
        for hi, head in enumerate(heads):
            lab = cluster[:, li, hi]
            lab = lab[lab >= 0]
            if not len(lab):
                continue
            values, counts = np.unique(lab, return_counts=True)
            j = int(np.argmax(counts))
            if counts[j] / len(lab) >= share:
                out.setdefault(int(values[j]), []).append((int(layer), int(head)))
    return dict(sorted(out.items()))


def pruning_masks(
    order: list[tuple[int, int]], n_layers: int, n_heads: int, steps: int
) -> list[tuple[int, np.ndarray]]:
    """(heads removed, keep mask) at ``steps`` points from 0 to all but one head, removing in ``order``."""
    total = n_layers * n_heads
    counts = sorted({int(c) for c in np.rint(np.linspace(0, total - 1, steps))})
    out = []
    for c in counts:
        keep = np.ones((n_layers, n_heads), np.float32)
        for layer, head in order[:c]:
            keep[layer, head] = 0
        out.append((c, keep))
    return out


class HeadsStage(Stage):
    name = "heads"
    provides = S.arrays_of("heads")
    runs_on_workers = True
    worker_modules = (*MODEL_WORKER_MODULES, "rapids_attn.heads.work")
    summarised = True  # the explain stage joins it to the clusters, as head_importance
    settings = HeadsConfig

    @classmethod
    def report_section(cls) -> ReportSection:
        from rapids_attn.explain.stage_sections import HeadsSection

        return HeadsSection()

    def __init__(self, heads, model, extract, runtime, made_earlier: bool = False):
        self.cfg = heads
        self.model_cfg = model
        self.extract_cfg = extract
        self.runtime_cfg = runtime
        #: an earlier stage of the job makes the model (its :meth:`Stage.later_job` named it: the finetune stage's
        #: folder): until it exists, its head is checked when this stage runs, and ``metric: auto`` is what that
        #: stage's later job set (finetune: its task's metric)
        self.made_earlier = made_earlier
        self.requires = (S.EXAMPLE_GROUP, *((S.CLUSTER,) if "cluster" in heads.sets else ()))

    @classmethod
    def from_job(cls, cfg) -> HeadsStage:
        return cls(cfg.heads, cfg.model, cfg.extract, cfg.runtime, cfg.model != cfg.as_written.model)

    def _pending(self) -> bool:
        """The model is one an earlier stage makes (the fine-tune), not made yet."""
        from pathlib import Path

        return self.made_earlier and not Path(self.model_cfg.name).is_dir()

    @classmethod
    def runs_by_default(cls, cfg) -> bool:
        return bool(cfg.heads.enabled)

    def _config(self):
        if getattr(self, "_model_config", None) is None:
            from rapids_attn.extract.model import load_config

            self._model_config = load_config(self.model_cfg)[1]
        return self._model_config

    def metric_name(self, ctx: RunContext) -> str:
        from rapids_attn.heads.metrics import auto_metric

        if self.cfg.metric != "auto":
            return self.cfg.metric
        return auto_metric(self._config(), ctx.data.format)

    def check(self, ctx: RunContext) -> None:
        """The metric fits the model's head (``auto`` finds one) and the data (pairs for squad and
        retrieval); top_k is within the model's heads."""
        from rapids_attn.errors import JobConfigError
        from rapids_attn.heads.metrics import metric_for

        name = self.metric_name(ctx)
        # a fine-tune this run makes has its task's head: checked against its folder when this stage runs
        if not self._pending() and name != "retrieval":  # the task heads of an encoder-decoder model read its decoder
            import transformers

            from rapids_attn.extract.model import model_class

            if model_class(self._config(), self.model_cfg.name) is not transformers.AutoModel:
                raise JobConfigError(
                    f"heads.metric: {name} scores the task head of {self.model_cfg.name}, an encoder-decoder model "
                    "whose head reads its decoder, and rapids_attn masks its encoder's heads; use heads.metric: "
                    "retrieval (question/paragraph pairs), or an encoder-only or decoder-only model"
                )
        if not self._pending():
            metric_for(name).check(self._config(), None, self.model_cfg.name, ctx.data.format)
        if name in ("squad", "retrieval") and not ctx.data.pairs:
            raise JobConfigError(
                f"heads.metric: {name} needs question/paragraph pairs; this data has one text per example: "
                "use SQuAD JSON or name two data.text_fields"
            )
        from rapids_attn.stage import check_max_length, evaluated_count

        check_max_length("heads.max_length", self.cfg.max_length, ctx)
        k = evaluated_count(ctx, self.cfg.examples)
        if k < 2:
            raise JobConfigError(
                f"heads.examples: the heads stage needs at least 2 examples and would evaluate {k}; "
                + (
                    "raise heads.examples"
                    if self.cfg.examples is not None and self.cfg.examples < 2
                    else "use more data"
                )
            )
        n = ctx.model.n_layers * ctx.model.n_heads
        if self.cfg.probing.enabled and self.cfg.probing.top_k > n:
            raise JobConfigError(
                f"heads.probing.top_k: {self.cfg.probing.top_k} is more than the model's {n} heads; lower it"
            )

    def uses_cluster(self, ctx: RunContext) -> bool:
        return True

    # -- running tasks ---------------------------------------------------------------------------
    def _task(self, ctx, kind, examples, key, conditions=None, means=None):
        from rapids_attn.heads.work import HeadsTask

        return HeadsTask(
            self.model_cfg,
            self._metric,
            kind,
            ctx.devices.extract,
            self.runtime_cfg.threads_per_worker,
            self._max_length,
            self.cfg.batch_size,
            tuple(examples),
            conditions,
            means,
            key,
        )

    def _map(self, client, tasks, desc):
        from rapids_attn.heads.work import process_heads_task

        return map_tasks(client, process_heads_task, tasks, desc)

    def _score(self, ctx, client, shards, conditions: list[np.ndarray], means, desc) -> dict[str, np.ndarray]:
        """Per-example scores of every condition: {column: [C, N]}."""
        chunks = [conditions[i : i + CONDITIONS_PER_TASK] for i in range(0, len(conditions), CONDITIONS_PER_TASK)]
        tasks = [self._task(ctx, "score", sh, ctx.key, np.stack(ch), means) for ch in chunks for sh in shards]
        results = self._map(client, tasks, desc)
        cols: dict[str, list] = {}
        for ci, ch in enumerate(chunks):
            per_shard = results[ci * len(shards) : (ci + 1) * len(shards)]
            for j in range(len(ch)):
                partials = {k: np.concatenate([r.partials[j][k] for r in per_shard]) for k in per_shard[0].partials[j]}
                for col, v in self._metric_obj.scores(partials, self._examples).items():
                    cols.setdefault(col, []).append(np.asarray(v, np.float32))
        return {c: np.stack(v) for c, v in cols.items()}

    def run(self, ctx: RunContext, client=None) -> HeadsStageResult:
        from rapids_attn.heads.metrics import metric_for
        from rapids_attn.store.zarr_store import consolidate, mark_complete

        cfg = self.cfg
        g = open_for_run(self, ctx)
        pos = evaluated_positions(g, cfg.examples, ctx.seed)
        if len(pos) < 2:
            from rapids_attn.errors import JobConfigError

            raise JobConfigError(f"heads.examples: the heads stage needs at least 2 examples; this job has {len(pos)}")
        self._examples = ctx.data.read(pos)
        self._metric = self.metric_name(ctx)
        self._metric_obj = metric_for(self._metric)
        if self.made_earlier:  # a model an earlier stage made (the fine-tune): its head checked now that it exists
            self._metric_obj.check(self._config(), None, self.model_cfg.name, ctx.data.format)
        self._max_length = int(cfg.max_length or min(ctx.model.max_length, DEFAULT_MAX_LENGTH_CAP))  # eager: T^2 memory
        n_layers, n_heads = ctx.model.n_layers, ctx.model.n_heads
        shards = shards_of(self._examples, ctx)
        print(
            f"rapids_attn: heads: metric {self._metric} on {len(pos)} examples, {n_layers} x {n_heads} heads",
            file=sys.stderr,
            flush=True,
        )
        info: dict = {"metric": self._metric, "examples": len(pos), "ablation": cfg.ablation}
        scope = self._metric_obj.scope(self._examples)
        if scope is not None:  # what the scores are measured against (retrieval: the sample's paragraphs)
            info["scope"] = scope

        means = None
        if cfg.ablation == "mean":
            rs = self._map(client, [self._task(ctx, "means", sh, ctx.key) for sh in shards], "heads: means")
            means = (sum(r.sums for r in rs) / max(sum(r.count for r in rs), 1.0)).astype(np.float32)

        names, conditions = ["base"], [np.ones((n_layers, n_heads), np.float32)]
        if cfg.single:
            for layer in range(n_layers):
                for head in range(n_heads):
                    keep = np.ones((n_layers, n_heads), np.float32)
                    keep[layer, head] = 0
                    names.append(f"head:{layer}:{head}")
                    conditions.append(keep)
        if "layer" in cfg.sets:
            for layer in range(n_layers):
                keep = np.ones((n_layers, n_heads), np.float32)
                keep[layer] = 0
                names.append(f"layer:{layer}")
                conditions.append(keep)
        clusters = {}
        if "cluster" in cfg.sets:
            lay = ctx.layout
            clusters = dominant_heads(np.asarray(g[S.CLUSTER][:]), list(lay.layers), list(lay.heads), cfg.cluster_share)
            for c, members in clusters.items():
                keep = np.ones((n_layers, n_heads), np.float32)
                for layer, head in members:
                    keep[layer, head] = 0
                names.append(f"cluster:{c}")
                conditions.append(keep)
            from rapids_attn.learn.storeio import learn_key

            info["learn_key"] = learn_key(g.attrs)
        scores = self._score(ctx, client, shards, conditions, means, "heads: ablation")

        importance = raw = None
        if cfg.importance:
            rs = self._map(client, [self._task(ctx, "importance", sh, ctx.key) for sh in shards], "heads: importance")
            raw = (sum(r.sums for r in rs) / max(sum(r.count for r in rs), 1.0)).astype(np.float64)
            norm = np.linalg.norm(raw, axis=1, keepdims=True)
            importance = np.where(norm > 0, raw / np.where(norm > 0, norm, 1), 0.0)

        from rapids_attn.heads.summary import summarise_ablation

        headline = self._metric_obj.headline
        ablation = summarise_ablation(names, scores, headline, n_layers, n_heads, self._metric_obj.higher_is_better)
        info.update(ablation)
        info["clusters"] = {str(c): [list(m) for m in members] for c, members in clusters.items()}
        if importance is not None and ablation.get("cost") is not None:
            from rapids_attn.heads.summary import rank_agreement

            info["importance_vs_ablation"] = rank_agreement(ablation["cost"], raw, importance)

        orders = self._orders(cfg, ablation, importance, n_layers, n_heads, ctx.seed)
        curves = {}
        if orders:
            pr_names, pr_masks = [], []
            for oname, order in orders.items():
                for c, keep in pruning_masks(order, n_layers, n_heads, cfg.pruning.steps):
                    pr_names.append(f"prune:{oname}:{c}")
                    pr_masks.append(keep)
            pr_scores = self._score(ctx, client, shards, pr_masks, means, "heads: pruning")
            names += pr_names
            scores = {k: np.concatenate([scores[k], pr_scores[k]]) for k in scores}
            from rapids_attn.heads.summary import pruning_curves

            hib = self._metric_obj.higher_is_better
            curves = pruning_curves(pr_names, pr_scores, headline, ablation["base"], hib)
            # every column's curves too (retrieval ranks by MRR; "heads removable before recall@1 drops" needs its own)
            info["pruning_columns"] = {
                col: pruning_curves(pr_names, pr_scores, col, ablation["base_columns"][col], hib) for col in pr_scores
            }
        info["pruning"] = curves

        capture = None
        if cfg.probing.enabled:
            rs = self._map(client, [self._task(ctx, "capture", sh, ctx.key) for sh in shards], "heads: probing")
            capture = {k: np.concatenate([r.partials[0][k] for r in rs]) for k in ("heads", "hidden")}
            from rapids_attn.extract.model import load_tokenizer
            from rapids_attn.heads.summary import run_probes

            tok = load_tokenizer(self.model_cfg)
            meta = {
                "text": [e.text for e in self._examples],
                "label": [e.label for e in self._examples],
                # SentEval's Length: the first text's tokens (SQuAD: the question's), not the pair's
                "n_tokens": [len(tok(e.text, add_special_tokens=False)["input_ids"]) for e in self._examples],
            }
            info["probing"] = run_probes(capture, meta, cfg.probing, ctx.seed)

        self._write(g, pos, names, scores, raw, importance, capture, info)
        if importance is not None:
            info["importance"] = np.round(importance, 6).tolist()
        mark_complete(g, self.name, True, json_safe(info))
        consolidate(ctx.store_path)
        return HeadsStageResult(info=json_safe(info))

    def _orders(self, cfg, ablation, importance, n_layers, n_heads, seed) -> dict[str, list]:
        heads = [(layer, head) for layer in range(n_layers) for head in range(n_heads)]
        out = {}
        for o in cfg.pruning.orders:
            if o == "importance" and importance is not None:
                out[o] = sorted(heads, key=lambda lh: (importance[lh], lh))
            elif o == "ablation" and ablation.get("effect") is not None:
                cost = np.asarray(ablation["cost"])
                out[o] = sorted(heads, key=lambda lh: (cost[lh], lh))
            elif o == "random":
                rng = np.random.default_rng(seed)
                for r in range(cfg.pruning.random_orders):
                    perm = rng.permutation(len(heads))
                    out[f"random{r}"] = [heads[i] for i in perm]
        return out

    def _write(self, g, pos, names, scores, raw, importance, capture, info) -> None:
        cols = list(scores)
        S.create_array(g, S.HEADS_EXAMPLE, (len(pos),), data=None)[:] = pos.astype(np.int32)
        arr = S.create_array(
            g, S.HEADS_SCORES, (len(names), len(pos), len(cols)), attributes={"conditions": names, "columns": cols}
        )
        arr[:] = np.stack([scores[c] for c in cols], -1)
        if importance is not None:
            S.create_array(g, S.HEAD_IMPORTANCE, importance.shape)[:] = importance.astype(np.float32)
            S.create_array(g, S.HEAD_IMPORTANCE_RAW, raw.shape)[:] = raw.astype(np.float32)
        if capture is not None:
            S.create_array(g, S.HEAD_OUTPUT, capture["heads"].shape)[:] = capture["heads"].astype(np.float16)
            probing = info.get("probing", {})
            tasks = [t for t, r in probing.get("tasks", {}).items() if "accuracy" in r]
            if tasks:
                acc = np.stack([np.asarray(probing["tasks"][t]["accuracy"], np.float32) for t in tasks])
                S.create_array(g, S.HEAD_PROBE, acc.shape, attributes={"tasks": tasks})[:] = acc
