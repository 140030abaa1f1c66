"""KMeans's extra fits: the k sweep (inertia, silhouette and seed stability for each k) and the stability
refits of the fit sample, run here, one after another (:func:`kmeans_fit`).

Until issue 36 a CPU cluster's workers ran them at once, beside the final fit here; measured in the whole job, side
by side, that saved nothing (``python -m benchmarks.processes``; docs/decisions/2026-11-27-process-machinery.md),
so it was removed. A multi-GPU fit runs its refits with cuml.dask instead (:mod:`rapids_attn.learn.spread`).
"""

from __future__ import annotations

import numpy as np

from rapids_attn.backends import LearnBackend
from rapids_attn.learn.storeio import sample_maps

#: the adjusted Rand index between seeds at which a k counts as stable (the auto pick prefers those)
STABLE_ARI = 0.9


def seed_agreement(backend: LearnBackend, z, labels, k: int, seeds: list[int]) -> list[float]:
    """The adjusted Rand index of ``labels`` (a KMeans fit of ``z``) against a KMeans refit of ``z`` with
    each of ``seeds``: 1 means the clusters do not depend on the seed."""
    from sklearn.metrics import adjusted_rand_score

    mine = backend.to_numpy(labels)
    return [round(float(adjusted_rand_score(mine, kmeans_fit(backend, z, k, s)[0])), 4) for s in seeds]


def import_estimators() -> None:
    """Import the CPU fit's estimators (scikit-learn: about 1 s) before the fit sets the thread pools."""
    import sklearn.cluster
    import sklearn.decomposition
    import sklearn.metrics  # noqa: F401


def kmeans_fit(backend: LearnBackend, z, k: int, seed: int) -> tuple[np.ndarray, float]:
    """One KMeans fit of ``z``: its labels (int32, on the host) and inertia.

    On one thread: scikit-learn's KMeans rounds differently on one and on several threads (the labels of a few
    thousand maps differed in 4 of 50 fits), and the k sweep's and stability figures were recorded on one."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        km = backend.kmeans(k, seed)
        labels = km.fit_predict(z)
    return backend.to_numpy(labels).astype(np.int32), float(km.inertia_)


def sweep_k(
    backend: LearnBackend,
    z,
    k_range: list[int],
    sample: int,
    sil_sample: int,
    seed: int,
    stability: bool = True,
) -> dict:
    """KMeans inertia, silhouette and, with ``stability``, the ARI against a refit with the next seed, for
    each k in [first, last] on a seeded sample of ``z``. ``best_silhouette_k`` is the best silhouette
    among the stable k (ARI >= :data:`STABLE_ARI`), or among all when none is stable.

    Every k's silhouette is scored on the same seeded ``sil_sample`` of the sweep's maps (those
    ``backend.silhouette`` draws), so their pairwise distances are computed once for the whole sweep, not
    once per k, while they fit in :data:`SWEEP_DISTANCE_BYTES`. The fits run here, in order of k."""
    n = z.shape[0]
    idx = sample_maps(n, sample, seed)
    zs = z[backend.xp.asarray(idx)] if backend.gpu else z[idx]
    ks = [k for k in range(k_range[0], k_range[1] + 1) if k < len(idx)]
    scorer = _SweepSilhouette(backend, zs, sil_sample, seed)
    inertia, sil, agree = [], [], []
    for k in ks:
        labels, km_inertia = kmeans_fit(backend, zs, k, seed)
        inertia.append(km_inertia)
        sil.append(scorer(labels))
        agree.append(seed_agreement(backend, zs, labels, k, [seed + 1])[0] if stability else None)
    scored = [(s, k, a) for k, s, a in zip(ks, sil, agree) if s is not None]
    stable = [(s, k) for s, k, a in scored if a is None or a >= STABLE_ARI]
    best = max(stable or [(s, k) for s, k, _ in scored])[1] if scored else None
    return {
        "k": ks,
        "inertia": inertia,
        "silhouette": sil,
        "stability": agree,
        "best_silhouette_k": best,
        "n": len(idx),
    }


#: the most bytes the k sweep's silhouette distances may take (float32: a sample of about 8,000 maps)
SWEEP_DISTANCE_BYTES = 256 << 20


class _SweepSilhouette:
    """The silhouette of each k's labels on one seeded sample of the sweep's maps: the rows
    :meth:`LearnBackend.silhouette` would draw (KMeans labels every map, so they are the same for every k),
    their distances computed once. Beyond :data:`SWEEP_DISTANCE_BYTES`, scored per k as before."""

    def __init__(self, backend: LearnBackend, z, sample: int, seed: int):
        from sklearn.metrics import pairwise_distances

        self.backend, self.z, self.sample, self.seed = backend, z, sample, seed
        n = z.shape[0]
        self.rows = self.dist = None
        if 0 < sample and min(n, sample) ** 2 * 4 <= SWEEP_DISTANCE_BYTES and n >= 3:
            self.rows = np.random.default_rng(seed).choice(n, sample, replace=False) if n > sample else np.arange(n)
            x = backend.to_numpy(z)[self.rows].astype(np.float32)
            self.dist = pairwise_distances(x)

    def __call__(self, labels) -> float | None:
        if self.dist is None:
            return self.backend.silhouette(self.z, labels, self.sample, self.seed)
        lab = self.backend.to_numpy(labels)[self.rows]
        if len(np.unique(lab)) < 2:
            return None
        return silhouette_precomputed(self.dist, lab)


def silhouette_precomputed(dist: np.ndarray, labels: np.ndarray) -> float:
    """scikit-learn's ``silhouette_score(dist, labels, metric="precomputed")``, with each map's summed
    distance to every cluster taken in one matrix product (distances x one-hot labels) instead of a
    ``bincount`` per map: 15-20 times faster on the sweep's 5,000 maps, where scikit-learn took 75 ms per k.
    The same definition: a = mean distance to the other maps of its cluster, b = the least mean distance to
    another cluster's maps, (b - a) / max(a, b), 0 for a map alone in its cluster, averaged over the maps."""
    from sklearn.metrics import silhouette_score

    uniq, lab = np.unique(labels, return_inverse=True)
    n = len(lab)
    if not 2 <= len(uniq) <= n - 1:  # scikit-learn's own error
        return float(silhouette_score(dist, labels, metric="precomputed"))
    onehot = np.zeros((n, len(uniq)), dtype=dist.dtype)
    onehot[np.arange(n), lab] = 1
    sums = (dist @ onehot).astype(np.float64)  # [map, cluster]: summed distances
    freq = np.bincount(lab).astype(np.float64)
    rows = np.arange(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        intra = sums[rows, lab] / (freq[lab] - 1)
        means = sums / freq
        means[rows, lab] = np.inf
        inter = means.min(axis=1)
        sil = (inter - intra) / np.maximum(intra, inter)
    return float(np.mean(np.nan_to_num(sil)))
