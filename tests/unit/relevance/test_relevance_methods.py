"""Token relevance (rapids_attn/relevance/methods.py) against plain reference implementations: numpy
loops over one unpadded example at a time, networkx's maximum flow and PageRank, to 1e-6."""

import networkx as nx
import numpy as np
import pytest
import torch

from rapids_attn.relevance import methods as M

LENGTHS = [5, 9, 12]
T, L, H = 12, 3, 2


def _batch(seed, causal=False):
    """[L] x [B, H, T, T] float64 row-stochastic maps with padding, and the unpadded per-example maps."""
    rng = np.random.default_rng(seed)
    layers = []
    for _ in range(L):
        a = np.zeros((len(LENGTHS), H, T, T))
        for e, n in enumerate(LENGTHS):
            s = rng.normal(0, 2, size=(H, n, n))
            if causal:
                s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
            x = np.exp(s - s.max(-1, keepdims=True))
            a[e, :, :n, :n] = x / x.sum(-1, keepdims=True)
        layers.append(a)
    return [torch.from_numpy(x) for x in layers], torch.tensor(LENGTHS)


def _example(layers, e):
    n = LENGTHS[e]
    return [x[e, :, :n, :n].numpy() for x in layers]


def _pick(matrix, query):
    n = matrix.shape[0]
    if query == "mean":
        return matrix.mean(0)
    return matrix[{"first": 0, "last": n - 1}.get(query, query)]


def _residual(a, r=0.5):
    x = r * np.eye(a.shape[-1]) + (1 - r) * a.mean(0)
    return x / x.sum(1, keepdims=True)


def ref_rollout(ex, query, r=0.5):
    m = np.eye(ex[0].shape[-1])
    for a in ex:
        m = _residual(a, r) @ m
    return _pick(m, query)


def ref_grad_rollout(ex, grads, query):
    m = np.eye(ex[0].shape[-1])
    for a, g in zip(ex, grads):
        abar = np.maximum(g * a, 0).mean(0)
        m = m + abar @ m
    return _pick(m, query)


def ref_flow(ex, query, r=0.5):
    n = ex[0].shape[-1]
    g = nx.DiGraph()
    for li, a in enumerate(ex):
        x = _residual(a, r)
        for i in range(n):
            for j in range(n):
                if x[i, j] > 0:
                    g.add_edge((li, j), (li + 1, i), capacity=float(x[i, j]))
    rows = range(n) if query == "mean" else [{"first": 0, "last": n - 1}.get(query, query)]
    out = np.zeros(n)
    for q in rows:
        for j in range(n):
            out[j] += nx.maximum_flow_value(g, (0, j), (len(ex), q))
    return out / len(rows)


def ref_pagerank(a, damping):
    n = a.shape[0]
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    for i in range(n):
        for j in range(n):
            if a[i, j] > 0:
                g.add_edge(i, j, weight=float(a[i, j]))
    pr = nx.pagerank(g, alpha=damping, tol=1e-13, max_iter=10000, weight="weight")
    return np.array([pr[i] for i in range(n)])


