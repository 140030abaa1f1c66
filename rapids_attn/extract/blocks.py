"""The blocked PyTorch path's arithmetic: a layer's softmax recomputed one block of query rows at a time and handed
to a sink, without the T x T map (:func:`blocked_weights`), with the masks it reads (:func:`mask_rows`) and the
query heads a sink reads (:func:`head_map`).

The ``torch`` kernel (:class:`rapids_attn.extract.kernels.TorchKernel`) runs it under the attention functions
:mod:`rapids_attn.extract.blocked` registers; :mod:`rapids_attn.compare.pairwise` masks its scores with it. It
imports only :mod:`rapids_attn.extract.maps` (the sinks' row types) of the package.
"""

from __future__ import annotations

import math

import torch

from rapids_attn.extract.maps import SinkNeeds, SoftmaxRows, block_rows


def head_map(query: torch.Tensor, key: torch.Tensor, head_list: list[int] | None):
    """The sink's query heads (``head_list``; None: all of them), whether they are every head in order, their index
    on the query's device, and the key head each reads (grouped-query attention: query head h reads key head
    h // (query heads / key heads))."""
    n_q_heads = query.shape[1]
    heads = list(head_list) if head_list is not None else list(range(n_q_heads))
    idx = torch.tensor(heads, device=query.device)
    kv_heads = torch.div(idx, n_q_heads // key.shape[1], rounding_mode="floor")
    return heads, heads == list(range(n_q_heads)), idx, kv_heads


def needs_of(sink) -> SinkNeeds:
    """What ``sink`` takes: its ``needs`` (every sink class declares it)."""
    return sink.needs


#: what a key a row cannot see scores: finite, so that exp gives exactly 0 and 0 x score stays 0 (with -inf the
#: entropy's sum of p x score would be NaN); far below any real score
MASKED = -1e30


def mask_rows(scores, mask, r0: int, q_len: int, kv_len: int, causal: bool, sliding_window):
    """Mask query rows r0.. of ``scores`` [batch, head, rows, kv_len] in place (MASKED), from whatever the base's
    mask function returned: a boolean or additive 4-D mask, a 2-D padding mask (FlashAttention's), or None (the
    base relies on ``is_causal`` and, for a sliding window, on the window). Returns the hidden keys as a boolean
    tensor that broadcasts against ``scores``, or None when every row sees every key. An additive mask hides a key
    with -inf or its dtype's least value (``torch.finfo(dtype).min``: the eager mask of a float16 or bfloat16
    model is in the model's dtype); a value at or below it is a hidden key, whose weight is exactly 0."""
    r1, dev = r0 + scores.shape[2], scores.device
    if mask is not None and mask.dim() == 4:
        m = mask[:, :, r0:r1, :kv_len].to(dev)
        if m.dtype == torch.bool:
            scores.masked_fill_(~m, MASKED)
            return ~m
        if not m.is_floating_point():
            scores.add_(m.float()).clamp_(min=MASKED)
            return scores <= MASKED / 2
        # the mask's own "minus infinity": its dtype's least value or -inf; float16's, -65504, added to a score is
        # far above MASKED, so it is read from the mask, not from the sum
        hidden = m <= torch.finfo(m.dtype).min
        scores.add_(m.float()).masked_fill_(hidden, MASKED).clamp_(min=MASKED)
        return hidden | (scores <= MASKED / 2)
    hide = _position_hide(mask, r0, r1 - r0, kv_len - q_len, kv_len, causal, sliding_window, dev)
    if hide is not None:
        scores.masked_fill_(hide, MASKED)
    return hide


def _position_hide(mask, r0: int, rows: int, past: int, kv: int, causal: bool, window, dev):
    """The keys rows r0 .. r0 + rows - 1 cannot see for their positions (causal, a sliding window) and a 2-D
    padding mask ([batch, kv_len], 1 = a real token), as a boolean tensor that broadcasts against [batch, head,
    rows, kv] scores; None when they see every key."""
    hide = None
    if causal:
        i = torch.arange(r0, r0 + rows, device=dev)[:, None] + past  # the rows' absolute positions
        j = torch.arange(kv, device=dev)[None, :]
        hide = j > i
        if window:
            hide |= j <= i - int(window)
    if mask is not None and mask.dim() == 2:
        pad = ~mask[:, None, None, :kv].to(device=dev, dtype=torch.bool)
        hide = pad if hide is None else (hide[None, None] | pad)
    return hide


def blocked_weights(module, query, key, attention_mask, scaling, sink, layer: int, kwargs: dict, value=None):
    """Hand one layer's attention weights to ``sink`` as blocks of query rows (``sink.add_rows``), with each
    row's entropy and maximum from the softmax's own normaliser: with ``z = sum_j exp(s_j - max s)``, the
    row's maximum weight is 1 / z and its entropy ``log z + max s - sum_j p_j s_j``.

    With ``value``, the layer's attention output too ([batch, q_len, head, d], as transformers' functions
    return it), from the same blocks of weights, where the capture reads every query head (and the module
    is not training with dropout); otherwise, and without ``value``, None.

    Where nothing but the mask changes the scores (no soft-capping, a boolean, 2-D or absent mask), the
    work per block is kept to the few passes a softmax needs:

    - a causal block of rows ``r0 .. r1`` reads keys ``0 .. r1`` only (the rest are hidden): half the work;
    - the causal mask is applied to the block's last ``r1 - r0`` keys, the only ones it hides;
    - ``sum_j p_j s_j = q . (sum_j p_j k_j)``: one [rows, T] x [T, d] product instead of two passes over the
      block, so the scores are turned into weights in place.
    """
    n_q_heads, q_len, head_dim = query.shape[1], query.shape[2], query.shape[3]
    kv_len = key.shape[2]
    rep = n_q_heads // key.shape[1]  # grouped-query attention: query head h reads key head h // rep
    heads, every, idx, kv_heads = head_map(query, key, sink.head_list)  # every: the capture reads every query head
    scale = scaling if scaling is not None else 1.0 / math.sqrt(head_dim)
    # every head, one key head each (no grouped-query attention): the model's keys and values as they are,
    # where index_select would copy them (made contiguous once if they are a transposed view: every block's
    # product would copy them again)
    same = every and rep == 1
    q = ((query if every else query.index_select(1, idx)).float() * scale).contiguous()
    k = (key if same else key.index_select(1, kv_heads)).float().contiguous()  # [b, h, kv, d]
    # [b, h, d, kv] as a view: BLAS takes it as a transposed operand, about twice as fast on the CPU as a copy
    k_t = k.transpose(-1, -2)
    softcap = kwargs.get("softcap")
    sinks = kwargs.get("s_aux")
    causal = bool(kwargs.get("is_causal", getattr(module, "is_causal", False))) and q_len > 1
    window = kwargs.get("sliding_window")
    mask = attention_mask
    # the scores are q . k alone (a boolean mask hides keys, it adds nothing): the fast path
    plain = not softcap and (mask is None or mask.dtype == torch.bool or mask.dim() == 2)
    past = kv_len - q_len  # keys before the first query row (a cache); 0 in a capture's forward
    rows = block_rows(query.shape[0], len(heads), kv_len, sink.block_bytes)
    if causal and plain:  # the blocks read about half the keys on average: twice the rows in the same bytes
        rows = min(2 * rows, q_len)
    sk = sinks.float().index_select(0, idx).reshape(1, -1, 1, 1) if sinks is not None else None
    needs = needs_of(sink)
    if needs.qk:  # rapids_attn.compare: the layer's queries and keys, not its rows
        sink.add_qk(layer, q=q, k=k, mask=mask, causal=causal, window=window, softcap=softcap, sinks=sk)
        if value is None:  # the base computes the output
            return None
    numerators = needs.numerators  # LayerReducer: see SoftmaxRows
    own = (
        value is not None
        and every
        and not (module.training and getattr(module, "attention_dropout", getattr(module, "dropout", 0.0)))
    )
    # the numerators' path: the reducer's product gives the output beside the rest; otherwise one more product
    # here, [b, h, kv, d_v + 1]: each head's values and a column of ones (the rows' sums of the numerators)
    fused = own and plain and sk is None and numerators
    if own:
        v = (value if same else value.index_select(1, kv_heads)).float().contiguous()
        v_one = None if fused else torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
        # rows past an example's length are not the reducer's: their output is 0 (no real token reads them)
        out = torch.zeros(query.shape[0], n_q_heads, q_len, v.shape[-1], dtype=torch.float32, device=query.device)
    scratch = _scratch(q.shape[0] * len(heads) * min(rows, q_len) * kv_len, q.device, getattr(sink, "scratch", None))
    for r0 in range(0, q_len, rows):
        r1 = min(r0 + rows, q_len)
        kv = _visible_keys(mask, r0, r1, past, kv_len) if causal and plain else kv_len  # keys these rows can see
        shape = (q.shape[0], len(heads), r1 - r0, kv)
        s = torch.matmul(q[:, :, r0:r1], k_t[..., :kv], out=scratch[: math.prod(shape)].view(shape))
        if plain:
            hide = _mask_block(s, mask, r0, past, causal, window)
        else:
            if softcap:
                s = torch.tanh(s / softcap) * softcap
            hide = mask_rows(s, mask, r0, q_len, kv_len, causal, window)
        top = s.amax(-1, keepdim=True)
        if sk is not None:  # the sink logit is one more term of the softmax's denominator
            top = torch.maximum(top, sk)
        if plain:
            # in place: exp runs several times slower on inputs that underflow, so they stop at -80 (exp:
            # 2e-35) and the hidden keys are zeroed after
            w = s.sub_(top).clamp_(min=-80.0).exp_()
        else:  # s is kept for the entropy
            w = torch.exp((s - top).clamp_(min=-80.0))
        _zero_hidden(w, hide)
        if own and not fused:  # the output's rows: numerators x values, over their sums (plus the sink's term)
            pv = torch.matmul(w, v_one[:, :, : w.shape[-1]])
            z_out = pv[..., -1:] if sk is None else pv[..., -1:] + torch.exp(sk - top)
            out[:, :, r0:r1] = pv[..., :-1] / z_out.clamp_min(1e-30)
        if not needs.rows:  # the output alone (_OutputOnly)
            del s, w
            continue
        if plain and sk is None and numerators:  # the reducer divides by the row sums it takes from its product
            sm = SoftmaxRows(top[..., 0], q[:, :, r0:r1], k, v if fused else None, out if fused else None)
            sink.add_rows(layer, w, r0, selected=True, softmax=sm)
            del s, w
            continue
        z = w.sum(-1, keepdim=True)
        if sk is not None:
            z = z + torch.exp(sk - top)
        if sk is not None:  # the keys' weights do not sum to 1: the reducer reads entropy and maximum off them
            w.div_(z)
            sink.add_rows(layer, w, r0, selected=True)
        else:
            if plain:  # sum_j p_j s_j = q . sum_j p_j k_j, before w is normalised
                ps = (torch.matmul(w, k[:, :, :kv]) * q[:, :, r0:r1]).sum(-1, keepdim=True) / z
                w.div_(z)
            else:
                w.div_(z)
                ps = (w * s).sum(-1, keepdim=True)
            entropy = (torch.log(z) + top - ps).squeeze(-1)
            sink.add_rows(layer, w, r0, selected=True, row_entropy=entropy, row_max=(1.0 / z).squeeze(-1))
        del s, w
    return out.transpose(1, 2).to(query.dtype).contiguous() if own else None


def _scratch(numel: int, device, pool: ScratchPool | None = None) -> torch.Tensor:
    """A flat float32 buffer for blocks of scores, each block a view of it. With ``pool`` (the capture's,
    one per forward) the buffer is the forward's: a fresh block would be fresh memory, and on the CPU a block past
    glibc's mmap threshold (32 MiB at most) is mapped anew each time, its first writes page faults (at 4k tokens
    the scores' product took 11.3 ms a block into fresh memory against 2.1 ms into a reused buffer; a buffer per
    layer still faulted once a layer, 25 of a forward's 53 ms of scores' products, docs/benchmarks.md)."""
    if pool is None:
        return torch.empty(numel, dtype=torch.float32, device=device)
    return pool.get(numel, device)


class ScratchPool:
    """One forward's buffer for :func:`_scratch`: grown to the largest block asked for, kept until the forward
    ends (:meth:`rapids_attn.extract.capture.AttentionCapture.run`). Between layers it sits beside the model's own
    activations, at most one block's scores (``extract.attention_block_mb`` bounds it)."""

    def __init__(self) -> None:
        self._buf: torch.Tensor | None = None

    def get(self, numel: int, device) -> torch.Tensor:
        if self._buf is None or self._buf.numel() < numel or self._buf.device != torch.device(device):
            self._buf = None  # the old one goes before the new one is allocated
            self._buf = torch.empty(numel, dtype=torch.float32, device=device)
        return self._buf[:numel]

    def release(self) -> None:
        self._buf = None


def _visible_keys(mask, r0: int, r1: int, past: int, kv_len: int) -> int:
    """How many keys a causal block of rows r0 .. r1 - 1 must read: those up to its last row, unless a 4-D mask
    shows the rows a later key (a prefix-LM mask: image or prompt tokens seen both ways under ``is_causal``)."""
    kv = min(kv_len, r1 + past)
    if kv < kv_len and mask is not None and mask.dim() == 4 and bool(mask[:, :, r0:r1, kv:kv_len].any()):
        return kv_len
    return kv


def _mask_block(scores, mask, r0: int, past: int, causal: bool, window):
    """The fast path's mask of query rows r0.. of ``scores`` [batch, head, rows, kv] (a causal block's keys
    stop at its last row): a boolean 4-D mask, a 2-D padding mask, or None with ``causal`` and a sliding
    window. Hidden scores become MASKED (or, where the mask is applied as floats, the score plus MASKED);
    returns what :func:`_zero_hidden` needs after the exp: a boolean tensor broadcasting against the block,
    ``("diag", first key, 1.0 where seen)`` when a float mask of the keys from that one on says it (a 4-D
    mask's, or the causal triangle of the last keys), or None.

    Applied as floats, a hidden score that is not finite (an overflowed half-precision key, even a padding
    token's) stays so and makes its block's rows NaN, where ``masked_fill_`` hid it. SDPA's own output is NaN
    for those rows too (checked in float32 and float16), so the model's forward is already lost there."""
    rows, kv, dev = scores.shape[2], scores.shape[3], scores.device
    if mask is not None and mask.dim() == 4:  # added and multiplied as floats, as the causal triangle below
        keep = mask[:, :, r0 : r0 + rows, :kv].to(device=dev, dtype=torch.float32)
        scores.add_((keep - 1.0).mul_(-MASKED))
        return ("diag", 0, keep)
    if causal and not window and mask is None:  # keys r0 + past .. kv - 1 hold the triangle: row r0 + a hides
        k0 = r0 + past  # the keys past its own, and nothing else is hidden
        # as floats (1 seen, 0 hidden), added and multiplied: a [rows, rows] boolean broadcast over the batch and
        # heads makes masked_fill_ five to seven times slower than add_ or mul_ (0.14 ms against 0.02 at 272 rows).
        # A hidden score that is not finite (an overflowed half-precision key) stays so and makes its rows NaN,
        # where masked_fill_ hid it; the rows after it, which see it, are NaN either way, and so is the map
        keep = torch.ones(rows, kv - k0, dtype=torch.float32, device=dev).tril_()
        scores[..., k0:].add_((keep - 1.0).mul_(-MASKED))
        return ("diag", k0, keep)
    hide = _position_hide(mask, r0, rows, past, kv, causal, window, dev)
    if hide is not None:
        scores.masked_fill_(hide, MASKED)
    return hide


def _zero_hidden(w, hide) -> None:
    if hide is None:
        return
    if isinstance(hide, tuple):
        _, k0, keep = hide
        w[..., k0:].mul_(keep)
    else:
        w.masked_fill_(hide, 0.0)
