"""The job's stages, in order: extract (Dask workers) -> learn (fit) -> explain (tables, summary).

:func:`preflight` makes every check that can be made before a worker starts (the dataset reads,
the model config loads, layer and head indices exist, the embedder and its weights load, the
backend is available, the store is reusable). :func:`run_job` then runs the requested stages; each
reads only what the previous one wrote to the store, so any stage can be rerun alone.
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rapids_attn.data import Example, read_examples
from rapids_attn.errors import JobConfigError, StoreError
from rapids_attn.extract.maps import DETECTOR_NAMES, PROFILE_OFFSETS, STAT_NAMES
from rapids_attn.extract.model import ModelInfo, describe_model
from rapids_attn.job import JobConfig
from rapids_attn.store.zarr_store import StoreLayout

log = logging.getLogger(__name__)

STAGES = ("extract", "learn", "explain")


@dataclass
class Plan:
    """What preflight resolved: the inputs every stage needs."""

    cfg: JobConfig
    examples: list[Example]
    model: ModelInfo
    layout: StoreLayout
    key: str
    run_dir: Path
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def store_path(self) -> Path:
        return self.run_dir / "store.zarr"


def parse_stages(text: str | None) -> tuple[str, ...]:
    if not text:
        return STAGES
    names = [s.strip() for s in text.split(",") if s.strip()]
    for s in names:
        if s not in STAGES:
            import difflib

            near = difflib.get_close_matches(s, STAGES, n=1)
            hint = f"did you mean '{near[0]}'?" if near else f"stages are {', '.join(STAGES)}"
            raise JobConfigError(f"--stages: unknown stage '{s}'; {hint}")
    return tuple(s for s in STAGES if s in names)


def _check_indices(name: str, sel: list[int] | None, n: int, model: str) -> list[int]:
    if sel is None:
        return list(range(n))
    bad = [i for i in sel if i >= n]
    if bad:
        raise JobConfigError(f"extract.{name}: {bad} out of range; {model} has {n} {name} (0..{n - 1})")
    return sorted(sel)


def preflight(cfg: JobConfig, stages: tuple[str, ...], overwrite: bool = False) -> Plan:
    t0 = time.perf_counter()
    d = cfg.data
    examples = read_examples(
        d.path, format=d.format, text_fields=d.text_fields, id_field=d.id_field, group_field=d.group_field,
        label_field=d.label_field, limit=d.limit, sample=d.sample, seed=d.seed,
    )
    pairs = {e.text_pair is not None for e in examples}
    if len(pairs) > 1:
        raise JobConfigError("data: some examples are text pairs and some are not; give every record both text fields")
    info = describe_model(cfg.model)
    if d.probe.count:
        from rapids_attn.data.probe import repeated_token_probes
        from rapids_attn.extract.model import load_tokenizer

        examples = examples + repeated_token_probes(load_tokenizer(cfg.model), d.probe.count, d.probe.length,
                                                    d.probe.seed, pairs == {True})
    layers = _check_indices("layers", cfg.extract.layers, info.n_layers, cfg.model.name)
    heads = _check_indices("heads", cfg.extract.heads, info.n_heads, cfg.model.name)

    from rapids_attn.embed import build_embedder

    # also fetches and checks the weights; the int8 calibration is left to the workers
    embedder = build_embedder(cfg.embed, cfg.extract.image_size, "cpu", prepare=False)
    if cfg.embed.precision == "int8" and (cfg.extract.device == "cuda"
                                          or (cfg.extract.device == "auto" and _cuda_visible())):
        raise JobConfigError("embed.precision: int8 runs on the CPU only and extraction would run on a GPU; "
                             "use precision: auto (float16 on a GPU) or extract.device: cpu")
    if cfg.extract.thumbnail_size > cfg.extract.image_size:
        raise JobConfigError(
            f"extract.thumbnail_size: {cfg.extract.thumbnail_size} exceeds extract.image_size {cfg.extract.image_size}"
        )
    if "learn" in stages:
        from rapids_attn.backends import resolve_learn_backend

        resolve_learn_backend(cfg.runtime.learn_backend)
    if "extract" in stages:
        from rapids_attn.runtime import check_runtime

        check_runtime(cfg.runtime)
    layout = StoreLayout(
        n_examples=len(examples), layers=layers, heads=heads, feature_dim=embedder.dim,
        image_size=cfg.extract.image_size, thumb_size=cfg.extract.thumbnail_size,
        shard_size=cfg.extract.shard_size, stat_names=list(STAT_NAMES), profile_offsets=list(PROFILE_OFFSETS),
        detector_names=list(DETECTOR_NAMES),
        embed_outputs=dict(embedder.outputs), embed_attrs=dict(embedder.store_attrs),
        features_dtype=cfg.store.features_dtype, compression_level=cfg.store.compression_level,
    )
    plan = Plan(cfg, examples, info, layout, cfg.extraction_key(), cfg.run_dir)
    _check_store(plan, stages, overwrite)
    plan.timings["preflight"] = time.perf_counter() - t0
    return plan


def _check_store(plan: Plan, stages: tuple[str, ...], overwrite: bool) -> None:
    """Refuse, before any worker starts, a run directory whose store another job made."""
    from rapids_attn.store.zarr_store import foreign_store_error, inspect_store

    state = inspect_store(plan.store_path, plan.key, plan.layout)
    if "extract" in stages:
        if state == "different" and not overwrite:
            raise foreign_store_error(plan.store_path)
    elif state in ("absent", "partial"):
        raise StoreError(f"{plan.store_path}: no store from this job yet; run the extract stage first (--stages extract)")
    elif state == "different":
        raise foreign_store_error(plan.store_path)


def _progress(total: int, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="shard", file=sys.stderr, dynamic_ncols=True,
                disable=None if sys.stderr.isatty() else False, mininterval=1.0)


def run_extract(plan: Plan, client, overwrite: bool) -> dict:
    """Open (resume) or create the store, run the shards not yet done on the cluster."""
    from distributed import as_completed

    from rapids_attn.extract.shard import ShardTask, process_shard
    from rapids_attn.store.zarr_store import (
        consolidate,
        create_store,
        done_shards,
        mark_extract_complete,
        open_for_job,
    )

    cfg, layout = plan.cfg, plan.layout
    g = open_for_job(plan.store_path, plan.key, layout, overwrite)
    resumed = g is not None
    if g is None:
        meta = {"name": cfg.model.name, "source": plan.model.source, "type": plan.model.model_type,
                "revision": cfg.model.revision, "n_layers": plan.model.n_layers, "n_heads": plan.model.n_heads,
                "max_length": plan.model.max_length}
        g = create_store(plan.store_path, layout, cfg.to_dict(), plan.key, meta,
                         [e.id for e in plan.examples], [e.group for e in plan.examples],
                         [e.label for e in plan.examples])
    done = done_shards(g)
    pending = [s for s in range(layout.n_shards) if not done[s]]
    job = cfg.to_dict()
    tasks = []
    for s in pending:
        start, stop = layout.shard_rows(s)
        tasks.append(ShardTask(job, plan.key, str(plan.store_path), layout, s, plan.examples[start:stop],
                               plan.model.max_length))
    results = []
    maps_per_ex = len(layout.layers) * len(layout.heads)
    with _progress(len(tasks), "extract") as bar:
        futures = client.map(process_shard, tasks, pure=False) if tasks else []
        n_maps = 0
        for fut in as_completed(futures):
            r = fut.result()
            results.append(r)
            n_maps += r.n_maps
            bar.update(1)
            bar.set_postfix(maps=f"{n_maps:,}", refresh=False)
    mark_extract_complete(g)
    if not g.attrs["extract_complete"]:
        raise RuntimeError("extraction finished but some shards are not marked done")
    runs = list(g.attrs.get("extract_runs", []))
    runs.append({
        "shards": len(results),
        "examples": sum(r.n_examples for r in results),
        "maps": sum(r.n_maps for r in results),
        "devices": sorted({r.device for r in results}),
        "workers": sorted({r.worker for r in results}),
        "worker_seconds": {k: round(sum(r.seconds.get(k, 0.0) for r in results), 3)
                           for k in ("tokenize", "forward", "embed", "write")},
    })
    g.attrs["extract_runs"] = runs
    consolidate(plan.store_path)
    return {"resumed": resumed, "shards_run": len(results), "shards_total": layout.n_shards,
            "maps_run": sum(r.n_maps for r in results), "maps_per_example": maps_per_ex}


def open_store(plan: Plan, need: str):
    """Open the store written by an earlier stage; refuse a foreign or incomplete one."""
    import zarr

    from rapids_attn.store.zarr_store import open_for_job

    g = open_for_job(plan.store_path, plan.key, plan.layout, overwrite=False)
    if g is None:
        raise StoreError(f"{plan.store_path}: no store from this job yet; run the extract stage first (--stages extract)")
    if not g.attrs.get("extract_complete"):
        raise StoreError(f"{plan.store_path}: extraction is not complete; rerun with --stages extract to resume it")
    if need == "explain" and not g.attrs.get("learn_complete"):
        raise StoreError(f"{plan.store_path}: no complete clustering in the store; rerun with --stages learn")
    return zarr.open_group(str(plan.store_path), mode="r+")


def run_explain(plan: Plan, runtime_desc: dict, extract_info: dict | None) -> dict:
    """maps.parquet, cluster descriptions, the report and head views; returns the summary."""
    from rapids_attn.explain.describe import describe
    from rapids_attn.explain.outputs import write_outputs
    from rapids_attn.extract.model import load_tokenizer

    cfg = plan.cfg
    g = open_store(plan, "explain")
    summary = write_outputs(plan, g, runtime_desc, extract_info)
    d, arrays = describe(g, cfg.explain, cfg.runtime.seed, load_tokenizer(cfg.model))
    summary["clusters"]["descriptions"] = d["clusters"]
    summary["heads"] = d["heads_table"]
    summary["metadata"] = d["metadata"]
    summary["warnings"] = d["warnings"]
    summary["clusters"]["k_sweep"] = d["k_sweep"]
    summary["head_detectors"] = d["detectors"]
    _store_head_detectors(g, arrays["head_detectors"], d["detectors"]["names"])
    from rapids_attn.store.zarr_store import consolidate

    consolidate(plan.store_path)
    for w in d["warnings"]:
        print(f"warning: {w}", file=sys.stderr)
    if cfg.explain.report:
        from rapids_attn.explain.headview import write_head_views
        from rapids_attn.explain.report import write_report

        d.update({k: summary[k] for k in ("model", "data", "counts", "backend", "seconds")})
        d["seconds"] = {**summary["seconds"], **{k: round(v, 3) for k, v in plan.timings.items()}}
        d["clustering"] = {"coords": "umap" if cfg.reduce.umap.enabled else "pca", "method": cfg.cluster.method, "n_clusters": summary["clusters"]["n_clusters"],
                           "silhouette": summary["clusters"]["silhouette"],
                           "noise_share": summary["clusters"]["noise_share"], "embedder": cfg.embed.name}
        views = None
        if cfg.explain.head_views:
            try:
                views = write_head_views(plan.run_dir / "report", cfg.model, plan.examples, d["clusters"])
            except Exception as e:  # the head views are an aid: the report goes on without them, and says so
                msg = f"head views not written ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})"
                d["warnings"].append(msg)
                summary["warnings"].append(msg)
                print(f"warning: {msg}", file=sys.stderr)
        summary["report"] = str(write_report(plan.run_dir, d, arrays, views))
    return summary


def _store_head_detectors(g, values, names: list[str]) -> None:
    """Per-head detector scores into the store: head_detectors (layer, head, head_detector)."""
    g.create_array("head_detectors", data=values, dimension_names=("layer", "head", "head_detector"),
                   overwrite=True, attributes={"names": names})


def _keep_for_learn(client, stack: ExitStack, backend, runtime_desc: dict):
    """Keep the cluster only for a multi-GPU fit (cuml.dask), after the workers drop their models;
    otherwise close it now, so idle workers (and their RMM pools) do not hold memory the fit needs."""
    from rapids_attn.extract.shard import release_worker_cache

    if backend is not None and backend.gpu and runtime_desc.get("n_workers", 0) > 1:
        client.run(release_worker_cache)
        return client
    stack.close()
    return None


def write_resolved_job(plan: Plan) -> None:
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    tmp = plan.run_dir / "job.yaml.tmp"
    tmp.write_text(yaml.safe_dump(plan.cfg.to_dict(), sort_keys=False))
    tmp.replace(plan.run_dir / "job.yaml")


def run_job(cfg: JobConfig, stages: tuple[str, ...] = STAGES, overwrite: bool = False) -> dict:
    """Run the stages of a validated job; returns the summary (also written to summary.json)."""
    if overwrite and "extract" not in stages:
        raise JobConfigError("--overwrite replaces the store, so it needs the extract stage in --stages")
    plan = preflight(cfg, stages, overwrite)
    write_resolved_job(plan)
    runtime_desc: dict = {}
    learn_info = None
    extract_info = None
    backend = None
    if "learn" in stages:
        from rapids_attn.backends import resolve_learn_backend

        backend = resolve_learn_backend(cfg.runtime.learn_backend)
    need_cluster = "extract" in stages or (backend is not None and backend.gpu)
    with ExitStack() as stack:
        client = None
        if need_cluster:
            from rapids_attn.runtime import Runtime

            rt = Runtime(cfg.runtime)
            client = stack.enter_context(rt)
            runtime_desc = rt.description
            print(f"rapids_attn: {runtime_desc['n_workers']} worker(s) on {cfg.runtime.cluster}; "
                  f"dashboard: {runtime_desc['dashboard']}", file=sys.stderr, flush=True)
        if "extract" in stages:
            t = time.perf_counter()
            extract_info = run_extract(plan, client, overwrite)
            plan.timings["extract"] = time.perf_counter() - t
        if client is not None:
            client = _keep_for_learn(client, stack, backend, runtime_desc)
        if "learn" in stages:
            from rapids_attn.learn import run_learn
            from rapids_attn.store.zarr_store import consolidate

            g = open_store(plan, "learn")
            t = time.perf_counter()
            learn_info = run_learn(g, cfg, backend, client)
            consolidate(plan.store_path)
            plan.timings["learn"] = time.perf_counter() - t
    summary = None
    if "explain" in stages:
        t = time.perf_counter()
        summary = run_explain(plan, runtime_desc, extract_info)
        plan.timings["explain"] = time.perf_counter() - t
        summary["seconds"]["explain"] = round(plan.timings["explain"], 3)
        from rapids_attn.explain.outputs import write_json

        write_json(plan.run_dir / "summary.json", summary)
    return summary or {"stages": list(stages), "learn": learn_info, "extract": extract_info,
                       "seconds": {k: round(v, 3) for k, v in plan.timings.items()}}


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()
