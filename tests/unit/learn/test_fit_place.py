"""Where a GPU (cuML) fit runs (issue 35): never in the job process beside workers whose RMM pools hold most of
the GPU. A run whose workers are up (extract, heads, relevance) sends the fit to one GPU worker, which fits from
its pool and writes the store; a run without workers fits in the job process, on a GPU no worker holds.

cuML cannot fit without a GPU: the decisions are tested with stand-in devices, and the placement itself with
scikit-learn on a CPU LocalCluster, the worker chosen as if it were the GPU worker."""

import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import zarr
from helpers import learn_sections, make_job, planted_store

import rapids_attn.learn.fit as fit_mod
from rapids_attn.backends.learn import LearnBackend
from rapids_attn.learn.fit import fit_store, fit_worker
from rapids_attn.learn.stage import LearnStage
from rapids_attn.store import schema as S

GPU = SimpleNamespace(gpu=True)
CPU = SimpleNamespace(gpu=False)


def test_a_gpu_fit_goes_to_a_gpu_worker():
    """fit_worker names the first GPU worker; fit_store offers the fit to every GPU worker and the scheduler picks
    (tests/unit/test_gpu_hazards.py)."""
    ids = {"tcp://b:1": "GPU-2", "tcp://a:1": "GPU-1", "tcp://c:1": None}
    client = object()
    assert fit_worker(GPU, client, ids) == "tcp://a:1"
    assert fit_worker(GPU, None, ids) is None  # no workers: in this process
    assert fit_worker(CPU, client, ids) is None  # scikit-learn: this process (its extra fits too: kmeans_fits)
    assert fit_worker(GPU, client, {"tcp://c:1": None}) is None  # CPU workers hold no GPU: this process's


@pytest.mark.parametrize(
    ("kind", "stages", "gpu", "uses"),
    [
        ("local-cuda", ("extract", "learn", "heads", "relevance", "explain"), True, True),  # pools up for heads
        ("local-cuda", ("extract", "learn", "explain"), True, True),
        ("local-cuda", ("learn", "heads"), True, True),
        ("local-cuda", ("learn", "explain"), True, False),  # no workers start: the job process has the whole GPU
        ("scheduler", ("learn", "explain"), True, True),  # an external cluster's pools are up whatever the stages
        ("local", ("extract", "learn", "explain"), True, False),  # a LocalCluster's workers hold no pools
        ("local-cuda", ("extract", "learn", "explain"), False, False),  # scikit-learn, no extra fits: here
    ],
)
def test_the_learn_stage_keeps_the_workers_for_a_gpu_fit(kind, stages, gpu, uses):
    reduce, cluster = learn_sections(**{"cluster.k_sweep": None, "cluster.stability_seeds": 0})
    backend = LearnBackend("cuml", "test") if gpu else LearnBackend("sklearn", "test")
    from rapids_attn.registry import registered_stages

    ctx = SimpleNamespace(
        stages=stages, registry=registered_stages(), devices=SimpleNamespace(learn=backend, multi_gpu_learn=False)
    )
    assert LearnStage(reduce, cluster, cluster_kind=kind).uses_cluster(ctx) is uses


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    with cluster, Client(cluster) as c:
        yield c


def test_the_fit_runs_on_the_chosen_worker_and_writes_what_this_process_would(tmp_path, client, monkeypatch):
    from distributed import get_task_stream

    g, _ = planted_store(tmp_path)
    other = tmp_path / "copy.zarr"
    shutil.copytree(tmp_path / "store.zarr", other)
    reduce, cluster = learn_sections()
    here = fit_store(g, reduce, cluster, LearnBackend("sklearn", "test"), seed=0)
    worker = sorted(client.scheduler_info()["workers"])[1]
    # as if that worker held the GPU (the fit on it, given no client, stays there)
    monkeypatch.setattr(fit_mod, "fit_worker", lambda backend, c, ids=None: worker if c is not None else None)
    read = zarr.Array.__getitem__

    def refuse(self, *a, **k):  # the job process reads no features: the worker does
        if self.path == S.FEATURES:
            raise AssertionError("the job process read the features")
        return read(self, *a, **k)

    monkeypatch.setattr(zarr.Array, "__getitem__", refuse)
    g2 = zarr.open_group(str(other), mode="r+")
    with get_task_stream(client) as ts:
        there = fit_store(g2, reduce, cluster, LearnBackend("sklearn", "test"), seed=0, client=client)
    monkeypatch.undo()
    fits = [t for t in ts.data if str(t["key"]).startswith("_fit_store_on_worker")]
    assert [t["worker"] for t in fits] == [worker]
    assert there["fit_worker"] == worker and here["fit_worker"] is None
    g2 = zarr.open_group(str(other), mode="r")
    assert g2.attrs["learn_complete"] is True
    for name in (S.CLUSTER, S.REDUCED, S.COORDS):
        np.testing.assert_allclose(g2[name][:], g[name][:], atol=1e-3)
    assert there["stability"]["ari"] == pytest.approx(here["stability"]["ari"], abs=1e-3)
    assert there["k_sweep"]["k"] == here["k_sweep"]["k"]


