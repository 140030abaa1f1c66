"""Per-head interventions: ablation (zero or mean), gates for importance, capture of head outputs.

transformers 5 has no ``head_mask``, so we intervene where a head's contribution is still separable:
the INPUT of each attention layer's output projection (BERT ``attention.output.dense``, GPT-2
``attn.c_proj``, Llama-like ``self_attn.o_proj``, generic ``out_proj``/``o_proj``/``dense``/``o``/
``out_lin`` under an attention module). That input is the concatenation of the heads' outputs,
``[..., H * d]`` (H = ``num_attention_heads``, also for GQA models), and the projection is linear, so
zeroing head h's slice is exactly the model with that head's projection columns zeroed (Linear:
``weight[:, h*d:(h+1)*d]``; Conv1D: ``weight[h*d:(h+1)*d, :]``). A ``register_forward_pre_hook``
reshapes the input to ``[..., H, d]``, multiplies by the gates, applies keep / mean replacement,
calls ``pool`` and hands the projection the result. Cross-attention (encoder-decoder) is left alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Self

import torch

_PROJ_NAMES = {"o_proj", "out_proj", "dense", "c_proj", "out_lin", "o"}
_CROSS = ("cross", "encoder_attn", "encdec")


@dataclass(frozen=True)
class HeadSite:
    """One layer's attention output projection; its input is ``n_heads`` blocks of ``head_dim``."""

    layer: int
    module: torch.nn.Module
    n_heads: int
    head_dim: int


def _in_features(module: torch.nn.Module) -> int | None:
    if isinstance(module, torch.nn.Linear):
        return module.in_features
    if type(module).__name__ == "Conv1D" and getattr(module, "weight", None) is not None:
        return int(module.weight.shape[0])  # transformers' Conv1D: weight [in, out]
    return None


