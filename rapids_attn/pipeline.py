"""The job: preflight, then a short loop over its stages (extract -> learn -> explain by default).

:func:`preflight` makes every check that can be made before a worker starts: it indexes the dataset
(validates and counts every record in one streaming pass, never holding them; workers read their rows),
loads the model's config, resolves the device plan once (:mod:`rapids_attn.devices`), fixes the
store's layout, runs each stage's own ``check``, and checks that every array a stage requires is
provided by an earlier stage of this run or is already complete in the store. :func:`run_job` then
runs the stages in order. The pipeline, not a stage, owns the Dask client: it starts the cluster
before the first stage that uses it and closes it after the last, so idle workers never hold memory
a later stage needs. Each stage's typed result goes into ``summary.json``.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING

import yaml

from rapids_attn.errors import DataError, JobConfigError, StoreError
from rapids_attn.registry import default_stages, registered_stages, worker_stages
from rapids_attn.stage import RunContext, Stage

if TYPE_CHECKING:
    from rapids_attn.job import JobConfig

#: the message that tells a user how to produce what a stage needs, by the stage that writes it
_HOW = {
    "extract": (
        "no store from this job yet; run the extract stage first (--stages extract)",
        "extraction is not complete; rerun with --stages extract to resume it",
    ),
    "learn": ("no complete clustering in the store; rerun with --stages learn",) * 2,
}


def _later_jobs(cfg: JobConfig) -> tuple[dict[str, JobConfig], JobConfig]:
    """(the job each registered stage is built from, by name; the job after them all): the job as written, changed
    by every stage's :meth:`~rapids_attn.stage.Stage.later_job` in the registry's order. Each changed job keeps the
    job as written (``as_written``)."""
    out: dict[str, JobConfig] = {}
    job = cfg
    for name, st in registered_stages().items():
        out[name] = job
        later = st.later_job(job)
        if later is not job:
            later._as_written = cfg.as_written
        job = later
    return out, job


def stage_jobs(cfg: JobConfig) -> dict[str, JobConfig]:
    """The job each registered stage is built from, by name: the job as written, changed by every earlier stage's
    :meth:`~rapids_attn.stage.Stage.later_job` (whether or not this run runs that stage), so a stage after finetune
    analyses the fine-tuned model."""
    return _later_jobs(cfg)[0]


def _analysed_job(cfg: JobConfig) -> JobConfig:
    """The job after every registered stage's :meth:`~rapids_attn.stage.Stage.later_job`: the model the run's
    store describes."""
    return _later_jobs(cfg)[1]


def _index_data(cfg: JobConfig):
    """The dataset's index (counted and validated in one streaming pass; no texts held), with the probes
    appended inline."""
    from rapids_attn.data.readers import index_for

    d = cfg.data
    index = None
    jobs = stage_jobs(cfg)
    for name, st in registered_stages().items():  # a stage that changes the examples the later stages read
        changed = st.later_index(jobs[name])  # (finetune: the held-out groups'); the latest one wins
        index = index if changed is None else changed
    if index is None:
        index = index_for(d)
    if d.probe.count:
        from rapids_attn.data.probe import repeated_token_probes
        from rapids_attn.extract.model import load_tokenizer

        index = index.with_inline(
            repeated_token_probes(load_tokenizer(cfg.model), d.probe.count, d.probe.length, d.probe.seed, index.pairs)
        )
    return index


def _check_requirements(ctx: RunContext, stages: list[Stage]) -> None:
    """Every array a stage requires comes from an earlier stage of this run, or from a stage whose
    completion flag is set in this job's store, and that store is not about to be replaced."""
    from rapids_attn.store.zarr_store import complete_attr, foreign_store_error, inspect_store

    running = {st.name for st in stages}
    needs = {spec.stage for st in stages for spec in st.requires} - running
    if not needs:
        return
    path = ctx.store_path
    extracting = "extract" in running
    state = inspect_store(path, ctx.key, ctx.layout)
    if state == "different" and not (ctx.overwrite and extracting):
        raise foreign_store_error(path, ctx.job, ctx.layout, getattr(ctx.data, "fingerprint", None))
    # a store this run creates (none yet, an interrupted one, or --overwrite) has nothing complete in it
    fresh = state != "same" or (ctx.overwrite and extracting)
    if fresh and not extracting:
        raise StoreError(f"{path}: {_HOW['extract'][0]}")
    attrs = {}
    if not fresh:
        import zarr

        from rapids_attn.store.zarr_store import check_consistent

        check_consistent(path, ctx.layout, tuple(needs))  # every array a reused store should hold is there
        attrs = dict(zarr.open_group(str(path), mode="r").attrs)
    order = list(registered_stages())
    for writer in (w for w in order if w in needs):  # in stage order: report the earliest missing one
        if attrs.get(complete_attr(writer)):
            continue
        if fresh:
            raise StoreError(
                f"{path}: this run creates the store, so it holds no {writer} results yet; "
                f"add {writer} to --stages (e.g. --stages {','.join(w for w in order if w in running | needs)})"
            )
        how = _HOW.get(writer, (f"run the {writer} stage first (--stages {writer})",) * 2)[1]
        raise StoreError(f"{path}: {how}")


