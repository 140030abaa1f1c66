"""The job file: a pydantic v2 tree, one model per section, unknown keys rejected.

``load_job(path, overrides)`` reads YAML with :class:`JobLoader` (``yaml.SafeLoader`` that refuses
duplicate keys), merges the presets named in
``extends`` (a ``configs/`` folder beside the job file, then the built-in ``rapids_attn/presets``),
applies ``--set a.b=value`` overrides, and validates. Every
error becomes one :class:`JobConfigError` line that names the field and says how to fix it; an
unknown key suggests the closest valid name. Checks that need the filesystem or the model (paths
exist, the model config loads, the backend is available) live in :mod:`rapids_attn.preflight`.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import re
import typing
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rapids_attn.errors import JobConfigError

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

#: The folder a job may keep its own presets in, beside the job file or in one of its parents.
LOCAL_PRESETS = "configs"


def builtin_presets() -> Traversable:
    """The presets shipped in the package (``rapids_attn/presets``), read through importlib.resources
    so that an installed wheel finds them exactly as the checkout does."""
    return resources.files("rapids_attn") / "presets"


def _leaf_types(annotation: Any) -> set:
    """The plain types an annotation admits (``int | None`` -> {int, NoneType}; ``Literal`` leaves are
    left out: they name their own values)."""
    origin = typing.get_origin(annotation)
    if origin is None:
        return {annotation} if isinstance(annotation, type) else set()
    if origin is Literal:
        return set()
    if origin is typing.Annotated:
        return _leaf_types(typing.get_args(annotation)[0])
    if origin in (list, tuple, set, dict):
        return set()
    return set().union(*(_leaf_types(a) for a in typing.get_args(annotation)))


def _is_bool_field(annotation: Any) -> bool:
    """Whether a field takes true/false and nothing else (``bool`` or ``bool | None``)."""
    leaves = _leaf_types(annotation)
    return bool in leaves and not leaves - {bool, type(None)}


def _numeric_kind(annotation: Any) -> tuple[str | None, bool]:
    """("int"/"float"/None, whether it is a list of them) for a field that does not admit a bool."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is list or (origin is not None and any(typing.get_origin(a) is list for a in args)):
        inner = next((a for a in (annotation, *args) if typing.get_origin(a) is list), None)
        kind, _ = _numeric_kind(typing.get_args(inner)[0]) if inner is not None else (None, False)
        return kind, True
    leaves = _leaf_types(annotation)
    if bool in leaves:
        return None, False
    return ("int" if int in leaves else "float" if float in leaves else None), False


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info) -> Any:
        """pydantic reads ``true`` as 1 for an int (and 1.0 for a float) field: a YAML ``limit: true`` would
        silently mean one example. A number field that does not admit a bool refuses one; a true/false field
        refuses anything else (pydantic would read 1, 0, "yes" or "off" as a bool)."""
        field = cls.model_fields.get(info.field_name)
        if field is None:
            return value
        if _is_bool_field(field.annotation):
            if value is not None and not isinstance(value, bool):
                raise ValueError("must be true or false")
            return value
        kind, is_list = _numeric_kind(field.annotation)
        if kind is None:
            return value
        values = value if is_list and isinstance(value, list) else [value]
        if any(isinstance(v, bool) for v in values):
            what = "a whole number" if kind == "int" else "a number"
            raise ValueError(f"must be {what}{' in each entry' if is_list else ''}, not true/false")
        return value


class ProbeConfig(Section):
    #: repeated random-token probes appended to the dataset (for the induction detector); 0 adds none.
    count: int = Field(0, ge=0)
    #: random words per half; each probe is the sequence twice.
    length: int = Field(20, ge=2, le=200)
    seed: int = 0


class DataConfig(Section):
    path: Path
    format: Literal["auto", "squad", "jsonl", "csv", "text", "parquet", "hf"] = "auto"
    text_fields: list[str] | None = Field(None, min_length=1, max_length=2)
    id_field: str | None = None
    group_field: str | None = None
    label_field: str | None = None
    limit: int | None = Field(None, gt=0)
    sample: int | None = Field(None, gt=0)
    seed: int = 0
    #: SQuAD JSON only: one example per ``question`` (question and paragraph), or per ``article`` (its
    #: paragraphs joined into one document: long inputs for a decoder, jobs/long_documents.yaml).
    squad_unit: Literal["question", "article"] = "question"
    probe: ProbeConfig = ProbeConfig()