def _check(got, refs):
    got = got.numpy()
    for e, n in enumerate(LENGTHS):
        np.testing.assert_allclose(got[e, :n], refs[e], atol=1e-6, rtol=0)
        assert np.all(got[e, n:] == 0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("query", ["mean", "first", "last", 2])
def test_head_mean_last_layer_and_rollout_match_the_reference(causal, query):
    layers, lengths = _batch(0, causal)
    exs = [_example(layers, e) for e in range(len(LENGTHS))]
    _check(M.head_mean(layers, lengths, query), [_pick(np.mean([a.mean(0) for a in ex], 0), query) for ex in exs])
    _check(M.last_layer(layers, lengths, query), [_pick(ex[-1].mean(0), query) for ex in exs])
    _check(M.rollout(layers, lengths, query), [ref_rollout(ex, query) for ex in exs])
    _check(M.rollout(torch.stack(layers), lengths, query, residual=0.3), [ref_rollout(ex, query, 0.3) for ex in exs])


@pytest.mark.parametrize("causal", [False, True])
def test_grad_rollout_matches_the_reference(causal):
    layers, lengths = _batch(1, causal)
    grads, _ = _batch(2)
    grads = [g - 0.5 * g.mean() for g in grads]  # signed, so the positive part matters
    for q in ("mean", "first", "last"):
        refs = [ref_grad_rollout(_example(layers, e), _example(grads, e), q) for e in range(len(LENGTHS))]
        _check(M.grad_rollout(layers, grads, lengths, q), refs)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_flow_matches_networkx(causal):
    layers, lengths = _batch(3, causal)
    for q in ("mean", "last"):
        _check(M.attention_flow(layers, lengths, q), [ref_flow(_example(layers, e), q) for e in range(len(LENGTHS))])


@pytest.mark.parametrize("causal", [False, True])
def test_pagerank_matches_networkx(causal):
    layers, lengths = _batch(4, causal)
    a = layers[1]
    for heads in (None, [1]):
        got = M.pagerank(a, lengths, heads=heads, damping=0.85, tol=1e-13)
        refs = []
        for e, n in enumerate(LENGTHS):
            x = a[e, :, :n, :n].numpy()
            refs.append(ref_pagerank(x.mean(0) if heads is None else x[heads].mean(0), 0.85))
        _check(got, refs)
        assert torch.allclose(got.sum(1), torch.ones(len(LENGTHS), dtype=got.dtype))


def test_pagerank_rows_without_mass_teleport_as_networkx_dangling_nodes_do():
    a = torch.tensor([[[0.0, 0.7, 0.3], [0.0, 0.0, 0.0], [0.5, 0.5, 0.0]]], dtype=torch.float64)
    got = M.pagerank(a, torch.tensor([3]), tol=1e-13)
    np.testing.assert_allclose(got[0].numpy(), ref_pagerank(a[0].numpy(), 0.85), atol=1e-8)


def test_padding_does_not_leak_an_example_alone_gives_the_same_relevance():
    layers, lengths = _batch(5)
    grads, _ = _batch(6)
    for e, n in enumerate(LENGTHS):
        alone = [x[e : e + 1, :, :n, :n] for x in layers]
        galone = [x[e : e + 1, :, :n, :n] for x in grads]
        one = torch.tensor([n])
        pairs = [
            (M.rollout(layers, lengths), M.rollout(alone, one)),
            (M.head_mean(layers, lengths), M.head_mean(alone, one)),
            (M.grad_rollout(layers, grads, lengths), M.grad_rollout(alone, galone, one)),
            (M.pagerank(layers[0], lengths), M.pagerank(alone[0], one)),
        ]
        for batched, single in pairs:
            torch.testing.assert_close(batched[e, :n], single[0], atol=1e-10, rtol=0)


def test_rollout_invariants_and_the_streaming_class():
    layers, lengths = _batch(7)
    # residual 1 keeps only the identity: each query row is one-hot on itself
    got = M.rollout(layers, lengths, "first", residual=1.0)
    assert torch.all(got[:, 0] == 1) and torch.all(got[:, 1:] == 0)
    # every row of R sums to 1 over the valid tokens
    r = M.Rollout(lengths)
    for a in layers:
        r.update(a)
    assert torch.allclose(r.matrix[0, :5, :5].sum(-1), torch.ones(5, dtype=torch.float64))
    torch.testing.assert_close(r.relevance("last"), M.rollout(layers, lengths, "last"))


def test_flow_is_at_most_one_and_zero_without_a_path_and_bounded_in_tokens():
    layers, lengths = _batch(8)
    f = M.attention_flow(layers, lengths, "first")
    assert torch.all(f <= 1 + 1e-9) and torch.all(f >= 0)
    # residual 1: the graph holds only self edges, so only the query's own token reaches it
    only_self = M.attention_flow(layers, lengths, "first", residual=1.0)
    assert torch.allclose(only_self[:, 0], torch.ones(3, dtype=only_self.dtype)) and torch.all(only_self[:, 1:] == 0)
    with pytest.raises(ValueError, match="max_tokens"):
        M.attention_flow(layers, lengths, max_tokens=8)


def test_bad_query_rows_are_refused():
    layers, lengths = _batch(9)
    with pytest.raises(ValueError, match="query"):
        M.rollout(layers, lengths, "middle")
    with pytest.raises(ValueError, match="query"):
        M.rollout(layers, lengths, 7)  # the first example has 5 tokens


def test_nan_in_padded_rows_and_lengths_as_a_list_change_nothing():
    """A fully masked padded row can come back as NaN from a softmax: no method may let it in."""
    layers, lengths = _batch(10)
    grads, _ = _batch(11)
    dirty = [x.clone() for x in layers]
    for x in dirty:
        for e, n in enumerate(LENGTHS):
            x[e, :, n:, :] = float("nan")
    as_list = list(LENGTHS)
    pairs = [
        (M.head_mean(layers, lengths), M.head_mean(dirty, as_list)),
        (M.last_layer(layers, lengths), M.last_layer(dirty, as_list)),
        (M.rollout(layers, lengths), M.rollout(dirty, as_list)),
        (M.grad_rollout(layers, grads, lengths), M.grad_rollout(dirty, grads, as_list)),
        (M.attention_flow(layers, lengths, "first"), M.attention_flow(dirty, as_list, "first")),
        (M.pagerank(layers[0], lengths), M.pagerank(dirty[0], as_list)),
    ]
    for clean, got in pairs:
        torch.testing.assert_close(got, clean, atol=1e-12, rtol=0)
