"""embed.name: pattern-cnn through the embedder factory: features plus a pattern type per map."""

import pytest
import torch

from rapids_attn.embed import build_embedder
from rapids_attn.errors import JobConfigError
from rapids_attn.extract.signature import PROFILE_OFFSETS, STAT_NAMES
from rapids_attn.job import EmbedConfig


def test_pattern_cnn_embeds_and_classifies():
    from rapids_attn.embed.pattern import SIDE_SCALE, SIDE_STATS

    emb = build_embedder(EmbedConfig(name="pattern-cnn"), 32)
    # the CNN's 128-d embedding, then the scaled side copy: profile 9, SIDE_STATS 8, shared columns 1
    assert emb.name == "pattern-cnn" and emb.dim == 128 + len(PROFILE_OFFSETS) + len(SIDE_STATS) + 1 == 146
    assert emb.outputs == {"pattern": "int8", "pattern_prob": "float16"}
    assert emb.store_attrs["pattern_classes"][:3] == ["self", "prev", "next"]
    assert emb.store_attrs["pattern_classes"][-1] == "other"  # the abstaining label (rapids_attn/patterns/rules.py)
    assert len(emb.store_attrs["pattern_cnn_sha256"]) == 16
    n = 5
    images = torch.rand(n, 32, 32)
    profile, stats = torch.rand(n, len(PROFILE_OFFSETS)), torch.rand(n, len(STAT_NAMES))
    feats, more = emb.embed(images, profile, stats)
    assert feats.shape == (n, emb.dim)
    side = feats[:, 128:] / SIDE_SCALE
    torch.testing.assert_close(side[:, : len(PROFILE_OFFSETS)], profile)
    torch.testing.assert_close(side[:, 9:17], stats[:, [STAT_NAMES.index(s) for s in SIDE_STATS]])
    assert ((side[:, -1] >= 0) & (side[:, -1] <= 1)).all()  # shared columns: a share of the mass
    assert more["pattern"].shape == (n,) and int(more["pattern"].max()) < len(emb.store_attrs["pattern_classes"])
    assert ((more["pattern_prob"] > 0) & (more["pattern_prob"] <= 1)).all()
    assert emb.store_attrs["pattern_features"] == {
        "embedding": 128,
        "side_stats": list(SIDE_STATS),
        "scale": SIDE_SCALE,
    }


def test_missing_weights_are_a_user_error(monkeypatch, tmp_path):
    from rapids_attn.patterns import cnn

    monkeypatch.setattr(cnn, "WEIGHTS_DIR", tmp_path)
    monkeypatch.setattr(cnn, "WEIGHTS_FILE", tmp_path / "pattern_cnn.safetensors")
    monkeypatch.setattr(cnn, "META_FILE", tmp_path / "pattern_cnn.json")
    with pytest.raises(JobConfigError, match="embed.name: pattern-cnn weights are missing"):
        build_embedder(EmbedConfig(name="pattern-cnn"), 32)
