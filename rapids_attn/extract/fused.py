"""The fused capture: one Triton kernel per layer computes the layer's attention output and every map's sums over
query rows in one pass over the keys, never writing a weight (issue 45).

It is a flash-attention forward (online softmax over key tiles: the running row maximum ``m``, the keys' sum
``l = sum_j exp(s_j - m)``, the output's ``sum_j exp(s_j - m) v_j``) that carries, beside the output, what the
capture's statistics need, each rescaled with the output when the maximum moves:

- ``sum_j exp(s_j - m) s_j`` (the entropy: ``-sum_j p_j log p_j = lse * mass - sum_j p_j s_j``);
- ``sum_j exp(s_j - m) |i - j|`` (the distance) and the mass on the recent band and the sink tokens (streaming);
- the product of the weights with the per-key features ``[first, sep, punct, real token, j]`` and with the area
  resize's ``R^T`` (the image's rows), ``P @ [F | R^T]``, in the precision the caller chose
  (:data:`PRECISIONS`), accumulated in float32.

After the keys, each tile of query rows reads the nine profile diagonals ``p(i, i + o)`` from one more product of
its queries with the keys around them, over the final log-sum-exp (no second pass over the keys), and reduces every per-row quantity
over its rows with the rows' weights (a real row, ``1 / log(keys seen)``, the rows that see beyond the streaming
set, the rows that have a repeat target): the kernel writes per tile of rows a few dozen sums and one S x S block
of the image, not a row each (at 32k tokens a per-row write-out would be about 0.7 GB a layer). The per-row
log-sum-exp is written too: the duplicate-token and induction positions (a list that depends on the token ids)
are then cheap gathers, ``exp(q_i . k_j - lse_i)``, outside the kernel (:func:`pair_weights`).

Masks: none, a 2-D key padding mask, a 4-D boolean mask or a 4-D additive mask (read tile by tile, as the model's
own SDPA would), causal with an optional sliding window (tiles past the diagonal or before the window are not
visited), grouped-query heads (query head h reads key head ``kv_heads[h]``), attention sinks (a per-head logit in
the denominator) and soft-capping. With ``TRITON_INTERPRET=1`` the same kernel runs on CPU tensors (Triton's
interpreter): that is how CI proves it against a dense PyTorch reference (``tests/unit/extract/test_fused.py``).

Triton is imported when the kernel is first launched, never at import: a CPU install without Triton reads this
module (the sums' layout, :func:`available`) without it.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass

import torch

from rapids_attn.extract.signature import PROFILE_OFFSETS, RECENT_WINDOW, SINK_TOKENS

#: the input precision of the P @ [F | R^T] product (the statistics' and the image's): ``ieee`` (float32 inputs,
#: exact to float32 rounding), ``tf32`` (10-bit mantissas: the default on a GPU's tensor cores) or ``bf16`` (P and
#: the features rounded to bfloat16, 8-bit mantissas). Accumulation is float32 in every case. The scores' product
#: (Q K^T) and the output's (P V) run in the model's dtype as the model's own flash attention does (half-precision
#: inputs, float32 accumulation); a float32 model's in ``ieee``, as PyTorch's float32 SDPA.
PRECISIONS = ("ieee", "tf32", "bf16")

#: the worst relative error each precision leaves in a statistic that is a weighted sum of probabilities (the
#: inputs' rounding, half an ulp, on both factors: 2 x 2^-(mantissa + 1)); the tests hold the kernel to it against
#: a reference that rounds its inputs the same way
PRECISION_RTOL = {"ieee": 1e-5, "tf32": 2.0**-10, "bf16": 2.0**-7}

# the sums a tile of rows writes, per (example, head): SUMS[name] is the column
SUM_NAMES = (
    "first",
    "sep",
    "punct",
    "mass",
    "entropy",
    "entropy_norm",
    "row_max",
    "distance",
    "stream",
    *(f"diag{o:+d}" for o in PROFILE_OFFSETS),
    "pattern_mass0",
    "pattern_mass1",
    "pattern_mass2",
)
SUMS = {name: k for k, name in enumerate(SUM_NAMES)}
N_SUMS = 32  # the sums' row, padded
assert len(SUM_NAMES) <= N_SUMS

#: the per-key feature columns (the reducer's right-hand matrix's first five, padded to 16: tl.dot's least width)
KEY_FEATURES = 16
#: the per-row weight columns: a real row, 1 / log(keys seen), sees beyond the streaming set, has a duplicate,
#: induction, far-induction target; padded to 8
ROW_WEIGHTS = 8

#: what a hidden key scores before the exp (finite, as the blocked path's MASKED)
_MASKED = -1.0e30


def available() -> str | None:
    """None when the kernel can be launched here (Triton importable); else why not, in words."""
    try:
        import triton  # noqa: F401
    except ImportError as e:  # a CPU-only torch wheel does not bring Triton
        return f"Triton is not installed ({e}); pip install triton"
    return None


def interpreted() -> bool:
    """Whether Triton's interpreter is on (``TRITON_INTERPRET=1``): kernels then run on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