class ModelConfig(Section):
    #: a local folder, a HuggingFace hub id, or a built-in preset name (``minilm-l6``).
    name: str
    revision: str | None = None
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    trust_remote_code: bool = False
    #: longest input in tokens; default: the model's own limit (capped at 1024 by the eager capture only).
    #: Longer inputs are truncated (longest segment first) and counted in the summary, or read as windows.
    max_length: int | None = Field(None, gt=1)
    #: inputs longer than max_length: ``truncate`` them, or read them whole as overlapping ``windows`` of
    #: max_length tokens (an encoder's 512 positions over a long document; rapids_attn/extract/windows.py):
    #: each window repeats the input's leading and trailing special tokens, and each token's attention row
    #: comes from one window (the middle of each overlap splits it; causal models: the later window owns
    #: only what the earlier one does not hold).
    long_inputs: Literal["truncate", "windows"] = "truncate"
    #: content tokens two consecutive windows share (long_inputs: windows).
    window_overlap: int = Field(128, ge=0)


class ExtractConfig(Section):
    #: side of the area-resized map each attention map becomes (the embedder's input).
    image_size: int = Field(32, ge=4, le=512)
    #: side of the thumbnail kept for figures; 0 keeps none.
    thumbnail_size: int = Field(16, ge=0, le=128)
    #: which layers / heads to keep (0-based); None keeps all.
    layers: list[int] | None = None
    heads: list[int] | None = None
    #: examples per shard: the unit of parallel work, of resumption, and the store's row chunk. ``auto``: 128,
    #: or for fewer than 1,024 examples the multiple of 16 that makes about eight shards, so the last shard
    #: leaves the other workers idle for less (``rapids_attn.extract.stage.resolve_shard_size``).
    shard_size: int | Literal["auto"] = "auto"
    #: padded tokens per forward batch (batch size x longest input in the batch).
    token_budget: int = Field(8192, gt=0)
    #: attention entries per head and layer per batch (batch size x longest input squared): bounds
    #: the memory of one layer's maps, so peak memory does not grow with the longest input.
    attention_budget: int = Field(8192 * 192, gt=0)
    max_batch_size: int = Field(64, gt=0)
    #: where the model and the embedder run: auto picks CUDA when a worker sees a GPU.
    device: Literal["auto", "cpu", "cuda"] = "auto"
    #: how attention is captured. ``blocked``: the model's output comes from ``attention_base`` (SDPA by default)
    #: and every map's image, statistics, profile and detectors are accumulated block of query rows by block,
    #: never holding a T x T map (memory grows linearly with the length; no 1024-token cap). ``eager``: the
    #: model runs eager attention and each layer's whole maps are reduced (memory grows with the square).
    #: ``auto``: blocked wherever the model computes attention through transformers' attention interface.
    attention: Literal["auto", "blocked", "eager"] = "auto"
    #: the implementation that computes the model's output under the blocked capture: ``sdpa``, ``eager``, or
    #: another that transformers knows (``flash_attention_2`` on a GPU with flash-attn installed); or
    #: ``capture``: each layer whose every head is captured gets its output from the capture's own blocks of
    #: weights (one wider product per block instead of a second attention; the same output within 1e-5, about
    #: 10% faster at 4k tokens on the CPU, docs/benchmarks.md), the rest from SDPA.
    attention_base: str = Field("sdpa", pattern=r"^[A-Za-z0-9_]+$")
    #: MiB of float32 scores and weights one block of query rows may hold (batch x heads x rows x T x 3).
    attention_block_mb: int = Field(64, gt=0)

    @field_validator("shard_size", mode="before")
    @classmethod
    def _positive_shard_size(cls, value):
        """One message for anything but a positive whole number or ``auto`` (the union's own errors name a
        field ``shard_size.int`` that does not exist, and never say that ``auto`` is allowed)."""
        whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        if value == "auto" or (whole and not isinstance(value, bool) and value > 0):
            return value if value == "auto" else int(value)
        raise ValueError("must be a positive whole number of examples or auto")

    @model_validator(mode="after")
    def _unique_selection(self) -> ExtractConfig:
        for name in ("layers", "heads"):
            sel = getattr(self, name)
            if sel is not None:
                if len(sel) == 0:
                    raise ValueError(f"{name} is empty; leave it out to keep all {name}")
                if len(set(sel)) != len(sel) or any(i < 0 for i in sel):
                    raise ValueError(f"{name} must be distinct non-negative indices, got {sel}")
        return self


