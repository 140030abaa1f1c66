"""The compare stage's work on a worker: two models' maps of the same examples compared map to map
(:mod:`rapids_attn.compare.pairwise`), one task per slice of the sampled examples."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rapids_attn.data.example import Example
from rapids_attn.stagekit import WorkerCache

#: this worker's two models (their captures, the job's tokenizer and the device), loaded by the first task of a
#: (models, device, dtype, base) and kept for the stage's later tasks: the workers' one model cache
_PAIRS: WorkerCache[tuple] = WorkerCache()


@dataclass(frozen=True)
class MapsTask:
    """A slice of the sampled examples, compared between ``model_a`` (the compared model) and ``model_b`` (the
    job's), both loaded with the blocked capture."""

    model_a: object  # ModelConfig
    model_b: object  # ModelConfig
    devices: object  # ExtractDevices: both models run where and in the dtype the job's model is extracted
    threads: int
    examples: tuple[Example, ...]
    max_length: int
    batch_size: int
    attention_base: str
    block_bytes: int


def _models(task: MapsTask):
    from rapids_attn.compare.pairwise import forward_base
    from rapids_attn.extract.capture import AttentionCapture
    from rapids_attn.extract.model import checkpoint_dtype, load_model, load_tokenizer

    saved = checkpoint_dtype(task.model_b) if task.devices.model_dtype == "auto" else None
    dev = task.devices.on_this_worker(saved)
    key = repr((task.model_a, task.model_b, dev.device, dev.model_dtype, task.attention_base))

    def build():
        captures = []
        for m in (task.model_a, task.model_b):
            model = load_model(m, dev.device, dev.model_dtype, "blocked", forward_base(task.attention_base))
            captures.append(AttentionCapture(model, model.config.num_hidden_layers))
        return (*captures, load_tokenizer(task.model_b), dev.device)

    return _PAIRS.get(key, build)  # one pair at a time, built once under the cache's lock


def compare_maps(task: MapsTask) -> tuple[np.ndarray, np.ndarray]:
    """(cosine, mean row Jensen-Shannon divergence), each [examples, layers, heads] float64, of the task's examples
    in their order: batches of up to ``batch_size`` examples of similar length, each through both models once."""
    import torch

    from rapids_attn.compare.pairwise import QueryKeys, pair_sums
    from rapids_attn.extract.batching import tokenize

    if task.threads:
        torch.set_num_threads(task.threads)
    cap_a, cap_b, tokenizer, device = _models(task)
    tok = tokenize(tokenizer, list(task.examples), task.max_length)
    order = np.argsort(tok.lengths, kind="stable")
    n, n_layers = len(task.examples), cap_b.n_layers
    n_heads = cap_b.model.config.num_attention_heads
    cos = np.zeros((n, n_layers, n_heads))
    jsd = np.zeros((n, n_layers, n_heads))
    for s in range(0, n, task.batch_size):
        idx = [int(i) for i in order[s : s + task.batch_size]]
        batch = tokenizer.pad(tok.batch(idx), return_tensors="pt")
        batch = {k: v.to(device) for k, v in batch.items()}
        a, b = QueryKeys(), QueryKeys()
        cap_a.run(batch, a)
        cap_b.run(batch, b)
        c, j = pair_sums(a, b, batch["attention_mask"].sum(-1), task.block_bytes)
        cos[idx], jsd[idx] = c.numpy(), j.numpy()
    return cos, jsd


def release_models() -> int:
    """Drop this worker's compared models; how many pairs were held."""
    from rapids_attn.devices import empty_device_cache

    held = _PAIRS.release()
    empty_device_cache()
    return held