def test_a_job_with_heads_and_relevance_fits_on_a_worker_while_the_cluster_is_up(
    tmp_path, tiny_bert_dir, pair_data, monkeypatch
):
    """The order of events of a whole job with the heads and relevance stages on, its GPU fit stood in for: the
    cluster starts once, the fit runs on a worker of it (not in the job process beside the workers' pools), the
    heads and relevance stages run on the same workers, and the cluster closes after the last of them."""
    from rapids_attn import pipeline
    from rapids_attn.jobfile import load_job
    from rapids_attn.registry import registered_stages
    from rapids_attn.runtime import Runtime

    events = []
    start, stop = pipeline._start_cluster, Runtime.__exit__

    def started(*a, **k):
        events.append("cluster start")
        return start(*a, **k)

    def closed(self, *a):
        events.append("cluster close")
        return stop(self, *a)

    def on_worker(backend, client, ids=None):
        if client is None:  # the fit itself, on the worker (fit_store with no client): it stays there
            return None
        worker = min(client.scheduler_info()["workers"])
        events.append("fit placed on a worker")
        return worker

    for name, cls in registered_stages().items():
        run = cls.run

        def traced(self, ctx, client=None, _run=run, _name=name):
            events.append(f"{_name} (cluster {'up' if client is not None else 'not given'})")
            return _run(self, ctx, client)

        monkeypatch.setattr(cls, "run", traced)
    monkeypatch.setattr(pipeline, "_start_cluster", started)
    monkeypatch.setattr(Runtime, "__exit__", closed)
    monkeypatch.setattr(fit_mod, "fit_worker", on_worker)
    monkeypatch.setattr(LearnStage, "fits_on_a_gpu_worker", lambda self, ctx: True)  # as with cuML on local-cuda
    heads = {
        "enabled": True,
        "metric": "retrieval",
        "examples": 8,
        "pruning": {"steps": 2, "random_orders": 1},
        "batch_size": 4,
    }
    heads["probing"] = {"enabled": False}
    raw = make_job(tmp_path, tiny_bert_dir, pair_data, heads=heads, relevance={"enabled": True, "atlas": False})
    summary = pipeline.run_job(load_job(None, raw=raw))
    assert events == [
        "cluster start",
        "extract (cluster up)",
        "learn (cluster up)",
        "fit placed on a worker",
        "heads (cluster up)",
        "relevance (cluster up)",
        "cluster close",
        "explain (cluster not given)",
    ]
    assert summary["backend"]["learn_worker"].startswith("inproc://")  # make_job's workers are threads


def test_a_fit_on_a_worker_keeps_why_it_was_not_spread(tmp_path, client, monkeypatch):
    """A fit the device plan meant to spread, placed on one worker (one GPU among the workers), says why in the
    store's learn attribute, which summary.json reads: the worker writes it, not the job process."""
    g, _ = planted_store(tmp_path)
    reduce, cluster = learn_sections()
    worker = min(client.scheduler_info()["workers"])
    monkeypatch.setattr(fit_mod, "gpu_ids", lambda c: {worker: "GPU-a"})
    monkeypatch.setattr(fit_mod, "fit_worker", lambda backend, c, ids=None: worker if c is not None else None)
    info = fit_store(g, reduce, cluster, LearnBackend("sklearn", "test"), client=client, multi_gpu=True)
    assert info["multi_gpu_skipped"] == "1 distinct GPU(s) among the workers" and info["fit_worker"] == worker
    stored = dict(zarr.open_group(str(tmp_path / "store.zarr"), mode="r").attrs["learn"])
    assert stored["multi_gpu_skipped"] == info["multi_gpu_skipped"] and stored["fit_worker"] == worker