def _n_heads(model: torch.nn.Module) -> int | None:
    cfg = getattr(model, "config", None)
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    for key in ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads"):
        value = getattr(cfg, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def head_sites(model: torch.nn.Module) -> list[HeadSite]:
    """One site per (self-)attention layer, in module order; ValueError naming the class if none."""
    n_heads = _n_heads(model)
    sites: list[HeadSite] = []
    for name, module in model.named_modules():
        parts, width = name.lower().split("."), _in_features(module)
        if (
            width is None
            or parts[-1] not in _PROJ_NAMES
            or not any("attn" in p or "attention" in p for p in parts[-3:-1])  # under an attention module
            or any(c in p for p in parts for c in _CROSS)  # self-attention only
        ):
            continue
        if n_heads is None or width % n_heads:
            raise ValueError(
                f"{type(model).__name__}: cannot split {name} (input width {width}) into "
                f"{n_heads} heads; the config's num_attention_heads is missing or does not divide it"
            )
        sites.append(HeadSite(len(sites), module, n_heads, width // n_heads))
    if not sites:
        raise ValueError(
            f"{type(model).__name__}: no attention output projection found (looked for o_proj, "
            "out_proj, dense, c_proj, out_lin or o under an attention module); head interventions "
            "need one"
        )
    return sites


def ablation_mask(n_layers: int, n_heads: int, heads: Iterable[tuple[int, int]]) -> torch.Tensor:
    """``[L, H]`` float mask of 1s with 0 at each (layer, head) in ``heads``."""
    mask = torch.ones(n_layers, n_heads)
    for layer, head in heads:
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise ValueError(f"head ({layer}, {head}) is outside {n_layers} layers x {n_heads} heads")
        mask[layer, head] = 0.0
    return mask


def _per_layer(t: torch.Tensor, layer: int, batch: int, name: str) -> torch.Tensor:
    """``[L, H]`` -> ``[H]``; ``[B, L, H]`` -> ``[B, 1, H]`` (broadcast over tokens)."""
    if t.dim() == 2:
        return t[layer]
    if t.dim() == 3:
        if t.shape[0] != batch:
            raise ValueError(f"{name} has {t.shape[0]} per-example rows but the batch has {batch}")
        return t[:, layer, None, :]
    raise ValueError(f"{name} must be [L, H] or [B, L, H], got shape {tuple(t.shape)}")


class HeadIntervention:
    """Context manager hooking every site (hooks removed on exit, also on an exception).

    ``keep``/``means``/``gates``/``pool`` may be changed between forwards. In the hook: ``gates`` multiply,
    then ``keep`` k (0 = ablate) gives ``out * k + (1 - k) * means`` if ``means`` is set, else ``out * k``;
    then ``pool(layer, out [B, T, H, d])`` sees what the projection will get. ``keep`` and ``gates`` are
    ``[L, H]`` or per-example ``[B, L, H]`` (several conditions in one batch; per-example gates give
    per-example gradients in ``gate_importance``)."""

    def __init__(
        self,
        model: torch.nn.Module,
        sites: list[HeadSite] | None = None,
        *,
        keep: torch.Tensor | None = None,
        means: torch.Tensor | None = None,
        gates: torch.Tensor | None = None,
        pool: Callable[[int, torch.Tensor], None] | None = None,
    ):
        self.model = model
        self.sites = head_sites(model) if sites is None else list(sites)
        self.keep, self.means, self.gates, self.pool = keep, means, gates, pool
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def _hook(self, site: HeadSite):
        def pre_hook(module, args):
            if not args:
                raise ValueError(f"layer {site.layer}: the output projection got no positional input")
            x = args[0]
            if x.shape[-1] != site.n_heads * site.head_dim:
                raise ValueError(f"layer {site.layer}: input width {x.shape[-1]} != {site.n_heads} x {site.head_dim}")
            h = x.reshape(*x.shape[:-1], site.n_heads, site.head_dim)
            batch = x.shape[0]
            if self.gates is not None:
                g = _per_layer(self.gates, site.layer, batch, "gates").to(h.device, h.dtype)
                h = h * g[..., None]
            if self.keep is not None:
                k = _per_layer(self.keep, site.layer, batch, "keep").to(h.device, h.dtype)[..., None]
                if self.means is None:
                    h = h * k
                else:
                    m = self.means[site.layer].to(device=h.device, dtype=h.dtype)
                    h = h * k + (1 - k) * m
            if self.pool is not None:
                self.pool(site.layer, h)
            return (h.reshape(x.shape), *args[1:])

        return pre_hook

    def __enter__(self) -> Self:
        try:
            for site in self.sites:
                self._handles.append(site.module.register_forward_pre_hook(self._hook(site)))
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def remove(self) -> None:
        while self._handles:
            self._handles.pop().remove()


class HeadMeans:
    """Per-head mean output over non-padding tokens across batches (float64 sums), for mean ablation.

    ``with means.hook(batch["attention_mask"]): model(**batch)`` per batch, or ``with means:`` around
    a loop that sets ``means.attention_mask`` before each forward; ``update`` can be fed directly."""

    def __init__(self, model: torch.nn.Module, sites: list[HeadSite] | None = None):
        self.sites = head_sites(model) if sites is None else list(sites)
        self.attention_mask: torch.Tensor | None = None
        self._sums: dict[int, torch.Tensor] = {}
        self._counts: dict[int, float] = {}
        self._hooks = HeadIntervention(model, self.sites, pool=self._pool)

    def _pool(self, layer: int, out: torch.Tensor) -> None:
        self.update(layer, out, self.attention_mask)

    def update(self, layer: int, out: torch.Tensor, attention_mask: torch.Tensor | None = None) -> None:
        """Add ``out`` [B, T, H, d] of ``layer``, counting only tokens where ``attention_mask`` [B, T]."""
        out = out.detach().to(torch.float64)
        if attention_mask is None:
            total, count = out.sum(dim=(0, 1)), out.shape[0] * out.shape[1]
        else:
            if tuple(attention_mask.shape) != tuple(out.shape[:2]):
                raise ValueError(f"attention_mask {tuple(attention_mask.shape)} != tokens {tuple(out.shape[:2])}")
            w = attention_mask.to(device=out.device, dtype=torch.float64)
            total, count = torch.einsum("bt,bthd->hd", w, out), float(w.sum())
        self._sums[layer] = self._sums.get(layer, 0) + total
        self._counts[layer] = self._counts.get(layer, 0) + count

    def means(self) -> torch.Tensor:
        """``[L, H, d]`` float64 on the CPU; ValueError if a layer saw no token."""
        missing = [s.layer for s in self.sites if not self._counts.get(s.layer)]
        if missing:
            raise ValueError(f"no tokens seen for layers {missing}: run batches before means()")
        return torch.stack([(self._sums[s.layer] / self._counts[s.layer]).cpu() for s in self.sites])

    @contextlib.contextmanager
    def hook(self, attention_mask: torch.Tensor | None = None):
        self.attention_mask = attention_mask
        with self:
            yield self

    def __enter__(self) -> Self:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


def _batch_size(batch: dict) -> int:
    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    raise ValueError("batch holds no tensor to take the batch size from")


def gate_importance(
    model: torch.nn.Module,
    batches: Iterable[dict],
    loss_fn: Callable[[object, dict], torch.Tensor],
    normalise: bool = True,
    *,
    forward: Callable[[torch.nn.Module, dict], object] | None = None,
    sites: list[HeadSite] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Head importance of Michel et al. (2019): ``I(h) = E_x |dL(x)/dg_h|`` at gates g = 1.

    ``loss_fn(output, batch)`` returns per-example losses ``[B]``. Each batch gets per-example gates
    ``[B, L, H]`` (all 1); since example b's loss depends only on its own gates, one backward of
    ``loss.sum()`` yields every ``dL(x_b)/dg`` at once: the cost is one forward + backward per batch,
    not per example. A scalar loss counts as one example (the batch's |dL/dg|). ``raw`` is the mean
    over examples; ``normalised`` divides each layer's row by its l2 norm over heads (section 4.2),
    or equals ``raw`` if ``normalise`` is False. The model runs in eval mode with its parameters'
    ``requires_grad`` off (both restored after); ``forward`` defaults to ``model(**batch)``.
    """
    sites = head_sites(model) if sites is None else list(sites)
    n_layers, n_heads = len(sites), max(s.n_heads for s in sites)
    forward = forward or (lambda m, b: m(**b))
    params = list(model.parameters())
    flags, was_training = [p.requires_grad for p in params], model.training
    device = params[0].device if params else torch.device("cpu")
    dtype = params[0].dtype if params and params[0].is_floating_point() else torch.float32
    total = torch.zeros(n_layers, n_heads, dtype=torch.float64)
    count = 0
    try:
        for p in params:
            p.requires_grad_(False)
        model.eval()
        with torch.enable_grad(), HeadIntervention(model, sites) as hooks:
            for batch in batches:
                shape = (_batch_size(batch), n_layers, n_heads)
                gates = torch.ones(shape, device=device, dtype=dtype, requires_grad=True)
                hooks.gates = gates
                loss = loss_fn(forward(model, batch), batch)
                if loss.dim() not in (0, 1) or (loss.dim() == 1 and loss.shape[0] != shape[0]):
                    raise ValueError(f"loss_fn must return a scalar or [{shape[0]}] losses, got {tuple(loss.shape)}")
                loss.sum().backward()
                grad = gates.grad.detach().to(torch.float64).cpu()
                total += grad.sum(0).abs() if loss.dim() == 0 else grad.abs().sum(0)
                count += 1 if loss.dim() == 0 else shape[0]
    finally:
        for p, flag in zip(params, flags, strict=True):
            p.requires_grad_(flag)
        model.train(was_training)
    if count == 0:
        raise ValueError("gate_importance got no batches")
    raw = total / count
    if not normalise:
        return raw, raw.clone()
    return raw, raw / raw.norm(dim=1, keepdim=True).clamp_min(torch.finfo(raw.dtype).tiny)  # 0-rows stay 0
