"""Clusters against example metadata: do a map's cluster and its example's group or label go together?

:func:`describe <rapids_attn.explain.describe.describe>` asks two questions of the example-level
metadata, and they live here because both are about the examples rather than the maps:

- **Association.** :func:`metadata_association` measures how much cluster membership says about an
  example-level variable (group or label): mutual information with a p-value from permutations that
  shuffle whole examples (an example's L x H maps are not independent, so a chi-square over maps would
  overstate significance; it is reported too, as ``chi2_p_maps``). :func:`metadata_findings` runs it
  for label and group over the dataset's examples, leaving the repeated-token probes out.
- **Dominance.** :func:`dominance_warning` words the warning for a cluster whose maps come mostly from
  one example group (the per-cluster test itself is part of the cluster's composition).
"""

from __future__ import annotations

import math

import numpy as np

from rapids_attn.data.probe import PROBE_GROUP
from rapids_attn.explain.findings import ClusterFinding, MetadataFindings, MetadataTest


def _mutual_info(a: np.ndarray, b: np.ndarray) -> float:
    """MI (nats) of two non-negative integer label arrays, from their contingency table."""
    na, nb = a.max() + 1, b.max() + 1
    table = np.bincount(a * nb + b, minlength=na * nb).reshape(na, nb).astype(np.float64)
    p = table / table.sum()
    pa, pb = p.sum(1, keepdims=True), p.sum(0, keepdims=True)
    nz = p > 0
    return float((p[nz] * np.log(p[nz] / (pa @ pb)[nz])).sum())


def metadata_association(
    labels: np.ndarray, values: np.ndarray, maps_per_example: int, permutations: int, seed: int
) -> dict | None:
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
        p_perm = float((hits + 1) / (permutations + 1))
    return {
        "mutual_info": observed,
        "nmi": nmi,
        "p_permutation": p_perm,
        "permutations": permutations,
        "chi2": float(chi2),
        "chi2_p_maps": float(p_maps),
        "dof": int(dof),
        "n_maps": int(keep.sum()),
        "n_values": len(codes),
    }


def metadata_findings(
    map_clusters: np.ndarray,
    groups: np.ndarray,
    labels: np.ndarray,
    maps_per_example: int,
    permutations: int,
    seed: int,
) -> MetadataFindings:
    """Cluster against example label and group, over the dataset's examples only.

    map_clusters: cluster per map, example-major; groups, labels: one string per example.
    Probes (repeated random tokens) are not dataset examples: they would make their own "group" and
    "label" look associated with the clusters, so the tests leave them out.
    """
    real_ex = groups != PROBE_GROUP
    real_maps = np.repeat(real_ex, maps_per_example)

    def test(values: np.ndarray) -> MetadataTest | None:
        r = metadata_association(map_clusters[real_maps], values[real_ex], maps_per_example, permutations, seed)
        return None if r is None else MetadataTest(**r)

    return MetadataFindings(label=test(labels), group=test(groups), probe_examples_excluded=int((~real_ex).sum()))


def dominance_warning(c: ClusterFinding) -> str:
    """The warning for a cluster whose maps come mostly from one example group."""
    return (
        f"cluster {c.id}: {c.groups.share:.0%} of its maps come from group '{c.groups.top}' "
        f"({c.groups.overall_share:.0%} overall): a trivial cluster from shared contexts? "
        "Consider reduce.sample_by: group"
    )