@dataclass
class RunPlan:
    """What preflight resolved: the context every stage receives, and the stages, built and checked."""

    ctx: RunContext
    stages: list[Stage]


def _check_texts(cfg: JobConfig, data) -> None:
    """An example with no text, where the tokenizer adds no special tokens (GPT-2's), is no tokens and has no
    attention to capture: refused here, before any worker starts, naming it (every format's index records
    them; a worker's :func:`rapids_attn.extract.shard.check_tokens` is the last guard)."""
    hit = data.first_without_text()
    if hit is None:
        return
    from rapids_attn.extract.batching import tokenize
    from rapids_attn.extract.model import load_tokenizer

    _, ex, count = hit
    if tokenize(load_tokenizer(cfg.model), [ex], 16).lengths[0] > 0:  # [CLS] [SEP] and the like: a map to read
        return
    more = f" (and {count - 1} more)" if count > 1 else ""
    raise DataError(
        f"data.path: example {ex.id!r}{more} has no text, and the tokenizer of model.name adds no special "
        "tokens, so it has no tokens to attend over; give it text or remove it from the data"
    )


def preflight(cfg: JobConfig, stages: tuple[str, ...] | None = None, overwrite: bool = False) -> RunPlan:
    """Resolve the run (examples, model, devices, layout) and run every check, before any worker starts."""
    from rapids_attn.devices import resolve_devices
    from rapids_attn.extract.model import describe_model
    from rapids_attn.extract.stage import plan_layout

    stages = default_stages(cfg) if stages is None else stages
    t0 = time.perf_counter()
    data = _index_data(cfg)
    for w in data.warnings:  # once, here: --check shows them too; the explain stage puts them in the report
        print(f"warning: {w}", file=sys.stderr)
    first = data.read([0])[0] if len(data) else None  # one record: the tokenizer must know some of its words
    analysed, described = _analysed_model(cfg, stages)
    info = describe_model(
        described,
        sample=None if first is None else " ".join(filter(None, (first.text, first.text_pair))),
        attention=cfg.extract.attention,
    )
    if described is not analysed.model:  # the fine-tune is made by this run: its folder will be the source
        info = dataclasses.replace(info, source=analysed.model.name)
    _check_texts(cfg, data)
    devices = resolve_devices(cfg.extract, cfg.model, cfg.embed, cfg.runtime, stages, cfg.reduce, cfg.cluster)
    layout = plan_layout(cfg.extract, cfg.embed, cfg.store, len(data), info.n_layers, info.n_heads, cfg.model.name)
    if cfg.extract.shard_size == "auto":
        layout = _resumed_shard_size(cfg, layout, data.fingerprint)
    ctx = RunContext(
        run_dir=cfg.run_dir,
        job=cfg.to_dict(),
        job_name=cfg.name,
        data=data,
        model=info,
        layout=layout,
        key=cfg.extraction_key(data.fingerprint, layout.shard_size),
        devices=devices,
        seed=cfg.runtime.seed,
        stages=tuple(stages),
        overwrite=overwrite,
        registry=dict(registered_stages()),
    )
    _check_run_dir(ctx, cfg, analysed)
    jobs = stage_jobs(cfg)
    built = [registered_stages()[name].from_job(jobs[name]) for name in stages]
    if any(st.uses_cluster(ctx) for st in built):  # the cluster's settings against this machine (GPUs, TLS)
        from rapids_attn.runtime import check_runtime, reach_scheduler

        check_runtime(cfg.runtime)
        if cfg.runtime.cluster == "scheduler":  # its address and credentials tried now, not after the fine-tune
            reach_scheduler(cfg.runtime)
    for st in built:
        st.check(ctx)
    _check_requirements(ctx, built)
    ctx.timings["preflight"] = time.perf_counter() - t0
    return RunPlan(ctx, built)


