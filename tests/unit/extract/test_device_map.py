"""model.device_map (issue 50): a model larger than one GPU, its layers spread over the GPUs of one worker.

No GPU here: the loader's arguments, the reducer's per-device views (a layer whose weights arrive on another device is
reduced there, its means gathered to the reducer's device), the store (the same values and key with and without the
setting) and the checks that refuse what cannot hold one model per worker. The spread itself over real GPUs is
tests/gpu/test_device_map_gpu.py (it has not run: no GPU was lent)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import zarr
from helpers import make_job

from rapids_attn.devices import resolve_devices
from rapids_attn.errors import JobConfigError
from rapids_attn.extract import model as model_mod
from rapids_attn.extract.maps import LayerReducer, TokenMasks
from rapids_attn.job import ModelConfig
from rapids_attn.jobfile import load_job

# -- the loader ---------------------------------------------------------------------------------------------------


def _spy_loader(monkeypatch) -> dict:
    """Record from_pretrained's keyword arguments; a model it returns fails the test if it is moved."""
    real = model_mod.model_class
    seen: dict = {}

    def spying(config, name):
        cls = real(config, name)

        class Spy:
            @staticmethod
            def from_pretrained(*args, **kwargs):
                seen.clear()
                seen.update(kwargs)
                model = cls.from_pretrained(*args, **kwargs)
                if kwargs.get("device_map") is not None:
                    model.to = lambda *a, **k: pytest.fail("a model placed by device_map was moved")
                return model

        return Spy

    monkeypatch.setattr(model_mod, "model_class", spying)
    return seen


@pytest.mark.parametrize("device_map", ["auto", "balanced", "sequential"])
def test_the_loader_passes_device_map_and_does_not_move_the_model(monkeypatch, tiny_bert_dir, device_map):
    seen = _spy_loader(monkeypatch)
    model = model_mod.load_model(ModelConfig(name=str(tiny_bert_dir), device_map=device_map), "cpu", "float32")
    assert seen["device_map"] == device_map
    assert not model.training and model_mod.model_devices(model) == ["cpu"]  # no GPU: transformers keeps it here


def test_without_device_map_the_loader_passes_none_and_moves_the_model(monkeypatch, tiny_bert_dir):
    seen = _spy_loader(monkeypatch)
    model_mod.load_model(ModelConfig(name=str(tiny_bert_dir)), "cpu", "float32")
    assert "device_map" not in seen  # from_pretrained's own default, exactly as before the setting existed


# -- the reducer: a layer on another device ------------------------------------------------------------------------


def _reducer(causal: bool = False):
    ids = torch.tensor([[1, 2, 1, 3, 2, 0], [4, 1, 2, 4, 1, 2]])
    masks = TokenMasks.from_ids(ids, torch.tensor([3]), torch.tensor([2]))
    return LayerReducer([4, 6], masks, [0, 1, 2], [0, 1], 4, 2, causal, "cpu")


def _weights(seed: int, causal: bool = False):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(2, 2, 6, 6, generator=g)
    if causal:
        scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, -1)


def test_a_layer_on_another_device_is_reduced_there():
    """Weights arriving on another device (``meta`` stands in for a second GPU) are reduced by the reducer's view on
    that device: every tensor the reduction reads is there (a mix of devices would raise), and the layer's sums are
    kept there until the layer is finished."""
    red = _reducer()
    w = _weights(0).to("meta")
    red.add_rows(1, w, 0)
    view = red.on(torch.device("meta"))
    assert view is not red and red.on(torch.device("meta")) is view  # made once, then kept
    assert red.on(torch.device("cpu")) is red and view.on(torch.device("meta")) is view
    assert red._sums[1].image.device.type == "meta" and view._sums is red._sums  # one layer's sums, shared
    assert view.batch.right_rt.device.type == "meta" and view.patterns.row_flags.device.type == "meta"
    assert red.batch.right_rt.device.type == "cpu" and red.images.device.type == "cpu"  # the outputs stay home
    assert view.images is red.images  # the view writes the reducer's own outputs


@pytest.mark.parametrize("causal", [False, True])
def test_layers_reduced_by_views_give_the_same_outputs(causal):
    """Layers 0 and 2 through a view (the path a layer on another GPU takes), layer 1 at home: every output equals a
    reducer that read all three at home, bit for bit."""
    home, split = _reducer(causal), _reducer(causal)
    view = split.view_on("cpu")
    for layer in range(3):
        w = _weights(layer, causal)
        home(layer, w)
        target = view if layer != 1 else split
        for r0 in (4, 0, 2):  # blocks of rows, in any order
            target.add_rows(layer, w[:, :, r0 : r0 + 2], r0)
        split.end_layer(layer)  # the capture finishes each layer on the reducer it hands the rows to
    for name in ("images", "thumbs", "stats", "profile", "detectors"):
        torch.testing.assert_close(getattr(split, name), getattr(home, name), rtol=0, atol=1e-6, equal_nan=True)


