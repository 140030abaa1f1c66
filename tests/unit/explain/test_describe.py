"""Cluster descriptions on a hand-built store whose answers are known."""

import json
import math

import numpy as np
import pytest

from rapids_attn.explain.describe import describe, metadata_association, stat_labels
from rapids_attn.explain.findings import ClusterFinding, ExemplarRef, FigureArrays, Findings, GroupShare, HeadShare
from rapids_attn.job import ExplainConfig
from rapids_attn.store.schema import CLUSTER, COORDS, DETECTORS, REDUCED, STATS, THUMBNAILS, Attr, create_array
from rapids_attn.store.zarr_store import StoreLayout, create_store, encode_thumbnails, write_shard

E, L, H = 40, 2, 2  # head (0,0) is always cluster 0 (a fixed-pattern head); the others depend on the example
STAT_NAMES = ["entropy", "sep", "prev"]
SWEEP = {
    "k": [2, 3, 4],
    "inertia": [9.0, 5.5, 4.0],
    "silhouette": [0.41, 0.52, None],
    "best_silhouette_k": 3,
    "n": 160,
    "chosen": 3,
    "stability": [1.0, 0.97, 0.55],
}


def known_store(tmp_path, dominated_group: bool = False, sweep: bool = False):
    """Returns (group, cluster, stats, reduced, groups, labels) with every planted array."""
    layout = StoreLayout(
        n_examples=E,
        layers=[0, 1],
        heads=[0, 1],
        feature_dim=2,
        image_size=4,
        thumb_size=4,
        shard_size=16,
        stat_names=STAT_NAMES,
        features_dtype="float32",
        detector_names=["duplicate_token_cond", "induction_cond"],
    )
    groups = ["A" if i < 10 else "B" if i < 25 else "C" for i in range(E)]
    labels = ["yes" if i % 2 else "no" for i in range(E)]
    g = create_store(tmp_path / "s.zarr", layout, {}, "k", {}, [f"e{i}" for i in range(E)], groups, labels)
    cluster = np.zeros((E, L, H), dtype=np.int32)
    rng = np.random.default_rng(0)
    cluster[:, 0, 1] = 1
    cluster[:, 1, :] = rng.integers(1, 3, size=(E, 2))  # heads of layer 1 switch between 1 and 2
    if dominated_group:
        cluster[:10, 1, 0] = 3  # cluster 3 appears only in group A's examples
        cluster[:7, 1, 1] = 3  # (unequal head counts: no tie in its ranking of heads)
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
        write_shard(
            str(tmp_path / "s.zarr"),
            layout,
            s,
            {STATS: stats[a:b], THUMBNAILS: encode_thumbnails(thumbs[a:b].astype(np.float32)), DETECTORS: det[a:b]},
        )
    create_array(g, CLUSTER, cluster.shape, chunks=(16, L, H), data=cluster)
    red = np.zeros((E, L, H, 2), dtype=np.float32)
    red[..., 0] = cluster
    # distinct offsets (exact in float16) so that "nearest the centre" has one answer
    red[..., 1] = rng.permutation(E * L * H).reshape(E, L, H) / 64
    create_array(g, REDUCED, red.shape, chunks=(16, L, H, 2), data=red)
    create_array(g, COORDS, red.shape, chunks=(16, L, H, 2), data=red)
    if sweep:
        g.attrs[Attr.LEARN] = {"method": "kmeans", "k_sweep": SWEEP}
    return g, cluster, stats, red, groups, labels


