"""Turn cluster labels into findings: what each cluster is, where it lives, which examples make it.

:func:`describe` reads the store chunk by chunk and returns :class:`~rapids_attn.explain.findings.Findings`
(whose ``to_dict()`` goes into ``summary.json``) plus :class:`~rapids_attn.explain.findings.FigureArrays`
for the report's figures. This module holds the passes over the store and the assembly; each
cluster's wording is :mod:`rapids_attn.explain.clusters`, the metadata tests :mod:`rapids_attn.explain.metadata`.

- **Signature.** Each cluster's mean of every scalar stat against the mean over all maps, in
  plain words, with the stats ranked by their standardised difference (z).
- **Where.** Occupancy: the share of head (l, h)'s maps that fall in cluster k. Each head's
  *consistency* is 1 - H(its cluster distribution across examples) / log K: 1 marks a
  fixed-pattern head, 0 an input-dependent one.
- **Exemplars.** The maps nearest the cluster's centre in the reduced space, plus seeded random
  members.
- **Examples.** Cluster against example group and label (:mod:`rapids_attn.explain.metadata`):
  mutual information with a p-value from permutations that shuffle whole examples.

The store is read in its own chunks (whole shards of examples), so memory is bounded by a few
arrays of one value per map, never by the features or thumbnails of the whole store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rapids_attn.explain.clusters import describe_cluster, exemplar_picks
from rapids_attn.explain.findings import (
    ExemplarRef,
    FigureArrays,
    Findings,
    HeadDetectors,
    HeadTable,
    KSweep,
    ScatterSample,
)
from rapids_attn.explain.metadata import dominance_warning, metadata_association, metadata_findings
from rapids_attn.store import schema as S
from rapids_attn.store.zarr_store import decode_thumbnails

# metadata_association lives in explain.metadata; it is named here too, where callers have long found it
__all__ = ["STAT_WORDS", "describe", "metadata_association", "stat_labels"]

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
    """Each stat in plain words, naming the tokenizer's own first and separator tokens where it has them."""
    first = sep = None
    if tokenizer is not None:
        first = tokenizer.cls_token or tokenizer.bos_token
        sep = " / ".join(dict.fromkeys(t for t in (tokenizer.sep_token, tokenizer.eos_token) if t))
    first = f"({first})" if first else "([CLS] / BOS)"
    sep = sep or "separator / end tokens"
    return {s: STAT_WORDS.get(s, s).format(first=first, sep=sep) for s in stat_names}


# ---------------------------------------------------------------------------------------------
# reading the store


@dataclass
class Maps:
    """The clustered store's shape and every map's cluster, flat in store order (example-major)."""

    n_examples: int
    n_layers: int
    n_heads: int
    chunk: int  # examples per chunk of the cluster array: the passes read this many at a time
    layers: list[int]
    heads: list[int]
    stat_names: list[str]
    labels: np.ndarray  # [maps] int64: cluster id, -1 noise
    ids: list[int]  # the cluster ids present, sorted (noise first when present)
    row: np.ndarray  # [maps] int64: the map's cluster as a row 0..k-1 of ids

    @property
    def k(self) -> int:
        return len(self.ids)

    @property
    def per_ex(self) -> int:
        return self.n_layers * self.n_heads

    def rows_of(self, a: int, b: int) -> np.ndarray:
        """Cluster rows of the maps of examples a..b-1."""
        return self.row[a * self.per_ex : b * self.per_ex]

    def blocks(self):
        for start in range(0, self.n_examples, self.chunk):
            yield start, min(start + self.chunk, self.n_examples)


def _read_maps(g) -> Maps:
    cl = g[S.CLUSTER]
    e, nl, nh = cl.shape
    labels = np.asarray(cl[:], dtype=np.int64).reshape(-1)
    ids = sorted(int(c) for c in np.unique(labels))
    lut = np.zeros(max(ids) + 2, dtype=np.int64)  # cluster id (-1 = noise) -> row 0..k-1
    lut[np.asarray(ids) + 1] = np.arange(len(ids))
    return Maps(
        n_examples=e,
        n_layers=nl,
        n_heads=nh,
        chunk=cl.chunks[0],
        layers=[int(x) for x in g[S.LAYER][:]],
        heads=[int(x) for x in g[S.HEAD][:]],
        stat_names=[str(s) for s in g[S.STAT][:]],
        labels=labels,
        ids=ids,
        row=lut[labels + 1],
    )


