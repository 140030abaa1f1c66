"""What the explain stage finds, as typed objects: built by :func:`~rapids_attn.explain.describe.describe`,
rendered by :func:`~rapids_attn.explain.report.write_report`, saved into ``summary.json``.

:meth:`Findings.to_dict` is the JSON form that ``summary.json`` carries. Readers of ``summary.json``
depend on its keys, nesting and key order, so the field order of every dataclass here is the key order
of its dict: renaming, reordering or adding a field changes ``summary.json``.

:class:`FigureArrays` holds the arrays behind the figures (not saved), and :class:`RunOverview` the run's
facts that the report's overview shows beside the findings.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

import numpy as np


@dataclass
class SignatureItem:
    """One stat that sets a cluster apart: its cluster mean against the mean over all maps.

    z is the difference in standard deviations of the stat over all maps.
    """

    stat: str
    label: str  # the stat in plain words (describe.stat_labels)
    mean: float
    overall: float
    z: float


@dataclass
class HeadShare:
    """How much of a cluster one head makes up, and how much of the head the cluster takes."""

    layer: int
    head: int
    share_of_head: float  # of the head's maps, the share in this cluster
    share_of_cluster: float  # of the cluster's maps, the share from this head


@dataclass
class LayerShare:
    layer: int
    share_of_cluster: float


@dataclass
class GroupShare:
    """The example group most of a cluster's maps come from, against that group's share of all maps."""

    top: str
    share: float
    overall_share: float
    dominated: bool  # share > explain.group_dominance and at least twice overall_share


@dataclass
class ExemplarRef:
    """One exemplar map of a cluster: the example (store row and dataset id), layer and head."""

    example_index: int
    example_id: str
    layer: int
    head: int


@dataclass
class ClusterFinding:
    """One cluster (id -1: the noise of DBSCAN / HDBSCAN) in words and numbers."""

    id: int
    size: int  # maps
    share: float  # of all maps
    summary: str  # one line: the pattern type if known, then the signature
    signature: list[SignatureItem]  # the three stats with the largest |z|
    means: dict[str, float]  # every stat's mean over the cluster, in the store's stat order
    top_heads: list[HeadShare]  # up to 8, by share of the cluster
    top_layers: list[LayerShare]  # every layer with a map in the cluster, by share
    dominant_description: str  # "mostly layers 3-5 (72% of its maps); top heads ..."
    groups: GroupShare
    labels: dict[str, float]  # share of the cluster's maps per example label
    patterns: dict[str, float]  # pattern-cnn: share per pattern type, largest first; {} without it
    pattern: str | None  # the most common pattern type
    exemplar_examples: list[ExemplarRef]  # the first explain.head_views exemplars, for head views


@dataclass
class HeadTable:
    """Per head ([layer, head] arrays): the cluster most of its maps fall in, and how consistently.

    consistency = 1 - H(the head's cluster distribution) / log K, rounded to 4 places.
    """

    dominant_cluster: np.ndarray  # int
    consistency: np.ndarray  # float

    def to_dict(self) -> dict:
        return {
            "dominant_cluster": np.asarray(self.dominant_cluster).tolist(),
            "consistency": np.asarray(self.consistency).tolist(),
        }


@dataclass
class MetadataTest:
    """Cluster against one example-level variable (describe.metadata_association).

    p_permutation is None when explain.permutations is 0; chi2_p_maps counts every map as independent.
    """

    mutual_info: float
    nmi: float
    p_permutation: float | None
    permutations: int
    chi2: float
    chi2_p_maps: float
    dof: int
    n_maps: int
    n_values: int


@dataclass
class MetadataFindings:
    """The label and group tests; None where the variable has fewer than two values."""

    label: MetadataTest | None
    group: MetadataTest | None
    probe_examples_excluded: int  # repeated-token probes left out of both tests

    def to_dict(self) -> dict:
        return {
            "label": None if self.label is None else asdict(self.label),
            "group": None if self.group is None else asdict(self.group),
            "probe_examples_excluded": self.probe_examples_excluded,
        }


@dataclass
class KSweep:
    """The learn stage's KMeans sweep: inertia and silhouette (None where undefined) for each k."""

    k: list[int]
    inertia: list[float]
    silhouette: list[float | None]
    best_silhouette_k: int | None
    n: int  # maps in the sweep's sample
    chosen: int  # the k the clustering used
    #: per k, the ARI of its fit against a refit with the next seed (None: not measured)
    stability: list[float | None] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict | None) -> KSweep | None:
        """From the ``k_sweep`` entry of the store's learn attribute (None: no sweep was run)."""
        if d is None:
            return None
        return cls(
            k=list(d["k"]),
            inertia=list(d["inertia"]),
            silhouette=list(d["silhouette"]),
            best_silhouette_k=d["best_silhouette_k"],
            n=d["n"],
            chosen=d["chosen"],
            stability=list(d.get("stability") or [None] * len(d["k"])),
        )


