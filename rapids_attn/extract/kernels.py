"""The capture's kernel seam: what turns one layer's attention inputs into a sink's sums over query rows and the
layer's output (issue 45).

A **kernel** (:class:`AttentionKernel`) takes a layer's :class:`LayerAttention` (the post-rotary queries, keys and
values, the model's mask, scaling, soft-capping and attention sinks, as transformers' attention interface hands
them over) and a **sink** (what receives the layer: the capture's :class:`~rapids_attn.extract.maps.LayerReducer`,
a long input's window sink, the comparison's query-and-key sink, the probe's whole-map assembler). Each sink says
what it takes in one typed value, :class:`SinkNeeds`; a kernel says which layers it can serve
(:meth:`AttentionKernel.unsupported`), and where it cannot, the PyTorch kernel runs and the capture records why
(``summary.json``'s ``extract.runs[].kernels`` and ``kernel_fallbacks``): never a silent difference.

Registered kernels (:data:`KERNELS`, ``extract.kernel``):

- ``torch``: the blocked PyTorch path (:func:`rapids_attn.extract.blocks.blocked_weights`): the reference, the CPU
  default, and every sink's fallback;
- ``triton``: the fused kernel (:mod:`rapids_attn.extract.fused`): one launch per layer, the CUDA default
  (``auto``); on the CPU it runs only under Triton's interpreter (``TRITON_INTERPRET=1``), for checking.

A new kernel is a class with ``name``, ``unsupported`` and ``run`` added to :data:`KERNELS`
(docs/decisions/2026-11-29-capture-kernels.md).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

import torch

from rapids_attn.errors import ModelError
from rapids_attn.extract.blocks import blocked_weights, head_map, needs_of

#: ``extract.kernel``'s values
KERNEL_CHOICES = ("auto", "torch", "triton")


@dataclass
class LayerAttention:
    """One layer's attention inputs as transformers' attention interface hands them over: ``query`` [batch, head,
    q_len, d], ``key`` and ``value`` [batch, key heads, kv_len, d], the mask the base's mask function made,
    ``scaling`` (None: 1 / sqrt(d)) and the keyword arguments (``is_causal``, ``sliding_window``, ``softcap``,
    ``s_aux``)."""

    module: torch.nn.Module
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor | None
    mask: torch.Tensor | None
    scaling: float | None
    kwargs: dict

    @property
    def scale(self) -> float:
        return self.scaling if self.scaling is not None else 1.0 / math.sqrt(self.query.shape[-1])

    @property
    def causal(self) -> bool:
        return bool(self.kwargs.get("is_causal", getattr(self.module, "is_causal", False))) and self.query.shape[2] > 1

    @property
    def dropout(self) -> bool:
        """Whether the module trains with dropout (a capture runs in inference mode: never there)."""
        m = self.module
        return bool(m.training and getattr(m, "attention_dropout", getattr(m, "dropout", 0.0)))


class AttentionKernel(Protocol):
    """A kernel of the capture (module docstring)."""

    name: str

    def unsupported(self, layer: LayerAttention, sink) -> str | None:
        """None when this kernel can serve ``layer`` for ``sink``; else why not, in a few words."""

    def run(self, layer: LayerAttention, sink, index: int, output: bool) -> torch.Tensor | None:
        """Hand layer ``index``'s sums (or rows) to ``sink``; return its output [batch, q_len, head, d_v] in the
        query's dtype when ``output`` and the kernel computed it, else None (the base computes it)."""


class TorchKernel:
    """The blocked PyTorch path: every sink, every mask, every device."""

    name = "torch"

    def unsupported(self, layer: LayerAttention, sink) -> str | None:
        return None

    def run(self, layer: LayerAttention, sink, index: int, output: bool) -> torch.Tensor | None:
        return blocked_weights(
            layer.module,
            layer.query,
            layer.key,
            layer.mask,
            layer.scaling,
            sink,
            index,
            layer.kwargs,
            layer.value if output else None,
        )


