"""The files KV-cache tools load, built from per-head numbers: numpy, json and the standard library only, so a
consumer's environment (tests/consumers) imports this module without the rest of the package.

Each writer takes arrays indexed by the model's own [layer, query head] and a :class:`ModelShape` read from the
model's config, and refuses (:class:`ExportError`, one line) what the consumer would misread: a layer or head
missing, a head count that does not divide into the key-value heads, a value out of range.

- DuoAttention (``full_attention_heads.tsv`` + ``config.json``, as kvpress's ``DuoAttentionPress`` and
  duo-attention's ``load_attn_pattern`` read them): one row per layer, one column per key-value head, a float in
  [0, 1] (1: the head needs its full cache), and the streaming geometry ``sink_size`` / ``recent_size``.
- MInference, and vLLM's and SGLang's dual-chunk attention (``sparse_attention_config.json``, or MInference's
  ``*_best_pattern.json``): a list indexed by layer of ``{"<query head>": [pattern, vertical_size, slash_size,
  score]}``.
- HeadKV / Retrieval_Head (``head_score/<model>.json``): ``{"<layer>-<head>": [score, ...]}`` on one line, every
  query head in layer-major order (HeadKV reshapes the lists' means to [layer, head] in the file's order).
- A keep-index file for a KV budget (``kv_budget.json``): per layer and key-value head, the token spans
  ``[start, stop)`` a per-head eviction keeps at a given context length (:func:`keep_indices` expands them).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rapids_attn.errors import UserError


class ExportError(UserError):
    """An export that would not match its model, or a value the consumer would misread."""


@dataclass(frozen=True)
class ModelShape:
    """The model's attention geometry, from its config: layers, query heads and key-value heads (query head
    ``h`` reads key-value head ``h // group``, transformers' ``repeat_kv`` order)."""

    layers: int
    heads: int
    kv_heads: int
    name: str = ""

    def __post_init__(self):
        if min(self.layers, self.heads, self.kv_heads) < 1:
            raise ExportError(
                f"model {self.name!r}: its config gives {self.layers} layers, {self.heads} heads, "
                f"{self.kv_heads} key-value heads; an export needs at least one of each"
            )
        if self.heads % self.kv_heads:
            raise ExportError(
                f"model {self.name!r}: num_attention_heads {self.heads} is not a multiple of num_key_value_heads "
                f"{self.kv_heads}; the query heads cannot be grouped onto key-value heads"
            )

    @property
    def group(self) -> int:
        """Query heads per key-value head."""
        return self.heads // self.kv_heads

    @classmethod
    def from_config(cls, config, name: str = "") -> ModelShape:
        """From a transformers config (its text config for a multimodal one) or a config.json's dict."""
        if not isinstance(config, dict):
            get_text = getattr(config, "get_text_config", None)
            config = (get_text() if get_text else config).to_dict()
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
        layers = text.get("num_hidden_layers", text.get("n_layer"))
        heads = text.get("num_attention_heads", text.get("n_head"))
        if layers is None or heads is None:
            raise ExportError(
                f"model {name!r}: its config names no num_hidden_layers / num_attention_heads; pass --model "
                "a folder whose config.json has them"
            )
        kv = text.get("num_key_value_heads")
        kv = heads if kv is None else kv  # absent: one key-value head per query head; 0 is refused
        return cls(int(layers), int(heads), int(kv), name or str(config.get("_name_or_path") or ""))

    def check(self, layers, heads, what: str) -> None:
        """Refuse ``what`` unless ``layers`` and ``heads`` (the store's coordinates) are every layer and head of the
        model, in order: a consumer indexes the files by position."""
        layers, heads = [int(x) for x in layers], [int(x) for x in heads]
        if layers != list(range(self.layers)):
            raise ExportError(
                f"{what}: the run captured layers {_span(layers)} but model {self.name!r} has {self.layers} "
                f"(0-{self.layers - 1}); rerun extract with every layer (no extract.layers) or pass the model the "
                "run read"
            )
        if heads != list(range(self.heads)):
            raise ExportError(
                f"{what}: the run captured heads {_span(heads)} but model {self.name!r} has {self.heads} query heads "
                f"(0-{self.heads - 1}); rerun extract with every head (no extract.heads) or pass the model the run read"
            )


