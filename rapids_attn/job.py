"""The job file's schema: a pydantic v2 tree, one model per section, unknown keys rejected.

:class:`JobConfig` is the job; each section is a :class:`Section` (extra keys forbidden, a number field refuses
true/false). A value's checks that need nothing but the value live here, and every message is written to become
one :class:`JobConfigError` line that names the field and says how to fix it: a user's value quoted in an error is
cut to :data:`MAX_QUOTED` characters (:func:`show`, :func:`clip`), and a whole error line to :data:`MAX_LINE`
(:func:`one_line`). Checks that need the filesystem or the model (paths exist, the model config loads, the backend
is available) live in the stages' preflight checks.

Reading a job file (YAML, the presets named in ``extends``, ``--set`` overrides, the bounds on what a job file may
cost) is :mod:`rapids_attn.jobfile`. Its public names (:func:`load_job`, :func:`parse_override`,
:func:`preset_dirs`, ...) are re-exported here on purpose, so ``from rapids_attn.job import load_job`` keeps
working (:data:`_JOBFILE_NAMES`; looked up when first asked for, since the loader imports this schema).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import reprlib
import string
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rapids_attn.data.formats import FORMATS
from rapids_attn.embed.registry import embedder_spec
from rapids_attn.tls import plain_address, plain_refusal

#: characters of a user's value an error line quotes (then "...", and its length).
MAX_QUOTED = 120
#: characters of a whole job error line (a longer one keeps its start and its end, the fix).
MAX_LINE = 1000
#: local workers may run at most this many threads (``n_workers`` x ``threads_per_worker``) per CPU.
MAX_THREADS_PER_CPU = 4


def clip(text: str, limit: int = MAX_QUOTED) -> str:
    """``text`` as an error line quotes it: whole when short, else its first ``limit`` characters, "..." and
    its length."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxset = 3, 12, 12, 8, 12
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = MAX_QUOTED


def show(value: Any) -> str:
    """A user's value as an error line quotes it: its repr, at most :data:`MAX_QUOTED` characters (a long
    string is cut after them with its length; a long list or mapping shows its first entries and its length),
    built without writing out the whole value first."""
    if isinstance(value, str):
        return repr(value) if len(value) <= MAX_QUOTED else f"{value[:MAX_QUOTED]!r}... ({len(value):,} characters)"
    try:
        text = _REPR.repr(value)
    except ValueError:  # an int past Python's 4,300-digit str conversion limit (YAML reads 0x... of any size)
        return (
            f"a number of {value.bit_length() * 0.30103:,.0f} digits"
            if isinstance(value, int)
            else "a value too long to show"
        )
    if isinstance(value, (list, tuple, dict, set)) and len(value) > _REPR.maxlist:
        text += f" ({len(value):,} entries)"
    return clip(text, MAX_QUOTED + 30)


def one_line(message: str) -> str:
    """A job error as one line of at most :data:`MAX_LINE` characters: the start and the end (where the fix
    is) of a longer one, around a note of what was cut. Every error :func:`rapids_attn.jobfile.load_job` raises goes
    through it."""
    message = " ".join(str(message).splitlines())
    if len(message) <= MAX_LINE:
        return message
    head, tail = MAX_LINE * 3 // 5, MAX_LINE // 3
    return f"{message[:head]} ...({len(message) - head - tail:,} characters cut)... {message[-tail:]}"


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity: a batch allocation's share of the node), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform
        return max(1, os.cpu_count() or 1)


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


#: what ``data.format`` takes: ``auto``, then every format registered in :mod:`rapids_attn.data.formats`, as a
#: ``Literal`` (its JSON schema is their enum; a wrong value's error lists them all, in this order)
DataFormat = Literal[FORMATS]  # type: ignore[valid-type]  # built from the registry: one place per format


