"""The head atlas (rapids_attn/relevance/atlas.py): Clark et al.'s Jensen-Shannon head distance
against scipy's, padding, batching, and the embedding, clustering and related heads built on it."""

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon

from rapids_attn.relevance.atlas import HeadDistance, cluster_heads, embed_heads, js_sums, related_heads


def _maps(rng, b, h, t, lengths, causal=False):
    s = rng.normal(0, 2, size=(b, h, t, t))
    a = np.zeros_like(s)
    for e, n in enumerate(lengths):
        x = s[e, :, :n, :n].copy()
        if causal:
            x = np.where(np.tril(np.ones((n, n), bool)), x, -np.inf)
        x = np.exp(x - x.max(-1, keepdims=True))
        a[e, :, :n, :n] = x / x.sum(-1, keepdims=True)
    return a


def _reference(layers, lengths):
    """Mean over every valid query row of every example of JS divergence (nats), by scipy, one pair at a time."""
    a = np.concatenate(layers, 1)
    n = a.shape[1]
    total, rows = np.zeros((n, n)), 0
    for e, t in enumerate(lengths):
        rows += t
        for i in range(n):
            for j in range(n):
                for q in range(t):
                    total[i, j] += jensenshannon(a[e, i, q, :t], a[e, j, q, :t]) ** 2  # scipy: sqrt of JS, base e
    return total / rows


@pytest.mark.parametrize("causal", [False, True])
def test_head_distance_is_the_mean_js_divergence_over_valid_rows(causal):
    rng = np.random.default_rng(0)
    lengths = [5, 9, 12]
    layers = [_maps(rng, 3, 2, 12, lengths, causal) for _ in range(3)]
    hd = HeadDistance()
    hd.update([torch.from_numpy(x) for x in layers], torch.tensor(lengths))
    np.testing.assert_allclose(hd.distance, _reference(layers, lengths), atol=1e-10)
    assert hd.rows == sum(lengths)
    d = hd.distance
    assert np.allclose(d, d.T) and np.all(np.diag(d) == 0) and np.all(d >= 0) and np.all(d <= np.log(2) + 1e-12)


def test_padding_and_batching_do_not_change_the_distance():
    rng = np.random.default_rng(1)
    lengths = [4, 7, 10]
    layers = [_maps(rng, 3, 3, 10, lengths) for _ in range(2)]
    whole = HeadDistance()
    whole.update([torch.from_numpy(x) for x in layers], torch.tensor(lengths))
    parts = HeadDistance()
    for e, n in enumerate(lengths):  # each example alone, unpadded, in its own accumulator, then merged
        one = HeadDistance()
        one.update([torch.from_numpy(x[e : e + 1, :, :n, :n]) for x in layers], torch.tensor([n]))
        parts.merge(one)
    np.testing.assert_allclose(parts.distance, whole.distance, atol=1e-12)


def test_identical_heads_are_at_distance_zero_and_opposite_one_hot_heads_at_ln2():
    t = 6
    eye = np.eye(t)[None, None]
    shift = np.roll(np.eye(t), 1, axis=1)[None, None]
    a = torch.from_numpy(np.concatenate([eye, eye, shift], 1))  # heads 0 and 1 identical, 2 disjoint
    s, rows = js_sums(a, torch.tensor([t]))
    d = s.numpy() / rows
    assert d[0, 1] == 0 and d[0, 2] == pytest.approx(np.log(2)) and d[1, 2] == pytest.approx(np.log(2))


def test_atlas_groups_heads_that_attend_alike():
    rng = np.random.default_rng(2)
    # three families of four heads: each head is its family's map plus a little noise
    t, families = 16, 3
    base = _maps(rng, 1, families, t, [t])[0]
    heads = []
    for f in range(families):
        for _ in range(4):
            x = base[f] * np.exp(rng.normal(0, 0.05, size=(t, t)))
            heads.append(x / x.sum(-1, keepdims=True))
    hd = HeadDistance()
    hd.update([torch.from_numpy(np.stack(heads)[None])], torch.tensor([t]))
    d = hd.distance
    labels = cluster_heads(d, families)
    truth = np.repeat(np.arange(families), 4)
    from sklearn.metrics import adjusted_rand_score

    assert adjusted_rand_score(truth, labels) == 1.0
    near = related_heads(d, k=3)
    assert all(set(near[i]) == set(np.flatnonzero(truth == truth[i])) - {i} for i in range(len(d)))
    xy = embed_heads(d, seed=0)
    assert xy.shape == (12, 2) and np.isfinite(xy).all()
    # in the embedding too, every head is nearer its own family's centre than any other family's
    centres = np.stack([xy[truth == f].mean(0) for f in range(families)])
    nearest = np.argmin(((xy[:, None] - centres[None]) ** 2).sum(-1), 1)
    assert np.array_equal(nearest, truth)


def test_bad_matrices_and_empty_accumulators_are_refused():
    with pytest.raises(ValueError, match="square"):
        related_heads(np.zeros((3, 4)))
    with pytest.raises(ValueError, match="no rows"):
        _ = HeadDistance().distance


def _js_sums_per_head(attn, lengths):
    """The definition before issue 34: valid rows gathered by a boolean mask, one head against the later ones."""
    n, t = attn.shape[1], attn.shape[-1]
    a = attn.transpose(1, 2)[torch.arange(t)[None, :] < lengths[:, None]]  # [R, N, T]
    neg_h = torch.xlogy(a, a).sum(-1)
    out = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        m = 0.5 * (a[:, i : i + 1] + a[:, i:])
        s = (0.5 * (neg_h[:, i : i + 1] + neg_h[:, i:]) - torch.xlogy(m, m).sum(-1)).clamp_min(0).sum(0)
        out[i, i:] = s
        out[i:, i] = s
    out.fill_diagonal_(0.0)
    return out, a.shape[0]


@pytest.mark.parametrize("k", [1, 3, 7])  # one head a block, blocks not dividing the 7 heads, all at once
def test_blocked_js_sums_equal_the_per_head_loop(k):
    rng = np.random.default_rng(5)
    lengths = torch.tensor([3, 9, 6])
    a = torch.zeros(3, 7, 9, 9, dtype=torch.float64)
    for e, n in enumerate(lengths.tolist()):
        x = torch.from_numpy(rng.dirichlet(np.ones(n) * 0.5, size=(7, n)))
        a[e, :, :n, :n] = x
        a[e, :, n:, :] = float("nan")  # padded query rows: never read
    want, want_rows = _js_sums_per_head(a, lengths)
    r = a.shape[0] * a.shape[-1]  # the blocked form's rows: every query row, padded ones zeroed
    got, rows = js_sums(a, lengths, block_bytes=r * k * 7 * 9 * 8)
    assert isinstance(rows, torch.Tensor) and int(rows) == want_rows == 18
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    assert torch.equal(got, got.T)
