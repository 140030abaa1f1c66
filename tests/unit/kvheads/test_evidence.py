"""rapids_attn.kvheads.evidence on a small synthetic store: which examples define the streaming and retrieval
scores, the weighted means against numpy loops, the bootstrap and split halves, kappa against scikit-learn."""

import numpy as np
import pytest
import zarr

from rapids_attn.kvheads.evidence import (
    NOT_APPLICABLE,
    OTHER,
    bootstrap_weights,
    kappa,
    labels,
    read_evidence,
    split_halves,
    stability,
)

E, L, H = 8, 2, 3
DET = ["previous_token_head", "streaming", "retrieval", "induction_head"]
OFFSETS = np.arange(-4, 5)
T = {"sink": 0.3, "streaming": 0.9, "retrieval": 0.1}


def _store(tmp_path, seq_len, groups=None, seed=0, stable=True):
    """stats [E, L, H, 2] (entropy, first), detectors [E, L, H, 4], profile [E, L, H, 9] at offsets -4..4;
    with ``stable`` head (0, 0) streams (0.97-0.99) and never retrieves, head (1, 2) retrieves (0.5-0.6)."""
    rng = np.random.default_rng(seed)
    e = len(seq_len)
    first = rng.uniform(0.05, 0.6, (e, L, H))
    first[1, 1, 1] = np.nan  # a map with no finite first statistic
    stats = np.zeros((e, L, H, 2), np.float32)
    stats[..., 1] = first
    det = rng.uniform(0, 1, (e, L, H, len(DET))).astype(np.float32)
    det[2, 0, 1, DET.index("retrieval")] = np.nan  # an example with no far repeat for one head
    if stable:
        det[:, 0, 0, DET.index("streaming")] = rng.uniform(0.97, 0.99, e)
        det[:, 0, 0, DET.index("retrieval")] = rng.uniform(0.0, 0.02, e)
        det[:, 1, 2, DET.index("retrieval")] = rng.uniform(0.5, 0.6, e)
    prof = rng.uniform(0, 0.1, (e, L, H, len(OFFSETS))).astype(np.float16)
    g = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    g.create_array("stats", data=stats, chunks=(3, L, H, 2))
    g.create_array("stat", data=np.array(["entropy", "first"]))
    g.create_array("detectors", data=det, chunks=(3, L, H, len(DET)))
    g.create_array("detector", data=np.array(DET))
    g.create_array("profile", data=prof, chunks=(3, L, H, len(OFFSETS)))
    g.create_array("offset", data=OFFSETS.astype(np.int32))
    g.create_array("seq_len", data=np.asarray(seq_len, np.int32))
    g.create_array("example_group", data=np.array(groups if groups is not None else [""] * e))
    g.create_array("layer", data=np.arange(L, dtype=np.int32))
    g.create_array("head", data=np.arange(H, dtype=np.int32))
    g.attrs["extract_runs"] = [{"shards": 1, "causal": True}]
    return g, first.astype(np.float32).astype(np.float64), det.astype(np.float64), prof.astype(np.float64)


LENGTHS = [300, 50, 200, 128, 127, 400, 10, 260]


@pytest.fixture
def store(tmp_path):
    return _store(tmp_path, LENGTHS, groups=[f"g{i % 4}" for i in range(E)])


def _weighted(x, w):
    """sum(w x) / sum(w) over the examples where x is finite; NaN where none (the reference)."""
    ok = np.isfinite(x)
    num = (w[:, None, None] * np.where(ok, x, 0)).sum(0)
    den = (w[:, None, None] * ok).sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)


def _reference(first, det, prof, lengths, min_length, w=None):
    n = np.asarray(lengths, np.float64)[:, None, None]
    w = np.ones(len(lengths)) if w is None else w
    ok = np.isfinite(first) & (n > 1)
    num = (w[:, None, None] * np.where(ok, first * n - 1, 0)).sum(0)
    den = (w[:, None, None] * np.where(ok, n - 1, 0)).sum(0)
    long = n >= min_length
    out = {"sink": num / den}
    for name in ("streaming", "retrieval"):
        out[name] = _weighted(np.where(long, det[..., DET.index(name)], np.nan), w)
    local = prof[..., OFFSETS <= 0].sum(-1)  # a decoder: keys at or before the query
    out["local"] = _weighted(np.where(long, local, np.nan), w)
    return out


def test_eligibility_and_scores_match_numpy(store):
    g, first, det, prof = store
    ev = read_evidence(g, 128)
    assert ev.causal and ev.layers == [0, 1] and ev.heads == [0, 1, 2] and ev.profile_offsets == 5
    assert ev.eligible.tolist() == [x >= 128 for x in LENGTHS]
    short = ~ev.eligible
    assert np.isnan(ev.parts["streaming"][short]).all() and np.isnan(ev.parts["retrieval"][short]).all()
    assert np.isfinite(ev.parts["streaming"][ev.eligible]).all()
    got, want = ev.scores(), _reference(first, det, prof, LENGTHS, 128)
    assert set(got) == {"sink", "streaming", "retrieval", "local"}
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, err_msg=k)


