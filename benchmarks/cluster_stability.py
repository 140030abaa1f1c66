"""``python -m benchmarks.cluster_stability RUN_DIR [RUN_DIR ...]`` (from the repository root): how much the
clusters of a finished run depend on KMeans's seed, for several numbers of restarts (``n_init``).

For each run it redoes the learn stage's fit exactly (the job's own fit sample, PCA and k, with
``rapids_attn.learn.fit``'s code), then fits KMeans with seeds 0..S-1 at each ``n_init`` and prints
a markdown table: the adjusted Rand index (ARI) of every other seed's labels of the fit sample against
seed 0's (min and mean), and the seconds per fit. The result is recorded in docs/benchmarks.md
(its row; the protocol: docs/decisions/2026-11-22-in-process-suite.md).
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import numpy as np
import yaml
import zarr
from sklearn.metrics import adjusted_rand_score

from rapids_attn.backends.learn import LearnBackend
from rapids_attn.jobfile import load_job
from rapids_attn.learn.storeio import read_sample, sample_maps
from rapids_attn.store import schema as S
from rapids_attn.store.schema import read_strings


def fit_sample(run: Path):
    """The reduced fit sample of a run's learn stage, and its k (as the job fitted them)."""
    cfg = load_job(None, raw=yaml.safe_load((run / "job.yaml").read_text()))
    g = zarr.open_group(str(run / "store.zarr"), mode="r")
    feats = g[S.FEATURES]
    e, nl, nh, d = feats.shape
    groups = None
    if cfg.reduce.sample_by == "group":
        _, groups = np.unique(read_strings(g[S.EXAMPLE_GROUP]), return_inverse=True)
    backend = LearnBackend("cpu", "benchmark")
    idx = sample_maps(e * nl * nh, cfg.reduce.fit_sample, cfg.runtime.seed, groups, nl * nh)
    x = read_sample(backend, feats, idx, feats.chunks[0])
    pca = backend.pca(min(cfg.reduce.pca_components, d), cfg.runtime.seed).fit(x)
    k = dict(g.attrs.get("learn", {})).get("n_clusters") or cfg.cluster.n_clusters
    return backend, pca.transform(x), int(k)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--n-init", type=int, nargs="+", default=[1, 4, 10, 25])
    args = ap.parse_args(argv)
    print("| run | maps fitted | k | n_init | ARI vs seed 0: min | mean | all pairs: min | s per fit |")
    print("|---|---|---|---|---|---|---|---|")
    for run in args.runs:
        backend, z, k = fit_sample(run)
        for n_init in args.n_init:
            labels, took = [], []
            for seed in range(args.seeds):
                km = backend.kmeans(k, seed).set_params(n_init=n_init)
                t = time.perf_counter()
                labels.append(km.fit_predict(z))
                took.append(time.perf_counter() - t)
            vs0 = [adjusted_rand_score(labels[0], other) for other in labels[1:]]
            pairs = [adjusted_rand_score(a, b) for a, b in itertools.combinations(labels, 2)]
            print(
                f"| {run.name} | {len(z):,} | {k} | {n_init} | {min(vs0):.3f} | {np.mean(vs0):.3f} | "
                f"{min(pairs):.3f} | {np.mean(took):.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