def _status(line: str) -> None:
    """One progress line of the run on stderr (``rapids_attn: learn: done in 23.4 s``), flushed at once."""
    print(f"rapids_attn: {line}", file=sys.stderr, flush=True)


def _resumed_shard_size(cfg: JobConfig, layout, fingerprint: str):
    """``extract.shard_size: auto``: a store of this job made with another number of examples per shard (an
    explicit one, or 128, the default before ``auto``) keeps its own, so the run resumes it rather than refusing
    it as another job's: the shard size changes where the rows are chunked, not what they hold."""
    from dataclasses import asdict, replace

    from rapids_attn.store.zarr_store import stored_key_and_layout

    found = stored_key_and_layout(cfg.run_dir / "store.zarr")
    if found is None:
        return layout
    key, stored = found
    size = stored.get("shard_size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1 or size == layout.shard_size:
        return layout
    theirs = replace(layout, shard_size=size)
    if key == cfg.extraction_key(fingerprint, size) and stored == asdict(theirs):
        return theirs
    return layout


def _analysed_model(cfg: JobConfig, stages: tuple[str, ...]):
    """(the job after every stage's :meth:`~rapids_attn.stage.Stage.later_job`, the model section preflight
    describes). Where a stage points the later stages at a model it makes (finetune: its folder in the run directory)
    and that model is not there yet (:meth:`~rapids_attn.stage.Stage.later_ready`), preflight describes the model it
    starts from (the same layers, heads and tokenizer), and a run whose later stages need it without that stage is
    refused."""
    jobs = stage_jobs(cfg)
    order = list(registered_stages())
    described = None
    for name, st in registered_stages().items():
        job = jobs[name]
        later = st.later_job(job)
        if later.model == job.model or st.later_ready(job):
            continue
        after = [s for s in stages if order.index(s) > order.index(name)]
        if name not in stages and after:
            raise StoreError(
                f"{later.model.name}: the {name} stage makes this model for the later stages, and it is not there "
                f"yet; add {name} to --stages (e.g. --stages {','.join(s for s in order if s in {name, *stages})})"
            )
        described = described or job.model
    analysed = _analysed_job(cfg)
    return analysed, described or analysed.model


def _check_run_dir(ctx: RunContext, cfg: JobConfig, analysed: JobConfig) -> None:
    """The run directory is absent, empty, marked as rapids_attn's, or holds a rapids_attn store (made
    before the marker); anything else is refused unless --overwrite, and even then where a file of the
    user's has a name rapids_attn writes (:mod:`rapids_attn.rundir`)."""
    from pathlib import Path

    from rapids_attn.rundir import check_run_dir, check_run_dir_place
    from rapids_attn.store.zarr_store import inspect_store

    data_path = ctx.job.get("data", {}).get("path")
    # the job's own model, not one a stage makes in the run directory (the fine-tune)
    model = Path(ctx.model.source) if analysed.model == cfg.model else Path(cfg.model.name)
    check_run_dir_place(
        ctx.run_dir,
        {"data.path": Path(data_path) if data_path else None, "model.name": model if model.is_dir() else None},
    )
    check_run_dir(
        ctx.run_dir, ctx.job, ctx.overwrite, lambda: inspect_store(ctx.store_path, ctx.key, ctx.layout) != "absent"
    )


def write_resolved_job(ctx: RunContext) -> None:
    """``job.yaml``: one of the names rapids_attn owns in a run directory (:data:`rapids_attn.rundir.OUTPUTS`),
    written only after preflight's run-directory check and under the marker."""
    from rapids_attn.rundir import JOB_YAML

    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    tmp = ctx.run_dir / (JOB_YAML + ".tmp")
    tmp.write_text(yaml.safe_dump(ctx.job, sort_keys=False))
    tmp.replace(ctx.run_dir / JOB_YAML)


def run_job(cfg: JobConfig, stages: tuple[str, ...] | None = None, overwrite: bool = False) -> dict:
    """Run the stages of a validated job; returns the summary (also written to summary.json when
    the explain stage ran)."""
    stages = default_stages(cfg) if stages is None else stages
    if overwrite and "extract" not in stages:
        raise JobConfigError("--overwrite replaces the store, so it needs the extract stage in --stages")
    if worker_stages() & set(stages):  # the workers' imports run beside the checks (processes.start_worker_server)
        from rapids_attn.processes import start_worker_server
        from rapids_attn.registry import worker_modules

        start_worker_server(cfg.runtime, worker_modules())
    if sys.stderr.isatty():  # where someone waits on it; in a log a failure stays its one line
        _status(f"preflight: checking the data, the model and the stages ({', '.join(stages)})")
    plan = preflight(cfg, stages, overwrite)
    from rapids_attn.runlock import run_lock

    with run_lock(plan.ctx.run_dir):  # from here on this run writes: one run per run directory
        ctx = plan.ctx
        _status(
            f"preflight: done in {ctx.timings['preflight']:.1f} s ({len(ctx.data):,} examples, {ctx.model.n_layers} "
            f"layers x {ctx.model.n_heads} heads)"
        )
        from rapids_attn.rundir import mark_run_dir, remove_stale_outputs

        mark_run_dir(plan.ctx.run_dir)  # before any output: the directory is rapids_attn's from now on
        stale = remove_stale_outputs(plan.ctx.run_dir, plan.stages)
        if stale:
            print(
                f"rapids_attn: removed the earlier {', '.join(stale)} (they described the store before this run); "
                "--stages explain writes them again",
                file=sys.stderr,
            )
        return _run_stages(cfg, plan)


def _run_stages(cfg: JobConfig, plan: RunPlan) -> dict:
    ctx, built = plan.ctx, plan.stages
    write_resolved_job(ctx)
    using = [i for i, st in enumerate(built) if st.uses_cluster(ctx)]
    with ExitStack() as cluster_scope:
        client = None
        for i, st in enumerate(built):
            if client is None and using and using[0] <= i <= using[-1]:
                t = time.perf_counter()
                client = _start_cluster(cfg, ctx, cluster_scope)
                ctx.timings["cluster_start"] = time.perf_counter() - t  # workers up (not loaded: see extract)
            t = time.perf_counter()
            _status(f"{st.name}: started ({i + 1} of {len(built)} stages)")
            result = st.run(ctx, client if st.uses_cluster(ctx) else None)
            result.seconds = time.perf_counter() - t
            _status(f"{st.name}: done in {result.seconds:.1f} s")
            ctx.timings[st.name] = result.seconds
            ctx.results[st.name] = result
            if client is not None:
                if i >= using[-1]:  # no later stage needs the workers: close them now
                    t = time.perf_counter()
                    cluster_scope.close()
                    ctx.timings["cluster_stop"] = time.perf_counter() - t
                    client = None
                else:
                    st.release(client)
    return _summary(ctx)


def _start_cluster(cfg: JobConfig, ctx: RunContext, scope: ExitStack):
    from rapids_attn.runtime import Runtime

    rt = Runtime(cfg.runtime)
    client = scope.enter_context(rt)
    ctx.runtime.update(rt.description)
    print(
        f"rapids_attn: {ctx.runtime['n_workers']} worker(s) on {cfg.runtime.cluster}; "
        f"dashboard: {ctx.runtime['dashboard']}",
        file=sys.stderr,
        flush=True,
    )
    return client


def _summary(ctx: RunContext) -> dict:
    from rapids_attn.explain.outputs import write_json

    seconds = {k: round(v, 3) for k, v in ctx.timings.items()}
    explain = ctx.results.get("explain")
    if explain is None:
        return {
            "stages": list(ctx.stages),
            **{name: r.to_dict() for name, r in ctx.results.items()},
            "seconds": seconds,
        }
    summary = explain.to_dict()
    summary["seconds"] = {**summary.get("seconds", {}), **seconds}
    for name, result in ctx.results.items():  # every other stage's result under its name
        if name != "explain" and not registered_stages()["explain"].carries(registered_stages()[name]):
            summary[name] = result.to_dict()
    write_json(ctx.run_dir / "summary.json", summary)
    return summary
