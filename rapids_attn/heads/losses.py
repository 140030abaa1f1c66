"""Differentiable losses for head importance (Michel et al. 2019), one per task metric.

Importance is I(h) = E_x |dL(x)/dg_h| at gates g = 1, where g_h multiplies head h's output before the
attention output projection (:class:`~rapids_attn.heads.hooks.HeadIntervention`). Where examples are
independent (``lm``, ``squad``, ``accuracy``) each example gets its own gates ([B, L, H]), so one backward
of the batch's summed loss gives every example's own gradient and the expectation is over examples,
exactly as defined. ``retrieval`` scores a question against the batch's paragraphs, so its examples are
not independent: it uses one gate per head and takes |dL/dg| of the batch's mean loss, the estimator of
Michel et al.'s released code (and of transformers' bertology example); the expectation is over batches.

- ``lm``: the metric's own token loss (causal: next token; masked: its seeded 15% of tokens).
- ``squad``: cross-entropy of the start and end logits against the first gold answer's tokens (found by
  its text in the context, since the reader keeps answer texts; [CLS] for an unanswerable question or one
  whose answer was cut off), over the input's own positions (padding masked), averaged over the two.
- ``accuracy``: cross-entropy against the label.
- ``retrieval``: in-batch InfoNCE, each question against the batch's distinct paragraphs (temperature 0.05
  on cosine similarity of the mean-pooled embeddings).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from rapids_attn.heads import metrics as M
from rapids_attn.heads.squad_eval import gold_answer_tokens

TEMPERATURE = 0.05


def _f(x: torch.Tensor) -> torch.Tensor:
    """At least float32 (half-precision logits lose the loss's small differences); float64 stays."""
    return x if x.dtype == torch.float64 else x.float()


def _padded(tokenizer, features: list[dict], device) -> dict:
    batch = tokenizer.pad(features, return_tensors="pt")
    return {k: v.to(device) for k, v in batch.items()}


def _lm_losses(metric, model, tokenizer, examples, device, max_length) -> torch.Tensor:
    masked = M.head_kind(model)[0] == "masked-lm"
    texts, pairs = [e.text for e in examples], [e.text_pair for e in examples]
    kw = {"truncation": True, "max_length": max_length, "return_special_tokens_mask": True}
    enc = tokenizer(texts, pairs, **kw) if all(p is not None for p in pairs) else tokenizer(texts, **kw)
    features, targets = [], []
    for i, ex in enumerate(examples):
        f = M.encoded_features(enc, i)
        ids = np.asarray(f["input_ids"])
        target = np.full(ids.size, -100, np.int64)
        if masked:
            where = M.mask_positions(np.flatnonzero(np.asarray(enc["special_tokens_mask"][i]) == 0), ex.id)
            target[where] = ids[where]
            ids = ids.copy()
            ids[where] = tokenizer.mask_token_id
            f["input_ids"] = ids.tolist()
        else:
            target[1:] = ids[1:]
        features.append(f)
        targets.append(target)
    batch = _padded(tokenizer, features, device)
    labels = np.full(tuple(batch["input_ids"].shape), -100, np.int64)  # on the host: one copy in, not one per example
    for row, t in enumerate(targets):
        labels[row, : t.size] = t
    labels = torch.from_numpy(labels).to(batch["input_ids"].device)
    logits = _f(model(**M.forward_inputs(model, batch, device)).logits)
    if not masked:
        logits, labels = logits[:, :-1], labels[:, 1:]
    tok = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
    return tok.sum(1) / (labels != -100).sum(1).clamp(min=1)


def _squad_losses(metric, model, tokenizer, examples, device, max_length) -> torch.Tensor:
    encoded = metric._encode(tokenizer, examples, max_length)
    features = [M.encoded_features(enc, r) for enc, r in encoded]
    gold = [gold_answer_tokens(enc, r, ex.answer_span()) for (enc, r), ex in zip(encoded, examples, strict=True)]
    batch = _padded(tokenizer, features, device)
    out = model(**M.forward_inputs(model, batch, device))
    start = torch.tensor([s for s, _ in gold], device=device)
    end = torch.tensor([e for _, e in gold], device=device)
    pad = batch["attention_mask"] == 0  # padding is no position: a batch-mate's length must not change the loss
    ls = F.cross_entropy(_f(out.start_logits).masked_fill(pad, float("-inf")), start, reduction="none")
    le = F.cross_entropy(_f(out.end_logits).masked_fill(pad, float("-inf")), end, reduction="none")
    return (ls + le) / 2


def _accuracy_losses(metric, model, tokenizer, examples, device, max_length) -> torch.Tensor:
    target = torch.from_numpy(M.label_ids(model.config, examples)).to(device)
    texts, pairs = [e.text for e in examples], [e.text_pair for e in examples]
    kw = {"truncation": True, "max_length": max_length}
    enc = tokenizer(texts, pairs, **kw) if all(p is not None for p in pairs) else tokenizer(texts, **kw)
    batch = _padded(tokenizer, [M.encoded_features(enc, i) for i in range(len(examples))], device)
    logits = _f(model(**M.forward_inputs(model, batch, device)).logits)
    return F.cross_entropy(logits, target, reduction="none")


def _embed(model, tokenizer, texts: list[str], device, max_length) -> torch.Tensor:
    enc = tokenizer(texts, truncation=True, max_length=max_length)
    batch = _padded(tokenizer, [M.encoded_features(enc, i) for i in range(len(texts))], device)
    hidden = _f(model(**M.forward_inputs(model, batch, device)).last_hidden_state)
    mask = batch["attention_mask"].unsqueeze(-1).float()
    return F.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1), dim=-1)


def _retrieval_loss(metric, model, tokenizer, examples, device, max_length) -> torch.Tensor:
    paragraphs = [M.paired_text(e, metric.name) for e in examples]
    distinct = list(dict.fromkeys(paragraphs))
    own = torch.tensor([distinct.index(p) for p in paragraphs], device=device)
    q = _embed(model, tokenizer, [e.text for e in examples], device, max_length)
    p = _embed(model, tokenizer, distinct, device, max_length)
    return F.cross_entropy(q @ p.T / TEMPERATURE, own)


_PER_EXAMPLE = {"lm": _lm_losses, "squad": _squad_losses, "accuracy": _accuracy_losses}


def importance_sums(metric, model, tokenizer, sites, examples, device, max_length: int, batch_size: int):
    """-> (sum of |dL/dg| [L, H] float64 over the units, units): examples, or batches for retrieval."""
    from rapids_attn.heads.hooks import HeadIntervention

    n_layers, n_heads = len(sites), sites[0].n_heads
    total = torch.zeros(n_layers, n_heads, dtype=torch.float64)
    units = 0
    per_example = _PER_EXAMPLE.get(metric.name)
    with torch.enable_grad(), HeadIntervention(model, sites) as hooks:
        for i in range(0, len(examples), batch_size):
            b = examples[i : i + batch_size]
            shape = (len(b), n_layers, n_heads) if per_example else (n_layers, n_heads)
            gates = torch.ones(shape, device=device, requires_grad=True)
            hooks.gates = gates
            if per_example:
                loss = per_example(metric, model, tokenizer, b, device, max_length).sum()
            else:
                loss = _retrieval_loss(metric, model, tokenizer, b, device, max_length)
            (grad,) = torch.autograd.grad(loss, gates)
            g = grad.detach().double().abs().cpu()
            total += g.sum(0) if per_example else g
            units += len(b) if per_example else 1
    return total.numpy(), units