def _span(xs: list[int]) -> str:
    if not xs:
        return "none"
    return f"{xs[0]}-{xs[-1]} ({len(xs)})" if xs == list(range(xs[0], xs[-1] + 1)) else str(xs)


def _in_range(name: str, values: np.ndarray, lo: float = 0.0, hi: float = 1.0) -> np.ndarray:
    v = np.asarray(values, np.float64)
    if not np.isfinite(v).all() or (v < lo).any() or (v > hi).any():
        bad = np.argwhere(~(np.isfinite(v) & (v >= lo) & (v <= hi)))[0].tolist()
        raise ExportError(f"{name}: value {v[tuple(bad)]!r} at {bad} is outside [{lo}, {hi}]")
    return v


# --- DuoAttention ---------------------------------------------------------------------------------------------

DUO_TSV = "full_attention_heads.tsv"
DUO_CONFIG = "config.json"


def group_heads(values: np.ndarray, shape: ModelShape, combine: str = "max") -> np.ndarray:
    """[layer, query head] -> [layer, key-value head]: the query heads of each group combined by ``max`` (a
    key-value head is streamed only when every query head reading it can be) or ``mean`` (kvpress's on-the-fly
    scores)."""
    v = np.asarray(values, np.float64)
    if v.shape != (shape.layers, shape.heads):
        raise ExportError(f"group_heads: values of shape {v.shape}, model has {(shape.layers, shape.heads)}")
    g = v.reshape(shape.layers, shape.kv_heads, shape.group)
    if combine == "max":
        return g.max(-1)
    if combine == "mean":
        return g.mean(-1)
    raise ExportError(f"duo_attention combine: unknown {combine!r}; use max or mean")


