"""The Python API for maps a user already has: the job's own code path, not a copy. A map analysed
through the API gives what a job stores for it, and clustering features through the API is the learn
stage's fit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import zarr
from helpers import make_job, write_jsonl
from sklearn.metrics import adjusted_rand_score

from rapids_attn.api import analyse_maps, cluster_features
from rapids_attn.extract.maps import repeat_masks
from rapids_attn.extract.signature import DETECTOR_NAMES, STAT_NAMES
from rapids_attn.jobfile import load_job
from rapids_attn.pipeline import run_job


def test_a_map_through_the_api_is_what_the_job_stores(tmp_path, tiny_bert_dir):
    """One (question, context) pair through a job, and the same model's eager attention through the API."""
    from transformers import AutoModel, AutoTokenizer

    from rapids_attn.extract.maps import punctuation_ids, separator_ids

    q, c = "Who met Bob, and when?", "Ann met Bob. Then Bob met Ann again, twice."
    data = write_jsonl(
        tmp_path / "one.jsonl", [{"id": "a", "question": q, "context": c, "topic": "t", "answerable": True}]
    )
    cfg = load_job(None, raw=make_job(tmp_path, tiny_bert_dir, data, embed={"name": "pattern-cnn"}))
    run_job(cfg, ("extract",))
    g = zarr.open_group(str(cfg.run_dir / "store.zarr"), mode="r")

    tok = AutoTokenizer.from_pretrained(tiny_bert_dir)
    model = AutoModel.from_pretrained(tiny_bert_dir, attn_implementation="eager").eval()
    enc = tok(q, c, return_tensors="pt")
    with torch.no_grad():
        att = torch.stack(model(**enc, output_attentions=True).attentions, dim=1)  # [1, layer, head, T, T]
    ids = enc["input_ids"]
    out = analyse_maps(
        att,
        sep=torch.isin(ids, separator_ids(tok)),
        punct=torch.isin(ids, punctuation_ids(tok)),
        token_ids=ids,
        image_size=g.attrs["layout"]["image_size"],  # the tiny job's (8): the CNN area-resizes it to 32
    )
    assert out.stats.shape == (1, *g["stats"].shape[1:])
    np.testing.assert_allclose(out.stats, g["stats"][:], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.detectors, g["detectors"][:], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.profile, g["profile"][:].astype(np.float32), rtol=1e-3, atol=1e-3)  # stored f16
    np.testing.assert_allclose(out.features, g["features"][:].astype(np.float32), rtol=1e-2, atol=1e-2)  # f16
    np.testing.assert_array_equal(out.extras["pattern"], g["pattern"][:])
    assert set(out.pattern_names().ravel()) <= set(out.classes)


def test_padding_lengths_roles_and_missing_ids():
    g = torch.Generator().manual_seed(1)
    t, lengths = 9, [9, 4]
    w = torch.zeros(2, 3, t, t)
    for b, n in enumerate(lengths):  # row-stochastic over each example's own tokens; garbage in the padding
        w[b, :, :n, :n] = torch.softmax(torch.randn(3, n, n, generator=g), -1)
        w[b, :, n:, :] = 5.0
        w[b, :, :, n:] = 5.0 if n < t else w[b, :, :, n:]
    sep = torch.zeros(2, t, dtype=torch.bool)
    sep[:, 3] = True
    sep[:, 0] = True  # position 0 is "first", never counted as a separator
    ids = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2, 3], [4, 5, 4, 5, 0, 0, 0, 0, 0]])
    out = analyse_maps(w, lengths, sep=sep, token_ids=ids, embedder="pooled", image_size=8, pooled_size=8)
    short = analyse_maps(
        w[1:, :, :4, :4], [4], sep=sep[1:, :4], token_ids=ids[1:, :4], embedder="pooled", image_size=8, pooled_size=8
    )
    np.testing.assert_allclose(out.stats[1], short.stats[0], rtol=1e-6)  # the padding never enters
    s = STAT_NAMES.index("sep")
    np.testing.assert_allclose(out.stats[0, :, s], w[0, :, :, 3].mean(-1).numpy(), rtol=1e-5)
    dup, _ = repeat_masks(ids[0])
    d = DETECTOR_NAMES.index("duplicate_token_head")
    want = (w[0] * dup).sum((-2, -1)) / w[0].sum((-2, -1))
    np.testing.assert_allclose(out.detectors[0, :, d], want.numpy(), rtol=1e-5)
    no_ids = analyse_maps(w, lengths, sep=sep, embedder="pooled", image_size=8, pooled_size=8)
    p = DETECTOR_NAMES.index("previous_token_head")
    assert np.isnan(np.delete(no_ids.detectors, p, axis=-1)).all()  # unknown without ids, not 0
    np.testing.assert_allclose(no_ids.detectors[..., p], out.detectors[..., p])
    assert out.features.shape == (2, 3, 64) and out.images.shape == (2, 3, 8, 8)
    with pytest.raises(ValueError, match="lengths"):
        analyse_maps(w, [10, 4], embedder="pooled")
    with pytest.raises(ValueError, match="sep"):
        analyse_maps(w, lengths, sep=sep[:, :5], embedder="pooled")


