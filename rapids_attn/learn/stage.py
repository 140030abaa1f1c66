"""The learn stage: reduce (PCA, optional UMAP) and cluster (KMeans, DBSCAN, HDBSCAN) every map.

It reads ``features`` and writes ``reduced``, ``coords`` and ``cluster``; the fitting itself is
:func:`rapids_attn.learn.fit.fit_store`, which works on any store with a ``features`` array.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field

from rapids_attn.stage import RunContext, Stage, StageResult
from rapids_attn.store import schema as S


@dataclass
class LearnResult(StageResult):
    #: what fit_store reports (also the store's ``learn`` attribute): backend, method, sizes, silhouette, ...
    info: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dict(self.info)


class LearnStage(Stage):
    name = "learn"
    requires = (S.FEATURES, S.EXAMPLE_GROUP)
    provides = S.arrays_of("learn")

    def __init__(self, reduce, cluster, seed: int = 0, cluster_kind: str = "local"):
        self.reduce_cfg = reduce
        self.cluster_cfg = cluster
        self.seed = seed
        self.cluster_kind = cluster_kind  # runtime.cluster: local, local-cuda or scheduler

    @classmethod
    def from_job(cls, cfg) -> LearnStage:
        return cls(cfg.reduce, cfg.cluster, cfg.runtime.seed, cfg.runtime.cluster)

    def check(self, ctx: RunContext) -> None:
        """The learn settings fit the maps this run has (examples x kept layers x kept heads): KMeans's k,
        the k sweep's first k (each below the maps it fits on) and PCA's components (at most them). The
        sweep's last k is clipped to one below the maps it fits on (sweep_k), not refused. UMAP, DBSCAN and
        HDBSCAN: :meth:`_check_density`."""
        from rapids_attn.errors import JobConfigError

        lay = ctx.layout
        n_maps = lay.n_examples * len(lay.layers) * len(lay.heads)
        maps = f"{n_maps} maps ({lay.n_examples} examples x {len(lay.layers)} layers x {len(lay.heads)} heads)"
        fit_n = min(n_maps, self.reduce_cfg.fit_sample)
        fitted = maps if fit_n == n_maps else f"{fit_n} maps of reduce.fit_sample"
        components = min(self.reduce_cfg.pca_components, lay.feature_dim)
        if fit_n < components:
            raise JobConfigError(
                f"reduce.pca_components: {components} components need at least {components} maps to fit on; "
                f"this run has {maps}: lower reduce.pca_components or add examples"
            )
        self._check_density(fit_n, fitted)
        c = self.cluster_cfg
        if c.method != "kmeans":
            return
        if isinstance(c.n_clusters, int) and c.n_clusters >= fit_n:  # as the sweep: k below the maps (silhouette)
            raise JobConfigError(
                f"cluster.n_clusters: {c.n_clusters} clusters needs more maps than the {fitted} KMeans fits on; "
                f"use at most {fit_n - 1}, or n_clusters: auto"
            )
        sweep_n = min(fit_n, c.sweep_sample)
        if c.k_sweep is not None and c.k_sweep[0] >= sweep_n:
            raise JobConfigError(
                f"cluster.k_sweep: its first k {c.k_sweep[0]} is not below the {sweep_n} maps the sweep fits on "
                f"(of {maps}; at most reduce.fit_sample and cluster.sweep_sample); lower it, or set k_sweep: null "
                "to skip the sweep"
            )

    def _check_density(self, fit_n: int, fitted: str) -> None:
        """Neighbourhood sizes the fit sample (``fit_n`` maps, described by ``fitted``) can hold.

        - UMAP: fewer neighbours than maps (umap-learn silently truncates them, cuML does not), and at least
          n_components + 2 maps (its spectral start needs n_components + 1 eigenvectors below the maps).
        - DBSCAN: a core map has min_samples maps within eps, itself included: more than the maps is all noise.
        - HDBSCAN: min_samples at most the maps (scikit-learn raises otherwise); clusters come from splits
          into two parts of min_cluster_size maps or more (a single cluster is not allowed), so
          2 x min_cluster_size above the maps leaves every map as noise.
        """
        from rapids_attn.errors import JobConfigError

        more = "raise reduce.fit_sample" if "reduce.fit_sample" in fitted else "add examples"
        u = self.reduce_cfg.umap
        if u.enabled and u.n_neighbors >= fit_n:
            raise JobConfigError(
                f"reduce.umap.n_neighbors: {u.n_neighbors} neighbours need more maps than the {fitted} UMAP fits "
                f"on; use at most {fit_n - 1}, or {more}"
            )
        if u.enabled and u.n_components + 2 > fit_n:
            raise JobConfigError(
                f"reduce.umap.n_components: {u.n_components} components need at least {u.n_components + 2} maps; "
                f"UMAP fits on {fitted}: lower it, or {more}"
            )
        c = self.cluster_cfg
        if c.method in ("dbscan", "hdbscan") and c.min_samples > fit_n:
            raise JobConfigError(
                f"cluster.min_samples: {c.min_samples} is more than the {fitted} {c.method.upper()} fits on "
                f"(every map would be noise); use at most {fit_n}, or {more}"
            )
        if c.method == "hdbscan" and 2 * c.min_cluster_size > fit_n:
            raise JobConfigError(
                f"cluster.min_cluster_size: two clusters of {c.min_cluster_size} maps do not fit in the {fitted} "
                f"HDBSCAN fits on (every map would be noise); use at most {fit_n // 2}, or {more}"
            )

    def uses_cluster(self, ctx: RunContext) -> bool:
        """A multi-GPU fit (cuml.dask) runs on the workers. So does a single-GPU (cuML) fit, on one GPU worker
        (:func:`rapids_attn.learn.fit.fit_worker`), where workers hold RMM pools beside it
        (:meth:`fits_on_a_gpu_worker`). Any other fit runs in this process, KMeans's extra fits (the k sweep's
        and the stability refits) included."""
        return ctx.devices.multi_gpu_learn or self.fits_on_a_gpu_worker(ctx)

    def fits_on_a_gpu_worker(self, ctx: RunContext) -> bool:
        """A cuML fit goes to a GPU worker, and fits from its RMM pool, wherever workers hold pools beside it: an
        external cluster's (``scheduler``: up whatever this run's stages), or a ``local-cuda`` cluster this run
        starts anyway (a stage on the workers: with heads or relevance on it stays up through learn, and each
        worker's pool holds 80% of its GPU). A ``local`` cluster's workers hold no pools (and asking them for
        their GPU would start CUDA in each); a run that starts no workers leaves the job process the whole GPU."""
        if ctx.devices.learn is None or not ctx.devices.learn.gpu:
            return False
        on_workers = any(ctx.registry[s].runs_on_workers for s in ctx.stages if s in ctx.registry)
        return self.cluster_kind == "scheduler" or (self.cluster_kind == "local-cuda" and on_workers)

    def run(self, ctx: RunContext, client=None) -> LearnResult:
        from rapids_attn.learn.fit import fit_store
        from rapids_attn.learn.progress import stage_lines
        from rapids_attn.stagekit import open_for_run
        from rapids_attn.store.zarr_store import consolidate

        g = open_for_run(self, ctx, rewrite=False)  # fit_store clears the flag where the fit runs (here, or a worker)
        threads = contextlib.nullcontext()
        if not ctx.devices.learn.gpu:  # this process's own fits on the user's threads (runtime.job_threadpools)
            from rapids_attn.learn.kmeans_fits import import_estimators
            from rapids_attn.runtime import job_threadpools

            import_estimators()  # loaded first: threadpoolctl sets the pools of the libraries loaded
            threads = job_threadpools()
        with threads, stage_lines():  # a line per step of the fit on stderr
            info = fit_store(
                g,
                self.reduce_cfg,
                self.cluster_cfg,
                ctx.devices.learn,
                self.seed,
                client,
                multi_gpu=ctx.devices.multi_gpu_learn,
            )
        consolidate(ctx.store_path)
        if info.get("multi_gpu_skipped"):  # the device plan meant to spread the fit over the GPUs: one line why not
            print(f"rapids_attn: learn: not spread over the GPUs: {info['multi_gpu_skipped']}", file=sys.stderr)
        for w in info.get("warnings", []):  # e.g. HDBSCAN left every map as noise (fit.noise_warnings)
            print(f"warning: {w}", file=sys.stderr)
        return LearnResult(info=info)
