"""Tests for rapids_attn.extract.model: name resolution (preset, folder, hub id), describe_model,
and loading a hub id from an offline HuggingFace cache."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

from rapids_attn.errors import ModelError
from rapids_attn.extract.model import describe_model, load_model, load_tokenizer, resolve_model_name
from rapids_attn.job import ModelConfig

# --- resolve_model_name -----------------------------------------------------------------------


def test_preset_resolves_to_a_model_folder():
    p = Path(resolve_model_name("minilm-l6"))
    assert p.is_absolute() and p.is_dir()
    assert (p / "config.json").is_file()


def test_local_folder_becomes_absolute(tiny_bert_dir, monkeypatch):
    monkeypatch.chdir(tiny_bert_dir.parent)
    out = resolve_model_name(tiny_bert_dir.name)
    assert Path(out).is_absolute()
    assert Path(out) == tiny_bert_dir.resolve()
    assert resolve_model_name(f"./{tiny_bert_dir.name}") == out


def test_folder_without_config_rejected(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelError, match=r"model.name: folder .* has no config.json"):
        resolve_model_name(str(tmp_path))


@pytest.mark.parametrize("name", ["./nope", "/definitely/not/here", "~/no-such-model-folder", "a/b/c"])
def test_missing_path_rejected(name):
    with pytest.raises(ModelError, match="model.name: no such model folder"):
        resolve_model_name(name)


@pytest.mark.parametrize("name", ["org/name", "bert-base-uncased"])
def test_hub_ids_returned_as_is(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no folder of that name here
    assert resolve_model_name(name) == name


# --- describe_model ---------------------------------------------------------------------------


def test_describe_minilm():
    info = describe_model(ModelConfig(name="minilm-l6"))
    assert (info.model_type, info.n_layers, info.n_heads, info.max_length) == ("bert", 6, 12, 512)
    assert info.source == resolve_model_name("minilm-l6")
    assert describe_model(ModelConfig(name="minilm-l6", max_length=64)).max_length == 64
    with pytest.raises(ModelError, match="model.max_length: 600 exceeds the model's 512 positions"):
        describe_model(ModelConfig(name="minilm-l6", max_length=600))


@pytest.fixture
def long_context_config(tmp_path) -> Path:
    """A config-only folder for a BERT with 4096 positions (describe_model reads nothing else when told not
    to check the tokenizer and weights)."""
    from transformers import BertConfig

    BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_position_embeddings=4096
    ).save_pretrained(tmp_path / "long")
    return tmp_path / "long"


def test_default_max_length_is_capped_at_1024(long_context_config):
    assert describe_model(ModelConfig(name=str(long_context_config)), check_files=False).max_length == 1024
    assert (
        describe_model(ModelConfig(name=str(long_context_config), max_length=1000), check_files=False).max_length
        == 1000
    )


def test_explicit_max_length_above_the_default_cap(long_context_config):
    assert (
        describe_model(ModelConfig(name=str(long_context_config), max_length=2048), check_files=False).max_length
        == 2048
    )
    with pytest.raises(ModelError, match="exceeds the model's 4096 positions; set it to 4096 or less"):
        describe_model(ModelConfig(name=str(long_context_config), max_length=5000), check_files=False)


def test_describe_tiny_gpt2(tiny_gpt2_dir):
    info = describe_model(ModelConfig(name=str(tiny_gpt2_dir)))
    assert info.model_type == "gpt2"
    assert info.n_layers == 2 and info.n_heads == 2
    assert info.max_length == 128  # n_positions
    with pytest.raises(ModelError, match="model.max_length: 200 exceeds the model's 128 positions"):
        describe_model(ModelConfig(name=str(tiny_gpt2_dir), max_length=200))


def test_load_tiny_models_eager_and_right_padded(tiny_llama_dir):
    cfg = ModelConfig(name=str(tiny_llama_dir))
    model = load_model(cfg, "cpu", "float32")
    assert model.config._attn_implementation == "eager"
    assert not model.training
    assert next(model.parameters()).dtype == torch.float32  # dtype auto on CPU
    tok = load_tokenizer(cfg)
    assert tok.padding_side == "right"
    assert tok.pad_token == "<|endoftext|>"  # the BPE tokenizer has no pad token: eos stands in


# --- hub ids from an offline cache ------------------------------------------------------------


@pytest.fixture
def fake_hub(tmp_path, tiny_bert_dir, monkeypatch):
    """A HuggingFace cache holding ``testorg/tiny-bert`` (the tiny BERT's files), offline mode on."""
    import huggingface_hub.constants as hf_constants

    home = tmp_path / "hf"
    cache = home / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--testorg--tiny-bert"
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    for f in tiny_bert_dir.iterdir():
        shutil.copy(f, snap / f.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)

    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads these once, at import: patch the module constants it (and transformers) use
    monkeypatch.setattr(hf_constants, "HF_HOME", str(home))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)  # so "testorg/tiny-bert" is not mistaken for a local folder
    return cache