@dataclass
class TritonKernel:
    """The fused Triton kernel (:mod:`rapids_attn.extract.fused`), for a sink that takes sums (a batch's
    LayerReducer). ``precision``: the P @ [F | R^T] product's input precision (:data:`~rapids_attn.extract.fused.
    PRECISIONS`), or ``auto``: ieee for float32 queries, tf32 for half-precision ones."""

    precision: str = "auto"
    block_m: int = 64
    block_n: int = 64
    name: str = field(default="triton", init=False)

    def precision_for(self, dtype: torch.dtype) -> str:
        if self.precision != "auto":
            return self.precision
        return "ieee" if dtype in (torch.float32, torch.float64) else "tf32"

    def unsupported(self, layer: LayerAttention, sink) -> str | None:
        from rapids_attn.extract import fused

        if not needs_of(sink).sums:
            return "the sink reads blocks of rows (a long input's windows, the probe or a comparison)"
        missing = fused.available()
        if missing:
            return missing
        if layer.query.device.type != "cuda" and not fused.interpreted():
            return (
                f"the kernel runs on CUDA, or on the CPU under TRITON_INTERPRET=1; the layer is on {layer.query.device}"
            )
        if layer.dropout:
            return "the module trains with dropout"
        if max(layer.query.shape[-1], 0 if layer.value is None else layer.value.shape[-1]) > 256:
            return "head dimension above 256"
        mask = layer.mask
        if mask is not None and mask.dim() not in (2, 4):
            return f"a {mask.dim()}-D mask"
        if mask is not None and mask.dim() == 4 and mask.shape[1] not in (1, layer.query.shape[1]):
            return "a mask whose head dimension is neither 1 nor the query heads'"
        every = sink.head_list is None or list(sink.head_list) == list(range(layer.query.shape[1]))
        if mask is not None and mask.dim() == 4 and mask.shape[1] > 1 and not every:
            return "a mask per head with a subset of the heads captured"
        if layer.key.shape[2] - layer.query.shape[2] < 0:
            return "fewer keys than queries"
        return None

    def run(self, layer: LayerAttention, sink, index: int, output: bool) -> torch.Tensor | None:
        from rapids_attn.devices import launching_on

        # Triton launches on the current CUDA device: a layer on another GPU (model.device_map) runs under its own
        with launching_on(layer.query):
            return self._run(layer, sink, index, output)

    def _run(self, layer: LayerAttention, sink, index: int, output: bool) -> torch.Tensor | None:
        from rapids_attn.extract.fused import MaskSpec, fused_layer, pair_weights

        query, key = layer.query, layer.key
        _, every, idx, kv_heads = head_map(query, key, sink.head_list)
        q = query if every else query.index_select(1, idx)
        sinks = layer.kwargs.get("s_aux")
        sinks = sinks.index_select(0, idx) if sinks is not None else None
        softcap = layer.kwargs.get("softcap") or None
        spec = MaskSpec(
            layer.mask,
            layer.causal,
            int(layer.kwargs.get("sliding_window") or 0),
            key.shape[2] - query.shape[2],
        )
        value = layer.value if output and every else None
        sums, out = fused_layer(
            q,
            key,
            value,
            kv_heads,
            spec,
            layer.scale,
            sink.kernel_inputs(query.device),
            softcap=softcap,
            sinks=sinks,
            precision=self.precision_for(query.dtype),
            block_m=self.block_m,
            block_n=self.block_n,
            memo=getattr(sink, "forward_memo", None),
        )

        def pairs(eb, ei, ek):
            return pair_weights(q, key, kv_heads, sums.lse, layer.scale, spec, eb, ei, ek, softcap)

        sink.add_sums(index, sums, pairs)
        return out


#: ``extract.kernel`` -> the kernel's class (a new kernel is registered here)
KERNELS: dict[str, type] = {"torch": TorchKernel, "triton": TritonKernel}


def resolve_kernel(choice: str, device: str) -> str:
    """``extract.kernel`` for a worker on ``device`` (``cpu`` or ``cuda``): ``auto`` is ``triton`` on CUDA where
    Triton is installed, else ``torch``; ``triton`` on the CPU only under ``TRITON_INTERPRET=1`` (refused in one
    line otherwise, as without Triton)."""
    from rapids_attn.extract import fused

    if choice not in KERNEL_CHOICES:
        raise ModelError(f"extract.kernel: unknown kernel {choice!r}; use one of: {', '.join(KERNEL_CHOICES)}")
    if choice == "auto":
        return "triton" if device == "cuda" and fused.available() is None else "torch"
    if choice == "triton":
        missing = fused.available()
        if missing:
            raise ModelError(f"extract.kernel: triton cannot run here: {missing}; or set extract.kernel: torch")
        if device != "cuda" and not fused.interpreted():
            raise ModelError(
                "extract.kernel: triton runs on a CUDA GPU; on the CPU set TRITON_INTERPRET=1 to run it in Triton's "
                "interpreter (slow: for checking), or use extract.kernel: torch (or auto)"
            )
    return choice


def make_kernel(name: str, precision: str = "auto"):
    """The kernel object for a resolved ``extract.kernel`` name."""
    cls = KERNELS[name]
    return cls(precision=precision) if cls is TritonKernel else cls()


@dataclass
class KernelLog:
    """Which kernel served each layer, and why the PyTorch kernel ran where another was asked for: forwards
    counted per (layer, kernel) and per reason."""

    layers: dict[int, Counter] = field(default_factory=dict)
    fallbacks: Counter = field(default_factory=Counter)

    def record(self, layer: int, kernel: str, reason: str | None = None) -> None:
        self.layers.setdefault(layer, Counter())[kernel] += 1
        if reason:
            self.fallbacks[reason] += 1

    def by_kernel(self) -> dict[str, list[int]]:
        """kernel name -> the layers it served at least once."""
        out: dict[str, list[int]] = {}
        for layer in sorted(self.layers):
            for name in self.layers[layer]:
                out.setdefault(name, []).append(layer)
        return out

    def merge(self, other: KernelLog) -> None:
        for layer, c in other.layers.items():
            self.layers.setdefault(layer, Counter()).update(c)
        self.fallbacks.update(other.fallbacks)


def run_layer(kernel, layer: LayerAttention, sink, index: int, output: bool, log: KernelLog | None):
    """Run layer ``index`` through ``kernel``, or through the PyTorch kernel where it cannot serve it (recorded in
    ``log`` with the reason)."""
    reason = kernel.unsupported(layer, sink)
    chosen = kernel if reason is None else TorchKernel()
    if log is not None:
        log.record(index, chosen.name, None if reason is None else f"{kernel.name}: {reason}")
    return chosen.run(layer, sink, index, output)