def write_duo_attention(
    folder: Path, kv_values: np.ndarray, sink_size: int, recent_size: int, meta: dict
) -> list[Path]:
    """``folder/full_attention_heads.tsv`` (``kv_values`` [layer, key-value head] in [0, 1], tab-separated, one
    row per layer) and ``folder/config.json`` (``sink_size``, ``recent_size`` and ``meta``)."""
    v = _in_range("full_attention_heads", kv_values)
    if v.ndim != 2:
        raise ExportError(f"full_attention_heads: need [layer, key-value head], got shape {v.shape}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tsv, cfg = folder / DUO_TSV, folder / DUO_CONFIG
    tsv.write_text("\n".join("\t".join(f"{x:.6f}" for x in row) for row in v) + "\n", encoding="utf-8")
    doc = {**meta, "sink_size": int(sink_size), "recent_size": int(recent_size)}
    cfg.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return [tsv, cfg]


# --- MInference / vLLM / SGLang ----------------------------------------------------------------------------------

SPARSE_CONFIG = "sparse_attention_config.json"
VERTICAL_AND_SLASH = "vertical_and_slash"


def vertical_slash_config(
    vertical: np.ndarray, slash: np.ndarray, score: np.ndarray, shape: ModelShape
) -> list[dict[str, list]]:
    """The list indexed by layer, each ``{"<query head>": ["vertical_and_slash", vertical_size, slash_size,
    score]}``: ``vertical`` and ``slash`` [layer, head] counts (key columns and diagonals kept), ``score`` the share
    of the head's attention mass they were measured to hold."""
    v, s = np.asarray(vertical, np.float64), np.asarray(slash, np.float64)
    sc = _in_range("sparse_attention_config score", score)
    for name, a in (("vertical_size", v), ("slash_size", s)):
        if a.shape != (shape.layers, shape.heads):
            raise ExportError(f"{name}: shape {a.shape}, model has {(shape.layers, shape.heads)}")
        if not np.isfinite(a).all() or (a != np.round(a)).any() or (a < 1).any():
            raise ExportError(f"{name}: every head needs a whole number of at least 1, got {a[~(a >= 1)][:1]}")
    return [
        {
            str(h): [VERTICAL_AND_SLASH, int(v[i, h]), int(s[i, h]), round(float(sc[i, h]), 4)]
            for h in range(shape.heads)
        }
        for i in range(shape.layers)
    ]


# --- HeadKV / Retrieval_Head -------------------------------------------------------------------------------------


def head_scores(per_example: np.ndarray, shape: ModelShape, digits: int = 4) -> dict[str, list[float]]:
    """``{"<layer>-<head>": [score per example]}`` from ``per_example`` [example, layer, head] (NaN: the example
    does not define the score, left out), every query head in layer-major order; the consumers rank heads by each
    list's mean (HeadKV normalises the means by their sum: all zero is refused)."""
    x = np.asarray(per_example, np.float64)
    if x.shape[1:] != (shape.layers, shape.heads):
        raise ExportError(f"head scores: shape {x.shape[1:]} per example, model has {(shape.layers, shape.heads)}")
    out = {}
    for i in range(shape.layers):
        for h in range(shape.heads):
            col = x[:, i, h]
            col = col[np.isfinite(col)]
            if not len(col):
                raise ExportError(f"head scores: head {i}-{h} has no example that defines its score")
            out[f"{i}-{h}"] = [round(float(c), digits) for c in col]
    if not any(any(v) for v in out.values()):
        raise ExportError("head scores: every head's score is 0; HeadKV would divide by their sum")
    return out


# --- a keep-index file for a budget ------------------------------------------------------------------------------

KEEP_FILE = "kv_budget.json"


def keep_spans(kv_values: np.ndarray, budget: int, context_length: int, sink_size: int, recent_size: int) -> dict:
    """Which key-value heads keep everything and which keep the sink and the recent window, so that the mean
    tokens kept per key-value head at ``context_length`` is at most ``budget``: heads are streamed in order of
    their value (lowest first, ties by layer then head). Returns the document: per layer, per key-value head,
    its spans ``[start, stop)``."""
    v = _in_range("kv budget values", kv_values)
    if v.ndim != 2:
        raise ExportError(f"kv budget values: need [layer, key-value head], got shape {v.shape}")
    n = v.size
    streamed_keep = min(context_length, sink_size + recent_size)
    if budget < streamed_keep and context_length > streamed_keep:
        raise ExportError(
            f"kv budget: {budget} tokens per head is under the sink + recent window ({sink_size} + {recent_size}) "
            "a streamed head keeps; raise the budget"
        )
    if budget >= context_length or context_length <= streamed_keep:
        streamed = np.zeros(v.shape, bool)
    else:
        # mean keep = (full * T + streamed * s) / n <= budget  ->  streamed >= n (T - budget) / (T - s)
        need = int(np.ceil(n * (context_length - budget) / (context_length - streamed_keep) - 1e-9))
        order = np.lexsort((np.arange(n), v.ravel()))[: min(need, n)]
        streamed = np.zeros(n, bool)
        streamed[order] = True
        streamed = streamed.reshape(v.shape)
    full = [[0, context_length]]
    stream = [[0, sink_size], [context_length - recent_size, context_length]]
    layers = [{str(k): (stream if streamed[i, k] else full) for k in range(v.shape[1])} for i in range(v.shape[0])]
    kept = np.where(streamed, streamed_keep, context_length)
    return {
        "budget": int(budget),
        "context_length": int(context_length),
        "sink_size": int(sink_size),
        "recent_size": int(recent_size),
        "mean_kept": round(float(kept.mean()), 2),
        "streamed_heads": int(streamed.sum()),
        "layers": layers,
    }


def keep_indices(doc: dict, layer: int, kv_head: int) -> np.ndarray:
    """The token indices ``doc`` (a :func:`keep_spans` document) keeps for one key-value head."""
    spans = doc["layers"][layer][str(kv_head)]
    return np.concatenate([np.arange(a, b) for a, b in spans]) if spans else np.zeros(0, np.int64)


def write_json(path: Path, doc, one_line: bool = False) -> Path:
    """``doc`` as JSON; ``one_line``: on a single line (HeadKV and Retrieval_Head read ``json.loads(f.readline())``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, allow_nan=False) if one_line else json.dumps(doc, indent=1, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")
    return path


def safe_name(model: str) -> str:
    """A model id or folder as one file name (HeadKV's ``head_score/<model>.json``): its last path part."""
    base = os.path.basename(str(model).rstrip("/\\")) or "model"
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in base)
