"""The job file's schema: a pydantic v2 tree, one model per section, unknown keys rejected.

:class:`JobConfig` is the job; each section is a :class:`Section` (extra keys forbidden, a number field refuses
true/false). A value's checks that need nothing but the value live here, and every message is written to become
one :class:`JobConfigError` line that names the field and says how to fix it: a user's value quoted in an error is
cut to :data:`MAX_QUOTED` characters (:func:`show`, :func:`clip`), and a whole error line to :data:`MAX_LINE`
(:func:`one_line`). Checks that need the filesystem or the model (paths exist, the model config loads, the backend
is available) live in the stages' preflight checks.

Reading a job file (YAML, the presets named in ``extends``, ``--set`` overrides, the bounds on what a job file may
cost) is :mod:`rapids_attn.jobfile` (:func:`rapids_attn.jobfile.load_job`), which imports this schema.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import string
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, PrivateAttr, create_model, field_validator, model_serializer, model_validator

from rapids_attn.data.formats import FORMATS
from rapids_attn.embed.registry import embedder_spec
from rapids_attn.learn.config import (  # noqa: F401  (the learn stage's sections, re-exported)
    MAX_K_SWEEP,
    ClusterConfig,
    ReduceConfig,
    UmapConfig,
    UmapMetric,
)
from rapids_attn.settings import MAX_LINE, MAX_QUOTED, Section, clip, one_line, show  # noqa: F401  (re-exported)
from rapids_attn.tls import plain_address, plain_refusal

#: local workers may run at most this many threads (``n_workers`` x ``threads_per_worker``) per CPU.
MAX_THREADS_PER_CPU = 4


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity: a batch allocation's share of the node), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform
        return max(1, os.cpu_count() or 1)


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
    #: a hub dataset id in ``path`` (``owner/name``, or ``owner/name:config``) only: the configuration (subset),
    #: the split (default: the only one, or ``validation``) and the revision (a branch, tag or commit) that
    #: ``datasets.load_dataset`` reads (rapids_attn/data/hub.py). Left out of the job as written when unset, so
    #: the extraction keys of stores made before they existed stay the same.
    config: str | None = Field(None, min_length=1)
    split: str | None = Field(None, min_length=1)
    revision: str | None = Field(None, min_length=1)

    @model_serializer(mode="wrap")
    def _hub_fields_when_set(self, handler):
        out = handler(self)
        for name in ("config", "split", "revision"):
            if out.get(name) is None:
                out.pop(name, None)
        return out


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
    #: a model larger than one GPU: its layers spread over every GPU its worker sees, by transformers' (accelerate's)
    #: strategy, ``auto`` / ``balanced`` (the same: even shares), or ``sequential`` (fill each GPU in turn); None
    #: (the default) loads it whole onto the worker's one device. One worker then holds the model: local-cuda and
    #: local need ``runtime.n_workers: 1`` (rapids_attn.devices.resolve_devices). Not part of the extraction key
    #: (where the layers run does not change their maps), and left out of the job as written when unset, so the
    #: keys of stores made before it existed stay the same.
    device_map: Literal["auto", "balanced", "sequential"] | None = None

    @model_serializer(mode="wrap")
    def _device_map_when_set(self, handler):
        out = handler(self)
        if out.get("device_map") is None:
            out.pop("device_map", None)
        return out


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


class HeadClassExports(Section):
    """explain.head_classes.exports: the files KV-cache tools load, written to head_classes/ beside head_classes.json
    for a decoder (docs/kv-heads.md; ``python -m rapids_attn.export`` writes them from an existing run)."""

    #: write them (a decoder whose every layer and head the run captured; skipped with a note otherwise).
    enabled: bool = True
    #: how a key-value head's DuoAttention value combines its query heads' (max: streamed only when every
    #: query head of the group can be; mean: kvpress's on-the-fly scores).
    combine: Literal["max", "mean"] = "max"
    #: the share of each head's attention mass the vertical and slash sizes of sparse_attention_config.json must
    #: hold (the smallest measured pattern that does; its measured share is the entry's score).
    share: float = Field(0.9, gt=0, le=1)
    #: kv_budget.json: mean tokens kept per key-value head, as a share of context_length.
    budget: float = Field(0.5, gt=0, le=1)
    #: kv_budget.json's context length in tokens (unset: the run's longest input).
    context_length: int | None = Field(None, ge=1)


class HeadClassThresholds(Section):
    """explain.head_classes: the score a head's dataset mean must reach for each class, where the classes apply,
    their stability measures and the exports (rapids_attn/explain/head_classes.py; docs/kv-heads.md)."""

    #: mass on the first token (Gu et al. 2025's epsilon).
    sink: float = Field(0.3, gt=0, le=1)
    #: mass on the sink tokens and the recent window (rows that see beyond both).
    streaming: float = Field(0.9, gt=0, le=1)
    #: far induction mass (Wu et al. 2024's retrieval-score threshold).
    retrieval: float = Field(0.1, gt=0, le=1)
    #: the streaming and retrieval scores read only examples of at least this many tokens (a streaming cache of
    #: 4 + 64 tokens drops at least as much as it keeps from 136 on); none: the classes are not_applicable.
    min_length: int = Field(256, ge=2)
    #: bootstrap resamples of the examples for each head's interval and class stability (0: none).
    bootstrap: int = Field(200, ge=0, le=10_000)
    exports: HeadClassExports = Field(default_factory=HeadClassExports)

    def thresholds(self) -> dict[str, float]:
        return {"sink": self.sink, "streaming": self.streaming, "retrieval": self.retrieval}


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


class JobCore(Section):
    """The job's core sections, which every run reads; :data:`JobConfig` adds the registered stages' own sections
    (:func:`job_model`)."""

    #: a plain file name (it becomes the run directory's name under the default ``output.dir``).
    name: str = "job"
    extends: list[str] = Field(default_factory=list)
    data: DataConfig
    model: ModelConfig
    extract: ExtractConfig = ExtractConfig()
    embed: EmbedConfig = EmbedConfig()
    store: StoreConfig = StoreConfig()
    reduce: ReduceConfig = ReduceConfig()
    cluster: ClusterConfig = ClusterConfig()
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

    @property
    def as_written(self) -> JobCore:
        """The job as its file wrote it, before any stage changed it for the stages after it
        (:meth:`rapids_attn.stage.Stage.later_job`): this job itself unless it is such a later job."""
        return self._as_written or self

    _as_written: JobCore | None = PrivateAttr(None)

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> JobCore:
        """A copy is a job of its own (a compared model's, say): its ``as_written`` is itself, unless whoever makes
        it a later job sets it (:meth:`rapids_attn.stage.Stage.later_job`, :func:`rapids_attn.pipeline.stage_jobs`)."""
        copy = super().model_copy(update=update, deep=deep)
        copy._as_written = None
        return copy


#: the registered stages' own sections, by key (``heads``: HeadsConfig), in the registry's order: set by
#: :mod:`rapids_attn.registry` (:func:`use_stage_sections`), which imports this module (this one never imports it)
_STAGE_SECTIONS: dict[str, type[Section]] = {}
_MODELS: dict[tuple, type[JobCore]] = {}


def use_stage_sections(sections: dict[str, type[Section]]) -> None:
    """The registry's stages' sections, the job's from now on (:func:`job_model`)."""
    clash = set(sections) & set(JobCore.model_fields)
    if clash:
        raise ValueError(f"stage section {min(clash)!r} is a core section of the job; name it otherwise")
    _STAGE_SECTIONS.clear()
    _STAGE_SECTIONS.update(sections)


def job_model() -> type[JobCore]:
    """The job's model: :class:`JobCore` with one section per registered stage that has settings
    (:attr:`rapids_attn.stage.Stage.settings`), each defaulting to its settings' defaults, so a stage's section is
    validated, defaulted and named in errors like a core one. Built once per set of sections. The sections are the
    ones :mod:`rapids_attn.registry` set when it was imported (this module never imports it, as the stages import
    this one): ask :func:`rapids_attn.registry.job_model`, which has."""
    key = tuple(_STAGE_SECTIONS.items())
    if key not in _MODELS:
        fields: dict[str, Any] = {name: (cls, Field(default_factory=cls)) for name, cls in key}
        _MODELS[key] = create_model("JobConfig", __base__=JobCore, __module__=__name__, **fields)
    return _MODELS[key]


if TYPE_CHECKING:  # the type of a job as validated (:func:`rapids_attn.registry.job_model` is the model itself)
    JobConfig = JobCore


def extraction_settings(job: dict, data_fingerprint: str = "", shard_size: int | None = None) -> dict:
    """What :meth:`JobConfig.extraction_key` hashes, from a job as :meth:`JobConfig.to_dict` writes it (the store
    keeps that dict, so the settings a store was made with can be set beside a job's to name what changed)."""
    d = json.loads(json.dumps(job))  # a copy: the caller's dict is left as it is
    if shard_size is not None:
        d["extract"]["shard_size"] = int(shard_size)
    keep = {k: d.get(k, {}) for k in ("data", "model", "extract", "embed", "store")}
    keep["data_content"] = data_fingerprint
    for name, settings in _STAGE_SECTIONS.items():  # a stage that changes what the later stages read (finetune)
        keep.update(settings.store_settings(name, d.get(name) or {}))
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
    # nor over how many GPUs the model's layers are spread (model.device_map: the same maps, where extract.device is
    # left out above)
    keep["model"] = {k: v for k, v in keep["model"].items() if k != "device_map"}
    return keep