def test_signature_heads_and_exemplars(tmp_path):
    g, cluster, *_ = known_store(tmp_path)
    f, arrays = describe(g, ExplainConfig(exemplars=4, head_views=2, permutations=50))
    assert isinstance(f, Findings) and isinstance(arrays, FigureArrays)
    by_id = {c.id: c for c in f.clusters}
    assert set(by_id) == {0, 1, 2}
    assert sum(c.size for c in f.clusters) == E * L * H
    c0 = by_id[0]
    assert isinstance(c0, ClusterFinding)
    assert c0.signature[0].stat == "sep"
    assert c0.signature[0].mean == pytest.approx(0.8)
    assert "0.80 vs" in c0.summary and "overall" in c0.summary
    assert c0.top_heads[0] == HeadShare(layer=0, head=0, share_of_head=1.0, share_of_cluster=1.0)
    assert c0.dominant_description.startswith("mostly layer 0 (100% of its maps); top heads L0-H0")
    assert by_id[2].signature[0].stat == "prev"
    # head (0,0) never changes cluster: consistency 1; layer-1 heads switch: lower
    cons = np.asarray(f.heads_table.consistency)
    assert cons[0, 0] == pytest.approx(1.0) and cons[0, 1] == pytest.approx(1.0)
    assert cons[1, 0] < 0.7 and cons[1, 1] < 0.7
    assert np.asarray(f.heads_table.dominant_cluster)[0].tolist() == [0, 1]
    # mean thumbnail of cluster 0 is its planted pattern; exemplars are members of their cluster
    pos0 = [c.id for c in f.clusters].index(0)
    assert arrays.mean_thumbs[pos0][:, 3] == pytest.approx(np.ones(4))
    for pos, info in enumerate(arrays.exemplar_info):
        cid = f.clusters[pos].id
        assert len(info) == min(4, f.clusters[pos].size)
        assert all(cluster[ex, la, he] == cid for ex, la, he in info)
    assert len(c0.exemplar_examples) == 2
    assert all(isinstance(r, ExemplarRef) and r.example_id == f"e{r.example_index}" for r in c0.exemplar_examples)
    assert arrays.occupancy.shape == (3, L, H)
    assert f.warnings == []
    det = f.detectors
    assert det.names == ["duplicate_token_cond", "induction_cond"]  # the store's own
    assert det.scores["induction_cond"][1][0] == pytest.approx(0.9)  # mean over the examples that define it
    assert det.scores["induction_cond"][1][1] == pytest.approx(0.1)
    assert np.isnan(det.scores["induction_cond"][0][0])  # never defined: NaN, not 0
    assert det.examples["induction_cond"] == E // 2
    assert arrays.head_detectors.shape == (L, H, 2)
    assert f.k_sweep is None  # no learn attribute in this store


def test_group_dominated_cluster_is_flagged(tmp_path):
    g, *_ = known_store(tmp_path, dominated_group=True)
    f, _ = describe(g, ExplainConfig(permutations=50))
    c3 = next(c for c in f.clusters if c.id == 3)
    assert c3.groups == GroupShare(top="A", share=1.0, overall_share=0.25, dominated=True)
    assert len(f.warnings) == 1 and "cluster 3" in f.warnings[0] and "'A'" in f.warnings[0]
    assert f.metadata.group.p_permutation < 0.05  # cluster 3 is tied to group A


def _assert_same(actual, expected, where="d"):
    """Equal structure, key order and values (floats to 1e-6, NaN equal to NaN), plain JSON types only."""
    assert type(actual) in (dict, list, str, int, float, bool, type(None)), f"{where}: {type(actual)}"
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and list(actual) == list(expected), f"{where}: {list(actual)}"
        for k in expected:
            _assert_same(actual[k], expected[k], f"{where}[{k!r}]")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected)):
            _assert_same(a, e, f"{where}[{i}]")
    elif isinstance(expected, float):
        assert isinstance(actual, float), where
        assert (math.isnan(actual) and math.isnan(expected)) or actual == pytest.approx(expected, abs=1e-6), where
    else:
        assert type(actual) is type(expected) and actual == expected, f"{where}: {actual!r} != {expected!r}"