class DataConfig(Section):
    path: Path
    #: ``auto`` or a registered format (:data:`DataFormat`)
    format: DataFormat = "auto"
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
    #: the dtype the model runs in. ``auto``: float32 on the CPU; on a GPU the checkpoint's own (its config's dtype):
    #: bfloat16 where the GPU runs it natively, else float32; float16 for float16; float16 for a float32 checkpoint
    #: or one naming none (rapids_attn.devices.auto_model_dtype, resolved on each worker). The extraction key holds
    #: the setting as written, so stores made before auto read the checkpoint keep their keys.
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
    #: how attention is captured. ``blocked``: the model's output comes from ``attention_base`` (by default the
    #: capture's own softmax)
    #: and every map's image, statistics, profile and detectors are accumulated block of query rows by block,
    #: never holding a T x T map (memory grows linearly with the length; no 1024-token cap). ``eager``: the
    #: model runs eager attention and each layer's whole maps are reduced (memory grows with the square).
    #: ``auto``: blocked wherever the model computes attention through transformers' attention interface.
    attention: Literal["auto", "blocked", "eager"] = "auto"
    #: the implementation that computes the model's output under the blocked capture. ``capture`` (the default):
    #: each layer whose every head is captured gets its output from the capture's own blocks of weights (one
    #: wider product per block instead of a second attention over the same scores; the same output within 1e-5,
    #: faster on the CPU at every length measured and lighter on a GPU in float32, docs/benchmarks.md), the rest
    #: from SDPA; or ``sdpa``, ``eager``, or another implementation transformers knows (``flash_attention_2`` on a
    #: GPU with flash-attn installed).
    attention_base: str = Field("capture", pattern=r"^[A-Za-z0-9_]+$")
    #: MiB of float32 scores and weights one block of query rows may hold (batch x heads x rows x T x 3).
    attention_block_mb: int = Field(64, gt=0)
    #: the blocked capture's kernel (rapids_attn/extract/kernels.py). ``torch``: the blocked PyTorch path. ``triton``:
    #: the fused kernel, one launch per layer for the output and every map's sums (on a CUDA GPU; on the CPU only
    #: under ``TRITON_INTERPRET=1``, Triton's interpreter, for checking). ``auto``: triton on a GPU with Triton
    #: installed, else torch. A layer the kernel cannot serve (a long input's windows) runs the torch path, and
    #: summary.json says which kernel served each layer and why. Not part of the store key: the kernels agree
    #: within 1e-5 (``kernel_precision: ieee``; tests/unit/extract/test_fused.py).
    kernel: Literal["auto", "torch", "triton"] = "auto"
    #: the fused kernel's input precision for the product of the weights with the key features and the image's
    #: R^T: ``tf32`` (tensor cores, relative error under 2^-10), ``bf16`` (2^-7) or ``ieee`` (float32); ``auto``:
    #: ieee for a model that runs in float32, tf32 for one in float16 or bfloat16 (whose scores are no finer).
    #: Accumulation is float32 in each; the scores and the output are in the model's dtype, as its flash attention's.
    kernel_precision: Literal["auto", "ieee", "tf32", "bf16"] = "auto"

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
                    raise ValueError(f"{name} must be distinct non-negative indices, got {show(sel)}")
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
        if self.precision == "int8" and not embedder_spec(self.name).int8:
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
            raise ValueError(f"n_clusters must be at least 2 or auto, got {show(self.n_clusters)}")
        if self.k_sweep is not None and not (2 <= self.k_sweep[0] < self.k_sweep[1]):
            raise ValueError(f"k_sweep must be [first, last] with 2 <= first < last, got {show(self.k_sweep)}")
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
    #: distinct head indices (0-based; preflight checks them against the model's heads); null: all heads.
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

    @field_validator("pagerank_heads")
    @classmethod
    def _some_distinct_heads(cls, value: list[int] | None) -> list[int] | None:
        """An empty list would average no heads (a uniform PageRank); a repeated head would count twice. The
        upper bound is the model's heads, checked in preflight (the relevance stage's check)."""
        if value is None:
            return value
        if not value:
            raise ValueError("is empty, which ranks every token the same; list heads, or leave it out for all heads")
        if len(set(value)) != len(value) or any(h < 0 for h in value):
            raise ValueError("must be distinct non-negative head indices; list each head once")
        return value


