"""A dense PyTorch reference for the fused capture kernel (rapids_attn.extract.fused): the whole [T, T] softmax in
float64, then every sum the kernel writes, written out from the definitions (tests only; small shapes)."""

from __future__ import annotations

import math

import torch

from rapids_attn.extract.fused import N_SUMS, SUMS, KernelInputs
from rapids_attn.extract.signature import PROFILE_OFFSETS, RECENT_WINDOW, SINK_TOKENS


def tf32(x: torch.Tensor) -> torch.Tensor:
    """float32 rounded to TF32 as the tensor cores round it (to nearest, ties away from zero)."""
    bits = x.float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def rounded(x: torch.Tensor, precision: str) -> torch.Tensor:
    if precision == "tf32":
        return tf32(x)
    if precision == "bf16":
        return x.float().to(torch.bfloat16).float()
    return x.float()


def hidden(mask, causal: bool, window: int, past: int, b: int, h: int, m: int, n: int) -> tuple:
    """[b, h, m, n] booleans (True: hidden) and the additive mask's values, as the blocked path reads a mask."""
    dev = mask.device if mask is not None else "cpu"
    add = torch.zeros(b, h, m, n, dtype=torch.float64, device=dev)
    if mask is not None and mask.dim() == 4:
        mk = mask[:, :, :m, :n].expand(b, h, m, n)
        if mk.dtype == torch.bool:
            return ~mk, add
        hide = mk <= torch.finfo(mk.dtype).min
        return hide, torch.where(hide, 0.0, mk.double())
    hide = torch.zeros(b, h, m, n, dtype=torch.bool, device=dev)
    if causal:
        i = torch.arange(m, device=dev)[:, None] + past
        j = torch.arange(n, device=dev)[None, :]
        hide = hide | (j > i)
        if window:
            hide = hide | (j <= i - window)
    if mask is not None and mask.dim() == 2:
        hide = hide | (mask[:, None, None, :n] == 0)
    return hide, add


def dense(
    q,
    k,
    v,
    kv_heads,
    mask,
    causal,
    window,
    past,
    scale,
    inputs: KernelInputs,
    softcap=None,
    sinks=None,
    precision="ieee",
):
    """(sums [b, h, N_SUMS], image [b, h, S, S], lse [b, h, m], output [b, m, h, dv] or None, weights [b, h, m, n])."""
    b, h, m, _ = q.shape
    n = k.shape[2]
    kk = k.double()[:, kv_heads.long().to(k.device)]
    s = torch.einsum("bhid,bhjd->bhij", q.double(), kk) * scale
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    hide, add = hidden(mask, causal, window, past, b, h, m, n)
    hide, add = hide.to(q.device), add.to(q.device)
    s = s + add
    s = s.masked_fill(hide, -math.inf)
    # the keys' own maximum: the kernel's running maximum after one tile of keys, so the weights before their
    # normalisation, exp(s - top), are what its product rounds (precision other than ieee: one tile of keys only)
    top = s.amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, 0.0)
    e = torch.exp(s - top)
    z = e.sum(-1, keepdim=True)
    if sinks is not None:
        z = z + torch.exp(sinks.double()[None, :, None, None] - top)
    seen = (~hide).any(-1, keepdim=True)
    zz = torch.where(seen, z, 1.0)
    p = torch.where(seen, e / zz, 0.0)  # [b, h, m, n]
    lse = torch.where(seen[..., 0], (top + torch.log(torch.where(seen, z, 1.0)))[..., 0], math.inf)
    out = None
    if v is not None:
        out = torch.einsum("bhij,bhjd->bihd", p, v.double()[:, kv_heads.long().to(v.device)])
    feats = inputs.features[:, :n].double()  # [b, n, 16]
    rt = inputs.rt[:, :n].double()
    rw = inputs.row_weights[:, :m].double()
    ok, ils, beyond = rw[..., 0][:, None], rw[..., 1][:, None], rw[..., 2][:, None]  # [b, 1, m]
    en = torch.where(seen, e, 0.0)
    pf = torch.einsum("bhij,bjc->bhic", rounded(en, precision).double(), rounded(feats, precision).double()) / zz
    sums = torch.zeros(b, h, N_SUMS, dtype=torch.float64, device=q.device)
    for c, name in enumerate(("first", "sep", "punct", "mass")):
        sums[..., SUMS[name]] = (ok * pf[..., c]).sum(-1)
    logp = torch.log(torch.where(p > 0, p, 1.0))
    ent = -(p * logp).sum(-1)
    sums[..., SUMS["entropy"]] = (ok * ent).sum(-1)
    sums[..., SUMS["entropy_norm"]] = (ils * ent).sum(-1)
    sums[..., SUMS["row_max"]] = (ok * p.amax(-1)).sum(-1)
    i = torch.arange(m, dtype=torch.float64, device=q.device)[:, None] + past
    j = torch.arange(n, dtype=torch.float64, device=q.device)[None, :]
    dist = (j - i).abs()
    sums[..., SUMS["distance"]] = (ok * (p * dist).sum(-1)).sum(-1)
    near = ((dist < RECENT_WINDOW) | (j < SINK_TOKENS)).double()
    sums[..., SUMS["stream"]] = (beyond * (p * near).sum(-1)).sum(-1)
    for o in PROFILE_OFFSETS:
        on = ((j - i) == o).double()
        sums[..., SUMS[f"diag{o:+d}"]] = (ok * (p * on).sum(-1)).sum(-1)
    mass = p.sum(-1)
    for t in range(3):
        sums[..., SUMS[f"pattern_mass{t}"]] = (rw[..., 3 + t][:, None] * mass).sum(-1)
    size = inputs.size
    rows = (rt[:, :m, :size] * rw[..., :1])[:, None]  # [b, 1, m, S]
    img = rows.transpose(-1, -2) @ (
        torch.einsum("bhij,bjs->bhis", rounded(en, precision).double(), rounded(rt[..., :size], precision).double())
        / zz
    )
    return sums, img, lse, out, p