def _expected_summary(cluster, stats, red, groups, labels, cfg, seed):
    """What summary.json has always carried for this store, computed from the planted arrays by brute force."""
    words = {
        "entropy": "attention entropy (nats)",
        "sep": "attends to separator / end tokens",
        "prev": "attends to the previous token",
    }
    flat_stats = stats.reshape(-1, 3).astype(np.float64)
    overall = flat_stats.mean(0)
    std = np.maximum(flat_stats.std(0), 1e-12)
    ex_groups = np.array(groups)[:, None, None].repeat(L, 1).repeat(H, 2)
    ex_labels = np.array(labels)[:, None, None].repeat(L, 1).repeat(H, 2)
    ids = sorted(set(cluster.reshape(-1).tolist()), key=lambda c: (-(cluster == c).sum(), c))
    clusters = []
    for c in ids:
        m = cluster == c
        size = int(m.sum())
        means = flat_stats[m.reshape(-1)].mean(0)
        z = (means - overall) / std
        sig = [
            {
                "stat": STAT_NAMES[j],
                "label": words[STAT_NAMES[j]],
                "mean": float(means[j]),
                "overall": float(overall[j]),
                "z": float(z[j]),
            }
            for j in sorted(range(3), key=lambda j: -abs(z[j]))
        ]
        heads = sorted(
            ((la, he) for la in range(L) for he in range(H) if m[:, la, he].any()),
            key=lambda lh: -m[:, lh[0], lh[1]].sum(),
        )
        top_heads = [
            {
                "layer": la,
                "head": he,
                "share_of_head": float(m[:, la, he].mean()),
                "share_of_cluster": float(m[:, la, he].sum() / size),
            }
            for la, he in heads[:8]
        ]
        layer_share = {la: float(m[:, la].sum() / size) for la in range(L) if m[:, la].any()}
        by_share = sorted(layer_share.items(), key=lambda x: -x[1])
        top_layers = [{"layer": la, "share_of_cluster": s} for la, s in by_share]
        main = [la for la, _ in by_share[: 1 if by_share[0][1] >= 0.6 else 2]]  # 60% of the cluster (two layers here)
        cum = sum(layer_share[la] for la in main)
        span = f"layer {main[0]}" if len(main) == 1 else f"layers {min(main)}-{max(main)}"
        heads_txt = ", ".join(
            f"L{h['layer']}-H{h['head']} ({h['share_of_head']:.0%} of its maps)" for h in top_heads[:3]
        )
        g_values, g_counts = np.unique(ex_groups[m], return_counts=True)
        top = str(g_values[g_counts.argmax()])
        share, overall_share = float(g_counts.max() / size), groups.count(top) / E
        # the nearest maps to the centre in the reduced space, nearest first (the planted offsets break ties)
        members = np.flatnonzero(m.reshape(-1))
        vecs = red.reshape(-1, 2)[members].astype(np.float64)
        dist = ((vecs - vecs.mean(0)) ** 2).sum(1)
        assert (np.diff(np.sort(dist)[: cfg.head_views + 1]) > 0).all()  # no tie among the ones picked
        nearest = members[np.argsort(dist)][: cfg.head_views]
        clusters.append(
            {
                "id": int(c),
                "size": size,
                "share": size / (E * L * H),
                "summary": "; ".join(f"{s['label']}: {s['mean']:.2f} vs {s['overall']:.2f} overall" for s in sig),
                "signature": sig,
                "means": {s: float(means[j]) for j, s in enumerate(STAT_NAMES)},
                "top_heads": top_heads,
                "top_layers": top_layers,
                "dominant_description": f"mostly {span} ({cum:.0%} of its maps); top heads {heads_txt}",
                "groups": {
                    "top": top,
                    "share": share,
                    "overall_share": overall_share,
                    "dominated": share > cfg.group_dominance and share >= 2 * overall_share,
                },
                "labels": {v: float((ex_labels[m] == v).mean()) for v in ("no", "yes")},
                "patterns": {},
                "pattern": None,
                "exemplar_examples": [
                    {
                        "example_index": int(f // (L * H)),
                        "example_id": f"e{f // (L * H)}",
                        "layer": int(f % (L * H) // H),
                        "head": int(f % H),
                    }
                    for f in nearest
                ],
            }
        )
    occ = np.stack([(cluster == c).mean(0) for c in sorted(ids)])  # [cluster by id, layer, head]
    with np.errstate(divide="ignore", invalid="ignore"):
        entropy = -np.where(occ > 0, occ * np.log(occ), 0.0).sum(0)
    induction = [[math.nan, math.nan], [0.9, 0.1]]  # as planted on the even examples; layer 0 never defined
    flat_cluster = cluster.reshape(-1).astype(np.int64)
    return {
        "layers": [0, 1],
        "heads": [0, 1],
        "stat_names": STAT_NAMES,
        "stat_labels": words,
        "global_means": {s: float(overall[j]) for j, s in enumerate(STAT_NAMES)},
        "clusters": clusters,
        "heads_table": {
            "dominant_cluster": np.array(sorted(ids))[occ.argmax(0)].tolist(),
            "consistency": np.round(1 - entropy / math.log(len(ids)), 4).tolist(),
        },
        "metadata": {
            "label": metadata_association(flat_cluster, np.array(labels), L * H, cfg.permutations, seed),
            "group": metadata_association(flat_cluster, np.array(groups), L * H, cfg.permutations, seed),
            "probe_examples_excluded": 0,
        },
        "warnings": [
            f"cluster {c['id']}: {c['groups']['share']:.0%} of its maps come from group "
            f"'{c['groups']['top']}' ({c['groups']['overall_share']:.0%} overall): a trivial cluster from "
            "shared contexts? Consider reduce.sample_by: group"
            for c in clusters
            if c["groups"]["dominated"]
        ],
        "k_sweep": SWEEP,
        "detectors": {
            "names": ["duplicate_token_cond", "induction_cond"],
            "scores": {"duplicate_token_cond": np.full((L, H), np.nan).tolist(), "induction_cond": induction},
            "examples": {"duplicate_token_cond": 0, "induction_cond": E // 2},
        },
    }


@pytest.mark.parametrize("dominated", [False, True])
def test_to_dict_is_the_summary_json_form(tmp_path, dominated):
    """to_dict() carries exactly the keys, order and values summary.json has always had."""
    g, cluster, stats, red, groups, labels = known_store(tmp_path, dominated_group=dominated, sweep=True)
    cfg = ExplainConfig(exemplars=4, head_views=2, permutations=30)
    f, _ = describe(g, cfg, seed=3)
    d = f.to_dict()
    expected = _expected_summary(cluster, stats, red, groups, labels, cfg, seed=3)
    assert len(expected["warnings"]) == int(dominated)
    _assert_same(d, expected)
    # and it goes into summary.json as it is
    assert json.loads(json.dumps(d))["clusters"][0]["exemplar_examples"] == expected["clusters"][0]["exemplar_examples"]


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


def test_all_noise_is_said_not_described_as_a_cluster(tmp_path):
    """HDBSCAN left every map as noise: the learn stage's warning leads the findings' warnings, and
    the one 'cluster' says it is every map, not a cluster."""
    g, *_ = known_store(tmp_path)
    g[CLUSTER][:] = -1
    warn = "cluster.hdbscan marked all 160 maps as noise (no clusters); lower cluster.min_cluster_size"
    g.attrs[Attr.LEARN] = {"method": "hdbscan", "warnings": [warn]}
    f, _ = describe(g, ExplainConfig(exemplars=4, head_views=2, permutations=10))
    assert f.warnings[0] == warn
    (c,) = f.clusters
    assert c.id == -1 and c.size == E * L * H and c.share == 1.0
    assert c.summary.startswith("every map is noise: the clusterer found no clusters")
    assert f.to_dict()["warnings"][0] == warn


def test_some_noise_is_named_as_noise(tmp_path):
    g, cluster, *_ = known_store(tmp_path)
    cluster[:5] = -1
    g[CLUSTER][:] = cluster
    f, _ = describe(g, ExplainConfig(exemplars=4, head_views=2, permutations=10))
    noise = f.clusters[-1]  # noise last
    assert noise.id == -1 and noise.size == 5 * L * H
    assert noise.summary.startswith("noise: maps the clusterer left out of every cluster; ")
    assert not any(c.summary.startswith(("noise", "every map")) for c in f.clusters[:-1])
    # no learn warnings in this store's attributes, and no "trivial cluster" warning for the noise,
    # although all of it comes from group A's examples
    assert noise.groups.dominated and f.warnings == []


def test_undefined_stats_are_left_out_of_the_means_not_counted_as_zero(tmp_path):
    """A one-token map's prev, next and entropy_norm are NaN: cluster and overall means are over the maps
    that define the stat, and a cluster where no map does gets NaN, never 0."""
    g, cluster, stats, *_ = known_store(tmp_path)
    stats = stats.astype(np.float64)
    stats[:5, 0, 0, 2] = np.nan  # five maps of cluster 0 (head L0-H0) without the stat
    g[STATS][:5, 0, 0, 2] = np.nan
    f, _ = describe(g, ExplainConfig(exemplars=2, head_views=0, permutations=10))
    c0 = next(c for c in f.clusters if c.id == 0)
    assert c0.means[STAT_NAMES[2]] == pytest.approx(np.nanmean(stats[cluster == 0][:, 2]))
    assert f.global_means[STAT_NAMES[2]] == pytest.approx(np.nanmean(stats[..., 2]))
    g[STATS][:, 0, 0, 2] = np.nan  # now no map of cluster 0 defines it
    f, _ = describe(g, ExplainConfig(exemplars=2, head_views=0, permutations=10))
    c0 = next(c for c in f.clusters if c.id == 0)
    assert np.isnan(c0.means[STAT_NAMES[2]])
    assert all(item.stat != STAT_NAMES[2] for item in c0.signature)  # an undefined stat is never a signature
