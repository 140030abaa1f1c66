"""Token relevance from attention, for a batch of padded inputs (issue 15).

Every function takes the attention of a batch, layer by layer: a list of ``[B, H, T, T]`` tensors
(or one ``[L, B, H, T, T]`` tensor), rows are queries and columns keys, each valid row summing to 1
over the valid keys, and ``lengths`` ``[B]`` (valid tokens per example; padding comes last). It
returns ``[B, T]``: the relevance of each key token for the chosen query rows, 0 at padded
positions. ``query`` chooses the rows: ``"mean"`` (the mean over the valid rows), ``"first"`` (row 0,
[CLS] in BERT), ``"last"`` (row ``length - 1``, the next-token position of a decoder) or an int.

=====================  ==============================================================================
method                 what it computes
=====================  ==============================================================================
``head_mean``          the attention each token receives, averaged over layers and heads
``last_layer``         the same from the last layer only (raw attention, as most viewers show it)
``rollout``            Abnar & Zuidema (2020): per layer A' = r I + (1 - r) mean_h A, rows renormalised;
                       R = A'_L ... A'_1; relevance = the query rows of R. Each row of R sums to 1.
``grad_rollout``       Chefer, Gur & Wolf (2021, "Generic attention-model explainability"): per layer
                       Abar = mean_h (dy/dA * A)^+; R = I, then R <- R + Abar R layer by layer
``attention_flow``     Abnar & Zuidema (2020): the maximum flow from input token j (layer 0) to the query
                       (layer L) through the layered graph whose edge (l-1, j) -> (l, i) has capacity A'_l[i, j]
``pagerank``           PageRank centrality on one layer's attention graph (edge i -> j weighted A[i, j]: a
                       query passes importance to the keys it reads); scores sum to 1 over the valid tokens
=====================  ==============================================================================

Rollout and flow use the same residual-mixed matrices A'. Flow needs one maximum-flow computation per
(query row, key token) pair on a graph of (L + 1) T nodes and L T^2 edges, so it is bounded by
``max_tokens`` (refused above it).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

Layers = Sequence[torch.Tensor] | torch.Tensor
#: scipy's maximum_flow takes 32-bit integer capacities (larger ones are silently wrong): each capacity (at
#: most 1) is scaled by this and rounded, to within 2^-30, and no residual capacity (at most twice a capacity)
#: reaches 2^31. A flow value's error is at most the number of edges in a minimum cut times 2^-30: up to
#: L T^2 edges in principle (9e-5 at L = 6, T = 128), about 1e-7 measured there against a certified interval
FLOW_SCALE = 2**29


def _valid(lengths, t: int, device) -> torch.Tensor:
    return torch.arange(t, device=device)[None, :] < torch.as_tensor(lengths, device=device)[:, None]  # [B, T]


def _rows(matrix: torch.Tensor, lengths: torch.Tensor, query) -> torch.Tensor:
    """matrix [B, T, T] -> [B, T]: the chosen query rows (the mean over the valid rows for "mean")."""
    b, t, _ = matrix.shape
    valid = _valid(lengths, t, matrix.device)
    if query == "mean":
        w = valid.to(matrix.dtype)
        out = (matrix * w[:, :, None]).sum(1) / w.sum(1, keepdim=True).clamp_min(1)
    else:
        if query in ("first", "cls"):
            idx = torch.zeros(b, dtype=torch.long, device=matrix.device)
        elif query == "last":
            idx = lengths.to(matrix.device).long() - 1
        elif isinstance(query, (int, np.integer)):
            if not all(0 <= int(query) < int(n) for n in lengths):
                raise ValueError(f"query: row {query} is outside an example of {int(lengths.min())} tokens")
            idx = torch.full((b,), int(query), dtype=torch.long, device=matrix.device)
        else:
            raise ValueError(f"query: {query!r}; use 'mean', 'first', 'last' or a row index")
        out = matrix[torch.arange(b, device=matrix.device), idx]
    return torch.where(valid, out, torch.zeros_like(out))


def _layers(attn: Layers) -> list[torch.Tensor]:
    return list(attn.unbind(0)) if torch.is_tensor(attn) else list(attn)


def _mask(a: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Zero the padded rows and keys of [B, T, T] (by selection: a fully masked padded row may hold NaN)."""
    v = _valid(lengths, a.shape[-1], a.device)
    return torch.where(v[:, :, None] & v[:, None, :], a, torch.zeros_like(a))