class _Observers:
    """Who is told of each launch (``benchmarks/op_count.py`` counts a launch as one operation and not the
    interpreter's own tensor work inside it): objects with ``launch_begin(name)`` and ``launch_end()``, and
    ``skip_kernel_bodies`` (an op count on a machine without a GPU: the launch is counted and its body, minutes in
    the interpreter at MiniLM's size, not run; its outputs stay zeros. The operations around it are the same
    whatever its values: no shape or branch of the capture depends on them, tests/unit/extract/test_op_count.py)."""

    def __init__(self) -> None:
        self.items: list = []

    @contextlib.contextmanager
    def launch(self, name: str):
        """Yields whether the kernel's body is to run."""
        for o in self.items:
            o.launch_begin(name)
        try:
            yield not any(getattr(o, "skip_kernel_bodies", False) for o in self.items)
        finally:
            for o in reversed(self.items):
                o.launch_end()


OBSERVERS = _Observers()


def _kernel():
    """The @triton.jit kernel (:mod:`rapids_attn.extract.fused_kernel`), imported on first use: Triton is imported
    there only. Whether it runs in the interpreter is fixed by ``TRITON_INTERPRET`` at that first import."""
    from rapids_attn.extract.fused_kernel import capture_fwd

    return capture_fwd


def pow2(n: int, least: int = 16) -> int:
    return max(least, 1 << max(0, int(n) - 1).bit_length())


@dataclass
class KernelInputs:
    """What a batch's maps are reduced against in the kernel, the same for every layer (built once per batch by
    :meth:`rapids_attn.extract.maps.LayerReducer.kernel_inputs`): per key ``features`` [batch, T, 16] (first, sep,
    punct, a real token, j; 0 past each example's length), ``rt`` [batch, T, S'] (each example's area resize R^T,
    padded to a power of two S' >= 16), per row ``row_weights`` [batch, T, 8] (a real row, 1 / log(keys seen),
    beyond the streaming set, a duplicate, induction and far-induction target), and the image's side ``size``."""

    features: torch.Tensor
    rt: torch.Tensor
    row_weights: torch.Tensor
    size: int


@dataclass
class LayerSums:
    """One layer's sums over query rows from the kernel: ``sums`` [batch, head, N_SUMS] (columns :data:`SUMS`),
    ``image`` [batch, head, S, S] (``R @ a @ R^T``), ``lse`` [batch, head, q_len] (each row's log-sum-exp; 3e38 on
    a row that sees no key)."""

    sums: torch.Tensor
    image: torch.Tensor
    lse: torch.Tensor


