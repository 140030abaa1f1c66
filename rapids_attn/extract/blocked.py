"""Attention statistics without the T x T map: an attention function for transformers' attention interface.

SDPA and FlashAttention return no weights, and ``output_attentions`` falls back to eager attention, which
holds each layer's [batch, head, T, T] weights: memory grows with the square of the length. This module
registers attention implementations named ``rapids_blocked_<base>`` (``base``: ``sdpa`` by default,
``eager``, or any implementation transformers knows, such as ``flash_attention_2`` on a GPU). Each one

1. returns the model's normal output, computed by the base implementation with the base's own mask, and
2. from the same post-rotary queries and keys, the same mask, scaling and soft-capping, recomputes the
   softmax of the reducer's heads one block of query rows at a time, ``[batch, head, rows, T]``, and hands
   each block to the capture's reducer (:meth:`rapids_attn.extract.maps.LayerReducer.add_rows`), which
   keeps only sums over rows: images, statistics, offset profile and detectors.

So a batch holds at most ``batch x heads x rows x T`` weights at once, ``rows`` chosen from
``extract.attention_block_mb``. Grouped-query attention is handled by mapping each query head to its key
head; a model's attention sinks (``s_aux``) join the softmax's denominator as they do in its own kernel.

The capture sets ``module._rapids_capture = (sink, layer)`` on each attention module for one forward; a
module without it (a forward outside a capture) only computes the output.
"""

from __future__ import annotations

import math

import torch

PREFIX = "rapids_blocked_"
_REGISTERED: set[str] = set()


def implementation_name(base: str) -> str:
    return PREFIX + base