@dataclass
class HeadDetectors:
    """Per-head detector scores ([layer, head] arrays, rounded to 4 places; NaN where never defined) and
    how many examples define each detector at the head that has most."""

    names: list[str]  # the store's detectors (extract.signature.DETECTOR_NAMES)
    scores: dict[str, np.ndarray]
    examples: dict[str, int]

    def to_dict(self) -> dict:
        return {
            "names": list(self.names),
            "scores": {name: np.asarray(v).tolist() for name, v in self.scores.items()},
            "examples": dict(self.examples),
        }


@dataclass
class Findings:
    """Everything describe says about a clustered store; clusters are sorted by size, noise last."""

    layers: list[int]
    heads: list[int]
    stat_names: list[str]
    stat_labels: dict[str, str]
    global_means: dict[str, float]
    clusters: list[ClusterFinding]
    heads_table: HeadTable
    metadata: MetadataFindings
    warnings: list[str]
    k_sweep: KSweep | None
    detectors: HeadDetectors

    def to_dict(self) -> dict:
        """The JSON-ready form (NaN stays a float NaN) that ``summary.json`` carries."""
        return {
            "layers": list(self.layers),
            "heads": list(self.heads),
            "stat_names": list(self.stat_names),
            "stat_labels": dict(self.stat_labels),
            "global_means": dict(self.global_means),
            "clusters": [asdict(c) for c in self.clusters],
            "heads_table": self.heads_table.to_dict(),
            "metadata": self.metadata.to_dict(),
            "warnings": list(self.warnings),
            "k_sweep": None if self.k_sweep is None else asdict(self.k_sweep),
            "detectors": self.detectors.to_dict(),
        }


@dataclass
class ScatterSample:
    """A seeded sample of maps in the learn stage's 2-D coordinates (sorted map order)."""

    x: np.ndarray  # float32
    y: np.ndarray  # float32
    cluster: np.ndarray  # int32
    layer: np.ndarray  # int16: the model's layer index


@dataclass
class FigureArrays:
    """The arrays behind the report's figures; rows of the per-cluster arrays follow ``Findings.clusters``."""

    mean_thumbs: np.ndarray | None  # [cluster, t, t] float32; None without thumbnails
    exemplar_thumbs: np.ndarray | None  # [cluster, exemplars, t, t] float32, NaN in unused slots
    exemplar_info: list[list[tuple[int, int, int]]]  # per cluster: (example index, layer, head) per exemplar
    occupancy: np.ndarray  # [cluster, layer, head] float32: share of each head's maps in the cluster
    scatter: ScatterSample
    head_detectors: np.ndarray  # [layer, head, detector] float32, unrounded; detector names in Findings.detectors


@dataclass
class ClusteringOverview:
    """The clustering facts the overview lists (in this order)."""

    coords: Literal["umap", "pca"]  # what the 2-D coordinates are
    method: str
    n_clusters: int
    silhouette: float | None
    noise_share: float
    embedder: str
    #: KMeans: the lowest ARI of the fit against its refits with other seeds (None: not measured)
    stability: float | None = None


@dataclass
class RunOverview:
    """The run's facts for the report's overview: free-form key-value tables, plus the clustering.

    The page's title and subtitle read ``model["name"]``, ``data["path"]``, ``counts["examples"]`` and
    ``counts["maps"]``; ``seconds`` maps a stage to its wall time.
    """

    model: dict
    data: dict
    counts: dict
    backend: dict
    seconds: dict
    clustering: ClusteringOverview
