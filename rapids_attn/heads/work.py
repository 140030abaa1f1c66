"""The heads stage's worker side: one Dask task per (kind of pass, shard of the evaluated examples).

Each task carries its examples inline (the stage evaluates a sample of at most a few thousand examples)
and what to do with them:

- ``score``: for each condition (a keep mask [layers, heads]: 1 keeps a head, 0 ablates it) one pass over
  the examples under :class:`~rapids_attn.heads.hooks.HeadIntervention`, returning the metric's
  per-example partials (:meth:`TaskMetric.partials`) per condition;
- ``means``: each head's mean output over the examples' tokens (for ``heads.ablation: mean``);
- ``importance``: Michel et al.'s |dL/dgate| per head, summed over the shard's examples (:mod:`.losses`);
- ``capture``: each head's output mean-pooled over an example's tokens [N, L, H, d], and the last layer's
  mean-pooled hidden state [N, D] (the probing stage's inputs and its reference representation).

The model is loaded once per worker process (float32: ablation effects are differences of a few points,
which half precision would blur) and kept between tasks of the same job.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from rapids_attn.data.example import Example
from rapids_attn.devices import ExtractDevices
from rapids_attn.job import ModelConfig
from rapids_attn.stagekit import WorkerCache


@dataclass
class HeadsTask:
    model: ModelConfig
    metric: str
    kind: str  # "score" | "means" | "importance" | "capture"
    device: ExtractDevices  # the device plan's extract part (the model runs where extraction does)
    threads: int
    max_length: int
    batch_size: int
    examples: tuple[Example, ...]
    #: score: keep masks [C, L, H] (float32)
    conditions: np.ndarray | None = None
    #: mean ablation: [L, H, d] replacement outputs (None: zero ablation)
    means: np.ndarray | None = None
    #: the job's key: a worker keeps one model per key
    key: str = ""


@dataclass
class HeadsResult:
    kind: str
    n: int
    #: score: one dict of per-example partials per condition; capture: {"heads": [N,L,H,d], "hidden": [N,D]}
    partials: list[dict] = field(default_factory=list)
    #: means: (sum [L,H,d], tokens); importance: (|grad| sum [L,H], batches)
    sums: np.ndarray | None = None
    count: float = 0.0
    seconds: float = 0.0
    device: str = ""


class HeadsWorker:
    """The metric's model and tokenizer on this worker's device."""

    def __init__(self, task: HeadsTask):
        from rapids_attn.extract.model import load_tokenizer, resolve_model_name
        from rapids_attn.heads.hooks import head_sites
        from rapids_attn.heads.metrics import metric_for

        self.device = task.device.on_this_worker().device  # the device plan's: cpu or cuda:N
        self.metric = metric_for(task.metric)
        self.tokenizer = load_tokenizer(task.model)
        self.model = self.metric.load_model(
            resolve_model_name(task.model.name),
            self.device,
            "float32",
            revision=task.model.revision,
            trust_remote_code=task.model.trust_remote_code,
        )
        self.model.requires_grad_(False)
        self.sites = head_sites(self.model)
        self.lock = threading.Lock()

    def _batches(self, examples: list[Example], size: int):
        for i in range(0, len(examples), size):
            yield examples[i : i + size]

    def run(self, task: HeadsTask) -> HeadsResult:
        t0 = time.perf_counter()
        ex = list(task.examples)
        with self.lock:
            out = getattr(self, f"_{task.kind}")(task, ex)
        out.seconds = time.perf_counter() - t0
        out.device = self.device
        return out

    def _score(self, task: HeadsTask, ex: list[Example]) -> HeadsResult:
        from rapids_attn.heads.hooks import HeadIntervention

        means = None if task.means is None else torch.as_tensor(task.means, device=self.device)
        parts = []
        for keep in task.conditions:
            with HeadIntervention(self.model, self.sites) as hi:
                hi.keep = torch.as_tensor(keep, device=self.device)
                hi.means = means
                parts.append(self.metric.partials(self.model, self.tokenizer, ex, self.device, task.max_length))
        return HeadsResult("score", len(ex), partials=parts)

    def _inputs(self, batch: list[Example], max_length: int) -> dict:
        enc = self.tokenizer(
            [e.text for e in batch],
            [e.text_pair for e in batch] if all(e.text_pair is not None for e in batch) else None,
            truncation=True,
            max_length=max_length,
            padding=True,
            return_tensors="pt",
        )
        return {k: v.to(self.device) for k, v in enc.items()}

    def _pooled(self, task: HeadsTask, ex: list[Example]):
        """Yield (attention mask [B, T], per-layer per-head outputs [L][B, T, H, d], last hidden [B, T, D])."""
        from rapids_attn.heads.hooks import HeadIntervention

        for b in self._batches(ex, task.batch_size):
            inputs = self._inputs(b, task.max_length)
            outs: dict[int, torch.Tensor] = {}
            with torch.inference_mode(), HeadIntervention(self.model, self.sites) as hi:
                hi.pool = lambda layer, o, outs=outs: outs.__setitem__(layer, o.float())
                res = self.model(**inputs, output_hidden_states=True)
            yield inputs["attention_mask"], [outs[i] for i in range(len(self.sites))], res.hidden_states[-1]

    def _means(self, task: HeadsTask, ex: list[Example]) -> HeadsResult:
        total, tokens = None, 0.0
        for mask, layers, _ in self._pooled(task, ex):
            m = mask.float()[:, :, None, None]
            s = torch.stack([(o * m).sum((0, 1)) for o in layers])  # [L, H, d]
            total = s if total is None else total + s
            tokens += float(mask.sum())
        return HeadsResult("means", len(ex), sums=total.cpu().numpy(), count=tokens)

    def _capture(self, task: HeadsTask, ex: list[Example]) -> HeadsResult:
        heads, hidden = [], []
        for mask, layers, last in self._pooled(task, ex):
            m = mask.float()
            n = m.sum(1).clamp(min=1)
            heads.append(torch.stack([(o * m[:, :, None, None]).sum(1) / n[:, None, None] for o in layers], 1))
            hidden.append((last.float() * m[:, :, None]).sum(1) / n[:, None])
        return HeadsResult(
            "capture",
            len(ex),
            partials=[{"heads": torch.cat(heads).cpu().numpy(), "hidden": torch.cat(hidden).cpu().numpy()}],
        )

    def _importance(self, task: HeadsTask, ex: list[Example]) -> HeadsResult:
        from rapids_attn.heads.losses import importance_sums

        sums, units = importance_sums(
            self.metric, self.model, self.tokenizer, self.sites, ex, self.device, task.max_length, task.batch_size
        )
        return HeadsResult("importance", len(ex), sums=sums, count=float(units))


#: this worker's model, per job key
_WORKERS: WorkerCache[HeadsWorker] = WorkerCache()


def _load(task: HeadsTask) -> HeadsWorker:
    torch.set_num_threads(int(task.threads))
    return HeadsWorker(task)


def process_heads_task(task: HeadsTask) -> HeadsResult:
    """The function Dask runs: load the model once per worker (per job key), run one task."""
    return _WORKERS.get(task.key, lambda: _load(task)).run(task)


def release_heads_cache() -> int:
    """Drop this worker's model; returns how many were held."""
    return _WORKERS.release()