class EmbedConfig(Section):
    #: ``pattern-cnn`` (the attention-pattern CNN shipped with the package: 146-d features, its
    #: 128-d embedding and a scaled copy of the profile and stats, and a
    #: pattern type per map), ``pooled`` (the area-pooled map, flattened: the baseline), or a
    #: torchvision classification model name such as ``resnet18`` / ``resnet50`` (penultimate layer).
    name: str = "pattern-cnn"
    #: pooled: side of the pooled map (dim = pooled_size ** 2); must divide image_size or be <= it.
    pooled_size: int = Field(16, ge=2, le=128)
    #: backbones: ``imagenet`` (torchvision's cache), ``random`` (a control), or a weights file.
    weights: str = "imagenet"
    #: backbones: side of the image fed to the network.
    input_size: int = Field(64, ge=16, le=512)
    batch_size: int = Field(1024, gt=0)
    #: ``auto`` (float16 on a GPU, float32 on the CPU), ``float32`` everywhere, or ``int8``:
    #: torchvision backbones on the CPU only, quantized after training and calibrated on fixed
    #: synthetic maps (2.4x faster than float32 for ResNet-50 at 224; docs/benchmarks.md).
    precision: Literal["auto", "float32", "int8"] = "auto"

    @model_validator(mode="after")
    def _int8_backbones_only(self):
        if self.precision == "int8" and self.name in ("pooled", "pattern-cnn"):
            raise ValueError(
                f"precision int8 applies to torchvision backbones (resnet18, resnet50, ...), not {self.name}; "
                "use precision: auto"
            )
        return self


class StoreConfig(Section):
    features_dtype: Literal["float16", "float32"] = "float16"
    #: zstd level for the store's arrays (0 stores uncompressed).
    compression_level: int = Field(3, ge=0, le=9)


#: UMAP metrics both backends accept on the (dense, signed) PCA output: umap-learn 0.5's named distances
#: intersected with cuML 26.10's brute-force kNN metrics for dense input (the build cuML uses when, as
#: here, random_state is set). Left out: hellinger (needs non-negative input; PCA coordinates are signed),
#: and names only one backend knows (cityblock, sqeuclidean: cuML only; braycurtis, mahalanobis, ...:
#: umap-learn only).
UmapMetric = Literal[
    "euclidean",
    "l2",
    "manhattan",
    "l1",
    "taxicab",
    "chebyshev",
    "linf",
    "minkowski",
    "cosine",
    "correlation",
    "canberra",
    "hamming",
]


class UmapConfig(Section):
    enabled: bool = False
    n_components: int = Field(2, ge=2)
    n_neighbors: int = Field(15, ge=2)
    min_dist: float = Field(0.1, ge=0)
    #: one of :data:`UmapMetric` (accepted by both umap-learn and cuML).
    metric: UmapMetric = "euclidean"


class ReduceConfig(Section):
    pca_components: int = Field(32, ge=2)
    umap: UmapConfig = UmapConfig()
    #: fit on a seeded sample of at most this many maps, then transform / assign every map.
    fit_sample: int = Field(200_000, gt=0)
    #: ``group``: draw the fit sample evenly across example groups (e.g. SQuAD articles), so groups
    #: with many examples (many questions on one context) do not dominate the fit.
    sample_by: Literal["none", "group"] = "none"

    @field_validator("fit_sample")
    @classmethod
    def _fit_sample_holds_components(cls, value: int, info) -> int:
        components = info.data.get("pca_components")  # validated before (declared first); absent if invalid
        if components is not None and value < components:
            raise ValueError(
                f"smaller than reduce.pca_components {components}; PCA needs at least as many maps "
                "as components: raise reduce.fit_sample or lower reduce.pca_components"
            )
        return value


#: the most cluster counts one k sweep may fit (``cluster.k_sweep``).
MAX_K_SWEEP = 200


