"""The extract stage: run the model over every shard on the Dask workers and write the store.

The client opens (resumes) or creates the store, then maps :func:`rapids_attn.extract.shard.process_shard`
over the shards not yet marked done; each worker reads its shard's rows from the input itself (the
task says where they are), writes them (example ids, groups and labels too) and then the shard's
done-marker. When every shard is done, the stage sets ``extract_complete``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from rapids_attn.errors import JobConfigError
from rapids_attn.extract.signature import DETECTOR_NAMES, PROFILE_OFFSETS, STAT_NAMES
from rapids_attn.stage import RunContext, Stage, StageResult
from rapids_attn.stagekit import MODEL_WORKER_MODULES, progress
from rapids_attn.store import schema as S
from rapids_attn.store.zarr_store import StoreLayout


@dataclass
class ExtractResult(StageResult):
    resumed: bool = False
    shards_run: int = 0
    shards_total: int = 0
    maps_run: int = 0
    maps_per_example: int = 0

    def to_dict(self) -> dict:
        # summary.json's extract.this_run: what this run did (the run record lives in extract.runs)
        return {
            "resumed": self.resumed,
            "shards_run": self.shards_run,
            "shards_total": self.shards_total,
            "maps_run": self.maps_run,
            "maps_per_example": self.maps_per_example,
        }


def _merge_kernels(results) -> dict[str, list[int]]:
    """The shards' kernel -> layers records as one: each kernel with every layer it served in any shard."""
    out: dict[str, set[int]] = {}
    for r in results:
        for name, layers in r.kernels.items():
            out.setdefault(name, set()).update(layers)
    return {name: sorted(layers) for name, layers in sorted(out.items())}


#: ``extract.shard_size: auto``: the most examples per shard, the shards it aims for below that, and the step
AUTO_SHARD_MAX, AUTO_SHARDS, AUTO_SHARD_STEP = 128, 8, 16