#: the finetune settings that add control fine-tunes or keep its steps, and leave the analysed one as it is
CONTROL_SETTINGS = ("control_seeds", "shuffled_labels", "trajectory")


class FinetuneConfig(Section):
    """Fine-tune the model for the task before its heads are analysed (the ``finetune`` stage, issue 37), on
    HuggingFace's ``Trainer``. When enabled, the job's later stages analyse the fine-tuned model (the folder
    ``models/finetuned`` in the run directory), over the examples of the held-out groups only."""

    #: run the stage by default (it always runs when --stages names it).
    enabled: bool = False
    #: ``qa``: extractive question answering on SQuAD-format data; ``classify``: sequence classification on
    #: data.label_field.
    task: Literal["qa", "classify"] = "qa"
    #: share of the file's examples held out for evaluation, as whole groups (data.group_field; SQuAD: articles),
    #: so no context is on both sides. The later stages analyse the held-out examples (then data.sample/limit).
    eval_fraction: float = Field(0.5, gt=0, lt=1)
    #: at most this many training examples: a seeded sample of the training groups' (null: all of them).
    train_examples: int | None = Field(None, gt=0)
    #: at most this many held-out examples scored after training: a seeded sample (null: all of them).
    eval_examples: int | None = Field(None, gt=0)
    #: qa: train on every question (``all``) or on the answerable ones only (``answerable``: SQuAD 1.1's recipe;
    #: the no-answer decision then rests on the threshold, threshold_examples).
    train_questions: Literal["all", "answerable"] = "all"
    #: qa: the no-answer threshold on the margin (no-answer score minus best span score). 0: run_qa.py's rule,
    #: threshold 0. N > 0: N questions of the training groups are held back from training (a seeded sample, every
    #: kind of question) and the threshold is the one that scores best on them (SQuAD 2.0's best F1), then applied
    #: unchanged to the held-out groups.
    threshold_examples: int = Field(0, ge=0)
    #: tokens per training window (question and context); longer contexts are read in overlapping windows.
    max_length: int = Field(384, gt=16)
    #: tokens two consecutive windows of one context share (qa).
    doc_stride: int = Field(128, gt=0)
    learning_rate: float = Field(5e-5, gt=0)
    epochs: float = Field(2.0, gt=0)
    #: stop after this many optimizer steps (-1: run the epochs).
    max_steps: int = Field(-1, ge=-1)
    batch_size: int = Field(16, gt=0)
    eval_batch_size: int = Field(32, gt=0)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    weight_decay: float = Field(0.01, ge=0)
    #: a checkpoint (weights, optimizer, scheduler, RNG) every this many steps: an interrupted run resumes there.
    save_steps: int = Field(100, gt=0)
    #: the training seed of the analysed fine-tune: the new head's initial weights, the order of the batches,
    #: dropout. Apart from runtime.seed, which draws the split of groups and the samples, so another training seed
    #: trains on the same examples.
    seed: int = 0
    #: further fine-tunes with these training seeds, the same data and schedule (``models/finetuned-seed<N>``): the
    #: compare stage measures seed-to-seed change beside base-to-fine-tune change, and calls a head changed only
    #: above that floor. At least two give the floor intervals over seeds (three fine-tunes in all).
    control_seeds: list[int] = []
    #: classify: one more fine-tune (training seed ``seed``) on the training labels shuffled among the examples
    #: (``models/finetuned-shuffled``): what training alone changes, without the task.
    shuffled_labels: bool = False
    #: keep the analysed fine-tune's weights at every checkpoint (``models/finetuned-steps/step-<N>``, every
    #: save_steps): the compare stage compares each with the base and with the final model, so the findings say
    #: when each change appears.
    trajectory: bool = False

    @model_validator(mode="after")
    def _controls(self) -> FinetuneConfig:
        if len(set(self.control_seeds)) != len(self.control_seeds) or self.seed in self.control_seeds:
            raise ValueError(
                f"control_seeds {self.control_seeds} must be distinct and differ from finetune.seed ({self.seed}): "
                "each names one more fine-tune"
            )
        if self.task != "qa" and (self.train_questions != "all" or self.threshold_examples):
            raise ValueError(
                "train_questions and threshold_examples are settings of finetune.task: qa; leave them at all and 0"
            )
        if self.shuffled_labels and self.task != "classify":
            raise ValueError(
                "shuffled_labels is a control of finetune.task: classify (labels shuffled among the training "
                "examples); set finetune.shuffled_labels: false, or use control_seeds for qa"
            )
        return self

    @model_validator(mode="after")
    def _stride_in_window(self) -> FinetuneConfig:
        if self.doc_stride >= self.max_length // 2:
            raise ValueError(
                f"doc_stride ({self.doc_stride}) must be under half of max_length ({self.max_length}), or the "
                "question and the overlap leave no new context per window; lower finetune.doc_stride"
            )
        return self


