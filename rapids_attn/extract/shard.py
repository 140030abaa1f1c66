"""Phase 1 on a worker: one shard of examples -> rows of the store, then its done-marker.

A worker loads the model, tokenizer and embedder once (cached per process, keyed by the job's
extraction key) and reuses them for every shard it runs. Tasks are small and cheap to pickle
(the job sections extraction uses, and a description of the shard's rows, not their texts): the
worker reads its own rows from the input and writes them, ids, groups and labels included, into
the store. A shard returns small metadata, never arrays. The device and dtypes come from the
device plan (:mod:`rapids_attn.devices`).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from rapids_attn.data.example import Example
from rapids_attn.data.index import Rows
from rapids_attn.devices import ExtractDevices, empty_device_cache
from rapids_attn.extract.batching import BatchCost, length_batches, tokenize
from rapids_attn.extract.capture import AttentionCapture, check_probe_map, not_finite
from rapids_attn.extract.kernels import KernelLog, make_kernel, resolve_kernel
from rapids_attn.extract.maps import LayerReducer, TokenMasks, punctuation_ids, separator_ids
from rapids_attn.extract.signature import DETECTOR_NAMES, PROFILE_OFFSETS, STAT_NAMES, first_not_finite
from rapids_attn.job import EmbedConfig, ExtractConfig, ModelConfig
from rapids_attn.stagekit import WorkerCache
from rapids_attn.store import schema as S
from rapids_attn.store.zarr_store import StoreLayout, encode_thumbnails, write_shard


@dataclass
class ShardTask:
    """One shard's work. Carries only the job sections extraction uses, the device plan's extract
    part and the shard's :class:`~rapids_attn.data.index.Rows` (where its examples are, not their
    texts; SQuAD's and the probes' travel inline): small and cheap to pickle."""

    model: ModelConfig
    extract: ExtractConfig
    embed: EmbedConfig
    devices: ExtractDevices
    threads: int  # torch threads per worker (runtime.threads_per_worker)
    key: str  # the job's extraction key (also the worker cache key)
    store_path: str
    layout: StoreLayout
    shard: int
    rows: Rows
    max_length: int

    @classmethod
    def from_job(
        cls,
        cfg,
        layout: StoreLayout,
        max_length: int,
        examples: list[Example] | None = None,
        shard: int = 0,
        store_path: str = "",
    ) -> ShardTask:
        """A task from a whole JobConfig, its devices resolved as preflight would (tests, benchmarks)."""
        from rapids_attn.devices import resolve_devices

        devices = resolve_devices(cfg.extract, cfg.model, cfg.embed, cfg.runtime, ("extract",))
        return cls(
            cfg.model,
            cfg.extract,
            cfg.embed,
            devices.extract,
            cfg.runtime.threads_per_worker,
            cfg.extraction_key(),
            store_path,
            layout,
            shard,
            Rows(None, inline=tuple(examples or ())),
            max_length,
        )


@dataclass
class ShardResult:
    shard: int
    n_examples: int
    n_maps: int
    n_truncated: int
    n_windowed: int
    n_tokens: int
    device: str
    worker: str
    seconds: dict[str, float] = field(default_factory=dict)
    causal: bool | None = None  # the model's attention, as the worker's probe found it
    dtype: str = ""  # the dtype the worker ran the model in (model.dtype, auto resolved there)
    #: which capture kernel served each layer (kernel -> layers), and the forwards where the torch kernel ran in
    #: another's place, by reason (rapids_attn.extract.kernels.KernelLog)
    kernels: dict[str, list[int]] = field(default_factory=dict)
    kernel_fallbacks: dict[str, int] = field(default_factory=dict)


def check_tokens(examples: list[Example], lengths: list[int]) -> None:
    """An example the tokenizer turned into no tokens has no attention to capture: a one-line error naming it
    (an empty text, with a tokenizer that adds no special tokens, as GPT-2's). Preflight refuses these from the
    index (:func:`rapids_attn.pipeline._check_texts`); this is the last guard, for a file changed since."""
    empty = [ex.id for ex, n_tok in zip(examples, lengths, strict=True) if n_tok == 0]
    if empty:
        from rapids_attn.errors import DataError

        more = f" (and {len(empty) - 1} more in its shard)" if len(empty) > 1 else ""
        raise DataError(
            f"data.path: example {empty[0]!r}{more} has no tokens: its text is empty and the tokenizer adds no "
            "special tokens; give it text or remove it from the data"
        )


class Extractor:
    """Model, tokenizer, embedder and the capture, loaded once per worker process."""

    def __init__(self, task: ShardTask):
        from rapids_attn.embed import build_embedder
        from rapids_attn.extract.model import checkpoint_dtype, load_model, load_tokenizer, model_devices

        self.extract_cfg = task.extract
        self.layout = task.layout
        self.max_length = task.max_length
        self.model_name = task.model.name
        # model.dtype: auto follows the checkpoint's own dtype on a GPU (rapids_attn.devices.auto_model_dtype)
        saved = checkpoint_dtype(task.model) if task.devices.model_dtype == "auto" else None
        dev = task.devices.on_this_worker(saved)
        self.device = dev.device
        self.model_dtype = dev.model_dtype
        self.tokenizer = load_tokenizer(task.model)
        ecfg = task.extract
        self.model = load_model(task.model, self.device, dev.model_dtype, ecfg.attention, ecfg.attention_base)
        # where the shards say they ran: the worker's device, or with model.device_map every device the model spans
        spans = model_devices(self.model)
        self.device_label = self.device if len(spans) <= 1 else ",".join(spans)
        n_layers = self.model.config.num_hidden_layers
        self.capture = AttentionCapture(self.model, n_layers)
        #: the blocked capture's kernel (extract.kernel: auto resolved for this worker's device)
        self.kernel = resolve_kernel(ecfg.kernel, self.device) if self.capture.mode == "blocked" else "torch"
        self.capture.kernel = make_kernel(self.kernel, ecfg.kernel_precision)
        self.embedder = build_embedder(task.embed, task.extract.image_size, self.device, dev.embed_precision)
        self.sep_ids = separator_ids(self.tokenizer)
        self.punct_ids = punctuation_ids(self.tokenizer)
        # hooks are registered per forward: two threads sharing this extractor must take turns
        self.lock = threading.Lock()
        self.causal = self._probe_causal()
        self.capture.kernel_log = KernelLog()  # the probe's forward reads whole maps: not the shards' record
        #: how the shard's inputs are grouped into batches: least padded work (extract/batching.py)
        self.batch_cost = BatchCost.for_model(int(getattr(self.model.config, "hidden_size", 768) or 768), self.device)

    def _probe_causal(self) -> bool:
        """True when every head of every layer puts no mass above the diagonal (decoder attention). Refuses, in one
        line, a model whose weights are not a map of probabilities (:func:`check_probe_map`)."""
        ids = self.tokenizer("a b c d e f", return_tensors="pt")["input_ids"][:, :6].to(self.device)
        upper: list[float] = []

        def look(layer, w):
            check_probe_map(self.model, layer, w, ids.shape[1], self.model_name)
            upper.append(float(torch.triu(w.float(), diagonal=1).sum()))

        self.capture.run({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, look)
        return max(upper) == 0.0

    def run_batch(
        self, input_ids: list[list[int]], token_type_ids: list[list[int]] | None = None
    ) -> dict[str, torch.Tensor]:
        """Forward one batch; return images [b, L, H, S, S], thumbs, stats for its examples."""
        lengths = [len(x) for x in input_ids]
        features = {"input_ids": input_ids}
        if token_type_ids is not None:
            features["token_type_ids"] = token_type_ids
        enc = self.tokenizer.pad(features, padding=True, return_tensors="pt")
        batch = {k: v.to(self.device) for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        masks = TokenMasks.from_ids(batch["input_ids"], self.sep_ids, self.punct_ids, host_ids=enc["input_ids"])
        reducer = self._reducer(lengths, masks)
        with self.lock:
            self.capture.run(batch, reducer)
        return self._outputs(reducer)

    def _reducer(self, lengths: list[int], masks: TokenMasks) -> LayerReducer:
        return LayerReducer(
            lengths,
            masks,
            self.layout.layers,
            self.layout.heads,
            self.layout.image_size,
            self.layout.thumb_size,
            self.causal,
            self.device,
            block_bytes=self.extract_cfg.attention_block_mb << 20,
        )

    def _outputs(self, reducer: LayerReducer) -> dict[str, torch.Tensor]:
        return {
            "images": reducer.images,
            S.THUMBNAILS: reducer.thumbs,
            S.STATS: reducer.stats,
            S.PROFILE: reducer.profile,
            S.DETECTORS: reducer.detectors,
        }

    def run_windows(self, tok, i: int, max_length: int, overlap: int) -> dict[str, torch.Tensor]:
        """One input longer than ``max_length``, read as overlapping windows (rapids_attn/extract/windows.py):
        the same outputs as :meth:`run_batch` for a batch of this one example."""
        from rapids_attn.extract.windows import WindowSink, plan_windows, template_ends

        ids = tok.input_ids[i]
        types = tok.token_type_ids[i] if tok.token_type_ids is not None else None
        plan = plan_windows(ids, types, max_length, overlap, template_ends(self.tokenizer), self.causal)
        host = torch.tensor([ids])
        masks = TokenMasks.from_ids(host.to(self.device), self.sep_ids, self.punct_ids, host_ids=host)
        reducer = self._reducer([len(ids)], masks)
        sink = WindowSink(reducer, plan, self.causal)
        ecfg = self.extract_cfg
        per_forward = max(1, min(ecfg.max_batch_size, ecfg.token_budget // max_length))
        if self.capture.mode != "blocked":  # whole maps: the eager capture's bound on a batch's T^2 entries
            per_forward = max(1, min(per_forward, ecfg.attention_budget // (max_length * max_length)))
        n_win = len(plan.windows)
        for k0 in range(0, n_win, per_forward):
            chunk = range(k0, min(k0 + per_forward, n_win))
            features = {"input_ids": [plan.input_ids[k] for k in chunk]}
            if plan.token_type_ids is not None:
                features["token_type_ids"] = [plan.token_type_ids[k] for k in chunk]
            enc = self.tokenizer.pad(features, padding=True, return_tensors="pt")
            batch = {
                k: v.to(self.device) for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")
            }
            sink.chunk, sink.last = chunk, chunk.stop == n_win
            with self.lock:
                self.capture.run(batch, sink)
        return self._outputs(reducer)

    def process(self, task: ShardTask) -> ShardResult:
        t0 = time.perf_counter()
        examples = task.rows.read()
        self.capture.kernel_log = KernelLog()  # this shard's record
        start, stop = self.layout.shard_rows(task.shard)
        if len(examples) != stop - start:
            raise ValueError(f"shard {task.shard}: read {len(examples)} examples, expected {stop - start}")
        windows = task.model.long_inputs == "windows"
        tok = tokenize(self.tokenizer, examples, task.max_length, windows=windows)
        check_tokens(examples, tok.lengths)
        n = len(examples)
        nl, nh = len(self.layout.layers), len(self.layout.heads)
        s, t = self.layout.image_size, self.layout.thumb_size
        feats = np.zeros((n, nl, nh, self.layout.feature_dim), dtype=self.layout.features_dtype)
        stats = np.zeros((n, nl, nh, len(STAT_NAMES)), dtype=np.float32)
        profile = np.zeros((n, nl, nh, len(PROFILE_OFFSETS)), dtype=np.float16)
        detectors = np.zeros((n, nl, nh, len(DETECTOR_NAMES)), dtype=np.float32)
        extra = {name: np.zeros((n, nl, nh), dtype=dtype) for name, dtype in self.layout.embed_outputs.items()}
        thumbs = np.zeros((n, nl, nh, t, t), dtype=np.uint8) if t else None
        # "tokenize" includes reading the shard's rows from the input
        seconds = {"tokenize": time.perf_counter() - t0, "forward": 0.0, "embed": 0.0, "write": 0.0}
        ecfg = self.extract_cfg
        # the blocked capture holds a block of rows, not a batch's whole maps: only the eager one needs the T^2 bound
        att_budget = None if self.capture.mode == "blocked" else ecfg.attention_budget
        # inputs over max_length (long_inputs: windows) are read one at a time, as a batch of their windows
        long = [i for i, n_tok in enumerate(tok.lengths) if n_tok > task.max_length] if windows else []
        short = [i for i in range(n) if i not in set(long)]
        batches = [
            [short[j] for j in b]
            for b in length_batches(
                [tok.lengths[i] for i in short], ecfg.token_budget, ecfg.max_batch_size, att_budget, self.batch_cost
            )
        ] + [[i] for i in long]
        for idx in batches:
            t1 = time.perf_counter()
            if long and idx[0] in long:
                out = self.run_windows(tok, idx[0], task.max_length, task.model.window_overlap)
            else:
                out = self.run_batch(**tok.batch(idx))
            t2 = time.perf_counter()
            images = out["images"].reshape(-1, s, s)  # [b*L*H, S, S]
            f, more = self.embedder.embed(
                images, out[S.PROFILE].reshape(images.shape[0], -1), out[S.STATS].reshape(images.shape[0], -1)
            )
            feats[idx] = f.reshape(len(idx), nl, nh, -1).cpu().numpy().astype(self.layout.features_dtype)
            for name, value in more.items():
                extra[name][idx] = value.reshape(len(idx), nl, nh).cpu().numpy().astype(extra[name].dtype)
            host_stats = out[S.STATS].cpu().numpy()
            self._check_finite(host_stats, idx, examples)  # on the host copy: no work or wait on the device
            stats[idx] = host_stats
            profile[idx] = out[S.PROFILE].cpu().numpy()
            detectors[idx] = out[S.DETECTORS].cpu().numpy()
            if thumbs is not None:
                thumbs[idx] = encode_thumbnails(out[S.THUMBNAILS].cpu().numpy())
            del out, images, f, more
            trim_heap()
            t3 = time.perf_counter()
            seconds["forward"] += t2 - t1
            seconds["embed"] += t3 - t2
        t4 = time.perf_counter()
        arrays = {
            S.FEATURES: feats,
            S.STATS: stats,
            S.PROFILE: profile,
            S.DETECTORS: detectors,
            **extra,
            S.SEQ_LEN: np.asarray(tok.lengths, dtype=np.int32),
            S.TRUNCATED: np.asarray(tok.truncated, dtype=bool),
            S.EXAMPLE_ID: np.asarray([e.id for e in examples], dtype=str),
            S.EXAMPLE_GROUP: np.asarray([e.group for e in examples], dtype=str),
            S.EXAMPLE_LABEL: np.asarray([e.label for e in examples], dtype=str),
        }
        if thumbs is not None:
            arrays[S.THUMBNAILS] = thumbs
        try:
            write_shard(task.store_path, self.layout, task.shard, arrays)
        except OSError as e:
            # a full disk: a chunk file's write names no file; name the store, for the job's one line
            if e.errno in (errno.ENOSPC, errno.EDQUOT) and not e.filename:
                raise OSError(e.errno, e.strerror, task.store_path) from e
            raise
        seconds["write"] = time.perf_counter() - t4
        return ShardResult(
            shard=task.shard,
            n_examples=n,
            n_maps=n * nl * nh,
            n_truncated=int(sum(tok.truncated)),
            n_windowed=len(long),
            n_tokens=int(sum(tok.lengths)),
            device=self.device_label,
            worker=f"{os.uname().nodename}:{os.getpid()}",
            seconds=seconds,
            causal=self.causal,
            dtype=self.model_dtype,
            kernels=self.capture.kernel_log.by_kernel(),
            kernel_fallbacks=dict(self.capture.kernel_log.fallbacks),
        )

    def _check_finite(self, stats: np.ndarray, idx: list[int], examples: list[Example]) -> None:
        """Refuse, in one line naming the layer and the dtype, a batch whose maps are not finite (a model that
        overflows half precision): read off the statistics the batch already copied to the host
        (:func:`rapids_attn.extract.signature.first_not_finite`), so the capture adds no operation or sync on the
        device. Raised before the shard is written: nothing of it is stored."""
        bad = first_not_finite(stats)
        if bad is None:
            return
        pos, rows = bad
        more = f" (and {len(rows) - 1} more of its batch)" if len(rows) > 1 else ""
        what = f"for example {examples[idx[int(rows[0])]].id!r}{more}"
        raise not_finite(self.model_name, self.layout.layers[pos], self.model_dtype, what)


#: this worker's model and embedder, per job key (one job's at a time)
_EXTRACTORS: WorkerCache[Extractor] = WorkerCache()


def _load(task: ShardTask) -> Extractor:
    torch.set_num_threads(int(task.threads))
    t0 = time.perf_counter()
    ex = Extractor(task)
    #: the load's seconds (model, tokenizer, embedder, causality probe), counted in the first shard's result
    ex.load_seconds = time.perf_counter() - t0
    return ex


def get_extractor(task: ShardTask) -> Extractor:
    """This worker's extractor for ``task``'s job: by the store key and the capture's settings outside it (the
    kernel, its precision, the base, the block size: the same maps, another extractor), so that a second job in
    the same process that changes only those does not run the first one's capture."""
    e = task.extract
    key = f"{task.key}|{e.kernel}|{e.kernel_precision}|{e.attention_base}|{e.attention_block_mb}"
    return _EXTRACTORS.get(key, lambda: _load(task))


def process_shard(task: ShardTask) -> ShardResult:
    """The function Dask runs: load (once) and process one shard."""
    ex = get_extractor(task)
    result = ex.process(task)
    load, ex.load_seconds = getattr(ex, "load_seconds", 0.0), 0.0
    result.seconds["load"] = load
    return result


def trim_heap() -> None:
    """Give the C heap's free pages back to the OS (glibc only; elsewhere a no-op).

    Batches allocate tensors of every size (crops and stats temporaries up to 12 x 512^2 floats);
    glibc serves the middle sizes from its heap (its mmap threshold rises as big blocks are freed)
    and keeps the freed pages, so without this a worker's peak RSS crept up with the number of
    batches it had run (docs/decisions/2026-11-24-long-context-memory.md). Called after each batch; it costs
    milliseconds against a batch's tenths of a second.
    """
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        try:
            import ctypes

            _MALLOC_TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _MALLOC_TRIM = False
    if _MALLOC_TRIM:
        _MALLOC_TRIM(0)


_MALLOC_TRIM = None


def release_worker_cache() -> int:
    """Drop this worker's model and embedder (and cached CUDA blocks); returns how many were held."""
    n = _EXTRACTORS.release()
    empty_device_cache()
    return n
