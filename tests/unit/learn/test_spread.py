"""The fit spread over the workers (the cuml.dask path), run on a CPU LocalCluster.

cuML cannot fit without a GPU, so the two cuml.dask estimators are stood in for by scikit-learn
ones with the same calls (``fit`` on a dask array, ``transform`` returning one, and
``get_combined_model``); what is tested here is the project's side: who reads the store's chunks,
where the parts land, and that the spread fit writes what the single-process fit writes. The
estimators' arguments are checked against the real cuML wheels in tests/contract.
"""

import shutil

import numpy as np
import pytest
import zarr
from distributed import Client, LocalCluster, wait
from helpers import E, H, L, learn_sections, planted_store

import rapids_attn.learn.fit as fit_mod
from rapids_attn.backends.learn import LearnBackend
from rapids_attn.devices import one_worker_per_gpu
from rapids_attn.learn.fit import fit_store
from rapids_attn.learn.spread import placement, spread_parts
from rapids_attn.learn.storeio import sample_maps
from rapids_attn.store import schema as S


class _DaskStandIn:
    """cuml.dask's estimator calls, on scikit-learn: fit gathers the dask array."""

    def __init__(self, model):
        self.model = model

    def fit(self, x):
        self.model.fit(x.compute())
        return self

    def transform(self, x, delayed=True):
        n = self.model.n_components
        return x.map_blocks(self.model.transform, dtype=np.float32, chunks=(x.chunks[0], (n,)))

    def predict(self, x, delayed=True):
        return x.map_blocks(self.model.predict, dtype=np.int32, drop_axis=1)

    def get_combined_model(self):
        return self.model


class _SpreadBackend(LearnBackend):
    def dask_pca(self, client, n_components):
        return _DaskStandIn(self.pca(n_components, 0))

    def dask_kmeans(self, client, n_clusters, seed):
        return _DaskStandIn(self.kmeans(n_clusters, seed))

    def __reduce__(self):  # the workers get a plain scikit-learn backend
        return LearnBackend, ("sklearn", self.reason)


@pytest.fixture(scope="module")
def client():
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    with cluster, Client(cluster) as c:
        yield c


def _forbid_reads_here(monkeypatch, only: str | None = None):
    """Reads of zarr arrays (or of the array ``only``) in this, the job's, process fail; the
    workers are other processes."""
    read = zarr.Array.__getitem__

    def refuse(self, *a, **k):
        if only is None or self.path == only:
            raise AssertionError(f"the job process read {self.path}")
        return read(self, *a, **k)

    monkeypatch.setattr(zarr.Array, "__getitem__", refuse)


