"""Dataset-level answers from per-example token relevance (the relevance stage's result).

- **Where relevance goes**: per method and per token role (the question, the context, special tokens,
  punctuation, the gold answer span), the share of an example's relevance that falls on the role's
  tokens, averaged over the examples that have such tokens, with a 95% t interval, beside the share of
  the tokens the role holds (what a uniform relevance would give) and their ratio, the *lift*.
- **How the methods disagree**: per pair of methods, Spearman's rank correlation of the two relevance
  vectors over each example's tokens, summarised over the examples (mean, quartiles).
- **The head atlas**: coordinates, clusters and related heads from :mod:`.atlas`, each head joined to
  its dominant map cluster where the learn stage ran.
"""

from __future__ import annotations

import math

import numpy as np

from rapids_attn.relevance.work import ANSWER, PUNCT, SECOND, SPECIAL


def role_masks(roles: np.ndarray, lengths: np.ndarray, pairs: bool) -> dict[str, np.ndarray]:
    """roles [N, T] bit flags -> {role: [N, T] bool} over the valid tokens."""
    valid = np.arange(roles.shape[1])[None, :] < lengths[:, None]
    special = (roles & SPECIAL) > 0
    out = {"special": special & valid, "punct": ((roles & PUNCT) > 0) & valid}
    if pairs:
        second = (roles & SECOND) > 0
        out["question"] = valid & ~special & ~second
        out["context"] = valid & ~special & second
        out["answer"] = ((roles & ANSWER) > 0) & valid
    return out


def _mean_ci(x: np.ndarray) -> tuple[float, float, float]:
    from rapids_attn.heads.metrics import mean_ci

    return mean_ci(np.asarray(x, np.float64))


def role_shares(relevance: np.ndarray, roles: np.ndarray, lengths: np.ndarray, methods, pairs: bool) -> dict:
    """{method: {role: {share, lo, hi, token_share, lift, examples}}}; relevance [N, M, T] (NaN padded)."""
    masks = role_masks(roles, lengths, pairs)
    valid = np.arange(roles.shape[1])[None, :] < lengths[:, None]
    out: dict = {}
    for mi, m in enumerate(methods):
        r = np.where(valid, np.nan_to_num(relevance[:, mi], nan=0.0), 0.0)
        total = r.sum(1)
        defined = np.isfinite(relevance[:, mi]).sum(1) == lengths  # flow is NaN where it was skipped
        ok = defined & (total > 0)
        per = {}
        for role, mask in masks.items():
            has = ok & mask.any(1)
            if not has.any():
                continue
            share = (r * mask).sum(1)[has] / total[has]
            tok = mask.sum(1)[has] / lengths[has]
            mean, lo, hi = _mean_ci(share)
            token_share = float(tok.mean())
            per[role] = {
                "share": mean,
                "lo": lo,
                "hi": hi,
                "token_share": token_share,
                "lift": mean / token_share if token_share > 0 else math.nan,
                "examples": int(has.sum()),
            }
        out[m] = per
    return out


def disagreement(relevance: np.ndarray, lengths: np.ndarray, methods) -> dict:
    """{"a vs b": {mean, q25, median, q75, examples}}: Spearman's rho of two methods' relevance per example."""
    from scipy.stats import spearmanr

    out = {}
    for i in range(len(methods)):
        for j in range(i + 1, len(methods)):
            rho = []
            for e, n in enumerate(lengths):
                a, b = relevance[e, i, :n], relevance[e, j, :n]
                if n < 3 or not (np.isfinite(a).all() and np.isfinite(b).all()) or a.std() == 0 or b.std() == 0:
                    continue
                rho.append(float(spearmanr(a, b).statistic))
            if rho:
                q = np.percentile(rho, [25, 50, 75])
                out[f"{methods[i]} vs {methods[j]}"] = {
                    "mean": float(np.mean(rho)),
                    "q25": float(q[0]),
                    "median": float(q[1]),
                    "q75": float(q[2]),
                    "examples": len(rho),
                }
    return out


def dominant_map_cluster(cluster: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cluster [E, L, H] (learn stage; -1 noise) -> (dominant cluster [L*H], its share of the head's maps)."""
    n_layers, n_heads = cluster.shape[1], cluster.shape[2]
    dom = np.full(n_layers * n_heads, -1, np.int64)
    share = np.zeros(n_layers * n_heads)
    for layer in range(n_layers):
        for head in range(n_heads):
            lab = cluster[:, layer, head]
            lab = lab[lab >= 0]
            if len(lab):
                values, counts = np.unique(lab, return_counts=True)
                k = int(np.argmax(counts))
                dom[layer * n_heads + head], share[layer * n_heads + head] = int(values[k]), counts[k] / len(lab)
    return dom, share


def atlas_summary(
    distance: np.ndarray,
    n_heads: int,
    n_clusters: int,
    related: int,
    seed: int,
    map_cluster: np.ndarray | None = None,
) -> tuple[dict, np.ndarray, np.ndarray]:
    """(the atlas as JSON, coordinates [N, 2], clusters [N]) for heads indexed layer * n_heads + head."""
    from rapids_attn.relevance.atlas import cluster_heads, embed_heads, related_heads

    xy = embed_heads(distance, seed)
    labels = cluster_heads(distance, n_clusters)
    near = related_heads(distance, related)
    dom = share = None
    if map_cluster is not None:
        dom, share = dominant_map_cluster(map_cluster)
    heads = []
    for i in range(len(distance)):
        row = {
            "layer": i // n_heads,
            "head": i % n_heads,
            "x": float(xy[i, 0]),
            "y": float(xy[i, 1]),
            "atlas_cluster": int(labels[i]),
            "related": [[int(j // n_heads), int(j % n_heads), float(distance[i, j])] for j in near[i]],
        }
        if dom is not None:
            row["map_cluster"], row["map_cluster_share"] = int(dom[i]), float(share[i])
        heads.append(row)
    groups = {}
    for c in sorted(set(labels.tolist())):
        members = np.flatnonzero(labels == c)
        inner = distance[np.ix_(members, members)]
        groups[str(c)] = {
            "heads": [[int(j // n_heads), int(j % n_heads)] for j in members],
            "mean_distance": float(inner[np.triu_indices(len(members), 1)].mean()) if len(members) > 1 else 0.0,
        }
    off = distance[np.triu_indices(len(distance), 1)]
    info = {
        "distance": "mean Jensen-Shannon divergence (nats) between two heads' attention rows on the same token",
        "mean_distance": float(off.mean()) if off.size else 0.0,
        "clusters": groups,
        "heads": heads,
    }
    return info, xy, labels
