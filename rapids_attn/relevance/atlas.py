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


JS_BLOCK_BYTES = 64 << 20  # the most one block's [R, k, N, T] temporary may take: k heads at a time


def js_sums(
    attn: torch.Tensor, lengths: torch.Tensor, block_bytes: int = JS_BLOCK_BYTES
) -> tuple[torch.Tensor, torch.Tensor]:
    """attn [B, N, T, T] (N heads, any layers; rows are queries), lengths [B] -> (sums [N, N] float64:
    the Jensen-Shannon divergence of each pair of heads summed over the valid query rows, rows: how many
    rows were summed, a 0-d int64 tensor), both on ``attn``'s device: nothing here waits for the device.
    Padded keys must carry no mass (as a padding mask makes them); padded query rows (past each example's
    length) are set to zero by a row mask, whatever they held (NaN and inf included), and a zero row adds
    exactly 0 (0 log 0 = 0). Heads are paired k at a time against all the later ones, k as large as keeps
    the [R, k, N, T] temporary under ``block_bytes`` (at least 1)."""
    n, t = attn.shape[1], attn.shape[-1]
    rows = torch.arange(t, device=attn.device)[None, :] < lengths.to(attn.device)[:, None]  # [B, T]
    a = torch.where(rows[:, :, None, None], attn.transpose(1, 2), attn.new_zeros(()))  # [B, T, N, T]
    a = a if a.dtype == torch.float64 else a.float()  # float32 maps stay float32: half the memory
    a = a.reshape(-1, n, t)  # [R, N, T]: every query row of every example, all heads; padded rows 0
    neg_h = _xlogx(a).sum(-1)  # [R, N]: -entropy of each head's row
    k = max(1, min(n, block_bytes // max(1, a.shape[0] * n * t * a.element_size())))
    out = torch.zeros(n, n, dtype=torch.float64, device=a.device)
    for i in range(0, n, k):
        j = min(i + k, n)
        m = 0.5 * (a[:, i:j, None] + a[:, None, i:])  # [R, j - i, N - i, T]
        js = 0.5 * (neg_h[:, i:j, None] + neg_h[:, None, i:]) - _xlogx(m).sum(-1)  # H(M) - (H(P) + H(Q)) / 2
        s = js.clamp_min(0.0).sum(0, dtype=torch.float64)  # [j - i, N - i]
        out[i:j, i:] = s
        out[i:, i:j] = s.T
    out.fill_diagonal_(0.0)
    return out, rows.sum()


class HeadDistance:
    """Accumulate Clark et al.'s head distance over batches: ``update(layers, lengths)`` with the
    per-layer maps of one batch ([L] x [B, H, T, T]); ``distance`` is the [L*H, L*H] mean JS
    divergence (head index = layer * H + head). The sums and the row count stay on the maps' device
    until ``sums``, ``rows`` or ``distance`` is read: one copy to the host per task, not per batch."""

    def __init__(self):
        self._sums: torch.Tensor | None = None
        self._rows: torch.Tensor | None = None
        self._host: tuple[np.ndarray | None, int] | None = None

    def update(self, layers: list[torch.Tensor], lengths: torch.Tensor) -> None:
        attn = torch.cat([a for a in layers], 1)  # [B, L*H, T, T]
        s, r = js_sums(attn, lengths)
        self._add(s, r)

    def _add(self, s: torch.Tensor, r: torch.Tensor) -> None:
        if self._sums is None:
            self._sums, self._rows = s.clone(), r.clone()
        else:
            self._sums = self._sums + s.to(self._sums.device)
            self._rows = self._rows + r.to(self._rows.device)
        self._host = None

    def _to_host(self) -> tuple[np.ndarray | None, int]:
        if self._host is None:
            if self._sums is None:
                self._host = (None, 0)
            else:  # sums and count in one copy
                both = torch.cat([self._sums.reshape(-1), self._rows.reshape(1).to(torch.float64)]).cpu().numpy()
                self._host = (both[:-1].reshape(self._sums.shape), int(both[-1]))
        return self._host

    @property
    def sums(self) -> np.ndarray | None:
        return self._to_host()[0]

    @property
    def rows(self) -> int:
        return self._to_host()[1]

    def merge(self, other: HeadDistance) -> None:
        if other._sums is not None:
            self._add(other._sums, other._rows)

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