def test_workers_read_the_sample_and_hold_it_spread(tmp_path, client, monkeypatch):
    g, _ = planted_store(tmp_path)
    feats = g[S.FEATURES]
    idx = sample_maps(E * L * H, 200, seed=0)
    _forbid_reads_here(monkeypatch)
    workers = sorted(client.scheduler_info()["workers"])
    parts = spread_parts(client, LearnBackend("sklearn", "test"), feats, idx, feats.chunks[0], workers)
    assert len(parts) == -(-E // feats.chunks[0])  # one part per store chunk holding sampled maps
    assert sum(m for _, m in parts) == len(idx)
    wait([f for f, _ in parts])
    held = client.who_has([f for f, _ in parts])
    workers = {a for where in held.values() for a in where}
    assert workers == set(client.scheduler_info()["workers"])  # both workers hold parts
    where = placement(client, parts, {})
    assert where["workers_with_parts"] == 2 and where["gpus_with_parts"] == 0
    rows = where["rows_per_worker"].values()
    assert abs(max(rows) - min(rows)) <= 2 * feats.chunks[0] * L * H  # round-robin: within a chunk or two
    monkeypatch.undo()
    got = np.concatenate(client.gather([f for f, _ in parts]))
    want = feats[:].reshape(-1, feats.shape[-1])[idx]
    np.testing.assert_array_equal(got, want)


def test_spread_fit_writes_what_the_single_process_fit_writes(tmp_path, client, monkeypatch):
    g, _ = planted_store(tmp_path)
    other = tmp_path / "copy.zarr"
    shutil.copytree(tmp_path / "store.zarr", other)
    reduce, cluster = learn_sections(**{"reduce.fit_sample": 150})
    single = fit_store(g, reduce, cluster, LearnBackend("sklearn", "test"), seed=0)

    workers = sorted(client.scheduler_info()["workers"])
    fake_ids = dict(zip(workers, ["GPU-a", "GPU-b"]))  # as if each worker had its own GPU
    monkeypatch.setattr(fit_mod, "gpu_ids", lambda c: fake_ids)
    g2 = zarr.open_group(str(other), mode="r+")
    _forbid_reads_here(monkeypatch, only=S.FEATURES)  # the workers read every feature, for the fit and the assignment
    spread = fit_store(g2, reduce, cluster, _SpreadBackend("sklearn", "test"), seed=0, client=client, multi_gpu=True)
    monkeypatch.undo()

    assert spread["multi_gpu"] is True and single["multi_gpu"] is False
    assert spread["fit_placement"]["workers_with_parts"] == 2
    assert spread["fit_placement"]["gpus_with_parts"] == 2  # the two (stand-in) UUIDs of the workers holding parts
    for name in (S.CLUSTER, S.REDUCED, S.COORDS):
        np.testing.assert_allclose(g2[name][:], g[name][:], atol=1e-3)
    assert spread["cluster_sizes"] == single["cluster_sizes"]
    assert spread["silhouette"] == pytest.approx(single["silhouette"], abs=0.05)
    assert g2.attrs["learn_complete"] is True
    # the k sweep and the stability refits are kept (issue 35: they were dropped, and summary.json said null)
    for key in ("k", "chosen", "best_silhouette_k", "n"):
        assert spread["k_sweep"][key] == single["k_sweep"][key], key
    np.testing.assert_allclose(spread["k_sweep"]["silhouette"], single["k_sweep"]["silhouette"], atol=1e-3)
    np.testing.assert_allclose(spread["k_sweep"]["stability"], single["k_sweep"]["stability"], atol=1e-3)
    assert spread["stability"]["seeds"] == single["stability"]["seeds"] == [1, 2]
    np.testing.assert_allclose(spread["stability"]["ari"], single["stability"]["ari"], atol=1e-3)
    assert spread["stability"]["n_fit"] == single["stability"]["n_fit"] == 150
    assert not client.who_has()  # the parts, the reduced sample and the refits released


def test_spread_fit_picks_k_with_the_sweep_on_one_worker(tmp_path, client, monkeypatch):
    """n_clusters: auto spreads too: the sweep runs on the first GPU worker over its sample, and the spread
    KMeans fits the k it picked, as the single-process fit does."""
    from distributed import get_task_stream

    g, _ = planted_store(tmp_path)
    other = tmp_path / "copy.zarr"
    shutil.copytree(tmp_path / "store.zarr", other)
    reduce, cluster = learn_sections(**{"cluster.n_clusters": "auto", "cluster.k_sweep": [2, 5]})
    single = fit_store(g, reduce, cluster, LearnBackend("sklearn", "test"), seed=0)
    workers = sorted(client.scheduler_info()["workers"])
    monkeypatch.setattr(fit_mod, "gpu_ids", lambda c: dict(zip(workers, ["GPU-a", "GPU-b"])))
    g2 = zarr.open_group(str(other), mode="r+")
    with get_task_stream(client) as ts:
        spread = fit_store(
            g2, reduce, cluster, _SpreadBackend("sklearn", "test"), seed=0, client=client, multi_gpu=True
        )
    sweeps = [t for t in ts.data if str(t["key"]).startswith("sweep_on_worker")]
    assert len(sweeps) == 1 and sweeps[0]["worker"] == workers[0]
    assert spread["multi_gpu"] is True
    assert spread["k_sweep"]["chosen"] == single["k_sweep"]["chosen"] == spread["n_clusters"] == 3
    np.testing.assert_array_equal(g2[S.CLUSTER][:], g[S.CLUSTER][:])


def test_spread_is_skipped_with_fewer_than_two_gpus(tmp_path, client):
    g, _ = planted_store(tmp_path)
    reduce, cluster = learn_sections()
    info = fit_store(g, reduce, cluster, LearnBackend("sklearn", "test"), client=client, multi_gpu=True)
    assert info["multi_gpu"] is False
    assert info["multi_gpu_skipped"] == "0 distinct GPU(s) among the workers"


def test_one_worker_per_distinct_gpu():
    """Workers without a GPU get no part, and of two workers on one GPU only one does (NCCL)."""
    ids = {"tcp://b:1": "GPU-1", "tcp://a:1": "GPU-1", "tcp://c:1": None, "tcp://d:1": "GPU-2"}
    assert one_worker_per_gpu(ids) == ["tcp://a:1", "tcp://d:1"]
    assert one_worker_per_gpu({"tcp://a:1": None}) == []


def test_two_workers_on_one_gpu_do_not_spread(tmp_path, client, monkeypatch):
    g, _ = planted_store(tmp_path)
    workers = sorted(client.scheduler_info()["workers"])
    monkeypatch.setattr(fit_mod, "gpu_ids", lambda c: dict.fromkeys(workers, "GPU-a"))
    reduce, cluster = learn_sections()
    info = fit_store(g, reduce, cluster, _SpreadBackend("sklearn", "test"), client=client, multi_gpu=True)
    assert info["multi_gpu"] is False
    assert info["multi_gpu_skipped"] == "1 distinct GPU(s) among the workers"


@pytest.mark.parametrize("n_clusters", [3, "auto"])
def test_the_sweep_and_refits_run_here_even_with_cpu_workers(tmp_path, client, n_clusters):
    """Given a CPU cluster's client, the k sweep's fits and the stability refits still run in this process
    (running them on the workers was measured and removed: rapids_attn/processes.py): no fit in the task stream,
    and the store and the figures are those of the same fit with no client."""
    from distributed import get_task_stream

    from rapids_attn.devices import resolve_learn_backend

    rng = np.random.default_rng(5)
    here, there = (planted_store(tmp_path / name)[0] for name in ("here", "there"))
    noisy = here[S.FEATURES][:] + rng.normal(0, 6.0, size=here[S.FEATURES].shape).astype(np.float32)
    here[S.FEATURES][:] = there[S.FEATURES][:] = noisy  # overlapping blobs: stability below 1 somewhere
    reduce, cluster = learn_sections(
        **{"cluster.n_clusters": n_clusters, "cluster.k_sweep": [2, 6], "cluster.stability_seeds": 2}
    )
    cpu = resolve_learn_backend("cpu")
    want = fit_store(here, reduce, cluster, cpu, seed=0)
    with get_task_stream(client) as ts:
        got = fit_store(there, reduce, cluster, cpu, seed=0, client=client)
    fits = [t for t in ts.data if str(t["key"]).startswith("kmeans_fit")]
    assert fits == [] and "kmeans_workers" not in got
    sweep, ref = got["k_sweep"], want["k_sweep"]
    assert sweep["k"] == ref["k"] and sweep["chosen"] == ref["chosen"]
    np.testing.assert_allclose(sweep["silhouette"], ref["silhouette"], atol=1e-6)
    np.testing.assert_allclose(sweep["inertia"], ref["inertia"], rtol=1e-5)
    np.testing.assert_allclose(sweep["stability"], ref["stability"], atol=1e-3)
    assert min(sweep["stability"]) < 1.0
    np.testing.assert_allclose(got["stability"]["ari"], want["stability"]["ari"], atol=1e-3)
    np.testing.assert_array_equal(there[S.CLUSTER][:], here[S.CLUSTER][:])
    assert got["silhouette"] == pytest.approx(want["silhouette"], abs=1e-6)
    assert not client.who_has()  # the scattered samples and every future released


@pytest.mark.parametrize(
    ("overrides", "stages", "gpu", "uses"),
    [
        ({}, ("extract", "learn", "explain"), False, False),  # the sweep and refits run in the job process
        ({}, ("learn", "heads"), False, False),
        ({}, ("learn", "explain"), False, False),
        ({}, ("extract", "learn"), True, True),  # cuML fits on a GPU worker, from its pool (test_fit_place.py)
        ({"cluster.k_sweep": None, "cluster.stability_seeds": 0}, ("extract", "learn"), False, False),
        ({"cluster.k_sweep": None}, ("extract", "learn"), False, False),
        ({"cluster.method": "dbscan", "cluster.k_sweep": None}, ("extract", "learn"), False, False),
    ],
)
def test_the_learn_stage_takes_workers_only_for_a_gpu_fit(overrides, stages, gpu, uses):
    from types import SimpleNamespace

    from rapids_attn.learn.stage import LearnStage
    from rapids_attn.registry import registered_stages

    reduce, cluster = learn_sections(**overrides)
    ctx = SimpleNamespace(
        stages=stages,
        registry=registered_stages(),
        devices=SimpleNamespace(learn=LearnBackend("cuml" if gpu else "sklearn", "test"), multi_gpu_learn=False),
    )
    assert LearnStage(reduce, cluster, cluster_kind="local-cuda" if gpu else "local").uses_cluster(ctx) is uses