@dataclass
class Sums:
    """Per-cluster totals from the accumulation pass."""

    counts: np.ndarray  # [k] maps
    means: np.ndarray  # [k, stat]
    overall: np.ndarray  # [stat] mean over all maps
    std: np.ndarray  # [stat] over all maps
    centre: np.ndarray  # [k, component] mean in the reduced space
    thumb_sum: np.ndarray | None  # [k, t, t]; None without thumbnails


def _accumulate(g, maps: Maps) -> Sums:
    """One chunked pass: stat sums and squares, thumbnail sums, and centres in the reduced space."""
    k, n_stats = maps.k, len(maps.stat_names)
    has_thumbs = S.THUMBNAILS in g
    t = g[S.THUMBNAILS].shape[-1] if has_thumbs else 0
    stat_sum = np.zeros((k, n_stats))
    stat_n = np.zeros((k, n_stats))  # maps where each stat is defined (NaN: a one-token map's prev, next ...)
    stat_sq = np.zeros(n_stats)
    thumb_sum = np.zeros((k, t, t)) if has_thumbs else None
    red = g[S.REDUCED]
    centre = np.zeros((k, red.shape[-1]))
    counts = np.zeros(k)
    for a, b in maps.blocks():
        lab = maps.rows_of(a, b)
        st = np.asarray(g[S.STATS][a:b], dtype=np.float64).reshape(-1, n_stats)
        defined = ~np.isnan(st)
        st = np.where(defined, st, 0.0)
        np.add.at(stat_sum, lab, st)
        np.add.at(stat_n, lab, defined)
        stat_sq += (st**2).sum(0)
        np.add.at(centre, lab, np.asarray(red[a:b], dtype=np.float64).reshape(-1, red.shape[-1]))
        counts += np.bincount(lab, minlength=k)
        if has_thumbs:
            np.add.at(thumb_sum, lab, decode_thumbnails(g[S.THUMBNAILS][a:b]).reshape(-1, t, t))
    n = stat_n.sum(0)  # [stat]
    with np.errstate(invalid="ignore", divide="ignore"):  # a stat defined on no map (of a cluster) is NaN
        overall = stat_sum.sum(0) / n
        means = stat_sum / stat_n
        std = np.sqrt(np.maximum(stat_sq / n - overall**2, 1e-24))
    return Sums(
        counts=counts,
        means=means,
        overall=overall,
        std=std,
        centre=centre / np.maximum(counts, 1)[:, None],
        thumb_sum=thumb_sum,
    )


def _nearest(g, maps: Maps, centre: np.ndarray, n_near: int) -> dict[int, list[int]]:
    """A second chunked pass: per cluster row, the n_near maps (flat indices) nearest its centre, nearest first."""
    red = g[S.REDUCED]
    best: dict[int, list[tuple[float, int]]] = {c: [] for c in range(maps.k)}
    for a, b in maps.blocks():
        lab = maps.rows_of(a, b)
        z = np.asarray(red[a:b], dtype=np.float64).reshape(-1, red.shape[-1])
        dist = ((z - centre[lab]) ** 2).sum(1)
        for c in np.unique(lab):
            sel = np.flatnonzero(lab == c)
            top = sel[np.argsort(dist[sel])[:n_near]]
            best[int(c)] = sorted(best[int(c)] + [(float(dist[i]), a * maps.per_ex + int(i)) for i in top])[:n_near]
    return {c: [idx for _, idx in v] for c, v in best.items()}


