"""GPU paths. Marked ``gpu``: they skip where no CUDA device is visible (conftest.py).

Run on a GPU machine with ``python -m pytest -q tests/gpu`` (alone: nothing here needs the rest of
the suite). Each test skips (not fails) when an optional GPU library it needs (cuML, dask-cuda,
cupy) is missing, and says which. What has run where is recorded in docs/deployment.md.
"""

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest
from helpers import REPO, make_job

pytestmark = pytest.mark.gpu


def needs(module: str):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")


def test_extraction_on_cuda_matches_cpu(tmp_path, tiny_bert_dir, pair_data):
    from rapids_attn.extract.shard import Extractor, ShardTask
    from rapids_attn.jobfile import load_job
    from rapids_attn.pipeline import preflight

    raw = make_job(tmp_path, tiny_bert_dir, pair_data, model={"dtype": "float32"})
    ctx = preflight(load_job(None, raw=raw), ("extract",)).ctx
    ids = [[101, 2054, 2003, 1037, 3231, 102], [101, 2748, 102]]
    outs = {}
    for device in ("cpu", "cuda"):
        cfg = load_job(None, raw=dict(raw, extract=dict(raw["extract"], device=device)))
        ex = Extractor(ShardTask.from_job(cfg, ctx.layout, ctx.model.max_length))
        assert ex.device.startswith(device)
        outs[device] = {k: v.cpu().numpy() for k, v in ex.run_batch(ids).items() if v is not None}
    for k in outs["cpu"]:
        np.testing.assert_allclose(outs["cuda"][k], outs["cpu"][k], atol=1e-4, err_msg=k)


def test_backbone_embedder_half_precision_on_cuda():
    import torch

    from rapids_attn.devices import ExtractDevices
    from rapids_attn.embed.backbone import BackboneEmbedder

    # embed.precision auto resolves to float16 on a worker that sees a GPU, and the embedder takes it as given
    resolved = ExtractDevices("cuda").on_this_worker()
    assert resolved.embed_precision == "float16"
    emb = BackboneEmbedder("resnet18", "random", 64, 256, resolved.device, precision=resolved.embed_precision)
    assert emb.dtype == torch.float16 and next(emb.net.parameters()).dtype == torch.float16
    out = emb(torch.rand(300, 32, 32, device="cuda"))
    assert out.shape == (300, 512) and out.device.type == "cuda" and torch.isfinite(out).all()


def test_cuml_backend_reads_cupy_from_store_and_recovers_clusters(tmp_path):
    needs("cuml")
    needs("cupy")
    import cupy
    from helpers import learn, planted_store
    from sklearn.metrics import adjusted_rand_score

    from rapids_attn.devices import resolve_learn_backend

    backend = resolve_learn_backend("gpu")
    assert backend.name == "cuml"
    g, truth = planted_store(tmp_path)
    block = backend.read(g["features"], slice(0, 16))
    assert isinstance(block, cupy.ndarray)
    info = learn(g, backend, **{"reduce.fit_sample": 100})
    assert info["backend"] == "cuml"
    assert adjusted_rand_score(truth, g["cluster"][:].reshape(-1)) == pytest.approx(1.0)


def _blobs(n: int = 3000, d: int = 16, k: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 10, size=(k, d))
    truth = rng.integers(0, k, size=n)
    return (centers[truth] + rng.normal(0, 0.3, size=(n, d))).astype(np.float32), truth


def test_every_gpu_estimator_fits_on_cupy():
    """PCA, KMeans, DBSCAN, HDBSCAN, UMAP and nearest neighbours, each built by the backend exactly
    as the learn stage builds it, fitted on CuPy arrays and checked against the planted blobs."""
    needs("cuml")
    needs("cupy")
    import cupy
    from sklearn.metrics import adjusted_rand_score

    from rapids_attn.devices import resolve_learn_backend

    backend = resolve_learn_backend("gpu")
    x_np, truth = _blobs()
    x = cupy.asarray(x_np)
    pca = backend.pca(8, seed=0).fit(x)
    z = pca.transform(x)
    assert isinstance(z, cupy.ndarray) and z.shape == (len(x), 8)
    assert float(backend.to_numpy(pca.explained_variance_ratio_).sum()) > 0.9
    for name, est in [
        ("kmeans", backend.kmeans(4, 0)),
        ("dbscan", backend.dbscan(3.0, 5)),
        ("hdbscan", backend.hdbscan(50, 5)),
    ]:
        labels = backend.to_numpy(est.fit_predict(z))
        assert adjusted_rand_score(truth, labels) > 0.99, name
    u = backend.umap(2, 15, 0.1, "euclidean", 0).fit_transform(z)
    assert backend.to_numpy(u).shape == (len(x), 2) and np.isfinite(backend.to_numpy(u)).all()
    _, ind = backend.nearest_neighbors().fit(z).kneighbors(z[:100])
    np.testing.assert_array_equal(backend.to_numpy(ind)[:, 0], np.arange(100))


