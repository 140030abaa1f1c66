"""model.device_map over real GPUs (issue 50): a model spread over every visible GPU gives the maps it gives whole on
one GPU. Marked ``gpu``; skipped with fewer than two GPUs visible.

Run on a machine with two or more GPUs: ``python -m pytest -q tests/gpu/test_device_map_gpu.py``. **Not run yet: no
GPU was lent when it was written** (docs/deployment.md, "A model larger than one GPU")."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import bpe_tokenizer, make_job

pytestmark = pytest.mark.gpu


@pytest.fixture
def two_gpus():
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs two GPUs; {torch.cuda.device_count()} visible")


@pytest.fixture(scope="module")
def six_layer_llama(tmp_path_factory):
    """A small decoder with six equal layers, so that transformers' balanced placement spreads them."""
    import torch
    from transformers import LlamaConfig, LlamaModel

    out = tmp_path_factory.mktemp("six-layer-llama")
    tok = bpe_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    LlamaModel(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _job(tmp_path, model_dir, data, name, model: dict, extract: dict | None = None):
    from rapids_attn.jobfile import load_job

    raw = make_job(tmp_path / name, model_dir, data, model={"dtype": "float32", **model}, extract=extract or {})
    return load_job(None, raw=raw)


@pytest.mark.parametrize("kernel", ["torch", "auto"])
def test_a_model_spread_over_the_gpus_gives_the_maps_of_one_gpu(tmp_path, two_gpus, six_layer_llama, pair_data, kernel):
    import torch

    from rapids_attn.extract.model import model_devices
    from rapids_attn.extract.shard import Extractor, ShardTask
    from rapids_attn.pipeline import preflight

    outs = {}
    for name, model in (("whole", {}), ("spread", {"device_map": "balanced"})):
        cfg = _job(tmp_path, six_layer_llama, pair_data, name, model, {"kernel": kernel})
        ctx = preflight(cfg, ("extract",)).ctx
        ex = Extractor(ShardTask.from_job(cfg, ctx.layout, ctx.model.max_length))
        spans = model_devices(ex.model)
        if name == "spread":
            assert len(spans) >= 2, f"balanced kept the model on {spans}"
            assert ex.device_label == ",".join(spans)
        else:
            assert spans == [ex.device]
        ids = [[1, 40, 41, 42, 43, 40, 41, 42, 43, 2], [1, 50, 51, 52, 2]]
        got = {k: v for k, v in ex.run_batch(ids).items() if v is not None}
        assert all(v.device == torch.device(ex.device) for v in got.values())  # gathered on the worker's device
        outs[name] = {k: v.cpu().numpy() for k, v in got.items()}
    for k, want in outs["whole"].items():
        np.testing.assert_allclose(outs["spread"][k], want, atol=1e-4, err_msg=k)


def test_a_job_with_device_map_stores_what_one_gpu_stores(tmp_path, two_gpus, six_layer_llama, pair_data):
    import zarr

    from rapids_attn.pipeline import run_job
    from rapids_attn.store import schema as S

    stores = {}
    for name, model in (("whole", {}), ("spread", {"device_map": "balanced"})):
        cfg = _job(tmp_path, six_layer_llama, pair_data, name, model)
        run_job(cfg, ("extract",))
        stores[name] = zarr.open_group(str(cfg.run_dir / "store.zarr"), mode="r")
    (record,) = stores["spread"].attrs[S.Attr.EXTRACT_RUNS]
    assert all("," in d for d in record["devices"]), record["devices"]  # the shards name every GPU they ran on
    for array in ("stats", "profile", "detectors"):
        np.testing.assert_allclose(stores["spread"][array][:], stores["whole"][array][:], atol=1e-4, err_msg=array)
