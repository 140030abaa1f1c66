"""The relevance stage: where information flows, and how heads relate, over the dataset (issue 15).

Over a seeded sample of the job's examples (``relevance.examples``; the probes are left out) the workers
run the model once per batch and return, per example, the relevance of every token under each method
(:mod:`.methods`), the tokens' roles, and the head atlas's Jensen-Shannon sums (:mod:`.atlas`). The
driver stores them (``relevance``, ``relevance_length``, ``relevance_roles``, ``head_distance``,
``head_atlas``, ``head_atlas_cluster``; ragged examples padded with NaN) and summarises them
(:mod:`.summary`): the share of relevance on the question, the context, special tokens, punctuation and
the answer span; how the methods disagree; and the atlas with each head's related heads and dominant
map cluster. The result goes into ``summary.json`` under ``relevance``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np

from rapids_attn.extract.model import DEFAULT_MAX_LENGTH_CAP
from rapids_attn.relevance.config import RelevanceConfig
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


@dataclass
class RelevanceStageResult(StageResult):
    info: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {**self.info, "seconds": round(self.seconds, 3)}


class RelevanceStage(Stage):
    name = "relevance"
    requires = (S.EXAMPLE_GROUP,)
    provides = S.arrays_of("relevance")
    runs_on_workers = True
    worker_modules = (*MODEL_WORKER_MODULES, "rapids_attn.relevance.work")
    summarised = True  # the explain stage reads it back from the store, as relevance
    settings = RelevanceConfig

    @classmethod
    def report_section(cls) -> ReportSection:
        from rapids_attn.explain.stage_sections import RelevanceSection

        return RelevanceSection()

    def __init__(self, relevance, model, runtime):
        self.cfg = relevance
        self.model_cfg = model
        self.runtime_cfg = runtime

    @classmethod
    def from_job(cls, cfg) -> RelevanceStage:
        return cls(cfg.relevance, cfg.model, cfg.runtime)

    @classmethod
    def runs_by_default(cls, cfg) -> bool:
        return bool(cfg.relevance.enabled)

    def check(self, ctx: RunContext) -> None:
        from rapids_attn.errors import JobConfigError

        cfg = self.cfg
        if not cfg.methods:
            raise JobConfigError("relevance.methods: empty; name at least one of the methods, or leave it unset")
        if len(set(cfg.methods)) != len(cfg.methods):
            raise JobConfigError(f"relevance.methods: {cfg.methods} names a method twice; list each once")
        from rapids_attn.stage import check_max_length, evaluated_count

        check_max_length("relevance.max_length", cfg.max_length, ctx)
        if evaluated_count(ctx, cfg.examples) < 1:
            raise JobConfigError("relevance.examples: this job has no examples to evaluate (only probes); add data")
        n_layers, n_heads = ctx.model.n_layers, ctx.model.n_heads
        if not -n_layers <= cfg.pagerank_layer < n_layers:
            raise JobConfigError(
                f"relevance.pagerank_layer: {cfg.pagerank_layer} is outside the model's {n_layers} layers "
                f"(0..{n_layers - 1}, or -1 for the last)"
            )
        from rapids_attn.settings import show

        bad = [h for h in cfg.pagerank_heads or [] if not 0 <= h < n_heads]
        if bad:
            raise JobConfigError(
                f"relevance.pagerank_heads: {show(bad)} outside the model's heads 0..{n_heads - 1}; list heads in range"
            )
        if cfg.atlas and cfg.atlas_clusters > n_layers * n_heads:
            raise JobConfigError(
                f"relevance.atlas_clusters: {cfg.atlas_clusters} is more than the model's {n_layers * n_heads} heads; "
                "lower it"
            )

    def uses_cluster(self, ctx: RunContext) -> bool:
        return True

    def release(self, client) -> None:
        from rapids_attn.relevance.work import release_relevance_cache

        client.run(release_relevance_cache)

    def run(self, ctx: RunContext, client=None) -> RelevanceStageResult:
        from rapids_attn.errors import JobConfigError
        from rapids_attn.relevance.summary import atlas_summary, disagreement, role_shares
        from rapids_attn.relevance.work import ROLE_BITS, RelevanceTask, process_relevance_task
        from rapids_attn.store.zarr_store import complete_attr, consolidate, mark_complete

        cfg = self.cfg
        g = open_for_run(self, ctx)
        pos = evaluated_positions(g, cfg.examples, ctx.seed)
        if len(pos) < 1:
            raise JobConfigError("relevance.examples: this job has no examples to evaluate (only probes)")
        examples = ctx.data.read(pos)
        methods = tuple(cfg.methods)
        n_layers, n_heads = ctx.model.n_layers, ctx.model.n_heads
        shards = shards_of(examples, ctx)
        print(
            f"rapids_attn: relevance: {', '.join(methods)} on {len(pos)} examples"
            + (f"; head atlas of {n_layers * n_heads} heads" if cfg.atlas else ""),
            file=sys.stderr,
            flush=True,
        )
        tasks = [
            RelevanceTask(
                self.model_cfg,
                ctx.devices.extract,
                self.runtime_cfg.threads_per_worker,
                int(cfg.max_length or min(ctx.model.max_length, DEFAULT_MAX_LENGTH_CAP)),  # eager: T^2 memory
                cfg.batch_size,
                tuple(sh),
                methods,
                cfg.query,
                cfg.residual,
                cfg.flow_max_tokens,
                cfg.pagerank_layer,
                None if cfg.pagerank_heads is None else tuple(cfg.pagerank_heads),
                cfg.atlas,
                ctx.key,
            )
            for sh in shards
        ]
        results = map_tasks(client, process_relevance_task, tasks, "relevance")

        t = max(r.relevance.shape[-1] for r in results)
        relevance = np.concatenate(
            [
                np.pad(r.relevance, ((0, 0), (0, 0), (0, t - r.relevance.shape[-1])), constant_values=np.nan)
                for r in results
            ]
        )
        roles = np.concatenate([np.pad(r.roles, ((0, 0), (0, t - r.roles.shape[-1]))) for r in results])
        lengths = np.concatenate([r.lengths for r in results])
        pairs = bool(ctx.data.pairs)
        query = results[0].query
        info: dict = {
            "examples": len(pos),
            "methods": list(methods),
            "query": query,
            "residual": cfg.residual,
            "flow_skipped": int(sum(r.flow_skipped for r in results)),
            "flow_max_tokens": cfg.flow_max_tokens,
            "tokens": {"mean": float(lengths.mean()), "max": int(lengths.max())},
            "shares": role_shares(relevance, roles, lengths, methods, pairs),
            "disagreement": disagreement(relevance, lengths, methods),
        }
        distance = xy = labels = None
        if cfg.atlas:
            sums = sum(r.distance_sums for r in results if r.distance_sums is not None)
            rows = sum(r.distance_rows for r in results)
            distance = sums / max(rows, 1)
            cluster = np.asarray(g[S.CLUSTER][:]) if g.attrs.get(complete_attr("learn")) else None
            if cluster is not None and cluster.shape[1:] != (n_layers, n_heads):
                cluster = None  # the store keeps a subset of layers or heads: no per-head join
            info["atlas"], xy, labels = atlas_summary(
                distance, n_heads, cfg.atlas_clusters, cfg.related, ctx.seed, cluster
            )
        self._write(g, pos, relevance, lengths, roles, methods, query, ROLE_BITS, distance, xy, labels)
        info = json_safe(info)
        mark_complete(g, self.name, True, info)
        consolidate(ctx.store_path)
        return RelevanceStageResult(info=info)

    def _write(self, g, pos, relevance, lengths, roles, methods, query, bits, distance, xy, labels) -> None:
        S.create_array(g, S.RELEVANCE_EXAMPLE, (len(pos),))[:] = pos.astype(np.int32)
        S.create_array(g, S.RELEVANCE, relevance.shape, attributes={"methods": list(methods), "query": query})[:] = (
            relevance
        )
        S.create_array(g, S.RELEVANCE_LENGTH, lengths.shape)[:] = lengths.astype(np.int32)
        S.create_array(g, S.RELEVANCE_ROLES, roles.shape, attributes={"bits": bits})[:] = roles
        if distance is not None:
            S.create_array(g, S.HEAD_DISTANCE, distance.shape)[:] = distance.astype(np.float32)
            S.create_array(g, S.HEAD_ATLAS, xy.shape)[:] = xy.astype(np.float32)
            S.create_array(g, S.HEAD_ATLAS_CLUSTER, labels.shape)[:] = labels.astype(np.int32)
