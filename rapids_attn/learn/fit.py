"""Fit on a seeded sample, then transform and assign every map, one store chunk at a time.

Memory stays bounded by the fit sample plus one chunk of rows, whatever the dataset's size:

1. draw a seeded sample of at most ``reduce.fit_sample`` maps and read their features;
2. fit PCA (then UMAP, if enabled) on the sample; fit the clusterer on the reduced sample;
3. pass over the store chunk by chunk: transform, assign a cluster, write ``reduced``, ``coords``
   and ``cluster`` rows.

KMeans assigns new maps with ``predict``. DBSCAN and HDBSCAN have no ``predict``: when the sample
is not the whole dataset, each other map takes the label of its nearest fitted neighbour in the
reduced space (noise stays noise). A density fit that leaves every map, or more than half of them,
as noise still succeeds, with a one-line warning in the result's ``warnings`` (:func:`noise_warnings`),
which the learn stage prints and the report shows. On a GPU the same code runs on cuML with CuPy blocks.

With two or more GPU workers, none on a MIG slice (NCCL does not run across slices), and a fit that cuml.dask
can run (PCA then KMeans), the fit is spread over the GPUs instead (:class:`rapids_attn.learn.spread.SpreadFit`):
each worker reads its share of the sample's store chunks itself, onto its own GPU (the job process reads no
features), the parts stay there (persisted, assigned round-robin), cuml.dask fits PCA and KMeans on them, and every
store chunk is then transformed, assigned and written by a worker. The figures of the single-process fit are kept: the
k sweep runs on one GPU worker over its seeded sample of the reduced maps (gathered from the parts),
and the stability refits are cuml.dask KMeans fits of the whole spread sample with the next seeds. The job
process drives cuml.dask, and holds a CUDA context and small fitted arrays on its first GPU
(:mod:`rapids_attn.learn.spread` says which). ``summary.json`` records how many parts, workers and distinct GPUs
(by UUID) held the fit's data.

A single-GPU fit (cuML) of a run whose workers are up (a local-cuda cluster, or an external one with GPU
workers) runs on one GPU worker (:func:`fit_worker`; the scheduler picks which), not in the job process: the
workers hold RMM pools of most of their GPU's memory (80% by default), so the job process would get what is left
of GPU 0. The worker fits from its own pool and writes the store itself; ``fit_worker`` in the summary names it.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import zarr

from rapids_attn.backends import LearnBackend
from rapids_attn.devices import gpu_ids, mig_workers, one_worker_per_gpu, supports_multi_gpu
from rapids_attn.learn.estimator import MapClusterer
from rapids_attn.learn.storeio import add_counts, blocks, output_arrays, read_sample, sample_maps, write_block
from rapids_attn.store import schema as S
from rapids_attn.store.zarr_store import mark_complete, read_strings

log = logging.getLogger(__name__)


#: a density clusterer leaving more than this share of the maps as noise gets a warning
NOISE_WARN_SHARE = 0.5


def noise_warnings(cluster, counts: dict[int, int], n_maps: int) -> list[str]:
    """One-line warnings when DBSCAN or HDBSCAN left every map (no clusters), or most of them, as
    noise: the run still succeeds, but its clusters describe few maps or none, and the line says
    which setting to change."""
    noise = counts.get(-1, 0)
    if cluster.method == "kmeans" or not n_maps or noise / n_maps <= NOISE_WARN_SHARE:
        return []
    if cluster.method == "hdbscan":
        fix = (
            f"lower cluster.min_cluster_size (now {cluster.min_cluster_size}) or cluster.min_samples "
            f"(now {cluster.min_samples})"
        )
    else:
        fix = f"raise cluster.eps (now {cluster.eps}) or lower cluster.min_samples (now {cluster.min_samples})"
    if noise == n_maps:
        return [f"cluster.{cluster.method} marked all {n_maps:,} maps as noise (no clusters); {fix}, or use kmeans"]
    share = f"{noise:,} of {n_maps:,} maps ({noise / n_maps:.0%})"
    return [f"cluster.{cluster.method} marked {share} as noise; the clusters describe only the rest: {fix}"]


def fit_worker(backend: LearnBackend, client, ids: dict[str, str | None] | None = None) -> str | None:
    """Whether a single-GPU fit goes to a worker: a GPU worker (the first by address of one per distinct GPU,
    :func:`one_worker_per_gpu`) when the fit is cuML's and the job has workers; None: the fit runs in this
    process. The workers' RMM pools hold most of each GPU (80% by default): a fit in the job process would get
    what is left of GPU 0, so it goes to a worker, which fits from its pool. :func:`fit_store` offers the task
    to every one of those GPU workers and the scheduler runs it on any one of them (not necessarily this
    first), so that a worker that restarts does not strand it; summary.json's ``fit_worker`` names the one that
    ran it. With no GPU among the workers (an external cluster of CPU workers) the fit stays here, on this
    process's GPU, which no worker holds."""
    if not backend.gpu or client is None:
        return None
    workers = one_worker_per_gpu(gpu_ids(client) if ids is None else ids)
    return workers[0] if workers else None


