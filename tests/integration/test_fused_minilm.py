"""The fused kernel on the real model and data (issue 45): MiniLM (the bundled all-MiniLM-L6-v2, 6 layers x 12
heads) over SQuAD question + context pairs of ../shared/data, through the worker's own extractor, the triton kernel
(in Triton's interpreter, float32 inputs) against the torch kernel: every array the store keeps (the pattern CNN's
features and pattern outputs, statistics, profile, detectors, thumbnails) and the model's output."""

import dataclasses

import numpy as np
import pytest
from helpers import SHARED_SQUAD

pytest.importorskip("triton")


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_SQUAD.is_file(), reason="needs ../shared/data/squad-v2-dev-half.json")
@pytest.mark.budget(
    50, reason="Triton's interpreter runs MiniLM's 6 x 12 heads over three questions, one program at a time"
)
def test_minilm_on_squad_pairs_stores_the_same_arrays_with_either_kernel(tmp_path):
    from rapids_attn.data import read_examples
    from rapids_attn.extract.batching import tokenize
    from rapids_attn.extract.kernels import TritonKernel
    from rapids_attn.extract.shard import Extractor, ShardTask
    from rapids_attn.extract.signature import STAT_NAMES
    from rapids_attn.registry import job_model

    JobConfig = job_model()
    from rapids_attn.store.zarr_store import StoreLayout

    # three articles' questions, their contexts cut to three lengths under 128 tokens: ragged, so padding is in play
    examples = list(read_examples(str(SHARED_SQUAD), format="squad"))[::997][:3]
    examples = [dataclasses.replace(e, text_pair=e.text_pair[:n]) for e, n in zip(examples, (420, 260, 90))]
    cfg = JobConfig.model_validate(
        {
            "model": {"name": "minilm-l6", "dtype": "float32"},
            "data": {"path": str(SHARED_SQUAD), "format": "squad"},
            "extract": {"device": "cpu", "kernel": "torch"},
            "embed": {"name": "pattern-cnn"},
            "output": {"dir": str(tmp_path / "unused")},
        }
    )
    layout = StoreLayout(
        n_examples=3,
        layers=list(range(6)),
        heads=list(range(12)),
        feature_dim=1,
        image_size=cfg.extract.image_size,
        thumb_size=cfg.extract.thumbnail_size,
        shard_size=3,
        stat_names=list(STAT_NAMES),
    )
    ex = Extractor(ShardTask.from_job(cfg, layout, max_length=128))
    tok = tokenize(ex.tokenizer, examples, 128)
    assert len(set(tok.lengths)) == 3  # ragged: padding in play
    batch = tok.batch([0, 1, 2])
    outs = {}
    for kernel in ("torch", "triton"):
        if kernel == "triton":  # tiles of 128: two programs' fewer loop steps in the interpreter
            ex.capture.kernel = TritonKernel(precision="ieee", block_m=128, block_n=128)
        out = ex.run_batch(**batch)
        images = out["images"].reshape(-1, layout.image_size, layout.image_size)
        feats, more = ex.embedder.embed(
            images, out["profile"].reshape(images.shape[0], -1), out["stats"].reshape(images.shape[0], -1)
        )
        outs[kernel] = {**{k: v for k, v in out.items() if v is not None}, "features": feats, **more}
    assert ex.capture.kernel_log.by_kernel() == {"torch": [0, 1, 2, 3, 4, 5], "triton": [0, 1, 2, 3, 4, 5]}
    assert not ex.capture.kernel_log.fallbacks
    a, b = outs["torch"], outs["triton"]
    assert set(a) == set(b) >= {"images", "thumbnails", "stats", "profile", "detectors", "features", "pattern"}
    for name in sorted(a):
        x, y = a[name].float().numpy(), b[name].float().numpy()
        if name == "pattern":  # the CNN's argmax: equal wherever its top two classes are not tied within 1e-4
            assert (x == y).mean() >= 0.999, name
            continue
        np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-5, equal_nan=True, err_msg=name)
