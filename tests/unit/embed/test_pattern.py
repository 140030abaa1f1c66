"""embed.name: pattern-cnn through the embedder factory: features plus a pattern type per map."""

import pytest
import torch

from rapids_attn.embed import build_embedder
from rapids_attn.errors import JobConfigError
from rapids_attn.extract.maps import PROFILE_OFFSETS, STAT_NAMES
from rapids_attn.job import EmbedConfig


def test_pattern_cnn_embeds_and_classifies():
    emb = build_embedder(EmbedConfig(name="pattern-cnn"), 32)
    assert emb.name == "pattern-cnn" and emb.dim == 128
    assert emb.outputs == {"pattern": "int8", "pattern_prob": "float16"}
    assert emb.store_attrs["pattern_classes"][:3] == ["self", "prev", "next"]
    assert emb.store_attrs["pattern_classes"][-1] == "other"  # the abstaining label (rapids_attn/patterns/rules.py)
    assert len(emb.store_attrs["pattern_cnn_sha256"]) == 16
    n = 5
    images = torch.rand(n, 32, 32)
    feats, more = emb.embed(images, torch.rand(n, len(PROFILE_OFFSETS)), torch.rand(n, len(STAT_NAMES)))
    assert feats.shape == (n, 128)
    assert more["pattern"].shape == (n,) and int(more["pattern"].max()) < len(emb.store_attrs["pattern_classes"])
    assert ((more["pattern_prob"] > 0) & (more["pattern_prob"] <= 1)).all()


def test_missing_weights_are_a_user_error(monkeypatch, tmp_path):
    from rapids_attn.patterns import cnn

    monkeypatch.setattr(cnn, "WEIGHTS_DIR", tmp_path)
    monkeypatch.setattr(cnn, "WEIGHTS_FILE", tmp_path / "pattern_cnn.safetensors")
    monkeypatch.setattr(cnn, "META_FILE", tmp_path / "pattern_cnn.json")
    with pytest.raises(JobConfigError, match="embed.name: pattern-cnn weights are missing"):
        build_embedder(EmbedConfig(name="pattern-cnn"), 32)
