"""A map of the heads themselves (issue 15's head atlas).

**Distance between heads** (Clark, Khandelwal, Levy & Manning 2019, "What does BERT look at?",
section 6): two heads are close when, on the same token of the same input, they spread their
attention alike. For heads i and j and a query row t of example x,

    JS(A_i[x, t, :], A_j[x, t, :]) = H(M) - (H(A_i) + H(A_j)) / 2,   M = (A_i + A_j) / 2,

in nats (H is the Shannon entropy, 0 log 0 = 0; it lies in [0, ln 2]). The distance is its mean
over every non-padding query row of every example ("averaged over tokens and examples"; Clark et
al. sum over the tokens of an example, which weighs long inputs more). :class:`HeadDistance`
accumulates the sums batch by batch, so the dataset never has to be held at once.

**The atlas**: the distance matrix embedded in 2-D by metric MDS on the precomputed
dissimilarities (scikit-learn), the heads clustered by average-linkage agglomerative clustering on
the same matrix, and each head's nearest heads ("related heads").
"""

from __future__ import annotations

import inspect

import numpy as np
import torch


def _xlogx(p: torch.Tensor) -> torch.Tensor:
    """p log p, 0 where p = 0: one fused kernel (``torch.xlogy``), the JS loop's inner cost."""
    return torch.xlogy(p, p)


def js_sums(attn: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, int]:
    """attn [B, N, T, T] (N heads, any layers; rows are queries), lengths [B] -> (sums [N, N] float64:
    the Jensen-Shannon divergence of each pair of heads summed over the valid query rows, rows: how many
    rows were summed). Padded keys must carry no mass (as a padding mask makes them); padded query rows
    (past each example's length) are never read, whatever they hold: the valid rows are gathered once,
    [B, N, T, T] -> [R, N, T], and only they enter the pairwise loop."""
    n, t = attn.shape[1], attn.shape[-1]
    rows = torch.arange(t, device=attn.device)[None, :] < lengths.to(attn.device)[:, None]  # [B, T]
    a = attn.transpose(1, 2)[rows]  # [R, N, T]: each valid query row of each example, all heads
    a = a if a.dtype == torch.float64 else a.float()  # float32 maps stay float32: half the memory
    neg_h = _xlogx(a).sum(-1)  # [R, N]: -entropy of each head's row
    out = torch.zeros(n, n, dtype=torch.float64, device=a.device)
    for i in range(n):
        m = 0.5 * (a[:, i : i + 1] + a[:, i:])  # [R, N - i, T]
        js = 0.5 * (neg_h[:, i : i + 1] + neg_h[:, i:]) - _xlogx(m).sum(-1)  # H(M) - (H(P) + H(Q)) / 2
        s = js.clamp_min(0.0).sum(0, dtype=torch.float64)  # [N - i]
        out[i, i:] = s
        out[i:, i] = s
    out.fill_diagonal_(0.0)
    return out, a.shape[0]


class HeadDistance:
    """Accumulate Clark et al.'s head distance over batches: ``update(layers, lengths)`` with the
    per-layer maps of one batch ([L] x [B, H, T, T]); ``distance`` is the [L*H, L*H] mean JS
    divergence (head index = layer * H + head)."""

    def __init__(self):
        self.sums: np.ndarray | None = None
        self.rows = 0

    def update(self, layers: list[torch.Tensor], lengths: torch.Tensor) -> None:
        attn = torch.cat([a for a in layers], 1)  # [B, L*H, T, T]
        s, r = js_sums(attn, lengths)
        s = s.cpu().numpy()
        self.sums = s if self.sums is None else self.sums + s
        self.rows += r

    def merge(self, other: HeadDistance) -> None:
        if other.sums is None:
            return
        self.sums = other.sums.copy() if self.sums is None else self.sums + other.sums
        self.rows += other.rows

    @property
    def distance(self) -> np.ndarray:
        if self.sums is None or self.rows == 0:
            raise ValueError("no rows were accumulated")
        return self.sums / self.rows


def embed_heads(distance: np.ndarray, seed: int = 0) -> np.ndarray:
    """[N, N] distances -> [N, 2] coordinates by metric MDS on the precomputed dissimilarities."""
    from sklearn.manifold import MDS

    params = inspect.signature(MDS).parameters
    if "metric_mds" in params:  # scikit-learn >= 1.8
        mds = MDS(n_components=2, metric="precomputed", init="classical_mds", random_state=seed)
    else:
        mds = MDS(n_components=2, dissimilarity="precomputed", n_init=4, random_state=seed)
    return np.asarray(mds.fit_transform(_symmetric(distance)), dtype=np.float64)


def cluster_heads(distance: np.ndarray, n_clusters: int) -> np.ndarray:
    """[N, N] distances -> [N] cluster labels: average-linkage agglomerative clustering."""
    from sklearn.cluster import AgglomerativeClustering

    n_clusters = int(min(max(n_clusters, 1), len(distance)))
    if n_clusters == 1:
        return np.zeros(len(distance), dtype=np.int64)
    model = AgglomerativeClustering(n_clusters=n_clusters, metric="precomputed", linkage="average")
    return model.fit_predict(_symmetric(distance)).astype(np.int64)


def related_heads(distance: np.ndarray, k: int = 5) -> np.ndarray:
    """[N, N] distances -> [N, k] indices of each head's k nearest other heads, nearest first (ties by index)."""
    d = _symmetric(distance).copy()
    np.fill_diagonal(d, np.inf)
    k = min(k, len(d) - 1)
    return np.argsort(d, axis=1, kind="stable")[:, :k]


def _symmetric(distance: np.ndarray) -> np.ndarray:
    d = np.asarray(distance, dtype=np.float64)
    if d.ndim != 2 or d.shape[0] != d.shape[1]:
        raise ValueError(f"a head distance matrix is square; got shape {d.shape}")
    d = 0.5 * (d + d.T)
    np.fill_diagonal(d, 0.0)
    return d