def _occupancy(maps: Maps) -> tuple[np.ndarray, np.ndarray, HeadTable]:
    """Maps per (cluster, layer, head), each head's share in each cluster, and the per-head table."""
    k, per_ex = maps.k, maps.per_ex
    lh = np.tile(np.arange(per_ex), maps.n_examples)
    shape = (k, maps.n_layers, maps.n_heads)
    occ_counts = np.bincount(maps.row * per_ex + lh, minlength=k * per_ex).reshape(shape).astype(np.float64)
    occupancy = occ_counts / maps.n_examples  # share of head (l, h)'s maps in each cluster
    p = np.clip(occupancy, 1e-300, 1)
    head_entropy = -(occupancy * np.log(p)).sum(0)
    consistency = 1 - head_entropy / math.log(k) if k > 1 else np.ones(shape[1:])
    dominant = np.array(maps.ids)[occupancy.argmax(0)]
    return occ_counts, occupancy, HeadTable(dominant_cluster=dominant, consistency=consistency.round(4))


def _head_detectors(g, maps: Maps) -> tuple[HeadDetectors, np.ndarray]:
    """Per-head means of each of the store's detectors over the examples where it is defined (NaN: none;
    TransformerLens's scores are defined on every example, the conditional ones where a row has a target).

    Returns the rounded findings and the unrounded [layer, head, detector] float32 array for the store.
    """
    names = [str(x) for x in g[S.DETECTOR][:]] if S.DETECTOR in g else []
    det_sum = np.zeros((maps.n_layers, maps.n_heads, len(names)))
    det_n = np.zeros_like(det_sum)
    if names:
        for a, b in maps.blocks():
            v = np.asarray(g[S.DETECTORS][a:b], dtype=np.float64)
            det_sum += np.nansum(v, axis=0)
            det_n += (~np.isnan(v)).sum(0)
    with np.errstate(invalid="ignore"):
        head_det = det_sum / det_n  # NaN where no example defines the detector
    found = HeadDetectors(
        names=names,
        scores={name: np.round(head_det[..., i], 4) for i, name in enumerate(names)},
        examples={name: det_n[..., i].max().astype(int).item() for i, name in enumerate(names)},
    )
    return found, head_det.astype(np.float32)


@dataclass
class Examples:
    """Example-level metadata, and each map's example and pattern type."""

    ids: np.ndarray  # [examples] str
    groups: np.ndarray  # [examples] str
    labels: np.ndarray  # [examples] str
    group_codes: np.ndarray  # the distinct groups, sorted
    group_inv: np.ndarray  # [examples] index into group_codes
    group_overall: np.ndarray  # [group] share of all examples (so of all maps)
    label_codes: np.ndarray
    label_inv: np.ndarray
    of_map: np.ndarray  # [maps] the example of each map
    pattern_classes: list[str]  # pattern-cnn's types; [] without it
    patterns: np.ndarray | None  # [maps] index into pattern_classes


def _examples(g, maps: Maps) -> Examples:
    groups = S.read_strings(g[S.EXAMPLE_GROUP])
    labels = S.read_strings(g[S.EXAMPLE_LABEL])
    group_codes, group_inv = np.unique(groups, return_inverse=True)
    label_codes, label_inv = np.unique(labels, return_inverse=True)
    pattern_classes = [str(c) for c in g.attrs.get(S.Attr.PATTERN_CLASSES, [])] if S.PATTERN in g else []
    return Examples(
        ids=S.read_strings(g[S.EXAMPLE_ID]),
        groups=groups,
        labels=labels,
        group_codes=group_codes,
        group_inv=group_inv,
        group_overall=np.bincount(group_inv, minlength=len(group_codes)) / maps.n_examples,
        label_codes=label_codes,
        label_inv=label_inv,
        of_map=np.repeat(np.arange(maps.n_examples), maps.per_ex),
        pattern_classes=pattern_classes,
        patterns=np.asarray(g[S.PATTERN][:], dtype=np.int64).reshape(-1) if pattern_classes else None,
    )


# ---------------------------------------------------------------------------------------------
# the figures' arrays, and the whole