class ClusterConfig(Section):
    method: Literal["kmeans", "dbscan", "hdbscan"] = "kmeans"
    #: kmeans: the number of clusters, or ``auto`` (the best silhouette of the k sweep).
    n_clusters: int | Literal["auto"] = 8
    #: kmeans: [first, last] cluster counts to sweep (inertia and silhouette on a sample); None skips.
    #: At most :data:`MAX_K_SWEEP` values (each is a KMeans fit); a last k at or above the maps in the
    #: sweep sample is clipped to one below it (preflight refuses a first k there).
    k_sweep: list[int] | None = Field(default_factory=lambda: [2, 16], min_length=2, max_length=2)
    #: maps drawn from the fit sample for the sweep. As many as the silhouette scores by default: on 500 SQuAD
    #: questions (36,000 maps) 5,000 and 20,000 picked the same k with curves within one seed's spread, at a
    #: third of the time (docs/benchmarks.md, "The whole job against the bare forward").
    sweep_sample: int = Field(5000, gt=0)
    eps: float = Field(0.5, gt=0)
    min_samples: int = Field(5, ge=1)
    min_cluster_size: int = Field(20, ge=2)
    #: maps sampled for the silhouette score in summary.json (0 skips it).
    silhouette_sample: int = Field(5000, ge=0)
    #: kmeans: refits with this many other seeds on the fit sample, for the stability figure in summary.json
    #: (adjusted Rand index of each against the fit); 0 skips them. The k sweep's auto pick also uses it.
    stability_seeds: int = Field(2, ge=0, le=10)

    @field_validator("k_sweep")
    @classmethod
    def _bounded_sweep(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and value[1] - value[0] + 1 > MAX_K_SWEEP:
            raise ValueError(
                f"spans {value[1] - value[0] + 1} cluster counts (a KMeans fit each); the most is {MAX_K_SWEEP}, "
                f"e.g. [{value[0]}, {value[0] + MAX_K_SWEEP - 1}]"
            )
        return value

    @model_validator(mode="after")
    def _k(self) -> ClusterConfig:
        if isinstance(self.n_clusters, int) and self.n_clusters < 2:
            raise ValueError(f"n_clusters must be at least 2 or auto, got {self.n_clusters}")
        if self.k_sweep is not None and not (2 <= self.k_sweep[0] < self.k_sweep[1]):
            raise ValueError(f"k_sweep must be [first, last] with 2 <= first < last, got {self.k_sweep}")
        if self.n_clusters == "auto" and (self.k_sweep is None or self.method != "kmeans"):
            raise ValueError("n_clusters: auto picks k from the k sweep; it needs method kmeans and a k_sweep")
        return self


class HeadClassThresholds(Section):
    """explain.head_classes: the score a head's dataset mean must reach for each class
    (rapids_attn/explain/head_classes.py; README, "Head classes")."""

    #: mass on the first token (Gu et al. 2025's epsilon).
    sink: float = Field(0.3, gt=0, le=1)
    #: mass on the sink tokens and the recent window (rows that see beyond both).
    streaming: float = Field(0.9, gt=0, le=1)
    #: far induction mass (Wu et al. 2024's retrieval-score threshold).
    retrieval: float = Field(0.1, gt=0, le=1)


class ExplainConfig(Section):
    #: thresholds of the long-context head classes written to head_classes.json.
    head_classes: HeadClassThresholds = Field(default_factory=HeadClassThresholds)
    #: write report/index.html with its figures.
    report: bool = True
    #: exemplar thumbnails per cluster in the report (nearest to the centre first, then random members).
    exemplars: int = Field(8, ge=1, le=64)
    #: examples per cluster shown as interactive BertViz head views (0 writes none).
    head_views: int = Field(2, ge=0, le=10)
    #: maps drawn for the 2-D scatter plots.
    scatter_sample: int = Field(20_000, gt=0)
    #: write report/explorer.html: the interactive map of all maps and head atlas (Bokeh, standalone, offline).
    explorer: bool = True
    #: maps in the explorer (a seeded sample); a browser holds 50,000 points smoothly.
    explorer_sample: int = Field(50_000, gt=0)
    #: a cluster is flagged as "dominated by one group" when more than this share of its maps comes
    #: from one group, and that is at least twice the group's overall share.
    group_dominance: float = Field(0.5, gt=0, le=1)
    #: label permutations (examples shuffled as units) for the metadata p-values.
    permutations: int = Field(200, ge=0)


class PruningConfig(Section):
    #: heads are removed cumulatively in each order; ``importance`` (least important first, by the gradient
    #: importance), ``ablation`` (smallest single-head ablation cost first) and ``random`` (the control).
    orders: list[Literal["importance", "ablation", "random"]] = ["importance", "ablation", "random"]
    #: random orders drawn (seeded by runtime.seed), each a curve; the report shows their mean and range.
    random_orders: int = Field(2, ge=1, le=20)
    #: points on each curve (heads removed at each point spaced evenly from 0 to all but one head).
    steps: int = Field(24, ge=2, le=1000)


class ProbingConfig(Section):
    enabled: bool = True
    #: built-in tasks: ``label`` (the data's label_field; SQuAD: answerable / impossible), ``wh_word``
    #: (question type from its wh-word), ``length`` (SentEval's Length: token counts in 6 equal-frequency bins).
    tasks: list[Literal["label", "wh_word", "length"]] = ["label", "wh_word", "length"]
    #: stratified cross-validation folds per head.
    folds: int = Field(5, ge=2, le=20)
    #: the "best heads" representation: these many heads, chosen inside each training fold.
    top_k: int = Field(8, ge=1)


class HeadsConfig(Section):
    """Which heads matter (the ``heads`` stage; docs/architecture.md, "Head importance")."""

    #: run the stage by default (it always runs when --stages names it).
    enabled: bool = False
    #: the task metric: ``squad`` (a question-answering head: SQuAD 2.0 exact match / F1), ``lm`` (a causal
    #: or masked LM head: loss), ``retrieval`` (a sentence-embedding model: question-to-paragraph recall@1
    #: and MRR), ``accuracy`` (a sequence classifier against label_field), or ``auto`` (by the model's head).
    metric: Literal["auto", "squad", "lm", "retrieval", "accuracy"] = "auto"
    #: examples evaluated: a seeded sample of the job's examples (runtime.seed), or all of them (null).
    examples: int | None = Field(1000, gt=0)
    #: how an ablated head's output is replaced: ``zero``, or ``mean`` (its mean output over the examples).
    ablation: Literal["zero", "mean"] = "zero"
    #: ablate every head alone (layers x heads runs over the examples).
    single: bool = True
    #: head sets ablated together: each ``layer``'s heads, each ``cluster``'s dominant heads (learn stage).
    sets: list[Literal["layer", "cluster"]] = ["layer", "cluster"]
    #: a head is one of a cluster's dominant heads when at least this share of its maps are in the cluster.
    cluster_share: float = Field(0.5, gt=0, le=1)
    #: Michel et al. (2019) importance: |dL/dgate| per head, accumulated over the examples.
    importance: bool = True
    pruning: PruningConfig = PruningConfig()
    probing: ProbingConfig = ProbingConfig()
    #: examples per forward pass.
    batch_size: int = Field(32, gt=0)
    #: tokens per input; longer inputs are truncated (the model's own limit when null).
    max_length: int | None = Field(None, gt=1)


class RelevanceConfig(Section):
    """Where information flows and how heads relate (the ``relevance`` stage; docs/architecture.md,
    "Relevance and the head atlas")."""

    #: run the stage by default (it always runs when --stages names it).
    enabled: bool = False
    #: examples evaluated: a seeded sample of the job's examples (runtime.seed), or all of them (null).
    examples: int | None = Field(200, gt=0)
    #: token relevance methods (rapids_attn/relevance/methods.py): the head mean, the raw last layer,
    #: attention rollout, gradient-weighted rollout (for the model's own output), attention flow, and PageRank.
    methods: list[Literal["head_mean", "last_layer", "rollout", "grad_rollout", "flow", "pagerank"]] = [
        "head_mean",
        "last_layer",
        "rollout",
        "grad_rollout",
        "flow",
        "pagerank",
    ]
    #: whose relevance: ``auto`` (the first token, [CLS], for encoders; the last token for decoders), ``first``,
    #: ``last``, or ``mean`` (the mean over every token's row; flow then costs T times more).
    query: Literal["auto", "first", "last", "mean"] = "auto"
    #: rollout and flow mix each layer's head-mean attention with the identity: r I + (1 - r) A (Abnar & Zuidema: 0.5).
    residual: float = Field(0.5, ge=0, le=1)
    #: attention flow runs one maximum flow per (query row, token) on (L + 1) T nodes; examples longer than
    #: this get no flow (NaN, counted in summary.json) instead of hours of CPU.
    flow_max_tokens: int = Field(128, gt=1)
    #: PageRank runs on the graph of one layer's heads (-1: the last layer), all of them or the ones listed.
    pagerank_layer: int = -1
    pagerank_heads: list[int] | None = None
    #: the head atlas: Clark et al.'s distance between heads, embedded in 2-D and clustered into this many groups.
    atlas: bool = True
    atlas_clusters: int = Field(8, ge=1)
    #: "related heads": each head's nearest heads in the atlas.
    related: int = Field(5, ge=1)
    #: examples per forward pass.
    batch_size: int = Field(8, gt=0)
    #: tokens per input; longer inputs are truncated (the model's own limit when null).
    max_length: int | None = Field(None, gt=1)


class RuntimeConfig(Section):
    #: ``local`` (dask LocalCluster), ``local-cuda`` (dask-cuda LocalCUDACluster, one worker per GPU),
    #: or ``scheduler`` (an existing cluster: set ``address`` or ``scheduler_file``).
    cluster: Literal["local", "local-cuda", "scheduler"] = "local"
    n_workers: int | None = Field(None, gt=0)
    threads_per_worker: int = Field(1, gt=0)
    #: worker processes (True) or threads in this process (False; handy for debugging).
    processes: bool = True
    address: str | None = None
    scheduler_file: Path | None = None
    dashboard_address: str = "127.0.0.1:8787"
    #: local-cuda: RMM pool per GPU: a size ("24GB"), a fraction of the GPU's memory (0.8), "auto"
    #: (0.8), or None for no pool.
    rmm_pool_size: float | str | None = "auto"
    #: where the fit runs: ``auto`` (cuML when importable and a GPU is visible), ``cpu``, ``gpu``.
    learn_backend: Literal["auto", "cpu", "gpu"] = "auto"
    seed: int = 0

    @model_validator(mode="after")
    def _scheduler_target(self) -> RuntimeConfig:
        if self.cluster == "scheduler" and not (self.address or self.scheduler_file):
            raise ValueError("cluster 'scheduler' needs address (tcp://host:8786) or scheduler_file")
        if self.cluster != "scheduler" and (self.address or self.scheduler_file):
            raise ValueError("address / scheduler_file are only used with cluster: scheduler")
        return self


class OutputConfig(Section):
    #: the run directory; relative paths are relative to the current directory. ``{name}`` is replaced
    #: by the job's name; no other ``{...}`` field is known.
    dir: Path = Path("runs/{name}")

    @field_validator("dir")
    @classmethod
    def _only_name_field(cls, value: Path) -> Path:
        try:
            str(value).format(name="job")
        except (KeyError, IndexError, ValueError, AttributeError) as e:
            raise ValueError(
                f"only {{name}} may be written in braces (not {e}); double a literal brace: {{{{ }}}}"
            ) from None
        return value


class JobConfig(Section):
    #: a plain file name (it becomes the run directory's name under the default ``output.dir``).
    name: str = "job"
    extends: list[str] = []
    data: DataConfig
    model: ModelConfig
    extract: ExtractConfig = ExtractConfig()
    embed: EmbedConfig = EmbedConfig()
    store: StoreConfig = StoreConfig()
    reduce: ReduceConfig = ReduceConfig()
    cluster: ClusterConfig = ClusterConfig()
    heads: HeadsConfig = HeadsConfig()
    relevance: RelevanceConfig = RelevanceConfig()
    explain: ExplainConfig = ExplainConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    output: OutputConfig = OutputConfig()

    @field_validator("name")
    @classmethod
    def _plain_file_name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", value) or set(value) == {"."}:
            raise ValueError(
                "must be a plain file name: letters, digits, '_', '-' and '.', and not '.' or '..' "
                "(it names the run directory), e.g. name: my-job"
            )
        return value

    @property
    def run_dir(self) -> Path:
        """Absolute, so workers started elsewhere (multi-node) find the same store."""
        return Path(str(self.output.dir).format(name=self.name)).expanduser().absolute()

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def extraction_key(self, data_fingerprint: str = "", shard_size: int | None = None) -> str:
        """Hash of everything that decides the store's contents; a store from another key is refused.

        ``data_fingerprint`` is the dataset's content hash (:attr:`DataIndex.fingerprint`): the same settings
        over an edited file are a different store, never reused and never mixed into a resume. ``shard_size``
        is the store's resolved examples per shard (its layout's): ``extract.shard_size: auto`` and the number
        it resolves to give one key, the key a store made with that number has (before ``auto`` existed, 128)."""
        d = self.to_dict()
        if shard_size is not None:
            d["extract"]["shard_size"] = int(shard_size)
        keep = {k: d[k] for k in ("data", "model", "extract", "embed", "store")}
        keep["data_content"] = data_fingerprint
        # where and in which batches maps are computed does not change them (tested: batch invariance)
        keep["extract"] = {
            k: v
            for k, v in keep["extract"].items()
            if k not in ("device", "token_budget", "attention_budget", "max_batch_size")
        }
        keep["embed"] = {k: v for k, v in keep["embed"].items() if k != "batch_size"}
        return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------------------------
# loading


def _deep_merge(base: dict, top: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping in the job (or a preset) gives one key twice; YAML itself would keep the last silently."""


class JobLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping, naming it and both lines."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:  # the mapping's own keys: one a merge (<<) brings in may be overridden
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                try:
                    key = self.construct_object(key_node, deep=True)
                    hash(key)
                except (TypeError, yaml.constructor.ConstructorError):
                    continue  # the base class reports an unhashable key
                if key in seen:
                    raise DuplicateKeyError(
                        None,
                        None,
                        f"duplicate key {key!r} (first on line {seen[key] + 1}); keep one of them",
                        key_node.start_mark,
                    )
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def yaml_load(text: str) -> Any:
    """Parse YAML as the job file is parsed: safe, and refusing duplicate keys."""
    return yaml.load(text, Loader=JobLoader)  # JobLoader is a SafeLoader


def _read_yaml(path: Path | Traversable, what: str) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise JobConfigError(f"{what}: no such file: {path}") from None
    except IsADirectoryError:
        raise JobConfigError(
            f"{what}: {path} is a directory; give the job's YAML file (e.g. jobs/quickstart.yaml)"
        ) from None
    except UnicodeDecodeError as e:
        raise JobConfigError(
            f"{what}: {path} is not a UTF-8 text file (byte {e.start} is 0x{e.object[e.start]:02x}); "
            "give a YAML job file, saved as UTF-8"
        ) from None
    except OSError as e:
        raise JobConfigError(f"{what}: cannot read {path} ({e.strerror or type(e).__name__}); check the path") from None
    try:
        raw = yaml_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        if isinstance(e, DuplicateKeyError):
            raise JobConfigError(f"{path}{where}: {e.problem}") from None
        if isinstance(e, yaml.reader.ReaderError):  # a character YAML refuses (NUL, a control code)
            ch = e.character if isinstance(e.character, int) else ord(e.character)
            raise JobConfigError(
                f"{path}: not a YAML text file (character #x{ch:04x} at position {e.position}); give a YAML job file"
            ) from None
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        raise JobConfigError(f"{path}{where}: not valid YAML ({problem})") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise JobConfigError(f"{path}: the job must be a YAML mapping of sections, got {type(raw).__name__}")
    return raw


def preset_dirs(job_path: Path | None) -> list[Traversable]:
    """Where ``extends`` names are looked up, in order: the nearest ``configs/`` folder beside the job
    file or in one of its parents (a project's own presets, which win), then the built-in presets."""
    dirs: list[Traversable] = []
    if job_path is not None:
        for parent in [job_path.resolve().parent, *job_path.resolve().parents]:
            if (parent / LOCAL_PRESETS).is_dir():
                dirs.append(parent / LOCAL_PRESETS)
                break
    dirs.append(builtin_presets())
    return dirs


def _preset_file(root: Traversable, name: str) -> Traversable:
    """``models/minilm-l6`` -> ``root/models/minilm-l6.yaml``, one part at a time (a Traversable
    joins one name per step)."""
    node = root
    *folders, last = name.split("/")
    for part in folders:
        node = node / part
    return node / f"{last}.yaml"


def _preset_names(root: Traversable, prefix: str = "") -> list[str]:
    """Every preset name under ``root`` (``folder/name`` without ``.yaml``), for the "did you mean"."""
    names = []
    for child in root.iterdir():
        if child.is_dir():
            names += _preset_names(child, f"{prefix}{child.name}/")
        elif child.name.endswith(".yaml"):
            names.append(prefix + child.name[: -len(".yaml")])
    return names


def _resolve_preset(name: str, dirs: list[Traversable]) -> Traversable:
    if not isinstance(name, str) or not name or any(p in ("", ".", "..") for p in name.split("/")):
        raise JobConfigError(f"extends: {name!r} is not a preset name; use folder/name, e.g. models/minilm-l6")
    for d in dirs:
        p = _preset_file(d, name)
        if p.is_file():
            return p
    known = sorted({n for d in dirs if d.is_dir() for n in _preset_names(d)})
    near = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean '{near[0]}'?" if near else f"known presets: {', '.join(known) or 'none'}"
    raise JobConfigError(f"extends: no preset '{name}' under {', '.join(map(str, dirs))}; {hint}")


def _anchor_data_path(preset: dict, path: Traversable, name: str) -> None:
    """Make a preset's relative ``data.path`` absolute against the preset's own folder.

    A preset that names data ships with it (``data/quickstart`` points into the package), so its
    path must not depend on where the job that extends it lives or where it is run from. A job's own
    relative ``data.path`` is still resolved against the job file, in :func:`load_job`."""
    data = preset.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("path"), str):
        return
    p = Path(data["path"]).expanduser()
    if p.is_absolute():
        return
    if not isinstance(path, Path):  # e.g. a package imported from a zip file: no folder on disk
        raise JobConfigError(
            f"extends: preset '{name}': data.path {data['path']} is relative to the preset, "
            f"but the preset is not a file on disk ({path}); give an absolute data.path"
        )
    data["path"] = str((path.parent / p).resolve())


def _expand_extends(raw: dict, dirs: list[Traversable], seen: tuple[str, ...] = ()) -> dict:
    extends = raw.get("extends", []) or []
    if isinstance(extends, str):
        extends = [extends]
    if not isinstance(extends, list):
        raise JobConfigError("extends: must be a list of preset names, e.g. [models/minilm-l6]")
    merged: dict = {}
    for name in extends:
        if name in seen:
            raise JobConfigError(f"extends: preset '{name}' extends itself through {' -> '.join(seen)}")
        path = _resolve_preset(name, dirs)
        preset = _read_yaml(path, f"extends: preset '{name}'")
        _anchor_data_path(preset, path, name)
        merged = _deep_merge(merged, _expand_extends(preset, dirs, (*seen, name)))
    body = {k: v for k, v in raw.items() if k != "extends"}
    out = _deep_merge(merged, body)
    out["extends"] = list(extends) + [e for e in merged.get("extends", []) if e not in extends]
    return out


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (["a", "b"], value); the value is parsed as YAML (so 3, true, [0, 1] work)."""
    if "=" not in text:
        raise JobConfigError(f"--set {text}: expected KEY=VALUE, e.g. --set data.limit=100")
    key, _, value = text.partition("=")
    parts = [p for p in key.strip().split(".")]
    if not all(parts):
        raise JobConfigError(f"--set {text}: the key '{key}' has an empty part")
    try:
        parsed = yaml_load(value) if value.strip() else None
    except DuplicateKeyError as e:
        raise JobConfigError(f"--set {text}: {e.problem}") from None
    except yaml.YAMLError:
        parsed = value
    return parts, parsed


def _apply_override(raw: dict, parts: list[str], value: Any, text: str) -> None:
    node = raw
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise JobConfigError(f"--set {text}: '{p}' is a value, not a section")
        node = nxt
    node[parts[-1]] = value


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The valid field names of the section that ``loc`` (a pydantic error location) points into."""
    cur: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = getattr(cur, "model_fields", {}).get(part)
        if field is None:
            return []
        ann = field.annotation
        cur = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
        if cur is None:
            return []
    return list(getattr(cur, "model_fields", {}))


def format_validation_error(err: ValidationError, source: str) -> str:
    """The first error of a pydantic ValidationError as one actionable line."""
    e = err.errors()[0]
    loc = tuple(e["loc"])
    field = ".".join(str(p) for p in loc) or "(top level)"
    more = f" (and {len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    if e["type"] == "extra_forbidden":
        valid = _fields_at(JobConfig, loc)
        near = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.5)
        hint = f"did you mean '{near[0]}'?" if near else f"valid keys here: {', '.join(valid)}"
        return f"{source}: {field}: unknown key; {hint}{more}"
    if e["type"] == "missing":
        return f"{source}: {field}: required but missing; add it to the job or pass --set {field}=...{more}"
    msg = e["msg"]
    msg = msg.removeprefix("Value error, ")
    given = e.get("input")
    shown = f" (got {given!r})" if given is not None and not isinstance(given, dict) else ""
    return f"{source}: {field}: {msg}{shown}{more}"


def load_job(
    path: str | Path | None, overrides: list[str] | tuple[str, ...] = (), raw: dict | None = None
) -> JobConfig:
    """Read, merge presets, apply overrides, validate. Raises JobConfigError with one line."""
    job_path = Path(path) if path is not None else None
    if raw is None:
        if job_path is None:
            raise JobConfigError("no job file given")
        raw = _read_yaml(job_path, "job")
    source = str(job_path) if job_path is not None else "job"
    raw = _expand_extends(raw, preset_dirs(job_path))
    for text in overrides:
        parts, value = parse_override(text)
        _apply_override(raw, parts, value, text)
    # a relative data path the job gives (a preset's was anchored to the preset in _expand_extends) is
    # relative to the job file, so jobs can be run from anywhere
    data = raw.get("data")
    if job_path is not None and isinstance(data, dict) and isinstance(data.get("path"), str):
        p = Path(data["path"]).expanduser()
        if not p.is_absolute() and not p.exists() and (job_path.resolve().parent / p).exists():
            data["path"] = str((job_path.resolve().parent / p).resolve())
    try:
        return JobConfig.model_validate(raw)
    except ValidationError as err:
        raise JobConfigError(format_validation_error(err, source)) from None