def test_cluster_features_is_the_learn_stages_fit():
    rng = np.random.default_rng(0)
    centers = rng.normal(0, 10, size=(4, 16))
    truth = rng.integers(0, 4, size=600)
    x = centers[truth] + rng.normal(0, 0.5, size=(600, 16))
    labels, info = cluster_features(x, n_clusters=4, pca_components=5)
    assert labels.shape == (600,) and adjusted_rand_score(truth, labels) == pytest.approx(1.0)
    assert info["reduced"].shape == (600, 5) and info["silhouette"] > 0.8
    assert info["stability"]["min_ari"] == 1.0
    auto, swept = cluster_features(x, n_clusters="auto", k_sweep=[2, 8], pca_components=5)
    assert swept["k_sweep"]["chosen"] == 4 and adjusted_rand_score(truth, auto) == pytest.approx(1.0)
    dense, _ = cluster_features(x, method="hdbscan", pca_components=5, min_cluster_size=30)
    assert adjusted_rand_score(truth, dense) > 0.95


def test_decoder_maps_are_read_as_causal_unless_told():
    """A decoder's maps (nothing above the diagonal) get the job's causal reading by default: the normalised
    entropy over the keys each row sees; an explicit causal=False reads them as an encoder's."""
    g = torch.Generator().manual_seed(0)
    s = torch.randn(2, 3, 20, 20, generator=g).masked_fill(torch.ones(20, 20, dtype=torch.bool).triu(1), float("-inf"))
    maps = s.softmax(-1)
    k = STAT_NAMES.index("entropy_norm")
    auto = analyse_maps(maps, embedder="pooled", pooled_size=4)
    told = analyse_maps(maps, causal=True, embedder="pooled", pooled_size=4)
    encoder = analyse_maps(maps, causal=False, embedder="pooled", pooled_size=4)
    np.testing.assert_array_equal(auto.stats, told.stats)
    assert np.abs(auto.stats[..., k] - encoder.stats[..., k]).max() > 0.05
    # right padding that holds anything (here 1 / T) is not the maps': only each example's own block is read
    padded = maps.clone()
    padded[1, :, 15:, :] = 1 / 20
    padded[1, :, :, 15:] = 1 / 20
    np.testing.assert_array_equal(
        analyse_maps(padded, [20, 15], embedder="pooled", pooled_size=4).stats,
        analyse_maps(padded, [20, 15], causal=True, embedder="pooled", pooled_size=4).stats,
    )
    full = torch.randn(2, 3, 20, 20, generator=g).softmax(-1)  # an encoder's: weight above the diagonal
    np.testing.assert_array_equal(
        analyse_maps(full, embedder="pooled", pooled_size=4).stats,
        analyse_maps(full, causal=False, embedder="pooled", pooled_size=4).stats,
    )