def test_weighted_scores_match_a_loop_over_replicates(store):
    g, first, det, prof = store
    ev = read_evidence(g, 128)
    w = bootstrap_weights(E, 7, seed=3)
    assert w.shape == (7, E) and (w.sum(1) == E).all() and (w >= 0).all() and (w == np.round(w)).all()
    assert not (w == 1).all()  # a resample, not the sample
    got = ev.scores(w)
    for b in range(7):
        want = _reference(first, det, prof, LENGTHS, 128, w[b])
        for k in want:
            np.testing.assert_allclose(got[k][b], want[k], rtol=1e-5, err_msg=f"{k} replicate {b}")
    # the same seed, the same resample
    np.testing.assert_array_equal(bootstrap_weights(E, 7, seed=3), w)


def test_no_long_example_makes_the_classes_not_applicable(tmp_path):
    g, *_ = _store(tmp_path, [100] * E)
    ev = read_evidence(g, 128)
    sc = ev.scores()
    assert np.isnan(sc["streaming"]).all() and np.isnan(sc["retrieval"]).all() and np.isfinite(sc["sink"]).all()
    assert (labels(sc, T) == NOT_APPLICABLE).all()


def test_labels_order_and_not_applicable():
    nan = np.nan
    sc = {
        "sink": np.array([0.5, 0.5, 0.1, 0.5, 0.1, nan]),
        "streaming": np.array([0.95, 0.95, 0.1, nan, nan, 0.95]),
        "retrieval": np.array([0.2, 0.0, 0.0, 0.0, nan, 0.0]),
    }
    assert labels(sc, T).tolist() == ["retrieval", "streaming", OTHER, NOT_APPLICABLE, NOT_APPLICABLE, "streaming"]


def test_kappa_matches_scikit_learn():
    from sklearn.metrics import cohen_kappa_score

    rng = np.random.default_rng(4)
    classes = np.array(["retrieval", "streaming", "sink", "other"])
    for _ in range(5):
        a = classes[rng.integers(0, 4, 40)]
        b = np.where(rng.random(40) < 0.6, a, classes[rng.integers(0, 4, 40)])
        assert kappa(a.reshape(5, 8), b.reshape(5, 8)) == pytest.approx(cohen_kappa_score(a, b))
    a = np.array(["x"] * 6)
    assert kappa(a, a) is None  # chance agreement 1: undefined
    b = np.array(["y"] * 6)
    assert kappa(a, b) == pytest.approx(cohen_kappa_score(a, b))


def test_split_halves_by_whole_groups(store):
    g, *_ = store
    ev = read_evidence(g, 128)
    wa, wb, how = split_halves(ev, seed=0)
    assert how.startswith("by group") and "2 of 4 groups" in how
    assert ((wa + wb) == 1).all() and set(np.unique(wa)) == {0.0, 1.0}
    for name in np.unique(ev.groups):
        members = wa[ev.groups == name]
        assert (members == members[0]).all(), name  # a group lies in one half
    assert wa.sum() == wb.sum() == 4


@pytest.mark.parametrize("groups", [["a", "b", "c"] * 2 + ["a", "b"], None, [f"g{i}" for i in range(E)]])
def test_split_halves_by_example_otherwise(tmp_path, groups):
    """Fewer than four groups (or every example its own): half the examples each."""
    g, *_ = _store(tmp_path, LENGTHS, groups=groups)
    wa, wb, how = split_halves(read_evidence(g, 128), seed=5)
    assert how.startswith("by example") and wa.sum() == wb.sum() == 4 and ((wa + wb) == 1).all()


def test_stability_of_a_stable_head(store):
    g, *_ = store
    ev = read_evidence(g, 128)
    sc = ev.scores()
    lab = labels(sc, T)
    assert lab[0, 0] == "streaming" and lab[1, 2] == "retrieval"
    score_of = np.where(np.isin(lab, ["retrieval", "streaming", "sink"]), lab, "").astype(object)
    st = stability(ev, lab, score_of, T, replicates=40, seed=0)
    assert st.replicates == 40 and st.same_class.shape == (L, H)
    assert ((st.same_class >= 0) & (st.same_class <= 1)).all()
    for (i, j), c in (((0, 0), "streaming"), ((1, 2), "retrieval")):
        assert st.same_class[i, j] == 1.0
        assert st.low[i, j] <= sc[c][i, j] <= st.high[i, j]
    assert st.half_counts == (4, 4) and st.halves.startswith("by group")
    assert st.kappa is None or -1 <= st.kappa <= 1
    assert st.agreement == pytest.approx(float((st.half_labels[0] == st.half_labels[1]).mean()))
    # no resamples: no intervals
    none = stability(ev, lab, score_of, T, replicates=0, seed=0)
    assert np.isnan(none.same_class).all() and np.isnan(none.low).all()
