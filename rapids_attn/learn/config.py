"""The learn stage's job sections, ``reduce`` (:class:`ReduceConfig`, with ``reduce.umap``: :class:`UmapConfig`)
and ``cluster`` (:class:`ClusterConfig`): core sections of every job (:class:`rapids_attn.job.JobConfig` holds and
re-exports them), defined here, beside the learn stage, so that its estimator (:class:`rapids_attn.learn.MapClusterer`)
checks its flat parameters with the same rules without importing the job's schema (and through it the stages)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from rapids_attn.settings import Section, show

#: UMAP metrics both backends accept on the (dense, signed) PCA output: umap-learn 0.5's named distances
#: intersected with cuML 26.10's brute-force kNN metrics for dense input (the build cuML uses when, as
#: here, random_state is set). Left out: hellinger (needs non-negative input; PCA coordinates are signed),
#: and names only one backend knows (cityblock, sqeuclidean: cuML only; braycurtis, mahalanobis, ...:
#: umap-learn only).
UmapMetric = Literal[
    "euclidean",
    "l2",
    "manhattan",
    "l1",
    "taxicab",
    "chebyshev",
    "linf",
    "minkowski",
    "cosine",
    "correlation",
    "canberra",
    "hamming",
]


class UmapConfig(Section):
    enabled: bool = False
    n_components: int = Field(2, ge=2)
    n_neighbors: int = Field(15, ge=2)
    min_dist: float = Field(0.1, ge=0)
    #: one of :data:`UmapMetric` (accepted by both umap-learn and cuML).
    metric: UmapMetric = "euclidean"


class ReduceConfig(Section):
    pca_components: int = Field(32, ge=2)
    umap: UmapConfig = UmapConfig()
    #: fit on a seeded sample of at most this many maps, then transform / assign every map.
    fit_sample: int = Field(200_000, gt=0)
    #: ``group``: draw the fit sample evenly across example groups (e.g. SQuAD articles), so groups
    #: with many examples (many questions on one context) do not dominate the fit.
    sample_by: Literal["none", "group"] = "none"

    @field_validator("fit_sample")
    @classmethod
    def _fit_sample_holds_components(cls, value: int, info) -> int:
        components = info.data.get("pca_components")  # validated before (declared first); absent if invalid
        if components is not None and value < components:
            raise ValueError(
                f"smaller than reduce.pca_components {components}; PCA needs at least as many maps "
                "as components: raise reduce.fit_sample or lower reduce.pca_components"
            )
        return value


#: the most cluster counts one k sweep may fit (``cluster.k_sweep``).
MAX_K_SWEEP = 200


class ClusterConfig(Section):
    method: Literal["kmeans", "dbscan", "hdbscan"] = "kmeans"
    #: kmeans: the number of clusters, or ``auto`` (the best silhouette of the k sweep).
    n_clusters: int | Literal["auto"] = 8
    #: kmeans: [first, last] cluster counts to sweep (inertia and silhouette on a sample); None skips.
    #: At most :data:`MAX_K_SWEEP` values (each is a KMeans fit); a last k at or above the maps in the
    #: sweep sample is clipped to one below it (preflight refuses a first k there).
    k_sweep: list[int] | None = Field(default_factory=lambda: [2, 16], min_length=2, max_length=2)
    #: maps drawn from the fit sample for the sweep. As many as the silhouette scores by default: on 500 SQuAD
    #: questions (36,000 maps) 5,000 and 20,000 picked the same k with curves within one seed's spread, at a
    #: third of the time (docs/decisions/2026-11-26-forward-ratio.md).
    sweep_sample: int = Field(5000, gt=0)
    eps: float = Field(0.5, gt=0)
    min_samples: int = Field(5, ge=1)
    min_cluster_size: int = Field(20, ge=2)
    #: maps sampled for the silhouette score in summary.json (0 skips it).
    silhouette_sample: int = Field(5000, ge=0)
    #: kmeans: refits with this many other seeds on the fit sample, for the stability figure in summary.json
    #: (adjusted Rand index of each against the fit); 0 skips them. The k sweep's auto pick also uses it.
    stability_seeds: int = Field(2, ge=0, le=10)

    @field_validator("k_sweep")
    @classmethod
    def _bounded_sweep(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and value[1] - value[0] + 1 > MAX_K_SWEEP:
            raise ValueError(
                f"spans {value[1] - value[0] + 1} cluster counts (a KMeans fit each); the most is {MAX_K_SWEEP}, "
                f"e.g. [{value[0]}, {value[0] + MAX_K_SWEEP - 1}]"
            )
        return value

    @model_validator(mode="after")
    def _k(self) -> ClusterConfig:
        if isinstance(self.n_clusters, int) and self.n_clusters < 2:
            raise ValueError(f"n_clusters must be at least 2 or auto, got {show(self.n_clusters)}")
        if self.k_sweep is not None and not (2 <= self.k_sweep[0] < self.k_sweep[1]):
            raise ValueError(f"k_sweep must be [first, last] with 2 <= first < last, got {show(self.k_sweep)}")
        if self.n_clusters == "auto" and (self.k_sweep is None or self.method != "kmeans"):
            raise ValueError("n_clusters: auto picks k from the k sweep; it needs method kmeans and a k_sweep")
        return self
