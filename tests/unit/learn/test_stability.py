"""KMeans's dependence on its seed, measured and reported: the fit's labels against refits with other
seeds (ARI), and the k sweep's auto pick preferring the k whose clusters do not move with the seed."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import learn, planted_store
from sklearn.metrics import adjusted_rand_score

import rapids_attn.learn.fit as fit_mod
import rapids_attn.learn.kmeans_fits as kf
from rapids_attn.backends.learn import kmeans_args
from rapids_attn.devices import resolve_learn_backend


def test_well_separated_clusters_are_stable_and_say_so(tmp_path):
    g, _ = planted_store(tmp_path)
    info = learn(g, **{"cluster.stability_seeds": 3, "cluster.k_sweep": None})
    st = info["stability"]
    assert st["seeds"] == [1, 2, 3] and st["n_fit"] == info["n_fit"]
    assert st["ari"] == [1.0, 1.0, 1.0] and st["min_ari"] == 1.0
    assert dict(g.attrs["learn"])["stability"] == st  # kept with the store, for summary.json


def test_the_figure_is_the_ari_of_real_refits(tmp_path):
    """Overlapping blobs: the refits disagree a little, and the figure is exactly their ARI."""
    rng = np.random.default_rng(0)
    z = rng.normal(size=(400, 3))
    backend = resolve_learn_backend("cpu")
    labels = backend.kmeans(7, 0).fit_predict(z)
    got = kf.seed_agreement(backend, z, labels, 7, [5, 6])
    want = [adjusted_rand_score(labels, backend.kmeans(7, s).fit_predict(z)) for s in (5, 6)]
    assert got == pytest.approx(want, abs=1e-4) and min(got) < 1.0


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"cluster.stability_seeds": 0}, "skipped"),
        ({"cluster.method": "dbscan", "cluster.eps": 3.0, "cluster.k_sweep": None}, "deterministic"),
    ],
)
def test_no_figure_when_skipped_or_deterministic(tmp_path, overrides, why):
    g, _ = planted_store(tmp_path)
    assert learn(g, **overrides)["stability"] is None, why


def test_auto_prefers_the_best_silhouette_among_stable_k(tmp_path, monkeypatch):
    g, _ = planted_store(tmp_path)
    info = learn(g, **{"cluster.n_clusters": "auto", "cluster.k_sweep": [2, 6]})
    sweep = info["k_sweep"]
    assert sweep["chosen"] == 3 and len(sweep["stability"]) == len(sweep["k"])  # the planted k, stable
    real = kf.seed_agreement

    def k3_unstable(backend, z, labels, k, seeds, *rest):
        return [0.5] if k == 3 else real(backend, z, labels, k, seeds, *rest)

    monkeypatch.setattr(kf, "seed_agreement", k3_unstable)
    info = learn(g, **{"cluster.n_clusters": "auto", "cluster.k_sweep": [2, 6]})
    sweep = info["k_sweep"]
    stable = [(s, k) for k, s, a in zip(sweep["k"], sweep["silhouette"], sweep["stability"]) if a >= 0.9]
    assert sweep["chosen"] != 3 and sweep["chosen"] == max(stable)[1]


@pytest.mark.parametrize("sil_sample", [40, 300, 10_000])
def test_the_sweep_scores_every_k_as_the_silhouette_does(sil_sample, monkeypatch):
    """The sweep computes its sample's distances once for every k; each k's silhouette is still the one
    LearnBackend.silhouette gives its labels (the same seeded sample), and so is the fallback past the
    distances' budget."""
    from sklearn.cluster import KMeans

    rng = np.random.default_rng(3)
    z = np.concatenate([rng.normal(c, 0.5, size=(100, 4)) for c in (0.0, 4.0, 8.0)]).astype(np.float32)
    backend = resolve_learn_backend("cpu")
    for budget in (kf.SWEEP_DISTANCE_BYTES, 0):
        monkeypatch.setattr(kf, "SWEEP_DISTANCE_BYTES", budget)
        got = kf.sweep_k(backend, z, [2, 5], 1000, sil_sample, seed=7, stability=False)
        want = [backend.silhouette(z, KMeans(**kmeans_args(k, 7)).fit_predict(z), sil_sample, 7) for k in got["k"]]
        assert got["k"] == [2, 3, 4, 5]
        np.testing.assert_allclose(got["silhouette"], want, rtol=1e-5)
        assert got["best_silhouette_k"] == 3


