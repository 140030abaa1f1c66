"""GPU paths. Marked ``gpu``: they skip where no CUDA device is visible (conftest.py).

Run on a GPU machine with ``python -m pytest -m gpu -q``. Each test skips (not fails) when an
optional GPU library it needs (cuML, dask-cuda, cupy) is missing, and says which.
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
    from rapids_attn.job import load_job
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

    from rapids_attn.embed.backbone import BackboneEmbedder

    emb = BackboneEmbedder("resnet18", "random", 64, 256, "cuda")
    assert emb.dtype == torch.float16
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