def test_hub_id_described_and_loaded_offline(fake_hub, tiny_bert_dir):
    cfg = ModelConfig(name="testorg/tiny-bert")
    assert resolve_model_name(cfg.name) == "testorg/tiny-bert"
    info = describe_model(cfg)
    assert (info.source, info.model_type, info.n_layers, info.n_heads, info.max_length) == (
        "testorg/tiny-bert",
        "bert",
        2,
        2,
        128,
    )
    model = load_model(cfg, "cpu", "float32")
    assert model.config.num_hidden_layers == 2
    ref = load_model(ModelConfig(name=str(tiny_bert_dir)), "cpu", "float32")
    for (k, a), (_, b) in zip(model.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(a, b), k
    tok = load_tokenizer(cfg)
    assert tok("a b")["input_ids"][0] == tok.cls_token_id


def test_uncached_hub_id_offline_fails_with_advice(fake_hub):
    cfg = ModelConfig(name="testorg/not-cached")
    with pytest.raises(ModelError, match="with no network, use a local folder or the preset minilm-l6") as err:
        describe_model(cfg)
    assert str(err.value).startswith("model.name: cannot load 'testorg/not-cached'")
    # a worker reads the config first (to choose the capture): the same one-line advice
    with pytest.raises(ModelError, match="^model.name: cannot load 'testorg/not-cached'.*with no network"):
        load_model(cfg, "cpu", "float32")
    assert os.environ["HF_HUB_OFFLINE"] == "1"


def test_a_window_overlap_that_leaves_no_stride_is_refused_at_preflight():
    ok = describe_model(ModelConfig(name="minilm-l6", max_length=64, long_inputs="windows", window_overlap=61))
    assert ok.max_length == 64  # 62 content tokens beside [CLS] and [SEP]
    with pytest.raises(ModelError, match=r"model.window_overlap: 62 must be less than the 62 content tokens"):
        describe_model(ModelConfig(name="minilm-l6", max_length=64, long_inputs="windows", window_overlap=62))


def _save_encoder_decoder(out: Path, kind: str) -> Path:
    """A tiny T5 (whole: T5Model; or its encoder alone: T5EncoderModel) or BART, with the tests' BPE tokenizer."""
    from helpers import bpe_tokenizer
    from transformers import BartConfig, BartModel, T5Config, T5EncoderModel, T5Model

    tok = bpe_tokenizer()
    torch.manual_seed(0)
    if kind == "bart":
        cfg = BartConfig(
            vocab_size=len(tok), d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=128,
        )  # fmt: skip
        BartModel(cfg).save_pretrained(out)
    else:
        cfg = T5Config(
            vocab_size=len(tok), d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, decoder_start_token_id=tok.pad_token_id,
        )  # fmt: skip
        (T5Model if kind == "t5" else T5EncoderModel)(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.mark.parametrize("kind", ["t5", "t5-encoder", "bart"])
def test_an_encoder_decoder_model_is_read_by_its_encoder_in_every_stage(tmp_path, kind):
    """AutoModel gives an encoder-decoder class (for T5 also from an encoder's own folder, whose config still says
    t5), and its forward wants decoder inputs: the workers load the encoder instead (T5EncoderModel; BART's from
    the whole model), the extract, relevance and heads stages read its self-attention, and the maps are that
    encoder's own."""
    from helpers import CORPUS, make_job, write_jsonl
    from transformers import AutoModel, T5EncoderModel

    from rapids_attn.extract.capture import AttentionCapture
    from rapids_attn.heads.metrics import metric_for
    from rapids_attn.jobfile import load_job
    from rapids_attn.pipeline import run_job

    folder = _save_encoder_decoder(tmp_path / kind, kind)
    want = "BartEncoder" if kind == "bart" else "T5EncoderModel"
    model = load_model(ModelConfig(name=str(folder)), "cpu", "float32")
    assert type(model).__name__ == want
    assert type(metric_for("retrieval").load_model(folder)).__name__ == want  # the heads stage's loader
    assert describe_model(ModelConfig(name=str(folder)), check_files=False).n_layers == 2
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    got = {}
    AttentionCapture(model, 2).run({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, got.__setitem__)
    assert sorted(got) == [0, 1]
    torch.testing.assert_close(got[1].sum(-1), torch.ones(1, 2, 5))
    assert float(torch.triu(got[1], diagonal=1).sum()) > 0  # the encoder reads both ways

    rows = [{"id": f"d{i}", "text": CORPUS[i % 5]} for i in range(6)]
    data = write_jsonl(tmp_path / "docs.jsonl", rows)
    job = make_job(tmp_path, folder, data, relevance={"enabled": True, "atlas": False})
    job["data"] = {"path": str(data), "format": "jsonl", "text_fields": ["text"], "id_field": "id"}
    cfg = load_job(None, raw=job)
    summary = run_job(cfg)
    assert summary["counts"]["maps"] == 6 * 2 * 2 and summary["model"]["attention"] == "eager"
    assert summary["relevance"]["examples"] == 6 and summary["relevance"]["query"] == "first"  # not causal
    g = zarr.open_group(str(cfg.run_dir / "store.zarr"), mode="r")
    assert [r["causal"] for r in g.attrs["extract_runs"]] == [False]
    # the first example's maps are the encoder's: its stats are those of that encoder's eager attention here
    from rapids_attn.api import analyse_maps
    from rapids_attn.extract.maps import punctuation_ids, separator_ids

    tok = load_tokenizer(cfg.model)
    enc = tok(CORPUS[0], return_tensors="pt")
    assert int(g["seq_len"][0]) == enc["input_ids"].shape[1]
    with torch.no_grad():
        if kind == "bart":  # the whole model, decoder inputs given: its encoder's attention
            whole = AutoModel.from_pretrained(folder, attn_implementation="eager")
            att = whole(**enc, decoder_input_ids=enc["input_ids"], output_attentions=True)
            att.attentions = att.encoder_attentions
        else:
            att = T5EncoderModel.from_pretrained(folder, attn_implementation="eager")(**enc, output_attentions=True)
    ids = enc["input_ids"]
    out = analyse_maps(
        torch.stack(att.attentions, dim=1),
        sep=torch.isin(ids, separator_ids(tok)),
        punct=torch.isin(ids, punctuation_ids(tok)),
        token_ids=ids,
        image_size=g.attrs["layout"]["image_size"],
    )
    np.testing.assert_allclose(out.stats[0], g["stats"][0], rtol=1e-5, atol=1e-6)


def test_a_model_that_reads_no_token_ids_is_refused_at_preflight(tmp_path):
    from transformers import ViTConfig, ViTModel

    ViTModel(
        ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    ).save_pretrained(tmp_path / "vit")
    with pytest.raises(
        ModelError, match=r"model\.name: .*\(vit\) does not read token ids \(its inputs are pixel_values"
    ):
        describe_model(ModelConfig(name=str(tmp_path / "vit")), check_files=False)


def test_an_encoder_decoder_model_whose_encoder_has_no_config_is_refused_in_one_line(tmp_path):
    from helpers import bpe_tokenizer
    from transformers import FSMTConfig, FSMTModel

    n = len(bpe_tokenizer())
    cfg = FSMTConfig(
        src_vocab_size=n, tgt_vocab_size=n, langs=["en", "de"], d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
        max_position_embeddings=128,
    )  # fmt: skip
    FSMTModel(cfg).save_pretrained(tmp_path / "fsmt")
    with pytest.raises(
        ModelError, match=r"^model\.name: the encoder-decoder model FSMTModel gives no encoder .*no config"
    ):
        load_model(ModelConfig(name=str(tmp_path / "fsmt")), "cpu", "float32")


def test_model_class_reads_a_tuple_entry_and_leaves_remote_code_to_automodel():
    from transformers import AutoModel, FunnelConfig, FunnelModel, T5Config

    from rapids_attn.extract.model import model_class

    assert model_class(FunnelConfig(), "f") is AutoModel  # MODEL_MAPPING: (FunnelModel, FunnelBaseModel)
    assert "input_ids" in FunnelModel.forward.__code__.co_varnames
    remote = T5Config(auto_map={"AutoModel": "modeling_mine.MyT5"})  # a remote model whose config is named T5Config
    assert model_class(remote, "r") is AutoModel
    assert model_class(T5Config(), "t").__name__ == "T5EncoderModel"


def test_checkpoint_dtype_is_what_the_config_names(tmp_path, tiny_bert_dir, monkeypatch):
    """model.dtype: auto reads the checkpoint's dtype from its config (``dtype``, or an older config's
    ``torch_dtype``), and the extractor hands it to the device plan, which resolves auto on the worker."""
    import json

    from rapids_attn.devices import ExtractDevices
    from rapids_attn.extract.model import checkpoint_dtype, dtype_name

    assert [dtype_name(x) for x in (torch.bfloat16, "torch.float16", "float32", "auto", None, "float64")] == [
        "bfloat16",
        "float16",
        "float32",
        None,
        None,
        None,
    ]
    folder = tmp_path / "m"
    shutil.copytree(tiny_bert_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    got = {}
    for key, value, want in [("dtype", "bfloat16", "bfloat16"), ("torch_dtype", "float16", "float16"), (None, 0, None)]:
        config.pop("dtype", None)
        config.pop("torch_dtype", None)
        if key:
            config[key] = value
        (folder / "config.json").write_text(json.dumps(config))
        got[key] = checkpoint_dtype(ModelConfig(name=str(folder)))
        assert got[key] == want, key
    # the extractor asks the plan with the checkpoint's dtype (on this CPU machine: float32 all the same)
    seen = []
    real = ExtractDevices.on_this_worker
    monkeypatch.setattr(ExtractDevices, "on_this_worker", lambda self, c=None: seen.append(c) or real(self, c))
    config["dtype"] = "bfloat16"
    (folder / "config.json").write_text(json.dumps(config))
    from helpers import make_job, pair_rows, write_jsonl

    from rapids_attn.extract.shard import Extractor, ShardTask
    from rapids_attn.jobfile import load_job
    from rapids_attn.pipeline import preflight

    data = write_jsonl(tmp_path / "d.jsonl", pair_rows(4))
    cfg = load_job(None, raw=make_job(tmp_path, folder, data))
    ctx = preflight(cfg, ("extract",)).ctx
    ex = Extractor(ShardTask.from_job(cfg, ctx.layout, ctx.model.max_length))
    assert seen[-1] == "bfloat16" and ex.model_dtype == "float32" and ex.model.dtype == torch.float32