class CompareConfig(Section):
    """Models compared head by head over the same inputs (the ``compare`` stage, issue 37)."""

    #: run the stage by default (it always runs when --stages names it).
    enabled: bool = False
    #: the models compared with the job's: local folders, hub ids or presets, each extracted over the job's examples
    #: into ``models/<label>`` of the run directory. Empty with finetune enabled: the model it started from.
    models: list[str] = []
    #: examples whose maps are compared map to map (a seeded sample of the run's examples; null: all of them).
    examples: int | None = Field(500, gt=0)
    #: examples per forward pass of each model.
    batch_size: int = Field(16, gt=0)
    #: bootstrap resamples of the examples behind each interval.
    resamples: int = Field(1000, ge=100)
    #: the intervals' confidence level.
    level: float = Field(0.95, gt=0.5, lt=1)
    #: with finetune.control_seeds: the false-discovery rate across heads at which a head is called changed beyond
    #: the seed-to-seed floor (Benjamini-Hochberg).
    fdr: float = Field(0.05, gt=0, lt=1)
    #: maps per model the shared clustering is fitted on (a seeded sample; every map is then assigned).
    fit_sample: int = Field(20000, gt=0)
    #: also run the heads stage on each compared model (the job's heads settings and metric, over the same
    #: examples), so each head's change is shown beside its ablation cost in both models. Needs heads.enabled and a
    #: metric every compared model can be scored on (a base model without the fine-tune's task head cannot).
    heads: bool = False

    @field_validator("models")
    @classmethod
    def _distinct_models(cls, value: list[str]) -> list[str]:
        """Each entry names a model, and a model once. The message names the entry (``compare.models[1]: ...``),
        which the job loader shows in place of the field. The same model written two ways (``./m``, ``m/``), and
        the job's own model, are refused in preflight (rapids_attn.compare.stage.check_compared_names)."""
        for i, v in enumerate(value):
            if not str(v).strip():
                raise ValueError(f"compare.models[{i}]: is empty; name a model (a folder, a hub id or a preset)")
            if v in value[:i]:
                j = value.index(v)
                raise ValueError(f"compare.models[{i}]: {show(v)} is compare.models[{j}] again; list each model once")
        return value