@pytest.mark.parametrize("method", ["kmeans", "dbscan", "hdbscan"])
def test_gpu_fit_store_matches_cpu_fit_store(tmp_path, method):
    """The whole learn stage on cuML and on scikit-learn, same store: the same partition."""
    needs("cuml")
    from helpers import learn, planted_store
    from sklearn.metrics import adjusted_rand_score

    from rapids_attn.devices import resolve_learn_backend

    params = {
        "kmeans": {},
        "dbscan": {"cluster.method": "dbscan", "cluster.eps": 2.0, "cluster.min_samples": 3},
        "hdbscan": {"cluster.method": "hdbscan", "cluster.min_cluster_size": 10, "cluster.min_samples": 3},
    }[method]
    labels = {}
    for name in ("cpu", "gpu"):
        g, _ = planted_store(tmp_path / name)
        learn(g, resolve_learn_backend(name), **params)
        labels[name] = g["cluster"][:].reshape(-1)
    assert adjusted_rand_score(labels["cpu"], labels["gpu"]) > 0.99


def test_float16_model_agrees_with_float32(tmp_path, tiny_bert_dir, pair_data):
    """model.dtype float16 (the GPU default) against float32 on the same inputs, on the GPU: every
    per-map statistic within 2e-2 (absolute; stats are shares and normalised entropies in [0, 1])."""
    from rapids_attn.extract.shard import Extractor, ShardTask
    from rapids_attn.jobfile import load_job
    from rapids_attn.pipeline import preflight

    raw = make_job(tmp_path, tiny_bert_dir, pair_data, extract={"device": "cuda"})
    ctx = preflight(load_job(None, raw=raw), ("extract",)).ctx
    ids = [[101, 2054, 2003, 1037, 3231, 102], [101, 2748, 102]]
    outs = {}
    for dtype in ("float16", "float32"):
        cfg = load_job(None, raw=dict(raw, model=dict(raw["model"], dtype=dtype)))
        ex = Extractor(ShardTask.from_job(cfg, ctx.layout, ctx.model.max_length))
        outs[dtype] = {k: v.float().cpu().numpy() for k, v in ex.run_batch(ids).items() if v is not None}
    assert "stats" in outs["float32"]
    for k in outs["float32"]:
        np.testing.assert_allclose(outs["float16"][k], outs["float32"][k], atol=2e-2, err_msg=k)


def test_multi_gpu_fit_spreads_over_every_gpu(tmp_path):
    """The cuml.dask fit on a LocalCUDACluster: parts on every GPU (by UUID), the planted blobs found."""
    needs("cuml")
    needs("dask_cuda")
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    from dask_cuda import LocalCUDACluster
    from distributed import Client
    from helpers import learn_sections, planted_store
    from sklearn.metrics import adjusted_rand_score

    from rapids_attn.devices import resolve_learn_backend
    from rapids_attn.learn.fit import fit_store

    g, truth = planted_store(tmp_path)
    reduce, cluster = learn_sections()
    with LocalCUDACluster(dashboard_address=":0") as lc, Client(lc) as client:
        info = fit_store(g, reduce, cluster, resolve_learn_backend("gpu"), client=client, multi_gpu=True)
    assert info["multi_gpu"] is True
    assert info["fit_placement"]["gpus_with_parts"] == torch.cuda.device_count()
    assert adjusted_rand_score(truth, g["cluster"][:].reshape(-1)) > 0.99


def test_bench_on_cuda_smoke(tmp_path):
    """``python -m benchmarks --quick --device cuda`` runs every case and writes its table."""
    from helpers import SHARED_SQUAD

    if not SHARED_SQUAD.exists():
        pytest.skip(f"{SHARED_SQUAD} is not here")
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "benchmarks", "--quick", "--device", "cuda", "--data", str(SHARED_SQUAD)]
    r = subprocess.run([*cmd, "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=1200, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    pipe = json.loads(out.read_text())["pipeline"]
    assert pipe["maps"] == pipe["examples"] * 6 * 12  # MiniLM: every example x layer x head


def test_quickstart_on_local_cuda_cluster(tmp_path):
    needs("dask_cuda")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "rapids_attn.run",
            str(REPO / "jobs" / "quickstart.yaml"),
            "--set",
            "runtime.cluster=local-cuda",
            "runtime.n_workers=null",
            "runtime.learn_backend=auto",
            f"output.dir={tmp_path / 'qs'}",
        ],
        capture_output=True,
        check=False,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((tmp_path / "qs" / "summary.json").read_text())
    assert all(d.startswith("cuda") for d in s["backend"]["extract_devices"])
    assert s["backend"]["runtime"]["cluster"] == "local-cuda"
