"""Capture attention weights layer by layer while the forward pass runs.

transformers 5 models name the module whose output holds the attention weights in
``_can_record_outputs["attentions"]`` (a class, or an ``OutputRecorder`` with the class, the index
of the weights in the module's output and a name filter). We hook those modules directly, so each
layer's maps are handed to ``sink(layer_index, weights)`` and reduced before the next layer runs:
one batch never holds every layer's full-size maps at once. Models that do not declare it (older or
remote-code architectures) fall back to ``output_attentions=True``; both paths give the same maps.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rapids_attn.errors import ModelError
from rapids_attn.extract.blocked import PREFIX as BLOCKED_PREFIX
from rapids_attn.extract.blocks import ScratchPool
from rapids_attn.extract.kernels import KernelLog, TorchKernel
from rapids_attn.extract.maps import SinkNeeds

Sink = Callable[[int, torch.Tensor], None]  # (layer index, weights [batch, head, q, k])


def _recorder_spec(model) -> tuple[type, int, str | None] | None:
    spec = getattr(model, "_can_record_outputs", None) or {}
    target = spec.get("attentions")
    if target is None:
        return None
    if isinstance(target, type):
        return target, 1, None
    cls = getattr(target, "target_class", None)
    if cls is None:
        return None
    return cls, int(getattr(target, "index", 1)), getattr(target, "layer_name", None)


def attention_modules(model) -> tuple[list[torch.nn.Module], int] | None:
    """The self-attention modules in layer order, and where their output holds the weights."""
    spec = _recorder_spec(model)
    if spec is None:
        return None
    cls, index, layer_name = spec
    mods = [
        m
        for name, m in model.named_modules()
        if isinstance(m, cls) and (layer_name is None or name.endswith(layer_name))
    ]
    return (mods, index) if mods else None


def dtype_of(model, fallback: torch.dtype | None = None) -> str:
    """The name of the dtype ``model`` runs in (``float16`` ...), or of ``fallback`` for a module without one."""
    dt = getattr(model, "dtype", None)
    dt = dt if isinstance(dt, torch.dtype) else fallback
    return str(dt).removeprefix("torch.") if dt is not None else "its dtype"


#: a changed model.dtype changes the store's key: the store of the refused run is another job's to the next one
_NEW_STORE = "and rerun with --overwrite (or another output.dir)"


def not_finite(model_name: str, layer: int, dtype: str, what: str = "") -> ModelError:
    """The one-line refusal of attention maps that are not finite (NaN or inf), naming the layer where they start and
    the dtype the model ran in. In half precision the model overflowed (activations past float16's 65504 give inf
    scores, then NaN weights): a wider dtype is the fix. In float32 the checkpoint itself is at fault. ``what``
    says which input (e.g. "for example 'q1'")."""
    where = f"layer {layer} of '{model_name}' gives attention maps that are not finite (NaN or inf) in {dtype}"
    where += f" {what}" if what else ""
    if dtype == "float16":
        return ModelError(
            f"model.dtype: {where}: the model overflows float16; set model.dtype: float32, or bfloat16 on a GPU "
            f"that supports it (Ampere or later), {_NEW_STORE}"
        )
    if dtype == "bfloat16":
        return ModelError(f"model.dtype: {where}: the model overflows bfloat16; set model.dtype: float32, {_NEW_STORE}")
    return ModelError(
        f"model.name: {where}: its weights or activations are not finite even in float32; check the checkpoint "
        "(a damaged or wrongly converted file)"
    )


def check_probe_map(model, layer: int, w: torch.Tensor, n: int, model_name: str | None = None) -> None:
    """A probe's attention weights (one unpadded input of ``n`` tokens) must be a map of probabilities: [1, head,
    n, n], finite, non-negative, each row's sum at most 1 (below it only where a learned sink takes a share, as
    gpt-oss's) and above 0. Refused in one line otherwise: a local-attention band (Longformer, LED, LongT5), scores
    before the softmax (ProphetNet) and the like would be stored as if they were maps."""
    name = type(model).__name__
    if w.dim() != 4 or tuple(w.shape[2:]) != (n, n):
        got = "x".join(map(str, w.shape))
        raise ModelError(
            f"model.name: layer {layer} of {name} returns attention of shape {got} for {n} tokens, not a "
            f"{n} x {n} map per head (local or block attention); rapids_attn reads models whose attention is one"
        )
    # float32 sums to 1 within 1e-6; half precision (a GPU's model dtype) within a few of its eps
    tol = 1e-3 if w.dtype in (torch.float32, torch.float64) else 16 * torch.finfo(w.dtype).eps
    if not bool(torch.isfinite(w).all()):  # an overflow (half precision): the dtype is at fault, not the model
        raise not_finite(model_name or name, layer, dtype_of(model, w.dtype), f"for the {n}-token probe")
    w = w.float()
    sums = w.sum(-1)
    if float(w.min()) < -1e-6 or float(sums.max()) > 1 + tol or float(sums.min()) <= 0:
        raise ModelError(
            f"model.name: layer {layer} of {name} returns attention weights that are not probabilities (rows sum "
            f"to {float(sums.min()):.3g} .. {float(sums.max()):.3g}, least weight {float(w.min()):.3g}); rapids_attn "
            "reads the weights after the softmax"
        )


class AttentionCapture:
    """Run ``forward(**batch)`` and send every layer's attention weights to ``sink`` as they appear."""

    def __init__(self, model, n_layers: int, use_hooks: bool = True, kernel=None):
        self.model = model
        self.n_layers = n_layers
        #: the blocked capture's kernel (rapids_attn.extract.kernels; the PyTorch one by default), and which kernel
        #: served each layer of every forward so far, with why the PyTorch one ran where another was asked for
        self.kernel = kernel if kernel is not None else TorchKernel()
        self.kernel_log = KernelLog()
        found = attention_modules(model) if use_hooks else None
        if found is not None and len(found[0]) != n_layers:
            found = None  # e.g. cross-attention modules share the class: do not guess, fall back
        self.modules, self.index = found if found is not None else ([], 1)
        self.mode = "hooks" if self.modules else "output_attentions"
        impl = str(getattr(getattr(model, "config", None), "_attn_implementation", None) or "")
        if impl.startswith(BLOCKED_PREFIX):
            if not self.modules:
                raise ModelError(
                    f"model.name: {type(model).__name__} declares no attention modules to capture blocked; "
                    "set extract.attention: eager"
                )
            self.mode = "blocked"

    @torch.inference_mode()
    def run(self, batch: dict, sink: Sink):
        if self.mode == "blocked":  # the model's output too (with extract.attention_base capture, the capture's)
            return self._run_blocked(batch, sink if hasattr(sink, "add_rows") else _Assembled(sink))
        if self.mode == "output_attentions":
            out = self.model(**batch, output_attentions=True)
            atts = getattr(out, "attentions", None)
            if atts is None or len(atts) != self.n_layers or any(a is None for a in atts):
                raise ModelError(
                    f"model.name: {type(self.model).__name__} returned no attention weights; "
                    "it must support eager attention with output_attentions"
                )
            for i, a in enumerate(atts):
                sink(i, a)
            return

        seen: list[int] = []

        def make_hook(layer: int):
            def hook(_module, _inputs, output):
                w = output[self.index] if isinstance(output, tuple) and len(output) > self.index else None
                if w is None or not torch.is_tensor(w) or w.dim() != 4:
                    raise ModelError(
                        f"model.name: layer {layer} of {type(self.model).__name__} returned no attention weights; "
                        "it must run eager attention"
                    )
                seen.append(layer)
                sink(layer, w)

            return hook

        handles = [m.register_forward_hook(make_hook(i)) for i, m in enumerate(self.modules)]
        try:
            self.model(**batch)
        finally:
            for h in handles:
                h.remove()
        if len(seen) != self.n_layers:
            raise ModelError(
                f"model.name: captured attention from {len(seen)} of {self.n_layers} layers; "
                "the model skipped layers or does not expose its attention"
            )

    def _run_blocked(self, batch: dict, sink):
        """The blocked attention function (:mod:`rapids_attn.extract.blocked`) hands each layer's rows to
        ``sink`` as the layer runs: tell each attention module its layer and the sink for this forward."""
        seen: list[int] = []

        class _Counting:
            def __getattr__(self, name):
                return getattr(sink, name)

            def end_layer(self, layer):
                seen.append(layer)
                sink.end_layer(layer)

        counting = _Counting()
        counting.scratch = ScratchPool()  # the blocks' buffer, kept through this forward's layers
        counting.forward_memo = {}  # what a kernel read off this forward's mask, for its later layers
        for i, m in enumerate(self.modules):
            m._rapids_capture = (counting, i, self.kernel, self.kernel_log)
        try:
            output = self.model(**batch)
        finally:
            counting.scratch.release()
            for m in self.modules:
                m.__dict__.pop("_rapids_capture", None)
        if sorted(seen) != list(range(self.n_layers)):
            raise ModelError(
                f"model.name: captured attention from {len(set(seen))} of {self.n_layers} layers; "
                "the model skipped layers or does not call its attention function"
            )
        return output


class _Assembled:
    """A plain ``sink(layer, weights)`` fed by the blocked path: the rows are put back into whole maps (for
    small inputs only, such as the causality probe)."""

    block_bytes = 1 << 26
    needs = SinkNeeds(rows=True)

    def __init__(self, sink: Sink):
        self.sink = sink
        self.rows: dict[int, list[tuple[int, torch.Tensor]]] = {}
        self.head_list: list[int] | None = None

    def wants(self, layer: int) -> bool:
        return True

    def add_rows(self, layer: int, block: torch.Tensor, first_row: int, selected: bool = False, **_rows) -> None:
        # a copy: the blocked path reuses one buffer for its blocks
        self.rows.setdefault(layer, []).append((first_row, block.clone()))

    def end_layer(self, layer: int) -> None:
        parts = sorted(self.rows.pop(layer, []), key=lambda p: p[0])
        if parts:  # a causal block holds the keys up to its last row only: the rest weigh nothing
            width = max(b.shape[3] for _, b in parts)
            blocks = [torch.nn.functional.pad(b, (0, width - b.shape[3])) for _, b in parts]
            self.sink(layer, torch.cat(blocks, dim=2))