@pytest.mark.parametrize(("n", "k"), [(600, 2), (600, 9), (40, 39), (300, 7)])
def test_the_sweeps_silhouette_is_scikit_learns(n, k):
    """One matrix product per k instead of scikit-learn's bincount per map: the same score, with maps alone
    in their cluster (0) and labels that are not 0..k-1; scikit-learn's own error for too many labels."""
    from sklearn.metrics import pairwise_distances, silhouette_score

    rng = np.random.default_rng(n + k)
    x = np.concatenate([rng.normal(c, 1.0, size=(n // 2, 5)) for c in (0.0, 3.0)]).astype(np.float32)
    dist = pairwise_distances(x)
    labels = rng.integers(0, k, size=len(x)) * 7 - 3
    labels[0] = 1000  # alone in its cluster
    want = silhouette_score(dist, labels, metric="precomputed")
    assert kf.silhouette_precomputed(dist, labels) == pytest.approx(want, abs=1e-6)
    with pytest.raises(ValueError, match="Number of labels"):
        kf.silhouette_precomputed(dist, np.arange(len(x)))


def _openmp_threads() -> list[int]:
    from threadpoolctl import threadpool_info

    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "openmp"]


def test_the_extra_kmeans_fits_run_on_one_thread_wherever_they_run(monkeypatch):
    """scikit-learn's KMeans rounds differently on one and on several threads, and a worker has one: the extra fits
    (the k sweep's, the stability refits) take one here too, so a run of the learn stage alone reports what the
    whole run, whose workers fitted them, reported."""
    from threadpoolctl import threadpool_limits

    kf.import_estimators()
    seen = []

    class Spy:
        inertia_ = 1.0

        def fit_predict(self, z):
            seen.append(_openmp_threads())
            return np.zeros(len(z), dtype=np.int64)

    backend = resolve_learn_backend("cpu")
    monkeypatch.setattr(backend, "kmeans", lambda k, seed: Spy())
    with threadpool_limits(limits=2):  # this process's own pool: two threads
        assert set(_openmp_threads()) == {2}
        labels, _ = kf.kmeans_fit(backend, np.zeros((5, 2), np.float32), 2, 0)
        assert set(_openmp_threads()) == {2}  # put back after the fit
    assert seen and set(seen[0]) == {1} and labels.dtype == np.int32


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to tell one thread from the user's")
def test_the_job_process_fits_on_the_users_threads_whatever_the_cluster_set():
    """A local cluster's nannies put OMP_NUM_THREADS=1 into the job process's environment while it runs; an
    OpenMP library loaded then (scikit-learn's, imported while extract's last shards run) starts with one thread.
    The learn stage's own fits run under ``runtime.job_threadpools``: the threads the user's environment gives."""
    code = (
        "import os, json\n"
        "os.environ.pop('OMP_NUM_THREADS', None)\n"
        "import rapids_attn.runtime as rt\n"
        "os.environ['OMP_NUM_THREADS'] = '1'  # as a running cluster leaves it\n"
        "import sklearn.cluster\n"
        "from threadpoolctl import threadpool_info\n"
        "def omp(): return sorted({i['num_threads'] for i in threadpool_info() if i['user_api'] == 'openmp'})\n"
        "before = omp()\n"
        "with rt.job_threadpools():\n"
        "    inside = omp()\n"
        "print(json.dumps([before, inside, omp(), len(os.sched_getaffinity(0))]))\n"
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    }
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    before, inside, after, cpus = json.loads(r.stdout.strip().splitlines()[-1])
    assert before == [1] and inside == [cpus] and after == [1]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to tell one thread from the user's")
def test_the_learn_stage_fits_under_the_users_threads(tmp_path, monkeypatch, tiny_bert_dir, pair_data):
    """The learn stage enters ``job_threadpools`` around its fit: a pool left at one thread (as a library loaded
    while the cluster ran gets it) is set to the user's threads for the fit."""
    from helpers import make_job
    from threadpoolctl import threadpool_limits

    from rapids_attn import runtime
    from rapids_attn.jobfile import load_job
    from rapids_attn.pipeline import run_job

    monkeypatch.setattr(runtime, "_USER_THREAD_ENV", {})  # the user set nothing: one thread per CPU
    seen, real = [], fit_mod.fit_store

    def spy(*a, **k):
        seen.append(_openmp_threads())
        return real(*a, **k)

    monkeypatch.setattr(fit_mod, "fit_store", spy)
    cfg = load_job(None, raw=make_job(tmp_path, tiny_bert_dir, pair_data))
    kf.import_estimators()
    with threadpool_limits(limits=1):
        run_job(cfg, ("extract", "learn"))
    assert len(seen) == 1 and set(seen[0]) == {len(os.sched_getaffinity(0))}  # every OpenMP library loaded
