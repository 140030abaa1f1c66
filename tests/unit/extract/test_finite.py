"""Maps that are not finite are refused, never stored (issue 35): a model that overflows its dtype (a bfloat16
checkpoint run in float16) gives NaN maps; the capture refuses the batch in one line naming the layer and the
dtype, from the statistics it already copies to the host (no work or wait added on the device), on the blocked, the
hook and the ``output_attentions`` paths alike, and the causality probe refuses the same in its own words."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml
from helpers import make_job

from rapids_attn.errors import ModelError
from rapids_attn.extract import shard as shard_mod
from rapids_attn.extract.capture import AttentionCapture, check_probe_map, not_finite
from rapids_attn.extract.signature import STAT_NAMES, first_not_finite
from rapids_attn.jobfile import load_job


def _poison(model, layer: int) -> None:
    """An inf in one query weight of ``layer``: its scores are inf, its weights NaN, as a half-precision overflow's."""
    with torch.no_grad():
        model.encoder.layer[layer].attention.self.query.weight[0, 0] = float("inf")


def _setup(tmp_path, model_dir, data, attention: str, dtype: str):
    from rapids_attn.extract.shard import Extractor, ShardTask
    from rapids_attn.pipeline import preflight

    raw = make_job(tmp_path, model_dir, data, model={"dtype": dtype}, extract={"attention": attention})
    cfg = load_job(None, raw=raw)
    ctx = preflight(cfg, ("extract",)).ctx
    start, stop = ctx.layout.shard_rows(0)
    task = ShardTask.from_job(cfg, ctx.layout, ctx.model.max_length, ctx.data.read(list(range(start, stop))))
    return Extractor(task), task


@pytest.mark.parametrize(
    ("attention", "mode", "dtype"),
    [
        ("blocked", "blocked", "float32"),
        ("eager", "hooks", "bfloat16"),
        ("eager", "output_attentions", "float32"),
    ],
)
def test_a_batch_whose_maps_are_not_finite_is_refused_naming_the_layer_and_dtype(
    tmp_path, tiny_bert_dir, pair_data, monkeypatch, attention, mode, dtype
):
    ex, task = _setup(tmp_path, tiny_bert_dir, pair_data, attention, dtype)
    if mode == "output_attentions":
        ex.capture = AttentionCapture(ex.model, ex.model.config.num_hidden_layers, use_hooks=False)
    assert ex.capture.mode == mode and ex.model_dtype == dtype
    written = []
    monkeypatch.setattr(shard_mod, "write_shard", lambda *a, **k: written.append(a))
    assert ex.process(task).dtype == dtype  # finite: the shard is written, with the dtype it ran in
    assert len(written) == 1
    _poison(ex.model, 1)  # after the probe: the batches' own check must catch it
    with pytest.raises(ModelError) as e:
        ex.process(task)
    msg = str(e.value)
    assert "\n" not in msg and "layer 1 of " in msg and f"not finite (NaN or inf) in {dtype}" in msg, msg
    assert "for example '" in msg, msg
    want = "model.dtype: " if dtype != "float32" else "model.name: "
    assert msg.startswith(want) and ("set model.dtype: float32" in msg) == (dtype != "float32"), msg
    assert len(written) == 1  # nothing of the refused shard was stored


def test_only_the_layers_maps_decide_not_the_statistics_that_are_undefined():
    """Statistics that are NaN by definition (one-token maps: entropy_norm, prev, next) are not a refusal."""
    stats = np.random.default_rng(0).random((3, 2, 2, len(STAT_NAMES))).astype(np.float32)
    for name in ("entropy_norm", "prev", "next"):
        stats[0, :, :, STAT_NAMES.index(name)] = np.nan
    assert first_not_finite(stats) is None
    stats[2, 1, 0, STAT_NAMES.index("entropy")] = np.inf
    stats[1, 1, 1, STAT_NAMES.index("max")] = np.nan
    pos, rows = first_not_finite(stats)
    assert pos == 1 and rows.tolist() == [1, 2]


def test_the_probe_refuses_a_map_that_is_not_finite_naming_the_layer_and_dtype():
    p = torch.softmax(torch.randn(1, 2, 5, 5), -1)
    for dtype, fix in [(torch.float16, "float32, or bfloat16"), (torch.bfloat16, "float32")]:
        bad = p.to(dtype)
        bad[0, 1, 3, 2] = float("nan")
        with pytest.raises(ModelError, match=rf"layer 3 of 'm' .* in {str(dtype)[6:]} .*set model.dtype: {fix}"):
            check_probe_map(torch.nn.Identity(), 3, bad, 5, "m")
    with pytest.raises(ModelError, match=r"^model.name: layer 0 of 'm' .* in float32 .*check the checkpoint"):
        check_probe_map(torch.nn.Identity(), 0, p * float("inf"), 5, "m")


def test_the_message_names_the_layer_and_dtype_in_one_line():
    for dtype in ("float16", "bfloat16", "float32"):
        msg = str(not_finite("gemma", 7, dtype, "for example 'q1'"))
        assert "\n" not in msg and "layer 7 of 'gemma'" in msg and f"in {dtype} for example 'q1'" in msg


def test_a_job_whose_model_gives_nan_maps_exits_2_in_one_line(tmp_path, tiny_bert_dir, pair_data, capsys):
    """Through the workers to the job process: the one-line error, exit 2 (the probe's refusal here: a checkpoint
    whose weights overflow gives NaN maps for any input)."""
    from transformers import AutoModel, AutoTokenizer

    from rapids_attn.run import main

    bad = tmp_path / "bad-model"
    model = AutoModel.from_pretrained(tiny_bert_dir)
    _poison(model, 1)
    model.save_pretrained(bad)
    AutoTokenizer.from_pretrained(tiny_bert_dir).save_pretrained(bad)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(make_job(tmp_path, bad, pair_data)))
    assert main([str(job), "--stages", "extract"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: model.name: layer 1 of ") and "not finite (NaN or inf) in float32" in err, err
