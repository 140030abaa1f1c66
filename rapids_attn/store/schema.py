"""Every array and attribute of the store, in one place: name, dimensions, dtype, and the stage that writes it.

No other module spells an array or attribute name: they import the constants below. An array
constant is an :class:`ArraySpec`, a ``str`` (so ``group[FEATURES]`` works) that also carries its
dimensions, dtype, fill value and writing stage. :func:`create_array` makes an array from its spec,
so shapes, chunks and dimension names cannot drift between the modules that write the store.

A new stage adds its arrays here, with ``stage=`` its own name, and lists them in its ``provides``.

Per-map arrays are example-major, ``(example, layer, head, ...)``, chunked by shard along
``example``, so a shard owns one chunk of every array and workers write without locks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

MAP_DIMS = ("example", "layer", "head")


class ArraySpec(str):
    """An array's name (the string itself) plus what the schema knows about it.

    ``dtype`` is a NumPy dtype name, or None where the job decides it (``features``: store.features_dtype).
    """

    dims: tuple[str, ...]
    dtype: str | None
    stage: str
    fill: Any
    doc: str

    def __new__(cls, name: str, dims: tuple[str, ...], dtype: str | None, stage: str, fill: Any = 0, doc: str = ""):
        obj = super().__new__(cls, name)
        obj.dims, obj.dtype, obj.stage, obj.fill, obj.doc = tuple(dims), dtype, stage, fill, doc
        return obj

    def __reduce__(self):  # pickles (e.g. inside a Dask task) as the plain name
        return (str, (str(self),))


# -- written by the extract stage ------------------------------------------------------------------
FEATURES = ArraySpec("features", (*MAP_DIMS, "feature"), None, "extract", 0, "the embedder's feature vector per map")
THUMBNAILS = ArraySpec(
    "thumbnails",
    (*MAP_DIMS, "ty", "tx"),
    "uint8",
    "extract",
    0,
    "the map area-resized to thumbnail_size, square-root coded (decode_thumbnails); absent when thumbnail_size is 0",
)
STATS = ArraySpec("stats", (*MAP_DIMS, "stat"), "float32", "extract", np.nan, "scalar signature at full resolution")
DETECTORS = ArraySpec(
    "detectors",
    (*MAP_DIMS, "detector"),
    "float32",
    "extract",
    np.nan,
    "head detectors, extract.signature.DETECTOR_NAMES (the *_cond ones NaN where the example repeats no token)",
)
PROFILE = ArraySpec(
    "profile", (*MAP_DIMS, "offset"), "float16", "extract", np.nan, "mean attention at key = query + offset"
)
PATTERN = ArraySpec("pattern", MAP_DIMS, "int8", "extract", 0, "pattern-cnn: index into the pattern_classes attribute")
PATTERN_PROB = ArraySpec(
    "pattern_prob", MAP_DIMS, "float16", "extract", 0, "pattern-cnn: the predicted type's probability"
)
SEQ_LEN = ArraySpec("seq_len", ("example",), "int32", "extract", 0, "tokens after truncation")
TRUNCATED = ArraySpec("truncated", ("example",), "bool", "extract", False, "the input was truncated")
EXAMPLE_ID = ArraySpec("example_id", ("example",), "str", "extract", "", "the dataset's id of each example")
EXAMPLE_GROUP = ArraySpec("example_group", ("example",), "str", "extract", "", "e.g. the SQuAD article title")
EXAMPLE_LABEL = ArraySpec("example_label", ("example",), "str", "extract", "", "e.g. answerable / impossible")
SHARDS_DONE = ArraySpec(
    "shards_done", ("shard",), "bool", "extract", False, "set only after a shard's rows are written"
)
LAYER = ArraySpec("layer", ("layer",), "int32", "extract", 0, "coordinate: the model's layer index")
HEAD = ArraySpec("head", ("head",), "int32", "extract", 0, "coordinate: the model's head index")
STAT = ArraySpec("stat", ("stat",), "str", "extract", "", "coordinate: names of the stats")
DETECTOR = ArraySpec("detector", ("detector",), "str", "extract", "", "coordinate: names of the detectors")
OFFSET = ArraySpec("offset", ("offset",), "int32", "extract", 0, "coordinate: profile offsets")

# -- written by the learn stage --------------------------------------------------------------------
REDUCED = ArraySpec("reduced", (*MAP_DIMS, "component"), "float16", "learn", 0, "PCA components of each map")
COORDS = ArraySpec("coords", (*MAP_DIMS, "xy"), "float32", "learn", 0, "2-D coordinates (UMAP, else the first two PCs)")
CLUSTER = ArraySpec("cluster", MAP_DIMS, "int32", "learn", -1, "cluster label; -1 is noise (DBSCAN / HDBSCAN)")

# -- written by the heads stage (issue 14; dims are the model's own layers and heads, all of them) ---
HEADS_EXAMPLE = ArraySpec(
    "heads_example", ("heads_example",), "int32", "heads", -1, "the store example each evaluated example is"
)
HEADS_SCORES = ArraySpec(
    "heads_scores",
    ("condition", "heads_example", "score"),
    "float32",
    "heads",
    np.nan,
    "the task metric per example under each condition (attrs: conditions, e.g. base, head:L:H; columns)",
)
HEAD_IMPORTANCE = ArraySpec(
    "head_importance",
    ("model_layer", "model_head"),
    "float32",
    "heads",
    np.nan,
    "Michel et al. importance, |dL/dgate| accumulated over batches, each layer divided by its l2 norm",
)
HEAD_IMPORTANCE_RAW = ArraySpec(
    "head_importance_raw", ("model_layer", "model_head"), "float32", "heads", np.nan, "importance before normalising"
)
HEAD_OUTPUT = ArraySpec(
    "head_output",
    ("heads_example", "model_layer", "model_head", "head_dim"),
    "float16",
    "heads",
    0,
    "each head's output (before the output projection) mean-pooled over the example's tokens",
)
HEAD_PROBE = ArraySpec(
    "head_probe",
    ("probe_task", "model_layer", "model_head"),
    "float32",
    "heads",
    np.nan,
    "cross-validated linear-probe accuracy per head (attrs: tasks)",
)

# -- written by the relevance stage (issue 15; examples are a sample, tokens padded with NaN past each length) --
RELEVANCE_EXAMPLE = ArraySpec(
    "relevance_example", ("relevance_example",), "int32", "relevance", -1, "the store example each evaluated example is"
)
RELEVANCE = ArraySpec(
    "relevance",
    ("relevance_example", "relevance_method", "token"),
    "float32",
    "relevance",
    np.nan,
    "token relevance per method (attrs: methods, query); NaN past relevance_length and where flow was skipped",
)
RELEVANCE_LENGTH = ArraySpec("relevance_length", ("relevance_example",), "int32", "relevance", 0, "tokens per example")
RELEVANCE_ROLES = ArraySpec(
    "relevance_roles",
    ("relevance_example", "token"),
    "uint8",
    "relevance",
    0,
    "token role bit flags (attrs: bits): special, punctuation, second segment, gold answer span",
)
HEAD_DISTANCE = ArraySpec(
    "head_distance",
    ("atlas_head", "atlas_head_to"),
    "float32",
    "relevance",
    np.nan,
    "Clark et al.'s mean Jensen-Shannon divergence between heads (index layer * heads + head)",
)
HEAD_ATLAS = ArraySpec(
    "head_atlas", ("atlas_head", "xy"), "float32", "relevance", np.nan, "MDS coordinates of each head"
)
HEAD_ATLAS_CLUSTER = ArraySpec(
    "head_atlas_cluster", ("atlas_head",), "int32", "relevance", -1, "average-linkage cluster of each head"
)
# -- written by the compare stage (issue 37; "compared" indexes the compared models, compare_model 0 is the job's) --
COMPARE_MODEL = ArraySpec(
    "compare_model",
    ("compare_model",),
    "str",
    "compare",
    "",
    "labels of the models: the job's first, then the compared",
)
COMPARE_EXAMPLE = ArraySpec(
    "compare_example", ("compare_example",), "int32", "compare", -1, "the store example each map-compared example is"
)
COMPARE_MAPS = ArraySpec(
    "compare_maps",
    ("compared", "compare_example", "model_layer", "model_head", "map_measure"),
    "float32",
    "compare",
    np.nan,
    "cosine and mean row Jensen-Shannon divergence of the job's map and the compared model's (NaN: statistics only)",
)
COMPARE_PAIR_MAPS = ArraySpec(
    "compare_pair_maps",
    ("compare_pair", "compare_example", "model_layer", "model_head", "map_measure"),
    "float32",
    "compare",
    np.nan,
    "cosine and divergence of the noise floor's other pairs of models (attribute pairs: their labels, a and b)",
)
COMPARE_MAP_HEADS = ArraySpec(
    "compare_map_heads",
    ("compared", "map_measure", "model_layer", "model_head", "bound"),
    "float32",
    "compare",
    np.nan,
    "each head's mean of a map measure over the examples, and its bootstrap interval (bound: mean, low, high)",
)
COMPARE_MAP_LAYERS = ArraySpec(
    "compare_map_layers",
    ("compared", "map_measure", "model_layer", "bound"),
    "float32",
    "compare",
    np.nan,
    "each layer's mean over its heads of a map measure, with its bootstrap interval over examples",
)
COMPARE_STAT_HEADS = ArraySpec(
    "compare_stat_heads",
    ("compared", "compare_stat", "layer", "head", "bound"),
    "float32",
    "compare",
    np.nan,
    "each head's mean change (job's model minus compared) of every stat and detector, with its interval",
)
COMPARE_CLUSTER = ArraySpec(
    "compare_cluster",
    ("compare_model", *MAP_DIMS),
    "int32",
    "compare",
    -1,
    "each model's maps in one clustering fitted on all models' features (-1: noise)",
)
COMPARE_COORDS = ArraySpec(
    "compare_coords",
    ("compare_model", *MAP_DIMS, "xy"),
    "float32",
    "compare",
    np.nan,
    "each model's maps in the shared clustering's space (UMAP's 2-D, else the first two PCs): the explorer's map",
)

# -- written by the explain stage ------------------------------------------------------------------
HEAD_DETECTORS = ArraySpec(
    "head_detectors",
    ("layer", "head", "head_detector"),
    "float32",
    "explain",
    np.nan,
    "per-head mean of each detector over the examples that define it",
)

ARRAYS: dict[str, ArraySpec] = {
    str(a): a
    for a in (
        FEATURES,
        THUMBNAILS,
        STATS,
        DETECTORS,
        PROFILE,
        PATTERN,
        PATTERN_PROB,
        SEQ_LEN,
        TRUNCATED,
        EXAMPLE_ID,
        EXAMPLE_GROUP,
        EXAMPLE_LABEL,
        SHARDS_DONE,
        LAYER,
        HEAD,
        STAT,
        DETECTOR,
        OFFSET,
        REDUCED,
        COORDS,
        CLUSTER,
        HEADS_EXAMPLE,
        HEADS_SCORES,
        HEAD_IMPORTANCE,
        HEAD_IMPORTANCE_RAW,
        HEAD_OUTPUT,
        HEAD_PROBE,
        RELEVANCE_EXAMPLE,
        RELEVANCE,
        RELEVANCE_LENGTH,
        RELEVANCE_ROLES,
        HEAD_DISTANCE,
        HEAD_ATLAS,
        HEAD_ATLAS_CLUSTER,
        COMPARE_MODEL,
        COMPARE_EXAMPLE,
        COMPARE_MAPS,
        COMPARE_PAIR_MAPS,
        COMPARE_MAP_HEADS,
        COMPARE_MAP_LAYERS,
        COMPARE_STAT_HEADS,
        COMPARE_CLUSTER,
        COMPARE_COORDS,
        HEAD_DETECTORS,
    )
}


def arrays_of(stage: str) -> tuple[ArraySpec, ...]:
    """The arrays a stage writes."""
    return tuple(a for a in ARRAYS.values() if a.stage == stage)


# -- attributes ------------------------------------------------------------------------------------
class Attr:
    """Root attribute names (and the few array attributes). Besides these, each stage keeps two
    attributes named after it: ``<stage>_complete`` (:func:`complete_attr`: set when every array it
    provides is written) and, where it has one, its result as ``<stage>`` (e.g. :attr:`LEARN`)."""

    CREATED_BY = "created_by"  # "rapids_attn": written first, so an interrupted creation is known to be ours
    FORMAT_VERSION = "format_version"  # int: the store layout's version
    VERSION = "rapids_attn_version"  # the package version that created the store
    LAYOUT = "layout"  # StoreLayout as a dict: the shapes
    MODEL = "model"  # the model's name, source, type, revision, layer and head counts
    JOB = "job"  # the resolved job that created the store
    DATA_CONTENT = "data_content"  # the dataset's content hash (DataIndex.fingerprint) the store was made from
    EXTRACTION_KEY = "extraction_key"  # written last at creation: its presence marks a complete creation
    EXTRACT_RUNS = "extract_runs"  # one record per extract run: shards, devices, workers, seconds
    LEARN = "learn"  # the learn stage's result (backend, method, sizes, silhouette, k sweep, seconds)
    PATTERN_CLASSES = "pattern_classes"  # pattern-cnn: class names, indexed by the pattern array
    PATTERN_CNN_SHA = "pattern_cnn_sha256"  # pattern-cnn: hash of the weights that made the store
    ENCODING = "encoding"  # on thumbnails: "sqrt-uint8"
    NAMES = "names"  # on head_detectors: the detector names along head_detector
    HEADS = "heads"  # the heads stage's result (metric, ablation effects, pruning curves, probing)
    RELEVANCE = "relevance"  # the relevance stage's result (dataset-level shares, disagreement, the head atlas)
    COMPARE = "compare"  # the compare stage's result (models, measures, most-changed heads, cluster transitions)


FORMAT_VERSION = 1


def complete_attr(stage: str) -> str:
    """The root attribute a stage sets when every array it provides is written (``extract_complete``, ...)."""
    return f"{stage}_complete"


def _compressors(level: int):
    # Plain zstd rather than Blosc: one codec that every zarr 3 reader has; level 0 stores raw chunks.
    from zarr.codecs import ZstdCodec

    return None if level == 0 else ZstdCodec(level=level)


def create_array(
    group,
    spec: ArraySpec,
    shape: tuple[int, ...],
    chunks: tuple[int, ...] | None = None,
    dtype: str | None = None,
    compression_level: int = 0,
    attributes: dict | None = None,
    data: np.ndarray | None = None,
):
    """Create (or replace) ``spec`` in ``group`` with the schema's dims, dtype and fill value."""
    if len(shape) != len(spec.dims):
        raise ValueError(f"{spec}: shape {shape} does not match its dims {spec.dims}")
    dt = dtype or spec.dtype
    if dt is None:
        raise ValueError(f"{spec}: the schema leaves its dtype to the job; pass dtype=")
    kw: dict[str, Any] = {"dimension_names": spec.dims, "overwrite": True}
    if attributes:
        kw["attributes"] = attributes
    if dt == "str":
        arr = group.create_array(spec, shape=shape, chunks=chunks or (max(shape[0], 1),), dtype=str, **kw)
        if data is not None:
            arr[:] = np.asarray(data, dtype=str)
        return arr
    arr = group.create_array(
        spec,
        shape=shape,
        chunks=chunks or shape,
        dtype=dt,
        fill_value=spec.fill,
        compressors=_compressors(compression_level),
        **kw,
    )
    if data is not None:
        arr[:] = data
    return arr


def read_strings(array) -> np.ndarray:
    """A zarr string array as a fixed-width NumPy ``str`` array (zarr returns NumPy's StringDType)."""
    return np.asarray(array[:]).astype(object).astype(str)
