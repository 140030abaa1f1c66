"""Turn cluster labels into findings: what each cluster is, where it lives, which examples make it.

:func:`describe` reads the store chunk by chunk and returns a JSON-ready dict (it also goes into
``summary.json``) plus arrays for the figures; the contract is in ``docs/architecture.md``.

- **Signature.** Each cluster's mean of every scalar stat against the mean over all maps, in
  plain words, with the stats ranked by their standardised difference (z).
- **Where.** Occupancy: the share of head (l, h)'s maps that fall in cluster k. Each head's
  *consistency* is 1 - H(its cluster distribution across examples) / log K: 1 marks a
  fixed-pattern head, 0 an input-dependent one.
- **Exemplars.** The maps nearest the cluster's centre in the reduced space, plus seeded random
  members.
- **Examples.** Cluster against example group and label: mutual information with a p-value from
  permutations that shuffle whole examples (an example's L x H maps are not independent, so a
  chi-square over maps would overstate significance; it is reported too, as ``chi2_p_maps``).
"""

from __future__ import annotations

import math

import numpy as np

from rapids_attn.data.probe import PROBE_GROUP
from rapids_attn.store.zarr_store import decode_thumbnails, read_strings

#: Plain words for each stat; {first} and {sep} are filled with the tokenizer's own tokens.
STAT_WORDS = {
    "entropy": "attention entropy (nats)",
    "entropy_norm": "normalised entropy (0 one token, 1 uniform)",
    "first": "attends to the first token {first}",
    "sep": "attends to {sep}",
    "punct": "attends to punctuation",
    "self": "attends to itself",
    "prev": "attends to the previous token",
    "next": "attends to the next token",
    "distance": "mean attention distance (tokens)",
    "max": "row maximum",
}


def stat_labels(stat_names: list[str], tokenizer=None) -> dict[str, str]:
    first = sep = None
    if tokenizer is not None:
        first = tokenizer.cls_token or tokenizer.bos_token
        sep = " / ".join(dict.fromkeys(t for t in (tokenizer.sep_token, tokenizer.eos_token) if t))
    first = f"({first})" if first else "([CLS] / BOS)"
    sep = sep or "separator / end tokens"
    return {s: STAT_WORDS.get(s, s).format(first=first, sep=sep) for s in stat_names}


def _blocks(n: int, rows: int):
    for start in range(0, n, rows):
        yield start, min(start + rows, n)


def _mutual_info(a: np.ndarray, b: np.ndarray) -> float:
    """MI (nats) of two non-negative integer label arrays, from their contingency table."""
    na, nb = a.max() + 1, b.max() + 1
    table = np.bincount(a * nb + b, minlength=na * nb).reshape(na, nb).astype(np.float64)
    p = table / table.sum()
    pa, pb = p.sum(1, keepdims=True), p.sum(0, keepdims=True)
    nz = p > 0
    return float((p[nz] * np.log(p[nz] / (pa @ pb)[nz])).sum())


def metadata_association(labels: np.ndarray, values: np.ndarray, maps_per_example: int, permutations: int,
                         seed: int) -> dict | None:
    """How much cluster membership says about an example-level variable (group or label).

    labels: cluster per map, example-major ([examples * maps_per_example]); values: one string per
    example. Noise (-1) is left out. None when the variable has fewer than two values.
    """
    from scipy.stats import chi2_contingency

    codes, inv = np.unique(values.astype(str), return_inverse=True)
    if len(codes) < 2:
        return None
    per_map = np.repeat(inv, maps_per_example)
    keep = labels >= 0
    lab, val = labels[keep], per_map[keep]
    if len(np.unique(lab)) < 2:
        return None
    observed = _mutual_info(lab, val)
    h_lab = _mutual_info(lab, lab)
    h_val = _mutual_info(val, val)
    nmi = observed / math.sqrt(h_lab * h_val) if h_lab > 0 and h_val > 0 else 0.0
    table = np.bincount(lab * len(codes) + val, minlength=(lab.max() + 1) * len(codes)).reshape(-1, len(codes))
    table = table[table.sum(1) > 0][:, table.sum(0) > 0]
    chi2, p_maps, dof, _ = chi2_contingency(table)
    p_perm = None
    if permutations:
        rng = np.random.default_rng(seed)
        hits = 0
        for _ in range(permutations):
            shuffled = np.repeat(rng.permutation(inv), maps_per_example)[keep]
            hits += _mutual_info(lab, shuffled) >= observed - 1e-12
        p_perm = (hits + 1) / (permutations + 1)
    return {
        "mutual_info": observed, "nmi": nmi, "p_permutation": p_perm, "permutations": permutations,
        "chi2": float(chi2), "chi2_p_maps": float(p_maps), "dof": int(dof), "n_maps": int(keep.sum()),
        "n_values": int(len(codes)),
    }


