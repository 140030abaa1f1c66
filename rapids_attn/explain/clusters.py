"""One cluster in words and numbers: what sets it apart, where it lives, which examples make it.

:func:`describe <rapids_attn.explain.describe.describe>` reads the store in chunked passes
(:mod:`rapids_attn.explain.describe`) and hands each cluster's totals here; :func:`describe_cluster`
turns them into a :class:`~rapids_attn.explain.findings.ClusterFinding`, and :func:`exemplar_picks`
chooses the maps shown as its exemplars. Nothing here reads the store: these are pure functions of
describe's per-cluster arrays, kept apart so that describe.py holds the passes and this module the
wording of one cluster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rapids_attn.explain.findings import ClusterFinding, ExemplarRef, GroupShare, HeadShare, LayerShare, SignatureItem

if TYPE_CHECKING:
    from rapids_attn.explain.describe import Examples, Maps, Sums


def _span(layers: list[int]) -> str:
    layers = sorted(layers)
    if len(layers) > 1 and layers == list(range(layers[0], layers[-1] + 1)):
        return f"layers {layers[0]}-{layers[-1]}"
    return ("layer " if len(layers) == 1 else "layers ") + ", ".join(map(str, layers))


def _signature(i: int, maps: Maps, sums: Sums, words: dict[str, str]) -> list[SignatureItem]:
    """The three stats whose cluster mean differs most from the overall mean, in standard deviations
    (a stat that no map of the cluster defines has no z and is never among them)."""
    z = (sums.means[i] - sums.overall) / sums.std
    order = [j for j in np.argsort(-np.abs(z)) if np.isfinite(z[j])]
    return [
        SignatureItem(
            stat=maps.stat_names[j],
            label=words[maps.stat_names[j]],
            mean=float(sums.means[i, j]),
            overall=float(sums.overall[j]),
            z=float(z[j]),
        )
        for j in order[:3]
    ]


def _where(maps: Maps, occ_counts: np.ndarray, occupancy: np.ndarray, size: int):
    """The cluster's top heads and layers, and a sentence naming the layers that hold most of it."""
    nh = maps.n_heads
    share_of_cluster = occ_counts / max(size, 1)
    flat_share, flat_occ = share_of_cluster.reshape(-1), occupancy.reshape(-1)
    top_heads = [
        HeadShare(
            layer=maps.layers[f // nh],
            head=maps.heads[f % nh],
            share_of_head=float(flat_occ[f]),
            share_of_cluster=float(flat_share[f]),
        )
        for f in np.argsort(-flat_share)[:8]
        if flat_share[f] > 0
    ]
    layer_share = share_of_cluster.sum(1)
    top_layers = [
        LayerShare(layer=maps.layers[j], share_of_cluster=float(layer_share[j]))
        for j in np.argsort(-layer_share)
        if layer_share[j] > 0
    ]
    cum, main_layers = 0.0, []
    for item in top_layers:  # the biggest layers until they hold 60% of the cluster, at most three
        main_layers.append(item.layer)
        cum += item.share_of_cluster
        if cum >= 0.6 or len(main_layers) == 3:
            break
    heads_txt = ", ".join(f"L{h.layer}-H{h.head} ({h.share_of_head:.0%} of its maps)" for h in top_heads[:3])
    return top_heads, top_layers, f"mostly {_span(main_layers)} ({cum:.0%} of its maps); top heads {heads_txt}"


def _composition(members: np.ndarray, ex: Examples, group_dominance: float):
    """Shares of the cluster's maps by example group (the top one), by label, and by pattern type."""
    size = max(len(members), 1)
    of_ex = ex.of_map[members]
    g_counts = np.bincount(ex.group_inv[of_ex], minlength=len(ex.group_codes)) / size
    gi = int(g_counts.argmax())
    dominated = bool(
        len(ex.group_codes) > 1 and g_counts[gi] > group_dominance and g_counts[gi] >= 2 * ex.group_overall[gi]
    )
    groups = GroupShare(
        top=str(ex.group_codes[gi]),
        share=float(g_counts[gi]),
        overall_share=float(ex.group_overall[gi]),
        dominated=dominated,
    )
    l_counts = np.bincount(ex.label_inv[of_ex], minlength=len(ex.label_codes)) / size
    labels = {str(lc): float(v) for lc, v in zip(ex.label_codes, l_counts)}
    patterns: dict[str, float] = {}
    if ex.patterns is not None:
        pc = np.bincount(ex.patterns[members], minlength=len(ex.pattern_classes)) / size
        patterns = {ex.pattern_classes[j]: float(pc[j]) for j in np.argsort(-pc) if pc[j] > 0}
    return groups, labels, patterns


def exemplar_picks(members: np.ndarray, near: list[int], m: int, rng: np.random.Generator) -> list[int]:
    """The maps nearest the centre, then seeded random members (sorted) up to m in all."""
    pool = np.setdiff1d(members, near)
    rand = rng.choice(pool, min(len(pool), m - len(near)), replace=False).tolist() if len(pool) else []
    return near + sorted(rand)


def describe_cluster(
    i: int,
    members: np.ndarray,
    maps: Maps,
    sums: Sums,
    occ: tuple[np.ndarray, np.ndarray],
    ex: Examples,
    words: dict[str, str],
    cfg,
    refs: list[ExemplarRef],
) -> ClusterFinding:
    """Cluster row i (its maps: members) in words and numbers. occ: its maps per head and its share of
    each head's maps."""
    size = int(sums.counts[i])
    signature = _signature(i, maps, sums, words)
    top_heads, top_layers, where = _where(maps, occ[0], occ[1], size)
    groups, labels, patterns = _composition(members, ex, cfg.group_dominance)
    pattern = next(iter(patterns), None)
    summary = (f"{pattern} pattern ({patterns[pattern]:.0%} of its maps); " if patterns else "") + "; ".join(
        f"{s.label}: {s.mean:.2f} vs {s.overall:.2f} overall" for s in signature
    )
    share = float(size / sums.counts.sum())
    if maps.ids[i] == -1:  # the noise of DBSCAN / HDBSCAN is no cluster: say so, above all when it is every map
        summary = (
            "every map is noise: the clusterer found no clusters, so this describes all maps together "
            "(see the warnings); "
            if size == sums.counts.sum()
            else "noise: maps the clusterer left out of every cluster; "
        ) + summary
    return ClusterFinding(
        id=maps.ids[i],
        size=size,
        share=share,
        summary=summary,
        signature=signature,
        means={s: float(sums.means[i, j]) for j, s in enumerate(maps.stat_names)},
        top_heads=top_heads,
        top_layers=top_layers,
        dominant_description=where,
        groups=groups,
        labels=labels,
        patterns=patterns,
        pattern=pattern,
        exemplar_examples=refs[: cfg.head_views],
    )