class RuntimeConfig(Section):
    #: ``local`` (dask LocalCluster), ``local-cuda`` (dask-cuda LocalCUDACluster, one worker per GPU),
    #: or ``scheduler`` (an existing cluster: set ``address`` or ``scheduler_file``).
    cluster: Literal["local", "local-cuda", "scheduler"] = "local"
    n_workers: int | None = Field(None, gt=0)
    threads_per_worker: int = Field(1, gt=0)
    #: worker processes (True) or threads in this process (False; handy for debugging).
    processes: bool = True
    #: ``scheduler``: join a scheduler that speaks plain, unencrypted TCP (whoever reaches it runs code on its
    #: workers); off by default, so a ``tcp://`` scheduler is refused
    plain_tcp: bool = False
    #: ``scheduler``: the folder of the TLS key and certificate the cluster was started with
    #: (``python -m rapids_attn.tls FOLDER``); without it, the Dask config's ``distributed.comm.tls.*``
    tls: Path | None = None
    address: str | None = None
    scheduler_file: Path | None = None
    dashboard_address: str = "127.0.0.1:8787"
    #: local-cuda: RMM pool per GPU: a size ("24GB"), a fraction of the GPU's memory (0.8), "auto"
    #: (0.8), or None for no pool.
    rmm_pool_size: float | str | None = "auto"
    #: where the fit runs: ``auto`` (cuML when importable and a GPU is visible), ``cpu``, ``gpu``.
    learn_backend: Literal["auto", "cpu", "gpu"] = "auto"
    seed: int = 0

    @field_validator("n_workers")
    @classmethod
    def _local_workers_fit_the_machine(cls, value: int | None, info) -> int | None:
        """``local`` workers are processes (or threads) on this machine: at most :data:`MAX_THREADS_PER_CPU` per
        CPU this process may use (100,000 would be started one by one, each importing torch). ``local-cuda``
        starts one per GPU (the devices' check); an external scheduler's workers are its own (n_workers unused)."""
        if value is not None and info.data.get("cluster") == "local":
            cpus = available_cpus()
            most = MAX_THREADS_PER_CPU * cpus
            if value > most:
                raise ValueError(
                    f"more local workers than this machine runs: {cpus} CPU{'s' if cpus > 1 else ''} here, at most "
                    f"{most} workers ({MAX_THREADS_PER_CPU} per CPU); lower runtime.n_workers, or leave it out for "
                    "one worker per CPU (up to 8)"
                )
        return value

    @field_validator("threads_per_worker")
    @classmethod
    def _local_threads_fit_the_machine(cls, value: int, info) -> int:
        """Each worker's torch threads, on this machine for ``local`` and ``local-cuda``: all of them together at
        most :data:`MAX_THREADS_PER_CPU` per CPU (an external scheduler's workers run on their own machines)."""
        cluster = info.data.get("cluster")
        if cluster not in ("local", "local-cuda"):
            return value
        workers = (info.data.get("n_workers") or 1) if cluster == "local" else 1
        cpus = available_cpus()
        most = MAX_THREADS_PER_CPU * cpus
        if workers * value > most:
            what = f"{workers} workers x {value} threads" if workers > 1 else f"{value} threads in a worker"
            raise ValueError(
                f"{what} for {cpus} CPU{'s' if cpus > 1 else ''} here; at most {most} threads in all "
                f"({MAX_THREADS_PER_CPU} per CPU): lower runtime.threads_per_worker"
                + (" or runtime.n_workers" if workers > 1 else "")
            )
        return value

    @field_validator("plain_tcp", "tls")
    @classmethod
    def _joined_clusters_only(cls, value, info):
        if value not in (None, False) and info.data.get("cluster") != "scheduler":
            raise ValueError(
                "only used with cluster: scheduler (a local cluster makes TLS credentials of its own); leave it out"
            )
        return value

    @field_validator("address")
    @classmethod
    def _encrypted_unless_told(cls, value: str | None, info) -> str | None:
        """A plain (``tcp://``) scheduler runs whatever reaches it: joined only with ``plain_tcp: true``."""
        if value is not None and plain_address(value) and not info.data.get("plain_tcp"):
            raise ValueError(plain_refusal())
        return value

    @model_validator(mode="after")
    def _scheduler_target(self) -> RuntimeConfig:
        if self.cluster == "scheduler" and not (self.address or self.scheduler_file):
            raise ValueError("cluster 'scheduler' needs address (tls://host:8786) or scheduler_file")
        if self.cluster != "scheduler" and (self.address or self.scheduler_file):
            raise ValueError("address / scheduler_file are only used with cluster: scheduler")

        return self