def _exemplar_thumbs(g, maps: Maps, picks: list[list[int]], m: int) -> np.ndarray | None:
    """[cluster, m, t, t] thumbnails of the picked maps, NaN in unused slots; None without thumbnails."""
    if S.THUMBNAILS not in g:
        return None
    thumbs = g[S.THUMBNAILS]
    t = thumbs.shape[-1]
    out = np.full((len(picks), m, t, t), np.nan, dtype=np.float32)
    for pos, flat in enumerate(picks):
        for j, f in enumerate(flat):
            ex, r = divmod(f, maps.per_ex)
            out[pos, j] = decode_thumbnails(thumbs[ex, r // maps.n_heads, r % maps.n_heads])
    return out


def _scatter(g, maps: Maps, rng: np.random.Generator, size: int) -> ScatterSample:
    """A seeded sample of maps in the learn stage's 2-D coordinates."""
    n = len(maps.labels)
    samp = rng.choice(n, min(n, size), replace=False)
    samp.sort()
    coords = np.asarray(g[S.COORDS][:], dtype=np.float32).reshape(-1, 2)
    return ScatterSample(
        x=coords[samp, 0],
        y=coords[samp, 1],
        cluster=maps.labels[samp].astype(np.int32),
        layer=np.asarray(maps.layers, dtype=np.int16)[(samp % maps.per_ex) // maps.n_heads],
    )


def describe(g, cfg, seed: int = 0, tokenizer=None, say=None) -> tuple[Findings, FigureArrays]:
    """Describe every cluster of a store whose learn stage is complete.

    cfg: the job's ExplainConfig. seed fixes the random exemplars and the scatter sample (and the
    permutations); tokenizer, if given, names its own first and separator tokens in the stat labels. say, if
    given, is called with a one-line status before each long step (the explain stage prints it).
    """
    say = say or (lambda _msg: None)
    maps = _read_maps(g)
    rng = np.random.default_rng(seed)
    sums = _accumulate(g, maps)
    near = _nearest(g, maps, sums.centre, max(1, cfg.exemplars // 2))
    occ_counts, occupancy, heads_table = _occupancy(maps)
    detectors, head_det = _head_detectors(g, maps)
    ex = _examples(g, maps)
    words = stat_labels(maps.stat_names, tokenizer)

    order = sorted(range(maps.k), key=lambda i: (maps.ids[i] < 0, -sums.counts[i]))  # by size, noise last
    clusters, picks, info = [], [], []
    for i in order:
        members = np.flatnonzero(maps.row == i)
        flat = exemplar_picks(members, near[i], cfg.exemplars, rng)
        where = [
            (int(f // maps.per_ex), maps.layers[(f % maps.per_ex) // maps.n_heads], maps.heads[f % maps.n_heads])
            for f in flat
        ]
        refs = [ExemplarRef(example_index=e, example_id=str(ex.ids[e]), layer=la, head=he) for e, la, he in where]
        clusters.append(describe_cluster(i, members, maps, sums, (occ_counts[i], occupancy[i]), ex, words, cfg, refs))
        picks.append(flat)
        info.append(where)

    counts = sums.counts[order]
    learn = g.attrs.get(S.Attr.LEARN) or {}
    # the learn stage's warnings first (e.g. every map noise), then the groups that dominate a cluster
    # (noise is no cluster, trivial or not)
    dominated = [dominance_warning(c) for c in clusters if c.groups.dominated and c.id != -1]
    arrays = FigureArrays(
        mean_thumbs=None
        if sums.thumb_sum is None
        else (sums.thumb_sum[order] / np.maximum(counts, 1)[:, None, None]).astype(np.float32),
        exemplar_thumbs=_exemplar_thumbs(g, maps, picks, cfg.exemplars),
        exemplar_info=info,
        occupancy=occupancy[order].astype(np.float32),
        scatter=_scatter(g, maps, rng, cfg.scatter_sample),
        head_detectors=head_det,
    )
    say(f"clusters against example label and group ({cfg.permutations:,} permutations each)")
    metadata = metadata_findings(maps.labels, ex.groups, ex.labels, maps.per_ex, cfg.permutations, seed)
    findings = Findings(
        layers=maps.layers,
        heads=maps.heads,
        stat_names=maps.stat_names,
        stat_labels=words,
        global_means={s: float(sums.overall[j]) for j, s in enumerate(maps.stat_names)},
        clusters=clusters,
        heads_table=heads_table,
        metadata=metadata,
        warnings=list(learn.get("warnings") or []) + dominated,
        k_sweep=KSweep.from_dict(learn.get("k_sweep")),
        detectors=detectors,
    )
    return findings, arrays
