"""The relevance stage's worker side: one Dask task per shard of the evaluated examples.

The shard's examples are batched in order of token length (each batch padded only to its own longest
input) and every output is put back in the shard's order. For each batch it runs the model once with
eager attention, keeps every layer's maps, and computes:

- each method's token relevance (:mod:`.methods`) for the query row (``auto``: the last token where the
  attention is causal, as the extract stage probes it, else the first);
- for ``grad_rollout``, the gradient of the model's own output with respect to every attention map
  (``torch.autograd.grad``; no parameter gradients are kept). The output, by the model's head
  (:func:`rapids_attn.heads.kinds.head_kind`): question answering, the best start logit plus the best
  end logit; a sequence classifier, its top logit; a causal LM, its top next-token logit at the last
  token; any other model (a bare encoder such as MiniLM, a masked LM loaded as its encoder), half the
  squared norm of its mean-pooled last hidden state, the sentence embedding such models are used for;
- each token's roles as bit flags (:data:`SPECIAL`, :data:`PUNCT`, :data:`SECOND`, :data:`ANSWER`);
- the head atlas's Jensen-Shannon sums (:class:`.atlas.HeadDistance`).

The model is loaded once per worker process (float32) and kept between tasks of the same job.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from rapids_attn.data.example import Example
from rapids_attn.devices import ExtractDevices
from rapids_attn.extract.capture import check_probe_map
from rapids_attn.job import ModelConfig
from rapids_attn.stagekit import WorkerCache

#: token role bits (``relevance_roles``)
SPECIAL, PUNCT, SECOND, ANSWER = 1, 2, 4, 8
ROLE_BITS = {"special": SPECIAL, "punct": PUNCT, "second": SECOND, "answer": ANSWER}

_AUTO = {
    "qa": "AutoModelForQuestionAnswering",
    "seq-cls": "AutoModelForSequenceClassification",
    "causal-lm": "AutoModelForCausalLM",
}


@dataclass
class RelevanceTask:
    model: ModelConfig
    device: ExtractDevices
    threads: int
    max_length: int
    batch_size: int
    examples: tuple[Example, ...]
    methods: tuple[str, ...]
    query: str  # "auto" | "first" | "last" | "mean"; the worker resolves "auto" (decoders: last)
    residual: float
    flow_max_tokens: int
    pagerank_layer: int
    pagerank_heads: tuple[int, ...] | None
    atlas: bool
    key: str = ""
    #: batch the examples in order of token length (less padding); off: in the order they came
    sort_by_length: bool = True


@dataclass
class RelevanceResult:
    lengths: np.ndarray  # [N] tokens per example
    relevance: np.ndarray  # [N, M, T] float32, NaN past each length (and for flow above its bound)
    roles: np.ndarray  # [N, T] uint8 bit flags
    distance_sums: np.ndarray | None  # [L*H, L*H] Jensen-Shannon sums
    distance_rows: int
    flow_skipped: int
    query: str = ""  # the query row used ("auto" resolved)
    seconds: float = 0.0
    device: str = ""
    #: tokens the model ran on, padding included: the sum over batches of batch size x its longest input
    padded_tokens: int = 0


def answer_tokens(example: Example, enc, b: int) -> np.ndarray:
    """[T] bool: the tokens of the second segment covering the first gold answer where the file marks it
    (:meth:`Example.answer_span`); all False without an answer."""
    t = len(enc["input_ids"][b])
    out = np.zeros(t, bool)
    span = example.answer_span()
    if span is None:
        return out
    start, end = span
    seq = enc.sequence_ids(b)
    for i, (a, z) in enumerate(enc["offset_mapping"][b]):
        if seq[i] == 1 and z > start and a < end:
            out[i] = True
    return out


class RelevanceWorker:
    def __init__(self, task: RelevanceTask):
        import transformers

        from rapids_attn.extract.maps import punctuation_ids
        from rapids_attn.extract.model import load_tokenizer, model_class, resolve_model_name
        from rapids_attn.heads.kinds import head_kind

        self.device = task.device.on_this_worker().device
        self.tokenizer = load_tokenizer(task.model)
        source = resolve_model_name(task.model.name)
        opts = {"revision": task.model.revision, "trust_remote_code": task.model.trust_remote_code}
        config = transformers.AutoConfig.from_pretrained(str(source), **opts)
        self.kind = head_kind(config)[0]
        auto = model_class(config, task.model.name)
        if auto is transformers.AutoModel:
            auto = getattr(transformers, _AUTO.get(self.kind, "AutoModel"))
        else:  # an encoder-decoder model: its encoder alone, as the extract stage reads it (any head is the decoder's)
            self.kind = "encoder"
        self.model = auto.from_pretrained(str(source), attn_implementation="eager", dtype=torch.float32, **opts)
        self.model.eval().to(self.device)
        self.punct_ids = punctuation_ids(self.tokenizer).to(self.device)
        self.lock = threading.Lock()
        self.causal = self._probe_causal()

    def _probe_causal(self) -> bool:
        """True when no head puts mass above the diagonal on a short input (decoder attention), as the
        extract stage decides it."""
        ids = self.tokenizer("a b c d e f", return_tensors="pt")["input_ids"][:, :6].to(self.device)
        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True)
        for layer, a in enumerate(out.attentions):
            check_probe_map(self.model, layer, a, ids.shape[1])
        return max(float(torch.triu(a.float(), diagonal=1).sum()) for a in out.attentions) == 0.0

    def _target(self, out, mask: torch.Tensor) -> torch.Tensor:
        """The model's own output, summed over the batch (examples are independent, so each example's
        gradient is its own)."""
        m = mask.bool()
        if self.kind == "qa":
            neg = torch.finfo(out.start_logits.dtype).min
            start = out.start_logits.masked_fill(~m, neg).max(-1).values
            end = out.end_logits.masked_fill(~m, neg).max(-1).values
            return (start + end).sum()
        if self.kind == "seq-cls":
            return out.logits.max(-1).values.sum()
        if self.kind == "causal-lm":
            last = m.sum(1) - 1
            return out.logits[torch.arange(len(last)), last].max(-1).values.sum()
        hidden = out.last_hidden_state
        w = m.to(hidden.dtype)[:, :, None]
        pooled = (hidden * w).sum(1) / w.sum(1).clamp_min(1)
        return 0.5 * (pooled**2).sum()

    def _token_lengths(self, texts: list[str], pairs: list[str] | None, max_length: int) -> np.ndarray:
        """[N] each input's token count as a batch's tokenizer call makes it (same truncation), unpadded."""
        enc = self.tokenizer(texts, pairs, truncation=True, max_length=max_length)
        return np.fromiter((len(ids) for ids in enc["input_ids"]), dtype=np.int64, count=len(texts))

    def run(self, task: RelevanceTask) -> RelevanceResult:
        """The task's examples in batches of ``task.batch_size``, taken in order of token length (stable: equal
        lengths keep their order) unless ``task.sort_by_length`` is off (arrival order), so that a batch is
        padded to a length near its own inputs'. Every per-example output is put back at the example's place
        in ``task.examples``: the result is the same whichever order the batches ran in (to float rounding)."""
        from rapids_attn.relevance import methods as M
        from rapids_attn.relevance.atlas import HeadDistance

        t0 = time.perf_counter()
        ex = list(task.examples)
        query = task.query if task.query != "auto" else ("last" if self.causal else "first")
        texts = [e.text for e in ex]
        pairs = [e.text_pair for e in ex] if all(e.text_pair is not None for e in ex) else None
        if task.sort_by_length:
            order = np.argsort(self._token_lengths(texts, pairs, task.max_length), kind="stable")
        else:
            order = np.arange(len(ex))
        parts = []  # (positions in ex, relevance [B, M, T_b], roles [B, T_b], lengths [B]) per batch
        dist = HeadDistance() if task.atlas else None
        skipped = padded = 0
        with self.lock:
            for i in range(0, len(ex), task.batch_size):
                idx = order[i : i + task.batch_size]
                batch = [ex[j] for j in idx]
                enc = self.tokenizer(
                    [texts[j] for j in idx],
                    None if pairs is None else [pairs[j] for j in idx],
                    truncation=True,
                    max_length=task.max_length,
                    padding=True,
                    return_tensors="pt",
                    return_offsets_mapping=pairs is not None,
                    return_special_tokens_mask=True,
                )
                inputs = {
                    k: v.to(self.device)
                    for k, v in enc.items()
                    if k not in ("offset_mapping", "special_tokens_mask", "overflow_to_sample_mapping")
                }
                mask = inputs["attention_mask"]
                padded += mask.numel()
                n = mask.sum(1)
                need_grad = "grad_rollout" in task.methods
                with torch.set_grad_enabled(need_grad):
                    out = self.model(**inputs, output_attentions=True)
                    atts = list(out.attentions)
                    grads = torch.autograd.grad(self._target(out, mask), atts) if need_grad else None
                atts = [a.detach().float() for a in atts]
                cols = []
                for m in task.methods:
                    if m == "head_mean":
                        r = M.head_mean(atts, n, query)
                    elif m == "last_layer":
                        r = M.last_layer(atts, n, query)
                    elif m == "rollout":
                        r = M.rollout(atts, n, query, task.residual)
                    elif m == "grad_rollout":
                        r = M.grad_rollout(atts, [g.float() for g in grads], n, query)
                    elif m == "pagerank":
                        r = M.pagerank(atts[task.pagerank_layer], n, heads=task.pagerank_heads)
                    elif m == "flow":
                        r = torch.full(mask.shape, float("nan"))
                        for b in range(len(batch)):
                            nb = int(n[b])
                            if nb > task.flow_max_tokens:
                                skipped += 1
                                continue
                            one = [a[b : b + 1, :, :nb, :nb] for a in atts]
                            r[b, :nb] = M.attention_flow(one, n[b : b + 1].cpu(), query, task.residual, nb)[0]
                    else:
                        raise ValueError(f"relevance.methods: no method {m!r}")
                    cols.append(r.to(mask.device, torch.float32))  # flow's host rows go along (small)
                rb = torch.stack(cols, 1).cpu()  # [B, M, T]: one copy to the host per batch, not one per method
                n_host = n.cpu()
                valid = torch.arange(rb.shape[-1])[None, :] < n_host[:, None]
                rb = torch.where(valid[:, None, :], rb, torch.full_like(rb, float("nan")))
                bits = np.zeros(tuple(mask.shape), np.uint8)
                bits |= enc["special_tokens_mask"].numpy().astype(np.uint8) * SPECIAL
                bits |= torch.isin(inputs["input_ids"], self.punct_ids).cpu().numpy().astype(np.uint8) * PUNCT
                if pairs is not None:
                    for b, e in enumerate(batch):
                        seq = enc.sequence_ids(b)
                        bits[b] |= np.array([s == 1 for s in seq], np.uint8) * SECOND
                        bits[b] |= answer_tokens(e, enc, b).astype(np.uint8) * ANSWER
                bits *= valid.numpy()
                if dist is not None:
                    dist.update(atts, n)
                parts.append((idx, rb.numpy(), bits, n_host.numpy()))
        # back to the examples' own order: each batch's rows at their places, padded to the longest input
        t = max(r.shape[-1] for _, r, _, _ in parts)
        relevance = np.full((len(ex), len(task.methods), t), np.nan, np.float32)
        role = np.zeros((len(ex), t), np.uint8)
        lengths = np.zeros(len(ex), np.int32)
        for idx, r, bits, nb in parts:
            relevance[idx, :, : r.shape[-1]] = r
            role[idx, : bits.shape[-1]] = bits
            lengths[idx] = nb
        return RelevanceResult(
            lengths=lengths,
            relevance=relevance,
            roles=role,
            distance_sums=None if dist is None else dist.sums,
            distance_rows=0 if dist is None else dist.rows,
            flow_skipped=skipped,
            query=query,
            seconds=time.perf_counter() - t0,
            device=self.device,
            padded_tokens=padded,
        )


#: this worker's model, per job key
_WORKERS: WorkerCache[RelevanceWorker] = WorkerCache()


def _load(task: RelevanceTask) -> RelevanceWorker:
    torch.set_num_threads(int(task.threads))
    return RelevanceWorker(task)


def process_relevance_task(task: RelevanceTask) -> RelevanceResult:
    """The function Dask runs: load the model once per worker (per job key), run one task."""
    return _WORKERS.get(task.key, lambda: _load(task)).run(task)


def release_relevance_cache() -> int:
    """Drop this worker's model; returns how many were held."""
    return _WORKERS.release()
