"""The learn stage: reduce (PCA, optional UMAP) and cluster (KMeans, DBSCAN, HDBSCAN) every map.

It reads ``features`` and writes ``reduced``, ``coords`` and ``cluster``; the fitting itself is
:func:`rapids_attn.learn.fit.fit_store`, which works on any store with a ``features`` array.
"""

from __future__ import annotations

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

    def __init__(self, reduce, cluster, seed: int = 0):
        self.reduce_cfg = reduce
        self.cluster_cfg = cluster
        self.seed = seed

    @classmethod
    def from_job(cls, cfg) -> LearnStage:
        return cls(cfg.reduce, cfg.cluster, cfg.runtime.seed)

    def uses_cluster(self, ctx: RunContext) -> bool:
        # only a multi-GPU fit (cuml.dask) runs on the workers; any other fit runs in this process,
        # and idle workers (with their RMM pools) would hold memory it needs
        return ctx.devices.multi_gpu_learn

    def run(self, ctx: RunContext, client=None) -> LearnResult:
        import zarr

        from rapids_attn.learn.fit import fit_store
        from rapids_attn.store.zarr_store import consolidate

        g = zarr.open_group(str(ctx.store_path), mode="r+")
        self.require_complete(g, ctx.store_path)
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
        return LearnResult(info=info)