def _span(layers: list[int]) -> str:
    layers = sorted(layers)
    if len(layers) > 1 and layers == list(range(layers[0], layers[-1] + 1)):
        return f"layers {layers[0]}-{layers[-1]}"
    return ("layer " if len(layers) == 1 else "layers ") + ", ".join(map(str, layers))


def describe(g, explain_cfg, seed: int = 0, tokenizer=None) -> tuple[dict, dict]:
    """Describe every cluster of a store whose learn stage is complete. Returns (dict, arrays)."""
    cl = g["cluster"]
    e, nl, nh = cl.shape
    rows = cl.chunks[0]
    per_ex = nl * nh
    layers = [int(x) for x in g["layer"][:]]
    heads = [int(x) for x in g["head"][:]]
    stat_names = [str(s) for s in g["stat"][:]]
    labels = np.asarray(cl[:], dtype=np.int64).reshape(-1)  # [maps]
    ids = sorted(int(c) for c in np.unique(labels))
    real = [c for c in ids if c >= 0]
    lut = np.zeros(max(ids) + 2, dtype=np.int64)  # cluster id (-1 = noise) -> row 0..k-1
    lut[np.asarray(ids) + 1] = np.arange(len(ids))
    k = len(ids)
    n_stats = len(stat_names)
    rng = np.random.default_rng(seed)

    # -- one chunked pass: stat sums, thumbnail sums, centres in the reduced space ----------------
    has_thumbs = "thumbnails" in g
    t = g["thumbnails"].shape[-1] if has_thumbs else 0
    stat_sum = np.zeros((k, n_stats))
    stat_sq = np.zeros(n_stats)
    thumb_sum = np.zeros((k, t, t)) if has_thumbs else None
    red = g["reduced"]
    centre = np.zeros((k, red.shape[-1]))
    counts = np.zeros(k)
    for a, b in _blocks(e, rows):
        lab = lut[labels[a * per_ex:b * per_ex] + 1]
        st = np.asarray(g["stats"][a:b], dtype=np.float64).reshape(-1, n_stats)
        np.add.at(stat_sum, lab, st)
        stat_sq += (st ** 2).sum(0)
        np.add.at(centre, lab, np.asarray(red[a:b], dtype=np.float64).reshape(-1, red.shape[-1]))
        counts += np.bincount(lab, minlength=k)
        if has_thumbs:
            np.add.at(thumb_sum, lab, decode_thumbnails(g["thumbnails"][a:b]).reshape(-1, t, t))
    n = counts.sum()
    means = stat_sum / np.maximum(counts, 1)[:, None]
    overall = stat_sum.sum(0) / n
    std = np.sqrt(np.maximum(stat_sq / n - overall ** 2, 1e-24))
    centre /= np.maximum(counts, 1)[:, None]

    # nearest-to-centre exemplars: a second chunked pass keeping the m best per cluster
    m = explain_cfg.exemplars
    n_near = max(1, m // 2)
    best: dict[int, list[tuple[float, int]]] = {c: [] for c in range(k)}
    for a, b in _blocks(e, rows):
        lab = lut[labels[a * per_ex:b * per_ex] + 1]
        z = np.asarray(red[a:b], dtype=np.float64).reshape(-1, red.shape[-1])
        dist = ((z - centre[lab]) ** 2).sum(1)
        for c in np.unique(lab):
            sel = np.flatnonzero(lab == c)
            top = sel[np.argsort(dist[sel])[:n_near]]
            best[c] = sorted(best[c] + [(float(dist[i]), a * per_ex + int(i)) for i in top])[:n_near]

    # -- occupancy and heads ---------------------------------------------------------------------
    lab_all = lut[labels + 1]
    lh = np.tile(np.arange(per_ex), e)
    occ_counts = np.bincount(lab_all * per_ex + lh, minlength=k * per_ex).reshape(k, nl, nh).astype(np.float64)
    occupancy = occ_counts / e  # share of head (l, h)'s maps in each cluster
    p = np.clip(occupancy, 1e-300, 1)
    head_entropy = -(occupancy * np.log(p)).sum(0)
    consistency = 1 - head_entropy / math.log(k) if k > 1 else np.ones((nl, nh))
    dominant = np.array(ids)[occupancy.argmax(0)]

    # -- head detectors: per-head means over the examples where each is defined ------------------
    prev_j = stat_names.index("prev") if "prev" in stat_names else None
    det_names = [str(x) for x in g["detector"][:]] if "detector" in g else []
    det_sum = np.zeros((nl, nh, 1 + len(det_names)))
    det_n = np.zeros_like(det_sum)
    for a, b in _blocks(e, rows):
        parts = [np.asarray(g["stats"][a:b, :, :, prev_j:prev_j + 1], dtype=np.float64)] if prev_j is not None else []
        if det_names:
            parts.append(np.asarray(g["detectors"][a:b], dtype=np.float64))
        if parts:
            v = np.concatenate(parts, axis=-1)
            det_sum += np.nansum(v, axis=0)
            det_n += (~np.isnan(v)).sum(0)
    with np.errstate(invalid="ignore"):
        head_det = det_sum / det_n  # NaN where no example defines the detector
    detectors = {"names": ["prev", *det_names],
                 "scores": {name: np.round(head_det[..., i], 4).tolist() for i, name in enumerate(["prev", *det_names])},
                 "examples": {name: det_n[..., i].max().astype(int).item() for i, name in enumerate(["prev", *det_names])}}

    # -- example metadata ----------------------------------------------------------------------
    groups = read_strings(g["example_group"])
    ex_labels = read_strings(g["example_label"])
    ex_of_map = np.repeat(np.arange(e), per_ex)
    warnings = []
    group_codes, group_inv = np.unique(groups, return_inverse=True)
    group_overall = np.bincount(group_inv, minlength=len(group_codes)) / e
    label_codes, label_inv = np.unique(ex_labels, return_inverse=True)

    labels_words = stat_labels(stat_names, tokenizer)
    pattern_classes = list(g.attrs.get("pattern_classes", [])) if "pattern" in g else []
    patterns = np.asarray(g["pattern"][:], dtype=np.int64).reshape(-1) if pattern_classes else None
    ex_ids = read_strings(g["example_id"])
    clusters = []
    order = sorted(range(k), key=lambda i: (ids[i] < 0, -counts[i]))
    exemplar_thumbs = np.full((k, m, t, t), np.nan, dtype=np.float32) if has_thumbs else None
    exemplar_info = []
    for pos, i in enumerate(order):
        c = ids[i]
        size = int(counts[i])
        members = np.flatnonzero(lab_all == i)
        z = (means[i] - overall) / std
        top = np.argsort(-np.abs(z))[:3]
        signature = [{"stat": stat_names[j], "label": labels_words[stat_names[j]], "mean": float(means[i, j]),
                      "overall": float(overall[j]), "z": float(z[j])} for j in top]
        share_of_cluster = occ_counts[i] / max(size, 1)
        flat = np.argsort(-share_of_cluster.reshape(-1))[:8]
        top_heads = [{"layer": layers[f // nh], "head": heads[f % nh],
                      "share_of_head": float(occupancy[i].reshape(-1)[f]),
                      "share_of_cluster": float(share_of_cluster.reshape(-1)[f])} for f in flat
                     if share_of_cluster.reshape(-1)[f] > 0]
        layer_share = share_of_cluster.sum(1)
        top_layers = [{"layer": layers[j], "share_of_cluster": float(layer_share[j])} for j in np.argsort(-layer_share)
                      if layer_share[j] > 0]
        cum, main_layers = 0.0, []
        for item in top_layers:
            main_layers.append(item["layer"])
            cum += item["share_of_cluster"]
            if cum >= 0.6 or len(main_layers) == 3:
                break
        heads_txt = ", ".join(f"L{h['layer']}-H{h['head']} ({h['share_of_head']:.0%} of its maps)" for h in top_heads[:3])
        dominant_description = f"mostly {_span(main_layers)} ({cum:.0%} of its maps); top heads {heads_txt}"

        g_counts = np.bincount(group_inv[ex_of_map[members]], minlength=len(group_codes)) / max(size, 1)
        gi = int(g_counts.argmax())
        dominated = bool(len(group_codes) > 1 and g_counts[gi] > explain_cfg.group_dominance
                         and g_counts[gi] >= 2 * group_overall[gi])
        if dominated:
            warnings.append(f"cluster {c}: {g_counts[gi]:.0%} of its maps come from group '{group_codes[gi]}' "
                            f"({group_overall[gi]:.0%} overall): a trivial cluster from shared contexts? "
                            "Consider reduce.sample_by: group")
        l_counts = np.bincount(label_inv[ex_of_map[members]], minlength=len(label_codes)) / max(size, 1)

        near = [idx for _, idx in best[i]]
        pool = np.setdiff1d(members, near)
        rand = rng.choice(pool, min(len(pool), m - len(near)), replace=False).tolist() if len(pool) else []
        picks = near + sorted(rand)
        info = [(int(f // per_ex), layers[(f % per_ex) // nh], heads[f % nh]) for f in picks]
        exemplar_info.append(info)
        if has_thumbs:
            for j, f in enumerate(picks):
                ex, r = divmod(f, per_ex)
                exemplar_thumbs[pos, j] = decode_thumbnails(g["thumbnails"][ex, r // nh, r % nh])
        pattern_share = {}
        if patterns is not None:
            pc = np.bincount(patterns[members], minlength=len(pattern_classes)) / max(size, 1)
            pattern_share = {pattern_classes[j]: float(pc[j]) for j in np.argsort(-pc) if pc[j] > 0}
        clusters.append({
            "id": c, "size": size, "share": size / n,
            "summary": (f"{next(iter(pattern_share))} pattern ({next(iter(pattern_share.values())):.0%} of its maps); "
                        if pattern_share else "")
            + "; ".join(f"{s['label']}: {s['mean']:.2f} vs {s['overall']:.2f} overall" for s in signature),
            "signature": signature,
            "means": {s: float(means[i, j]) for j, s in enumerate(stat_names)},
            "top_heads": top_heads, "top_layers": top_layers, "dominant_description": dominant_description,
            "groups": {"top": str(group_codes[gi]), "share": float(g_counts[gi]),
                       "overall_share": float(group_overall[gi]), "dominated": dominated},
            "labels": {str(lc): float(v) for lc, v in zip(label_codes, l_counts)},
            "patterns": pattern_share,
            "pattern": next(iter(pattern_share), None),
            "exemplar_examples": [{"example_index": ex, "example_id": str(ex_ids[ex]), "layer": la, "head": he}
                                  for ex, la, he in info[:explain_cfg.head_views]],
        })
    occ_sorted = occupancy[order].astype(np.float32)
    # probes (repeated random tokens) are not dataset examples: they would make their own "group"
    # and "label" look associated with the clusters, so the metadata tests leave them out
    real_ex = groups != PROBE_GROUP
    real_maps = np.repeat(real_ex, per_ex)
    meta = {
        "label": metadata_association(labels[real_maps], ex_labels[real_ex], per_ex, explain_cfg.permutations, seed),
        "group": metadata_association(labels[real_maps], groups[real_ex], per_ex, explain_cfg.permutations, seed),
        "probe_examples_excluded": int((~real_ex).sum()),
    }
    samp = rng.choice(len(labels), min(len(labels), explain_cfg.scatter_sample), replace=False)
    samp.sort()
    coords = np.asarray(g["coords"][:], dtype=np.float32).reshape(-1, 2)
    arrays = {
        "mean_thumbs": (thumb_sum[order] / np.maximum(counts[order], 1)[:, None, None]).astype(np.float32)
        if has_thumbs else None,
        "exemplar_thumbs": exemplar_thumbs,
        "exemplar_info": exemplar_info,
        "occupancy": occ_sorted,
        "scatter": {"x": coords[samp, 0], "y": coords[samp, 1], "cluster": labels[samp].astype(np.int32),
                    "layer": np.asarray(layers, dtype=np.int16)[(samp % per_ex) // nh]},
    }
    d = {
        "layers": layers, "heads": heads, "stat_names": stat_names, "stat_labels": labels_words,
        "global_means": {s: float(overall[j]) for j, s in enumerate(stat_names)},
        "clusters": clusters,
        "heads_table": {"dominant_cluster": dominant.tolist(), "consistency": consistency.round(4).tolist()},
        "metadata": meta,
        "warnings": warnings,
        "k_sweep": dict(g.attrs.get("learn", {})).get("k_sweep"),
        "detectors": detectors,
    }
    arrays["head_detectors"] = head_det.astype(np.float32)  # [layer, head, detector]
    return d, arrays