class OutputConfig(Section):
    #: the run directory; relative paths are relative to the current directory. ``{name}`` is replaced
    #: by the job's name; no other ``{...}`` field is known.
    dir: Path = Path("runs/{name}")

    @field_validator("dir", mode="before")
    @classmethod
    def _a_path(cls, value):
        """null, an empty string or a number is no directory: said with the fix, not as pydantic's type name."""
        if not isinstance(value, (str, Path)) or not str(value).strip():
            raise ValueError("must name a directory, e.g. runs/{name}; leave it out for runs/<job name>")
        return value

    @field_validator("dir")
    @classmethod
    def _only_name_field(cls, value: Path) -> Path:
        """Only the plain placeholder ``{name}``: no other field, and no attribute, index, conversion or format
        spec on it (``{name.__class__}``, ``{name[0]}``, ``{name!r}``, ``{name:>9}``), which ``str.format`` would
        follow into the string's own attributes."""
        fix = (
            "only {name} may be written in braces (no attribute, index, conversion or format spec); double a literal "
            "brace: {{ }}"
        )
        try:
            parts = list(string.Formatter().parse(str(value)))
        except ValueError as e:  # a lone brace
            raise ValueError(f"{clip(e)}; {fix}") from None
        for _, field, spec, conversion in parts:
            if field is not None and (field != "name" or spec or conversion):
                written = "{" + field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
                raise ValueError(f"{clip(written)} is not a placeholder; {fix}")
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
    finetune: FinetuneConfig = FinetuneConfig()
    compare: CompareConfig = CompareConfig()
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
        keep = extraction_settings(self.to_dict(), data_fingerprint, shard_size)
        return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


def extraction_settings(job: dict, data_fingerprint: str = "", shard_size: int | None = None) -> dict:
    """What :meth:`JobConfig.extraction_key` hashes, from a job as :meth:`JobConfig.to_dict` writes it (the store
    keeps that dict, so the settings a store was made with can be set beside a job's to name what changed)."""
    d = json.loads(json.dumps(job))  # a copy: the caller's dict is left as it is
    if shard_size is not None:
        d["extract"]["shard_size"] = int(shard_size)
    keep = {k: d.get(k, {}) for k in ("data", "model", "extract", "embed", "store")}
    keep["data_content"] = data_fingerprint
    if d.get("finetune", {}).get("enabled"):  # the store holds the fine-tune's maps, over the held-out examples
        # the analysed fine-tune's settings; its controls (other seeds, shuffled labels) are other models
        keep["finetune"] = {k: v for k, v in d["finetune"].items() if k not in CONTROL_SETTINGS}
    # where and in which batches maps are computed does not change them (tested: batch invariance)
    keep["extract"] = {
        k: v
        for k, v in keep["extract"].items()
        if k not in ("device", "token_budget", "attention_budget", "max_batch_size", "kernel", "kernel_precision")
    }
    # nor does which implementation gives the blocked capture's model output, nor the size of its blocks of rows
    # (the same maps within 1e-5, tests/unit/extract/test_blocked.py): the key holds the values every store was
    # made with before issue 34 changed the default base, so those stores still match an unchanged job
    keep["extract"].update(attention_base="sdpa", attention_block_mb=64)
    keep["embed"] = {k: v for k, v in keep["embed"].items() if k != "batch_size"}
    return keep


# ----------------------------------------------------------------------------------------------
# the job file loader's names, re-exported

#: the public names of :mod:`rapids_attn.jobfile` that importers read from here (``from rapids_attn.job import
#: load_job``). The loader imports this schema, so importing it at the top would be a cycle: each name is looked
#: up in the loader when asked for (PEP 562), always the loader's current one.
_JOBFILE_NAMES = frozenset(
    {
        "LOCAL_PRESETS",
        "MAX_DEPTH",
        "MAX_JOB_BYTES",
        "MAX_NODES",
        "NAME_MAX",
        "PATH_MAX",
        "DuplicateKeyError",
        "JobBoundError",
        "JobLoader",
        "builtin_presets",
        "check_expansion",
        "format_validation_error",
        "load_job",
        "parse_override",
        "preset_dirs",
        "yaml_load",
    }
)


def __getattr__(name: str) -> Any:
    if name in _JOBFILE_NAMES:
        from rapids_attn import jobfile

        return getattr(jobfile, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
