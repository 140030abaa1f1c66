"""The model folder's files are checked in preflight (describe_model), not first by the workers: tokenizer
files present and knowing some word, weights present and whole (issue 12: a folder without tokenizer files
ran to exit 0 on all-[UNK] input; a truncated model.safetensors passed --check and then crashed)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from rapids_attn.errors import ModelError
from rapids_attn.extract.model import SAMPLE_TEXT, describe_model, load_model, load_tokenizer, one_line
from rapids_attn.job import ModelConfig

TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def copy_model(src, dst, without=()):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*without))
    return ModelConfig(name=str(dst))


def cut(path, keep: int) -> None:
    """Keep the first ``keep`` bytes (a negative ``keep`` drops that many from the end)."""
    path.write_bytes(path.read_bytes()[:keep])


def test_whole_folder_passes_and_its_tokenizer_knows_the_sample(tiny_bert_dir):
    cfg = ModelConfig(name=str(tiny_bert_dir))
    assert describe_model(cfg).n_layers == 2
    tok = load_tokenizer(cfg)
    ids = tok(SAMPLE_TEXT, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in ids  # the sample is plain enough that a real vocabulary knows all of it


def test_folder_without_tokenizer_files_is_refused(tiny_bert_dir, tmp_path):
    cfg = copy_model(tiny_bert_dir, tmp_path / "m", without=TOKENIZER)
    for call in (describe_model, load_tokenizer):  # preflight, and a worker, refuse it alike
        with pytest.raises(ModelError, match=r"^model.name: .*/m has no tokenizer files \(tokenizer.json, vocab.txt"):
            call(cfg)


def test_tokenizer_knowing_no_word_is_refused(tiny_bert_dir, tmp_path):
    """Tokenizer files that hold only special tokens: every word comes out [UNK]."""
    cfg = copy_model(tiny_bert_dir, tmp_path / "m", without=TOKENIZER)
    (tmp_path / "m" / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
    with pytest.raises(ModelError, match=r"reads every word of .* as unknown \(a vocabulary of 5 tokens\)"):
        describe_model(cfg)


def test_gpt2_folder_without_tokenizer_files_is_refused(tiny_gpt2_dir, tmp_path):
    cfg = copy_model(tiny_gpt2_dir, tmp_path / "m", without=("tokenizer*", "vocab.json", "merges.txt"))
    with pytest.raises(ModelError, match="has no tokenizer files"):
        describe_model(cfg)


def test_folder_without_weights_is_refused(tiny_bert_dir, tmp_path):
    cfg = copy_model(tiny_bert_dir, tmp_path / "m", without=("*.safetensors",))
    with pytest.raises(ModelError, match=r"^model.name: .*/m has no weights \(one of model.safetensors, "):
        describe_model(cfg)


@pytest.mark.parametrize("keep", [0, 7, 100, -1], ids=["empty", "in-length", "in-header", "last-byte"])
def test_truncated_safetensors_is_refused(tiny_bert_dir, tmp_path, keep):
    cfg = copy_model(tiny_bert_dir, tmp_path / "m")
    cut(tmp_path / "m" / "model.safetensors", keep)
    with pytest.raises(ModelError, match=r"the weights file .*model.safetensors cannot be loaded \(.*\); it is trunc"):
        describe_model(cfg)


def test_truncated_safetensors_loaded_by_a_worker_is_one_line(tiny_bert_dir, tmp_path):
    """Past preflight (the file cut after the check), the worker's error is still a ModelError, not a
    SafetensorError traceback."""
    cfg = copy_model(tiny_bert_dir, tmp_path / "m")
    cut(tmp_path / "m" / "model.safetensors", -1)
    with pytest.raises(ModelError, match="model.name: cannot load the weights of .*incomplete metadata") as err:
        load_model(cfg, "cpu", "float32")
    assert "\n" not in str(err.value)


def _bin_folder(tiny_bert_dir, tmp_path):
    cfg = copy_model(tiny_bert_dir, tmp_path / "m", without=("*.safetensors",))
    torch.save(
        load_model(ModelConfig(name=str(tiny_bert_dir)), "cpu", "float32").state_dict(),
        tmp_path / "m" / "pytorch_model.bin",
    )
    return cfg


def test_pytorch_bin_whole_passes_and_cut_is_refused(tiny_bert_dir, tmp_path):
    cfg = _bin_folder(tiny_bert_dir, tmp_path)
    assert describe_model(cfg).n_heads == 2
    cut(tmp_path / "m" / "pytorch_model.bin", -100)
    with pytest.raises(ModelError, match=r"pytorch_model.bin cannot be loaded \(not a complete zip archive\)"):
        describe_model(cfg)


def test_sharded_weights_check_every_shard(tiny_bert_dir, tmp_path):
    cfg = copy_model(tiny_bert_dir, tmp_path / "m")
    m = tmp_path / "m"
    (m / "model.safetensors").rename(m / "model-00001-of-00002.safetensors")
    shutil.copy(m / "model-00001-of-00002.safetensors", m / "model-00002-of-00002.safetensors")
    index = {
        "metadata": {},
        "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"},
    }
    (m / "model.safetensors.index.json").write_text(json.dumps(index))
    describe_model(cfg)
    cut(m / "model-00002-of-00002.safetensors", 50)
    with pytest.raises(ModelError, match="model-00002-of-00002.safetensors cannot be loaded"):
        describe_model(cfg)
    (m / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(
        ModelError, match="index.json names the weights file model-00002-of-00002.safetensors, which is not"
    ):
        describe_model(cfg)
    (m / "model.safetensors.index.json").write_text("[]")
    with pytest.raises(ModelError, match="is not a weights index"):
        describe_model(cfg)


def test_truncated_weights_in_the_hub_cache_are_refused(tiny_bert_dir, tmp_path, monkeypatch):
    """A hub id's cached weights are checked like a folder's."""
    import huggingface_hub.constants as hf_constants

    snap = tmp_path / "hub" / "models--testorg--tiny-bert" / "snapshots" / ("0" * 40)
    shutil.copytree(tiny_bert_dir, snap)
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    cfg = ModelConfig(name="testorg/tiny-bert")
    assert describe_model(cfg).n_layers == 2
    cut(snap / "model.safetensors", -1)
    with pytest.raises(
        ModelError, match="hub/models--testorg--tiny-bert/snapshots/.*model.safetensors cannot be loaded"
    ):
        describe_model(cfg)


def test_library_messages_are_kept_whole_on_one_line():
    """transformers wraps its messages mid-sentence; the first line alone read as a cut sentence."""
    e = ValueError("Couldn't instantiate the backend tokenizer from one of: \n(1) a file, \n(2) a slow tokenizer")
    assert one_line(e) == "Couldn't instantiate the backend tokenizer from one of: (1) a file, (2) a slow tokenizer"
    assert one_line(OSError()) == "OSError"