def head_mean(attn: Layers, lengths: torch.Tensor, query="mean") -> torch.Tensor:
    lengths = torch.as_tensor(lengths)
    layers = _layers(attn)
    mean = torch.stack([a.mean(1) for a in layers]).mean(0)
    return _rows(_mask(mean, lengths), lengths, query)


def last_layer(attn: Layers, lengths: torch.Tensor, query="mean") -> torch.Tensor:
    lengths = torch.as_tensor(lengths)
    return _rows(_mask(_layers(attn)[-1].mean(1), lengths), lengths, query)


def residual_attention(layer: torch.Tensor, lengths: torch.Tensor, residual: float = 0.5) -> torch.Tensor:
    """[B, H, T, T] -> [B, T, T]: r I + (1 - r) mean_h A on the valid tokens, rows renormalised."""
    lengths = torch.as_tensor(lengths)
    t = layer.shape[-1]
    a = _mask(layer.mean(1), lengths)
    eye = torch.diag_embed(_valid(lengths, t, a.device).to(a.dtype))
    a = residual * eye + (1 - residual) * a
    return a / a.sum(-1, keepdim=True).clamp_min(torch.finfo(a.dtype).tiny)


class Rollout:
    """Attention rollout accumulated layer by layer (a capture hook calls ``update`` as each layer
    runs, so no more than one layer's maps are held): ``matrix`` is R = A'_l ... A'_1 so far."""

    def __init__(self, lengths: torch.Tensor, residual: float = 0.5):
        self.lengths = torch.as_tensor(lengths)
        self.residual = residual
        self.matrix: torch.Tensor | None = None

    def update(self, layer: torch.Tensor) -> None:
        a = residual_attention(layer, self.lengths, self.residual)
        self.matrix = a if self.matrix is None else a @ self.matrix

    def relevance(self, query="mean") -> torch.Tensor:
        if self.matrix is None:
            raise ValueError("Rollout.update was never called")
        return _rows(self.matrix, self.lengths, query)


def rollout(attn: Layers, lengths: torch.Tensor, query="mean", residual: float = 0.5) -> torch.Tensor:
    r = Rollout(lengths, residual)
    for layer in _layers(attn):
        r.update(layer)
    return r.relevance(query)


def grad_rollout(attn: Layers, grads: Layers, lengths: torch.Tensor, query="mean") -> torch.Tensor:
    """Chefer et al.'s gradient-weighted rollout; ``grads`` are d(output)/d(attention), shaped as ``attn``."""
    lengths = torch.as_tensor(lengths)
    layers, gl = _layers(attn), _layers(grads)
    if len(layers) != len(gl):
        raise ValueError(f"grad_rollout: {len(layers)} attention layers but {len(gl)} gradients")
    t = layers[0].shape[-1]
    r = torch.diag_embed(_valid(lengths, t, layers[0].device).to(layers[0].dtype))
    for a, g in zip(layers, gl):
        abar = _mask((g * a).clamp_min(0).mean(1), lengths)
        r = r + abar @ r
    return _rows(r, lengths, query)