@dataclass
class MaskSpec:
    """How one layer hides keys, in the forms the blocked path reads (:func:`rapids_attn.extract.blocks.mask_rows`):
    ``mask`` None, [batch, keys] (a key padding mask) or [batch, 1 or heads, q, keys] (boolean, or additive
    floats); ``causal`` with ``window`` (0: none) and ``past`` keys before the first query."""

    mask: torch.Tensor | None
    causal: bool
    window: int
    past: int


def fused_layer(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor | None,
    kv_heads: torch.Tensor,
    spec: MaskSpec,
    scale: float,
    inputs: KernelInputs,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    precision: str = "tf32",
    block_m: int = 64,
    block_n: int = 64,
    num_warps: int = 8,
    memo: dict | None = None,
) -> tuple[LayerSums, torch.Tensor | None]:
    """Launch the kernel for one layer: ``q`` [batch, head, q_len, d] (any float dtype; unscaled), ``k`` and ``v``
    [batch, key heads, keys, d] (``v`` None: no output), ``kv_heads`` [head] int (the key head of each query head),
    ``sinks`` [head] sink logits or None. Returns the layer's :class:`LayerSums` and the output [batch, q_len, head,
    d_v] in ``q``'s dtype (transformers' layout), or None without ``v``. ``num_warps`` 8: compiled for Hopper
    (sm_90a) with tiles of 64 x 64, the kernel needs 255 registers a thread; with 4 warps it spilled 3.4 KB a thread,
    with 8 at most 0.7 KB (docs/decisions/2026-11-29-capture-kernels.md). ``memo``: the capture's dict for one forward,
    where what the launcher reads off the mask (:func:`keys_only`, :func:`upper_hidden`) is kept for the next layers."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    b, h, m, d = q.shape
    n = k.shape[2]
    dev = q.device
    f, rt, rw = inputs.features, inputs.rt, inputs.row_weights
    if f.shape[1] < n or rw.shape[1] < m:
        raise ValueError(f"kernel inputs cover {f.shape[1]} keys and {rw.shape[1]} rows, the layer has {n} and {m}")
    f = f[:, :n].contiguous()
    rt = rt[:, :n].contiguous()
    rw = rw[:, :m].contiguous()
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    if v is not None and v.stride(-1) != 1:
        v = v.contiguous()
    mask = spec.mask
    mask_min = 0.0
    upper = False  # a 4-D mask that hides every key past each row (upper_hidden)
    if (
        mask is not None
        and mask.dim() == 4
        and not spec.causal
        and mask.dtype == torch.bool
        and keys_only(mask, m, n, memo)
    ):
        mask = mask[:, 0, 0, :n]  # an encoder's padding mask, every row alike: read as [batch, keys], not a tile
    if mask is None:
        kind, mk, strides = 0, q, (0, 0, 0, 0)
    elif mask.dim() == 2:
        mk = mask.to(torch.int8) if mask.dtype == torch.bool else mask
        kind, strides = 2, (mk.stride(0), 0, 0, mk.stride(1))
    elif mask.dim() == 4:
        mk = mask[:, :, :m, :n]
        upper = (
            spec.causal
            and (mk.dtype == torch.bool or mk.is_floating_point())
            and upper_hidden(mask, spec.past, m, n, memo)
        )
        if mk.dtype == torch.bool:
            mk, kind = mk.to(torch.int8), 3
        elif mk.is_floating_point():
            kind = 4
            mask_min = float(torch.finfo(mk.dtype).min)
        else:
            mk, kind = mk.float(), 4
            mask_min = -math.inf
        strides = tuple(mk.stride(i) if mk.shape[i] > 1 else 0 for i in range(4))
    else:
        raise ValueError(f"the kernel reads a 2-D or 4-D mask, not {mask.dim()}-D")
    out = torch.empty(b, m, h, v.shape[-1], dtype=q.dtype, device=dev) if v is not None else None
    tiles = triton_cdiv(m, block_m)
    s_pad = rt.shape[-1]
    lse = torch.empty(b, h, m, dtype=torch.float32, device=dev)
    sums = torch.zeros(b, h, tiles, N_SUMS, dtype=torch.float32, device=dev)
    img = torch.zeros(b, h, tiles, s_pad, s_pad, dtype=torch.float32, device=dev)
    # half-precision inputs run on the tensor cores as the model's flash attention would; float32 ones exactly
    qk_prec = "tf32" if q.dtype in (torch.float16, torch.bfloat16) else "ieee"
    sk = sinks.float().contiguous() if sinks is not None else lse
    vv = v if v is not None else k
    kernel = _kernel()
    with OBSERVERS.launch("capture_fwd") as run_body:
        if not run_body:
            lse.zero_()
            if out is not None:
                out.zero_()
        else:
            kernel[(tiles, b * h)](
                q,
                k,
                vv,
                kv_heads.to(device=dev, dtype=torch.int32).contiguous(),
                sk,
                mk,
                f,
                rt,
                rw,
                out if out is not None else lse,
                lse,
                sums,
                img,
                h,
                m,
                n,
                spec.past,
                int(spec.window or 0),
                float(scale),
                float(softcap or 0.0),
                mask_min,
                d,
                vv.shape[-1],
                q.stride(0),
                q.stride(1),
                q.stride(2),
                k.stride(0),
                k.stride(1),
                k.stride(2),
                vv.stride(0),
                vv.stride(1),
                vv.stride(2),
                out.stride(0) if out is not None else 0,
                out.stride(1) if out is not None else 0,
                out.stride(2) if out is not None else 0,
                *strides,
                tiles,
                inputs.size,
                MASK_KIND=kind,
                CAUSAL=bool(spec.causal),
                UPPER_HIDDEN=upper,
                SOFTCAP=bool(softcap),
                HAS_SINKS=sinks is not None,
                HAS_OUT=v is not None,
                PREC=PRECISIONS.index(precision),
                QK_PREC=qk_prec,
                EMULATE=interpreted(),
                BLOCK_M=block_m,
                BLOCK_N=block_n,
                BLOCK_D=pow2(d),
                BLOCK_DV=pow2(vv.shape[-1]),
                BLOCK_S=s_pad,
                NF=KEY_FEATURES,
                NW=ROW_WEIGHTS,
                NS=N_SUMS,
                WINDOW_BAND=RECENT_WINDOW,
                N_SINK=SINK_TOKENS,
                N_OFF=len(PROFILE_OFFSETS),
                OFF0=PROFILE_OFFSETS[0],
                BLOCK_W=pow2(block_m + len(PROFILE_OFFSETS) - 1),
                num_warps=num_warps,
            )
    size = inputs.size
    result = LayerSums(sums=sums.sum(2), image=img.sum(2)[..., :size, :size], lse=lse)
    return result, out


def _memo(memo: dict | None, key: tuple, compute):
    """``compute()``, remembered in ``memo`` (one forward's: the capture's, while the model holds its mask, so its
    memory cannot be another tensor's) under ``key``."""
    if memo is None:
        return compute()
    if key not in memo:
        memo[key] = compute()
    return memo[key]


def _mask_key(kind: str, mask: torch.Tensor, *more) -> tuple:
    return (kind, mask.data_ptr(), tuple(mask.shape), tuple(mask.stride()), mask.dtype, *more)


def keys_only(mask: torch.Tensor, rows: int, keys: int, memo: dict | None = None) -> bool:
    """Whether every row of a 4-D boolean mask (its first ``rows`` x ``keys``, every head) is the same: a key padding
    mask (an encoder's, as transformers' SDPA mask function makes it), which the kernel then reads as one [batch,
    keys] row instead of a [rows, keys] tile per program. One read of the mask (a host sync), once a forward with the
    capture's ``memo``: a model's layers share its mask."""

    def compute() -> bool:
        part = mask[:, :, :rows, :keys]
        return bool((part == part[:, :1, :1, :]).all())

    return _memo(memo, _mask_key("keys", mask, rows, keys), compute)


def upper_hidden(
    mask: torch.Tensor, past: int, rows: int | None = None, keys: int | None = None, memo: dict | None = None
) -> bool:
    """Whether a 4-D mask (its first ``rows`` x ``keys``) hides every key after each row's own position (a causal
    mask with padding; not a prefix-LM mask that shows some rows later keys), so that a causal kernel may skip those
    key tiles. One read of the mask (a host sync), once a forward with the capture's ``memo``."""
    m, n = rows or mask.shape[2], keys or mask.shape[3]

    def compute() -> bool:
        part = mask[:, :, :m, :n]
        above = torch.ones(m, n, dtype=torch.bool, device=mask.device).triu_(1 + past)
        seen = part if part.dtype == torch.bool else part > torch.finfo(part.dtype).min
        return not bool((seen & above).any())

    return _memo(memo, _mask_key("upper", mask, past, m, n), compute)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


#: the most bytes one chunk of listed (row, key) pairs may gather (queries and keys of every head, float32)
PAIR_CHUNK_BYTES = 32 << 20


def pair_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    kv_heads: torch.Tensor,
    lse: torch.Tensor,
    scale: float,
    spec: MaskSpec,
    eb: torch.Tensor,
    ei: torch.Tensor,
    ek: torch.Tensor,
    softcap: float | None = None,
) -> torch.Tensor:
    """The attention weights of listed (example, row, key) pairs, [P, head]: ``exp(s - lse)`` with the pair's
    score ``s`` (scaled, soft-capped, masked as the kernel masks it) and the row's log-sum-exp from the kernel.
    ``q`` [batch, head, q_len, d] (the kernel's heads), ``k`` [batch, key heads, kv, d]. Gathered in chunks of at
    most :data:`PAIR_CHUNK_BYTES` (a repetitive long input lists millions of pairs); the chunks are host
    arithmetic on the pairs' count."""
    h, d = q.shape[1], q.shape[3]
    total = int(eb.shape[0])
    step = max(1, PAIR_CHUNK_BYTES // max(1, 2 * h * d * 4))
    kvh = kv_heads.to(device=q.device, dtype=torch.long)
    parts = []
    for a in range(0, total, step):
        b_, i_, j_ = eb[a : a + step], ei[a : a + step], ek[a : a + step]
        s = (q[b_, :, i_].float() * k[b_, :, j_].float().index_select(1, kvh)).sum(-1) * scale  # [P, head]
        if softcap:
            s = torch.tanh(s / softcap) * softcap
        hide = _pair_hidden(spec, b_, i_, j_, k.shape[2])
        if spec.mask is not None and spec.mask.dim() == 4 and spec.mask.is_floating_point():
            add = spec.mask[b_, :, i_, j_].float()  # [P, 1 or head]
            s = s + torch.where(hide, 0.0, add)
        p = torch.exp(s - lse[b_, :, i_])
        parts.append(torch.where(hide, 0.0, p))
    return torch.cat(parts) if len(parts) != 1 else parts[0]


def _pair_hidden(spec: MaskSpec, eb, ei, ek, n_keys: int) -> torch.Tensor:
    """[P, 1 or head] booleans: the pairs the layer's mask hides (the kernel's ``_hidden``)."""
    mask = spec.mask
    if mask is not None and mask.dim() == 4:
        m = mask[eb, :, ei, ek]
        if m.dtype == torch.bool:
            return ~m
        if m.is_floating_point():
            return m <= torch.finfo(m.dtype).min
        return torch.zeros_like(m, dtype=torch.bool)
    hide = (ek >= n_keys)[:, None]
    if spec.causal:
        ia = ei + spec.past
        far = ek > ia
        if spec.window:
            far = far | (ek <= ia - spec.window)
        hide = hide | far[:, None]
    if mask is not None and mask.dim() == 2:
        hide = hide | (mask[eb, ek] == 0)[:, None]
    return hide