def resolve_shard_size(shard_size: int | str, n_examples: int) -> int:
    """The examples per shard of a store of ``n_examples``: a number as given, ``auto`` as
    :data:`AUTO_SHARD_MAX`, or for smaller data the multiple of :data:`AUTO_SHARD_STEP` that makes about
    :data:`AUTO_SHARDS` shards. Either way capped at the data: a shard larger than the dataset would only
    size buffers and chunks for rows that do not exist (shard_size 50000 on 20 examples peaked at 6.8 GB).

    The workers take shards as they free up, so the job ends when the last one does: on 500 SQuAD
    questions the four shards of 128 held 19k, 30k, 24k and 19k tokens, and one of two workers waited
    2.4-2.6 s for the other; eight shards of 64 ended the job 1.0-2.4 s sooner (docs/benchmarks.md). It
    depends on the data's size only, never on the workers, so a resumed run keeps its store's layout."""
    if shard_size == "auto":
        per = -(-n_examples // AUTO_SHARDS)
        shard_size = min(AUTO_SHARD_MAX, max(AUTO_SHARD_STEP, -(-per // AUTO_SHARD_STEP) * AUTO_SHARD_STEP))
    return max(1, min(int(shard_size), n_examples))


def plan_layout(extract, embed, store, n_examples: int, n_layers: int, n_heads: int, model_name: str) -> StoreLayout:
    """The store's shapes for this job; builds the embedder once on the CPU (which also fetches and
    checks its weights; the int8 calibration is left to the workers)."""
    from rapids_attn.embed import build_embedder

    layers = _check_indices("layers", extract.layers, n_layers, model_name)
    heads = _check_indices("heads", extract.heads, n_heads, model_name)
    if extract.thumbnail_size > extract.image_size:
        raise JobConfigError(
            f"extract.thumbnail_size: {extract.thumbnail_size} exceeds extract.image_size {extract.image_size}"
        )
    precision = "int8" if embed.precision == "int8" else "float32"
    embedder = build_embedder(embed, extract.image_size, "cpu", precision, prepare=False)
    return StoreLayout(
        n_examples=n_examples,
        layers=layers,
        heads=heads,
        feature_dim=embedder.dim,
        image_size=extract.image_size,
        thumb_size=extract.thumbnail_size,
        shard_size=resolve_shard_size(extract.shard_size, n_examples),
        stat_names=list(STAT_NAMES),
        profile_offsets=list(PROFILE_OFFSETS),
        detector_names=list(DETECTOR_NAMES),
        embed_outputs=dict(embedder.outputs),
        embed_attrs=dict(embedder.store_attrs),
        features_dtype=store.features_dtype,
        compression_level=store.compression_level,
    )


def _check_indices(name: str, sel: list[int] | None, n: int, model: str) -> list[int]:
    if sel is None:
        return list(range(n))
    bad = [i for i in sel if i >= n]
    if bad:
        raise JobConfigError(f"extract.{name}: {bad} out of range; {model} has {n} {name} (0..{n - 1})")
    return sorted(sel)


class ExtractStage(Stage):
    name = "extract"
    requires = ()
    provides = S.arrays_of("extract")
    runs_on_workers = True
    worker_modules = (*MODEL_WORKER_MODULES, "rapids_attn.extract.shard")

    def __init__(self, model, extract, embed, runtime):
        self.model_cfg = model
        self.extract_cfg = extract
        self.embed_cfg = embed
        self.runtime_cfg = runtime

    @classmethod
    def from_job(cls, cfg) -> ExtractStage:
        return cls(cfg.model, cfg.extract, cfg.embed, cfg.runtime)

    def check(self, ctx: RunContext) -> None:
        from rapids_attn.runtime import check_runtime
        from rapids_attn.store.zarr_store import store_action

        self.check_capture(ctx)
        check_runtime(self.runtime_cfg)
        # refuses what it may not touch; another job's store is named with what changed since it was made
        store_action(
            ctx.store_path, ctx.key, ctx.layout, ctx.overwrite, ctx.job, getattr(ctx.data, "fingerprint", None)
        )

    def check_capture(self, ctx: RunContext) -> None:
        """The capture's settings against the model and the device: the blocked capture's base implementation
        (``extract.attention_base``) and kernel (``extract.kernel``, resolved here where the job's process knows the
        device; each worker resolves it for the device it sees), and no Triton kernel under eager attention."""
        x, device = self.extract_cfg, ctx.devices.extract.device
        if ctx.model.attention == "blocked":
            from rapids_attn.extract.blocked import check_base
            from rapids_attn.extract.kernels import resolve_kernel

            check_base(x.attention_base, device)
            if device != "worker":
                resolve_kernel(x.kernel, device)
        elif x.kernel == "triton":
            from rapids_attn.errors import ModelError

            raise ModelError(
                f"extract.kernel: triton runs under the blocked capture, and '{self.model_cfg.name}' is read with "
                "eager attention (extract.attention); set extract.kernel: auto or torch"
            )

    def uses_cluster(self, ctx: RunContext) -> bool:
        return True

    def prepare(self, ctx: RunContext):
        """The driver's side of the stage: open (resume) or create the store, and one task per shard not yet
        done. Returns ``(store group, resumed, tasks)``. A task describes its shard's rows (file, record
        numbers, where to seek), never their texts: the worker reads them and writes the example ids,
        groups and labels itself."""
        from rapids_attn.extract.shard import ShardTask
        from rapids_attn.store.zarr_store import create_store, done_shards, open_for_job

        layout = ctx.layout
        g = open_for_job(ctx.store_path, ctx.key, layout, ctx.overwrite)
        resumed = g is not None
        if g is None:
            m = ctx.model
            meta = {
                "name": self.model_cfg.name,
                "source": m.source,
                "type": m.model_type,
                "revision": self.model_cfg.revision,
                "n_layers": m.n_layers,
                "n_heads": m.n_heads,
                "max_length": m.max_length,
                "attention": m.attention,  # blocked or eager capture (extract.attention)
            }
            g = create_store(
                ctx.store_path, layout, ctx.job, ctx.key, meta, data_content=getattr(ctx.data, "fingerprint", None)
            )
        done = done_shards(g)
        tasks = [
            ShardTask(
                self.model_cfg,
                self.extract_cfg,
                self.embed_cfg,
                ctx.devices.extract,
                self.runtime_cfg.threads_per_worker,
                ctx.key,
                str(ctx.store_path),
                layout,
                s,
                ctx.data.rows(*layout.shard_rows(s)),
                ctx.model.max_length,
            )
            for s in range(layout.n_shards)
            if not done[s]
        ]
        return g, resumed, tasks

    def run(self, ctx: RunContext, client=None) -> ExtractResult:
        from distributed import as_completed

        from rapids_attn.extract.shard import process_shard
        from rapids_attn.store.zarr_store import consolidate, done_shards, mark_complete

        layout = ctx.layout
        g, resumed, tasks = self.prepare(ctx)
        results = []
        with progress(len(tasks), "extract") as bar:
            futures = client.map(process_shard, tasks, pure=False) if tasks else []
            n_maps = 0
            for fut in as_completed(futures):
                r = fut.result()
                results.append(r)
                n_maps += r.n_maps
                bar.update(1)
                bar.set_postfix(maps=f"{n_maps:,}", refresh=False)
        complete = bool(done_shards(g).all())
        if not complete:
            raise RuntimeError("extraction finished but some shards are not marked done")
        record = {
            "shards": len(results),
            "examples": sum(r.n_examples for r in results),
            "maps": sum(r.n_maps for r in results),
            "windowed_examples": sum(r.n_windowed for r in results),  # model.long_inputs: windows
            # decoder attention (explain's sink score leaves out the first row, which sees the first token alone)
            "causal": all(bool(r.causal) for r in results) if results else None,
            "devices": sorted({r.device for r in results}),
            # the dtype the model ran in (model.dtype: auto resolved on each worker from the checkpoint and its GPU)
            "model_dtypes": sorted({r.dtype for r in results if r.dtype}),
            "workers": sorted({r.worker for r in results}),
            # the capture's kernel for each layer (extract.kernel), and where the torch kernel ran in its place, why
            "kernels": _merge_kernels(results),
            "kernel_fallbacks": dict(sum((Counter(r.kernel_fallbacks) for r in results), Counter())),
            "worker_seconds": {
                k: round(sum(r.seconds.get(k, 0.0) for r in results), 3)
                for k in ("load", "tokenize", "forward", "embed", "write")
            },
        }
        g.attrs[S.Attr.EXTRACT_RUNS] = [*g.attrs.get(S.Attr.EXTRACT_RUNS, []), record]
        mark_complete(g, self.name, True)
        consolidate(ctx.store_path)
        return ExtractResult(
            resumed=resumed,
            shards_run=len(results),
            shards_total=layout.n_shards,
            maps_run=record["maps"],
            maps_per_example=len(layout.layers) * len(layout.heads),
        )

    def release(self, client) -> None:
        """A later stage keeps the cluster (a multi-GPU fit): drop each worker's model and embedder first."""
        from rapids_attn.extract.shard import release_worker_cache

        client.run(release_worker_cache)
