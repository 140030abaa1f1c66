"""Cluster descriptions on a hand-built store whose answers are known."""

import numpy as np
import pytest

from rapids_attn.explain.describe import describe, metadata_association, stat_labels
from rapids_attn.job import ExplainConfig
from rapids_attn.store.zarr_store import StoreLayout, create_store, encode_thumbnails, write_shard

E, L, H = 40, 2, 2  # head (0,0) is always cluster 0 (a fixed-pattern head); the others depend on the example
STATS = ["entropy", "sep", "prev"]


def known_store(tmp_path, dominated_group: bool = False):
    layout = StoreLayout(n_examples=E, layers=[0, 1], heads=[0, 1], feature_dim=2, image_size=4, thumb_size=4,
                         shard_size=16, stat_names=STATS, features_dtype="float32")
    groups = ["A" if i < 10 else "B" if i < 25 else "C" for i in range(E)]
    labels = ["yes" if i % 2 else "no" for i in range(E)]
    g = create_store(tmp_path / "s.zarr", layout, {}, "k", {}, [f"e{i}" for i in range(E)], groups, labels)
    cluster = np.zeros((E, L, H), dtype=np.int32)
    rng = np.random.default_rng(0)
    cluster[:, 0, 1] = 1
    cluster[:, 1, :] = rng.integers(1, 3, size=(E, 2))  # heads of layer 1 switch between 1 and 2
    if dominated_group:
        cluster[:10, 1, :] = 3  # cluster 3 appears only in group A's examples
    stats = np.zeros((E, L, H, 3), dtype=np.float32)
    stats[..., 0] = 2.0
    stats[cluster == 0, 1] = 0.8  # cluster 0 attends to [SEP]
    stats[cluster == 2, 2] = 0.9  # cluster 2 attends to the previous token
    thumbs = np.zeros((E, L, H, 4, 4), dtype=np.float16)
    thumbs[cluster == 0, :, 3] = 1.0
    det = np.full((E, L, H, 2), np.nan, dtype=np.float32)
    det[::2, 1, 0, 1] = 0.9  # head (1, 0): an induction head, on the even examples (those with repeats)
    det[::2, 1, 1, 1] = 0.1
    for s in range(layout.n_shards):
        a, b = layout.shard_rows(s)
        write_shard(str(tmp_path / "s.zarr"), layout, s,
                    {"stats": stats[a:b], "thumbnails": encode_thumbnails(thumbs[a:b].astype(np.float32)),
                     "detectors": det[a:b]})
    g.create_array("cluster", data=cluster, chunks=(16, L, H), dimension_names=("example", "layer", "head"))
    red = np.zeros((E, L, H, 2), dtype=np.float32)
    red[..., 0] = cluster
    g.create_array("reduced", data=red, chunks=(16, L, H, 2))
    g.create_array("coords", data=red, chunks=(16, L, H, 2))
    return g, cluster


def test_signature_heads_and_exemplars(tmp_path):
    g, cluster = known_store(tmp_path)
    d, arrays = describe(g, ExplainConfig(exemplars=4, head_views=2, permutations=50))
    by_id = {c["id"]: c for c in d["clusters"]}
    assert set(by_id) == {0, 1, 2}
    assert sum(c["size"] for c in d["clusters"]) == E * L * H
    c0 = by_id[0]
    assert c0["signature"][0]["stat"] == "sep"
    assert c0["signature"][0]["mean"] == pytest.approx(0.8)
    assert "0.80 vs" in c0["summary"] and "overall" in c0["summary"]
    assert c0["top_heads"][0] == {"layer": 0, "head": 0, "share_of_head": 1.0, "share_of_cluster": 1.0}
    assert c0["dominant_description"].startswith("mostly layer 0 (100% of its maps); top heads L0-H0")
    assert by_id[2]["signature"][0]["stat"] == "prev"
    # head (0,0) never changes cluster: consistency 1; layer-1 heads switch: lower
    cons = np.array(d["heads_table"]["consistency"])
    assert cons[0, 0] == pytest.approx(1.0) and cons[0, 1] == pytest.approx(1.0)
    assert cons[1, 0] < 0.7 and cons[1, 1] < 0.7
    assert d["heads_table"]["dominant_cluster"][0] == [0, 1]
    # mean thumbnail of cluster 0 is its planted pattern; exemplars are members of their cluster
    pos0 = [c["id"] for c in d["clusters"]].index(0)
    assert arrays["mean_thumbs"][pos0][:, 3] == pytest.approx(np.ones(4))
    for pos, info in enumerate(arrays["exemplar_info"]):
        cid = d["clusters"][pos]["id"]
        assert len(info) == min(4, d["clusters"][pos]["size"])
        assert all(cluster[ex, la, he] == cid for ex, la, he in info)
    assert len(c0["exemplar_examples"]) == 2
    assert arrays["occupancy"].shape == (3, L, H)
    assert d["warnings"] == []
    det = d["detectors"]
    assert det["names"] == ["prev", "dup", "induction"]
    assert det["scores"]["induction"][1][0] == pytest.approx(0.9)  # mean over the examples that define it
    assert det["scores"]["induction"][1][1] == pytest.approx(0.1)
    assert np.isnan(det["scores"]["induction"][0][0])  # never defined: NaN, not 0
    assert det["examples"]["induction"] == E // 2
    assert arrays["head_detectors"].shape == (L, H, 3)


def test_group_dominated_cluster_is_flagged(tmp_path):
    g, _ = known_store(tmp_path, dominated_group=True)
    d, _ = describe(g, ExplainConfig(permutations=50))
    c3 = next(c for c in d["clusters"] if c["id"] == 3)
    assert c3["groups"] == {"top": "A", "share": 1.0, "overall_share": 0.25, "dominated": True}
    assert len(d["warnings"]) == 1 and "cluster 3" in d["warnings"][0] and "'A'" in d["warnings"][0]
    assert d["metadata"]["group"]["p_permutation"] < 0.05  # cluster 3 is tied to group A


def test_metadata_association_is_null_for_an_unrelated_label():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 4, size=200 * 6)
    values = rng.choice(["x", "y"], size=200)
    r = metadata_association(labels, values, 6, permutations=200, seed=0)
    assert r["p_permutation"] > 0.05
    # and strongly related: cluster = the label's code for every map of the example
    related = np.repeat((values == "x").astype(int), 6)
    r2 = metadata_association(related, values, 6, permutations=200, seed=0)
    assert r2["nmi"] == pytest.approx(1.0) and r2["p_permutation"] < 0.01
    assert metadata_association(labels, np.array(["same"] * 200), 6, 10, 0) is None


def test_stat_words_use_the_tokenizers_own_tokens(tiny_gpt2_dir):
    from rapids_attn.extract.model import load_tokenizer, resolve_model_name
    from rapids_attn.job import ModelConfig

    bert = stat_labels(["first", "sep"], load_tokenizer(ModelConfig(name=resolve_model_name("minilm-l6"))))
    assert bert == {"first": "attends to the first token ([CLS])", "sep": "attends to [SEP]"}
    gpt = stat_labels(["first", "sep"], load_tokenizer(ModelConfig(name=str(tiny_gpt2_dir))))
    assert gpt["sep"] == "attends to <|endoftext|>"
