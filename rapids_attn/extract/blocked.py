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

The capture sets ``module._rapids_capture = (sink, layer, kernel, log)`` on each attention module for one forward
(the kernel: :mod:`rapids_attn.extract.kernels`); a
module without it (a forward outside a capture) only computes the output.
"""

from __future__ import annotations

from rapids_attn.extract.blocks import blocked_weights
from rapids_attn.extract.kernels import LayerAttention, run_layer
from rapids_attn.extract.maps import SinkNeeds

PREFIX = "rapids_blocked_"
_REGISTERED: set[str] = set()


def implementation_name(base: str) -> str:
    return PREFIX + base


#: ``extract.attention_base: capture``: the capture's own softmax gives the model's output (see :func:`register`)
OWN = "capture"


#: implementations transformers registers that the capture cannot run over: flex attention's mask is a BlockMask
#: (no tensor to read the hidden keys from); the ``paged|...`` ones serve a generation cache
UNSUPPORTED = {"flex_attention": "its mask is a BlockMask, which the capture cannot read"}


def check_base(base: str, device: str | None = None) -> None:
    """Preflight: ``extract.attention_base`` names an implementation this capture can run over, on the job's
    extract ``device`` (``cpu``, ``cuda``, or None where the workers decide)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from rapids_attn.errors import ModelError

    usable = {OWN, "eager"} | {
        b for b in ALL_ATTENTION_FUNCTIONS if "|" not in b and b not in UNSUPPORTED and b not in _REGISTERED
    }
    known = ", ".join(sorted(usable))
    if base in UNSUPPORTED:
        raise ModelError(
            f"extract.attention_base: {base} cannot be captured ({UNSUPPORTED[base]}); use one of: {known}"
        )
    if base not in usable:
        raise ModelError(f"extract.attention_base: unknown attention implementation '{base}'; use one of: {known}")
    if base.startswith("flash_attention") and device == "cpu":
        raise ModelError(
            f"extract.attention_base: {base} runs on CUDA GPUs only and this job extracts on the CPU; "
            "use sdpa (the default) or capture, or extract.device: cuda on a GPU machine"
        )


def register(base: str = "sdpa") -> str:
    """Register ``rapids_blocked_<base>`` with transformers' attention and mask interfaces; returns the name.

    The mask function is the base's, so the base computes exactly what it would alone. With ``base``
    :data:`OWN` (``capture``), a layer whose every head is captured gets its output from the capture's own
    softmax: each block of weights times the values (one more product per block, ``[rows, T] x [T, d + 1]``,
    the last column giving the rows' sums) instead of a second attention over the same scores; the masks
    are SDPA's, and a layer outside the capture, or a forward without one, runs SDPA."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = implementation_name(base)
    if name in _REGISTERED:
        return name
    own = base == OWN
    fallback = "sdpa" if own else base
    if fallback != "eager" and fallback not in ALL_ATTENTION_FUNCTIONS:
        raise ValueError(f"unknown attention implementation {base!r}")
    try:
        mask_fn = ALL_MASK_ATTENTION_FUNCTIONS[fallback]
    except KeyError:  # an implementation with no mask function of its own gets no mask, as it would alone
        mask_fn = None

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        capture = getattr(module, "_rapids_capture", None)
        # transformers' SDPA drops attention sinks (s_aux: gpt-oss and others) and refuses soft-capping (Gemma 2),
        # and the model's eager function would misread SDPA's boolean (or absent) mask: such a layer's output comes
        # from the blocked softmax, which has all three, captured or not
        needs_own = kwargs.get("s_aux") is not None or bool(kwargs.get("softcap"))
        mine = own or (fallback == "sdpa" and needs_own)
        out = None
        if capture is not None:  # (sink, layer, kernel, log): rapids_attn.extract.capture.AttentionCapture
            sink, layer, kernel, log = capture
            if sink.wants(layer):
                la = LayerAttention(module, query, key, value, attention_mask, scaling, kwargs)
                out = run_layer(kernel, la, sink, layer, mine, log)
            sink.end_layer(layer)
        if out is None and mine and needs_own:  # not captured (or some heads): output alone
            out = blocked_weights(module, query, key, attention_mask, scaling, _OUTPUT_ONLY, 0, kwargs, value)
        if out is None:
            # eager attention is each model's own function, beside its attention class
            base_fn = _model_eager(module) if fallback == "eager" else ALL_ATTENTION_FUNCTIONS[fallback]
            out = base_fn(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)[0]
        return out, None

    AttentionInterface.register(name, attention)
    if mask_fn is not None:
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, mask_fn)
    _REGISTERED.add(name)
    return name


class _OutputOnly:
    """A sink that takes no rows: :func:`blocked_weights` then computes a layer's output alone (every head)."""

    head_list = None
    block_bytes = 64 << 20
    needs = SinkNeeds(rows=False)  # blocked_weights skips the normalising that only a sink's rows need

    def add_rows(self, *args, **kwargs) -> None:
        pass


_OUTPUT_ONLY = _OutputOnly()


def _model_eager(module):
    import sys

    fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if fn is None:
        raise ValueError(f"{type(module).__name__} has no eager_attention_forward beside it")
    return fn