def attention_flow(
    attn: Layers, lengths: torch.Tensor, query="mean", residual: float = 0.5, max_tokens: int = 128
) -> torch.Tensor:
    """Abnar & Zuidema's attention flow (scipy's maximum flow, integer capacities scaled by ``FLOW_SCALE``).

    Nodes (l, i) for l = 0..L; edge (l-1, j) -> (l, i) with capacity A'_l[i, j]. The relevance of key j
    for query q is the maximum flow from (0, j) to (L, q); "mean" averages it over the valid query rows.
    Costs one max-flow per (query, key) pair: T^2 of them for "mean", T for one row."""
    lengths = torch.as_tensor(lengths)
    from scipy.sparse import csr_array
    from scipy.sparse.csgraph import maximum_flow

    layers = _layers(attn)
    b, t = layers[0].shape[0], layers[0].shape[-1]
    if int(lengths.max()) > max_tokens:
        raise ValueError(
            f"max_tokens: attention flow is bounded to {max_tokens} tokens and an example has {int(lengths.max())}; "
            "raise max_tokens (the cost grows as T^2 maximum flows of (L + 1) T nodes and L T^2 edges) or truncate"
        )
    res = [residual_attention(a, lengths, residual).double().cpu().numpy() for a in layers]
    out = torch.zeros(b, t, dtype=torch.float64)
    n_layers = len(res)
    for e in range(b):
        n = int(lengths[e])
        src, dst, cap = [], [], []
        for li, a in enumerate(res):
            ii, jj = np.nonzero(a[e, :n, :n])
            src.append(li * n + jj)  # (l - 1, j)
            dst.append((li + 1) * n + ii)  # (l, i)
            cap.append(np.rint(a[e, ii, jj] * FLOW_SCALE).astype(np.int64))
        size = (n_layers + 1) * n
        graph = csr_array((np.concatenate(cap), (np.concatenate(src), np.concatenate(dst))), shape=(size, size))
        graph.sum_duplicates()
        qs = list(range(n)) if query == "mean" else [_row_index(query, n)]
        flow = np.zeros(n)
        for q in qs:
            sink = n_layers * n + q
            for j in range(n):
                flow[j] += maximum_flow(graph, j, sink).flow_value / FLOW_SCALE
        out[e, :n] = torch.from_numpy(flow / len(qs))
    return out.to(layers[0].dtype).to(layers[0].device)


def _row_index(query, n: int) -> int:
    if query in ("first", "cls"):
        return 0
    if query == "last":
        return n - 1
    if isinstance(query, (int, np.integer)) and 0 <= int(query) < n:
        return int(query)
    raise ValueError(f"query: {query!r}; use 'mean', 'first', 'last' or a row index within the example")


PAGERANK_CHECK_EVERY = 16  # power-iteration steps between two convergence checks (each one a device sync)


def pagerank(
    attn: torch.Tensor,
    lengths: torch.Tensor,
    heads: Sequence[int] | None = None,
    damping: float = 0.85,
    tol: float = 1e-10,
    max_iter: int = 1000,
) -> torch.Tensor:
    """PageRank on one layer's attention graph: ``attn`` [B, H, T, T] (``heads`` averaged; all by default)
    or [B, T, T]. Transition: each row of A over the valid keys, renormalised; teleport uniform over the
    valid tokens; a row with no mass teleports. Power iteration to an L1 change below ``tol`` (read every
    ``PAGERANK_CHECK_EVERY`` steps: one host sync per check, not per step)."""
    lengths = torch.as_tensor(lengths)
    if attn.dim() == 4:
        attn = (attn if heads is None else attn[:, list(heads)]).mean(1)
    a = _mask(attn, lengths)
    t = a.shape[-1]
    valid = _valid(lengths, t, a.device).to(a.dtype)
    n = valid.sum(1, keepdim=True)
    out_mass = a.sum(-1, keepdim=True)
    p = torch.where(out_mass > 0, a / out_mass.clamp_min(torch.finfo(a.dtype).tiny), torch.zeros_like(a))
    dangling = (out_mass[..., 0] <= 0).to(a.dtype) * valid  # [B, T]
    tele = valid / n
    x = tele.clone()
    done = 0
    while done < max_iter:
        # convergence is read on the host once per PAGERANK_CHECK_EVERY steps, not once per step (issue 34):
        # a few steps past the tolerance only bring x closer to the fixed point
        for _ in range(min(PAGERANK_CHECK_EVERY, max_iter - done)):
            spread = torch.bmm(x[:, None, :], p).squeeze(1)  # x P
            dang = (x * dangling).sum(1, keepdim=True) * tele
            new = damping * (spread + dang) + (1 - damping) * tele
            new = new * valid
            prev, x = x, new / new.sum(1, keepdim=True)
            done += 1
        if (x - prev).abs().sum(1).max() < tol:
            break
    return x