def register(base: str = "sdpa") -> str:
    """Register ``rapids_blocked_<base>`` with transformers' attention and mask interfaces; returns the name.

    The mask function is the base's, so the base computes exactly what it would alone."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = implementation_name(base)
    if name in _REGISTERED:
        return name
    if base != "eager" and base not in ALL_ATTENTION_FUNCTIONS:
        raise ValueError(f"unknown attention implementation {base!r}")
    try:
        mask_fn = ALL_MASK_ATTENTION_FUNCTIONS[base]
    except KeyError:  # an implementation with no mask function of its own gets no mask, as it would alone
        mask_fn = None

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        # eager attention is each model's own function, beside its attention class
        base_fn = _model_eager(module) if base == "eager" else ALL_ATTENTION_FUNCTIONS[base]
        out = base_fn(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        capture = getattr(module, "_rapids_capture", None)
        if capture is not None:
            sink, layer = capture
            if sink.wants(layer):
                blocked_weights(module, query, key, attention_mask, scaling, sink, layer, kwargs)
            sink.end_layer(layer)
        return out[0], None

    AttentionInterface.register(name, attention)
    if mask_fn is not None:
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, mask_fn)
    _REGISTERED.add(name)
    return name


def _model_eager(module):
    import sys

    fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if fn is None:
        raise ValueError(f"{type(module).__name__} has no eager_attention_forward beside it")
    return fn


#: what a key a row cannot see scores: finite, so that exp gives exactly 0 and 0 x score stays 0 (with -inf the
#: entropy's sum of p x score would be NaN); far below any real score
MASKED = -1e30


def _mask_rows(scores, mask, r0: int, q_len: int, kv_len: int, causal: bool, sliding_window):
    """Mask query rows r0.. of ``scores`` [batch, head, rows, kv_len] in place (MASKED), from whatever the base's
    mask function returned: a boolean or additive 4-D mask, a 2-D padding mask (FlashAttention's), or None (the
    base relies on ``is_causal`` and, for a sliding window, on the window). Returns the hidden keys as a boolean
    tensor that broadcasts against ``scores``, or None when every row sees every key."""
    r1, dev = r0 + scores.shape[2], scores.device
    if mask is not None and mask.dim() == 4:
        m = mask[:, :, r0:r1, :kv_len].to(dev)
        if m.dtype == torch.bool:
            scores.masked_fill_(~m, MASKED)
            return ~m
        scores.add_(m.float()).clamp_(min=MASKED)
        return scores <= MASKED / 2
    i = torch.arange(r0, r1, device=dev)[:, None] + (kv_len - q_len)  # the rows' absolute positions
    j = torch.arange(kv_len, device=dev)[None, :]
    hide = None
    if causal:
        hide = j > i
        if sliding_window:
            hide |= j <= i - int(sliding_window)
    if mask is not None and mask.dim() == 2:  # [batch, kv_len] padding, 1 = a real token
        pad = ~mask[:, None, None, :kv_len].to(device=dev, dtype=torch.bool)
        hide = pad if hide is None else (hide[None, None] | pad)
    if hide is not None:
        scores.masked_fill_(hide, MASKED)
    return hide


def blocked_weights(module, query, key, attention_mask, scaling, sink, layer: int, kwargs: dict) -> None:
    """Hand one layer's attention weights to ``sink`` as blocks of query rows (``sink.add_rows``), with each
    row's entropy and maximum from the softmax's own normaliser: with ``z = sum_j exp(s_j - max s)``, the
    row's maximum weight is 1 / z and its entropy log z + max s - sum_j p_j s_j."""
    n_q_heads, q_len, head_dim = query.shape[1], query.shape[2], query.shape[3]
    heads = sink.head_list if sink.head_list is not None else list(range(n_q_heads))
    kv_len = key.shape[2]
    rep = n_q_heads // key.shape[1]  # grouped-query attention: query head h reads key head h // rep
    idx = torch.tensor(heads, device=query.device)
    scale = scaling if scaling is not None else 1.0 / math.sqrt(head_dim)
    q = query.index_select(1, idx).float() * scale
    k_t = key.index_select(1, torch.div(idx, rep, rounding_mode="floor")).float().transpose(-1, -2)
    softcap = kwargs.get("softcap")
    sinks = kwargs.get("s_aux")
    causal = bool(kwargs.get("is_causal", getattr(module, "is_causal", False))) and q_len > 1
    window = kwargs.get("sliding_window")
    rows = block_rows(query.shape[0], len(heads), kv_len, sink.block_bytes)
    for r0 in range(0, q_len, rows):
        r1 = min(r0 + rows, q_len)
        s = torch.matmul(q[:, :, r0:r1], k_t)  # [b, h, rows, kv]
        if softcap:
            s = torch.tanh(s / softcap) * softcap
        hide = _mask_rows(s, attention_mask, r0, q_len, kv_len, causal, window)
        top = s.amax(-1, keepdim=True)
        if sinks is not None:  # the sink logit is one more term of the softmax's denominator
            sk = sinks.float().index_select(0, idx).reshape(1, -1, 1, 1)
            top = torch.maximum(top, sk)
        # one temporary (s is kept for the entropy). exp runs several times slower on inputs that underflow, so
        # they stop at -80 (exp: 2e-35) and the hidden keys are zeroed after
        w = torch.exp((s - top).clamp_(min=-80.0))
        if hide is not None:
            w.masked_fill_(hide, 0.0)
        z = w.sum(-1, keepdim=True)
        if sinks is not None:
            z = z + torch.exp(sk - top)
        w.div_(z)
        if sinks is None:
            entropy = (torch.log(z) + top - (w * s).sum(-1, keepdim=True)).squeeze(-1)
            sink.add_rows(layer, w, r0, selected=True, row_entropy=entropy, row_max=(1.0 / z).squeeze(-1))
        else:  # the keys' weights do not sum to 1: the reducer reads entropy and maximum off the weights
            sink.add_rows(layer, w, r0, selected=True)
        del s, w


def block_rows(batch: int, heads: int, kv_len: int, budget_bytes: int) -> int:
    """Query rows per block so that a block's float32 scores and weights fit in ``budget_bytes``."""
    # scores, mask and weights, and the reducer's per-row columns of one example (LayerReducer._row_columns)
    per_row = max(batch * heads * kv_len * 4 * 3 + kv_len * 4 * 6, 1)
    return max(1, int(budget_bytes // per_row))