def _fit_store_on_worker(store, reduce, cluster, backend: LearnBackend, seed: int, note: dict) -> dict:
    """On a GPU worker: :func:`fit_store` of the store at ``store`` (it writes the store itself, ``note`` in its
    ``learn`` attribute, which summary.json reads)."""
    return fit_store(zarr.open_group(store, mode="r+"), reduce, cluster, backend, seed, note=note)


def _worker_address() -> str | None:
    """The address of the Dask worker running this code (None: the job process)."""
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return None


def fit_store(
    g: zarr.Group,
    reduce,
    cluster,
    backend: LearnBackend,
    seed: int = 0,
    client=None,
    multi_gpu: bool = False,
    note: dict | None = None,
) -> dict:
    """Reduce and cluster every map of the store ``g`` (its ``features``); write ``reduced``,
    ``coords`` and ``cluster``; return what was done (also kept as the store's ``learn`` attribute).

    ``reduce`` and ``cluster`` are the job's ReduceConfig and ClusterConfig; any store with a
    ``features`` array works, with no job file. ``multi_gpu`` (from the device plan) spreads the
    fit over the GPU workers of ``client`` with cuml.dask when at least two distinct GPUs joined, none of
    them a MIG slice (:func:`rapids_attn.devices.mig_workers`), and the fit has a cuml.dask form; otherwise a
    cuML fit runs on one GPU worker of ``client`` (:func:`fit_worker`), and any other fit in this process.
    ``note`` is added to what is returned and kept."""
    ids = gpu_ids(client) if client is not None and (multi_gpu or backend.gpu) else {}
    gpu_workers = one_worker_per_gpu(ids)
    n_gpus = len(gpu_workers)
    mig = mig_workers(ids)  # NCCL does not run across MIG slices: no spread fit with any among the workers
    spread = multi_gpu and supports_multi_gpu(reduce, cluster) and n_gpus > 1 and not mig
    worker = None if spread else fit_worker(backend, client, ids)
    note = dict(note or {})
    if multi_gpu and not spread:
        note["multi_gpu_skipped"] = _spread_skipped(reduce, cluster, n_gpus, len(mig))
    # the whole fit on a GPU worker, from its RMM pool: offered to every GPU worker, the scheduler picks one (so a
    # worker that restarts does not strand it); the worker records its own address as fit_worker
    if worker is not None:
        args = (g.store, reduce, cluster, backend, seed, note)
        places = [worker, *(w for w in gpu_workers if w != worker)]
        log.info("fitting on a GPU worker (cuML, from the workers' memory pools)")
        info = client.submit(_fit_store_on_worker, *args, workers=places, pure=False).result()
        _log_result(info)
        return info
    mark_complete(g, "learn", False)
    feats = g[S.FEATURES]
    e, nl, nh, d = feats.shape
    rows = feats.chunks[0]
    n_maps = e * nl * nh
    timings = {}

    t0 = time.perf_counter()
    groups = None
    if reduce.sample_by == "group":
        _, groups = np.unique(read_strings(g[S.EXAMPLE_GROUP]), return_inverse=True)
    idx = sample_maps(n_maps, reduce.fit_sample, seed, groups, nl * nh)
    counts: dict[int, int] = {}
    placement = None
    if spread:
        from rapids_attn.learn.spread import SpreadFit

        log.info("fitting on %d GPUs (cuml.dask): %s of %s maps", n_gpus, f"{len(idx):,}", f"{n_maps:,}")
        fit = SpreadFit(client, backend, feats.store, gpu_workers, seed, ids)
        try:  # the parts are held on the workers' GPUs until released, whatever happens
            fit.fit(feats, idx, reduce, cluster, timings)
            model, placement = fit.model, fit.placement
            t = time.perf_counter()
            if cluster.stability_seeds:
                log.info("seed stability: KMeans refitted with the next %d seed(s)", cluster.stability_seeds)
            stability = fit.stability(cluster.stability_seeds)
            if stability is not None:
                timings["stability"] = time.perf_counter() - t
            k = int(model.pca_.n_components)
            output_arrays(g, e, nl, nh, rows, k)
            log.info("assigning and writing all %s maps", f"{n_maps:,}")
            t2 = time.perf_counter()
            counts = fit.assign_all(e, rows)
            timings["assign"] = time.perf_counter() - t2
            t3 = time.perf_counter()
            sil = fit.silhouette(cluster.silhouette_sample)
            timings["silhouette"] = time.perf_counter() - t3
        finally:
            fit.release()
    else:
        some = f"all {n_maps:,}" if len(idx) == n_maps else f"{len(idx):,} of {n_maps:,}"
        log.info(
            "reading %s maps to fit on (%s)",
            some,
            {"sklearn": "scikit-learn", "cuml": "cuML"}.get(backend.name, backend.name),
        )
        x_fit = read_sample(backend, feats, idx, rows)
        timings["read_sample"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        model = MapClusterer.from_config(reduce, cluster, seed, backend).fit(x_fit)
        stability = model.seed_stability()
        timings["fit"] = time.perf_counter() - t1
        timings.update(model.seconds_)
        k = int(getattr(model.pca_, "n_components_", None) or min(reduce.pca_components, d))
        outputs = output_arrays(g, e, nl, nh, rows, k)
        log.info("assigning and writing all %s maps", f"{n_maps:,}")
        t2 = time.perf_counter()
        for lo, hi in blocks(e, rows):
            x = backend.read(feats, slice(lo, hi)).reshape(-1, d)
            add_counts(counts, write_block(model, outputs, x, lo, hi))
        timings["assign"] = time.perf_counter() - t2
        t3 = time.perf_counter()
        sil = backend.silhouette(model.embedding_, model.labels_, cluster.silhouette_sample, seed)
        timings["silhouette"] = time.perf_counter() - t3
    evr = getattr(model.pca_, "explained_variance_ratio_", None)
    info = {
        "backend": backend.name,
        "backend_reason": backend.reason,
        "multi_gpu": spread,
        "method": cluster.method,
        "n_maps": n_maps,
        "n_fit": len(idx),
        "pca_components": k,
        "pca_explained_variance": float(backend.to_numpy(evr).sum()) if evr is not None else None,
        "umap": reduce.umap.enabled,
        "n_clusters": len([c for c in counts if c >= 0]),
        "cluster_sizes": {str(c): n for c, n in sorted(counts.items())},
        "noise_share": counts.get(-1, 0) / n_maps if n_maps else 0.0,
        "warnings": noise_warnings(cluster, counts, n_maps),
        "silhouette": sil,
        "silhouette_sample": min(cluster.silhouette_sample, len(idx)),
        "stability": stability,
        "k_sweep": model.k_sweep_,
        "fit_worker": _worker_address(),  # None: this fit ran in the job process (fit_worker says when not)
        "sample_by": reduce.sample_by,
        "seconds": timings,
    }
    info.update(note)
    if placement is not None:
        info["fit_placement"] = placement
    mark_complete(g, "learn", True, info)
    _log_result(info)
    return info


def _log_result(info: dict) -> None:
    """The fit's last progress line: its clusters (and noise) and silhouette (the stage's time follows it)."""
    share, sil = info.get("noise_share"), info.get("silhouette")  # a fit on a GPU worker reports what it has
    noise = f", {share:.0%} noise" if info.get("method", "kmeans") != "kmeans" and share is not None else ""
    score = f", silhouette {sil:.3f}" if sil is not None else ""
    log.info("%s cluster(s)%s%s", info.get("n_clusters", "?"), noise, score)


def _spread_skipped(reduce, cluster, n_gpus: int, n_mig: int = 0) -> str:
    """Why a fit the device plan meant to spread over the GPUs was not (one line, printed by the learn stage)."""
    if not supports_multi_gpu(reduce, cluster):
        return "no cuml.dask form"
    if n_mig and n_gpus > 1:
        return (
            f"{n_mig} worker(s) run on MIG slices, and NCCL (cuml.dask's fit) does not run across MIG slices: "
            "fitted on one GPU worker"
        )
    return f"{n_gpus} distinct GPU(s) among the workers"