def test_the_extractor_gathers_layers_reduced_elsewhere(tmp_path, tiny_bert_dir, pair_data, monkeypatch):
    """A whole batch through the model and the blocked capture, every layer's rows handed to a view of the reducer
    (as on a model spread over GPUs): the batch's outputs equal the ones reduced at home."""
    from rapids_attn.extract.shard import Extractor, ShardTask
    from rapids_attn.pipeline import preflight

    cfg = load_job(None, raw=make_job(tmp_path, tiny_bert_dir, pair_data))
    ctx = preflight(cfg, ("extract",)).ctx
    ex = Extractor(ShardTask.from_job(cfg, ctx.layout, ctx.model.max_length))
    ids = [[101, 2054, 2003, 1037, 3231, 102, 2054, 2003], [101, 2748, 1037, 102]]
    ref = {k: v.clone() for k, v in ex.run_batch(ids).items() if v is not None}

    views: set[int] = set()
    real_view_on = LayerReducer.view_on

    def elsewhere(self, device):  # every layer "elsewhere": a view, made once per reducer
        if id(self) in views:
            return self
        if "elsewhere" not in self._views:
            self._views["elsewhere"] = real_view_on(self, device)
            views.add(id(self._views["elsewhere"]))
        return self._views["elsewhere"]

    monkeypatch.setattr(LayerReducer, "on", elsewhere)
    got = {k: v for k, v in ex.run_batch(ids).items() if v is not None}
    assert views, "no layer went through a view"
    for k, want in ref.items():
        torch.testing.assert_close(got[k], want, rtol=0, atol=1e-6, equal_nan=True, msg=k)


# -- the store ------------------------------------------------------------------------------------------------------


def test_device_map_on_the_cpu_gives_the_same_store_and_key(tmp_path, tiny_bert_dir, pair_data):
    from rapids_attn.pipeline import run_job

    cfgs = {}
    for name, model in (("whole", {}), ("mapped", {"device_map": "auto"})):
        cfgs[name] = load_job(None, raw=make_job(tmp_path / name, tiny_bert_dir, pair_data, model=model))
        run_job(cfgs[name], ("extract",))
    assert cfgs["mapped"].model.device_map == "auto"
    assert cfgs["mapped"].extraction_key("fp") == cfgs["whole"].extraction_key("fp")
    assert "device_map" not in cfgs["whole"].to_dict()["model"]  # unset: the job as written is as before
    stores = {n: zarr.open_group(str(c.run_dir / "store.zarr"), mode="r") for n, c in cfgs.items()}
    for array in ("features", "stats", "profile", "detectors", "thumbnails", "seq_len"):
        np.testing.assert_array_equal(stores["mapped"][array][:], stores["whole"][array][:], err_msg=array)


# -- the checks -----------------------------------------------------------------------------------------------------


def _plan(tmp_path, tiny_bert_dir, pair_data, monkeypatch, gpus: int, **sections):
    from rapids_attn import devices

    monkeypatch.setattr(devices, "cuda_device_count", lambda: gpus)
    cfg = load_job(None, raw=make_job(tmp_path, tiny_bert_dir, pair_data, **sections))
    return resolve_devices(cfg.extract, cfg.model, cfg.embed, cfg.runtime, ("extract",))


def test_an_unknown_strategy_is_refused_naming_the_field(tmp_path, tiny_bert_dir, pair_data):
    with pytest.raises(JobConfigError, match=r"model\.device_map") as e:
        load_job(None, raw=make_job(tmp_path, tiny_bert_dir, pair_data, model={"device_map": "cuda:1"}))
    assert "\n" not in str(e.value)


def test_device_map_with_extract_device_cpu_is_refused(tmp_path, tiny_bert_dir, pair_data, monkeypatch):
    with pytest.raises(JobConfigError, match=r"^model\.device_map: auto .* extract\.device is cpu"):
        _plan(
            tmp_path, tiny_bert_dir, pair_data, monkeypatch, 0, model={"device_map": "auto"}, extract={"device": "cpu"}
        )


@pytest.mark.parametrize("n_workers", [None, 2])
def test_local_cuda_with_device_map_runs_one_worker(tmp_path, tiny_bert_dir, pair_data, monkeypatch, n_workers):
    runtime = {"cluster": "local-cuda", "n_workers": n_workers, "processes": True}
    with pytest.raises(JobConfigError, match=r"^runtime\.n_workers: model\.device_map .* set runtime\.n_workers: 1$"):
        _plan(tmp_path, tiny_bert_dir, pair_data, monkeypatch, 2, model={"device_map": "balanced"}, runtime=runtime)
    runtime["n_workers"] = 1
    plan = _plan(tmp_path, tiny_bert_dir, pair_data, monkeypatch, 2, model={"device_map": "balanced"}, runtime=runtime)
    assert plan.extract.device == "cuda" and plan.extract.device_map == "balanced"


def test_a_local_cluster_on_gpus_runs_one_worker_with_device_map(tmp_path, tiny_bert_dir, pair_data, monkeypatch):
    two = {"cluster": "local", "n_workers": 2}
    with pytest.raises(JobConfigError, match=r"^runtime\.n_workers: model\.device_map \(auto\)"):
        _plan(tmp_path, tiny_bert_dir, pair_data, monkeypatch, 4, model={"device_map": "auto"}, runtime=two)
    # no GPU: the setting keeps the model on the CPU, and any number of local workers may each hold it
    plan = _plan(tmp_path, tiny_bert_dir, pair_data, monkeypatch, 0, model={"device_map": "auto"}, runtime=two)
    assert plan.extract.device == "cpu" and plan.extract.device_map == "auto"


def test_an_external_scheduler_is_left_to_its_workers(tmp_path, tiny_bert_dir, pair_data, monkeypatch):
    runtime = {"cluster": "scheduler", "address": "tls://10.0.0.1:8786", "n_workers": None, "processes": True}
    plan = _plan(tmp_path, tiny_bert_dir, pair_data, monkeypatch, 0, model={"device_map": "auto"}, runtime=runtime)
    assert plan.extract.device == "worker" and plan.extract.device_map == "auto"


def test_a_worker_without_a_gpu_runs_the_model_on_its_cpu():
    from rapids_attn.devices import ExtractDevices

    resolved = ExtractDevices("worker", device_map="auto").on_this_worker()
    assert resolved.device == "cpu" and resolved.model_devices == ("cpu",)
