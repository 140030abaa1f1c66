"""A run's head classes as the files KV-cache tools load, written to ``head_classes/`` in the run directory (or
another folder) whole or not at all: checked against the model's config first (every layer and head, the grouping
of query heads onto key-value heads), every value in range (:mod:`rapids_attn.kvheads.formats`).

What each file holds, from the per-example evidence of :mod:`rapids_attn.kvheads.evidence` (the examples of at
least ``min_length`` tokens):

- ``duo_attention/``: a query head's value is the attention mass a streaming cache (the first ``SINK_TOKENS`` and
  the ``RECENT_WINDOW`` most recent tokens) would drop, ``1 - streaming``; 1 for a retrieval head and for a head
  whose class is not applicable. A key-value head takes the max of its query heads' (or their mean).
- ``sparse_attention_config.json``: each query head's smallest measured vertical-and-slash pattern that holds
  ``share`` of its attention mass: 1 vertical line (the first token) and the offset profile's diagonals (the query
  and the 4 keys before it), holding the sink plus local mass; else ``SINK_TOKENS`` vertical lines and
  ``RECENT_WINDOW`` diagonals, holding the streaming mass; else the whole context (score 1). The score is the
  share the chosen sizes were measured to hold. The capture measures no finer curve of mass against distance,
  so the sizes are these three steps.
- ``head_score/<model>.json``: each head's retrieval score per example, for HeadKV and Retrieval_Head.
- ``kv_budget.json``: which key-value heads keep everything and which keep the sink and the window, so that the
  mean kept per key-value head is ``budget`` of ``context_length``: the lowest DuoAttention values streamed first.
- ``exports.json``: the model's shape as checked, the settings, the stability of the classes (split-half kappa,
  each head's share of bootstrap resamples with the same class) and how to load each file.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from rapids_attn.kvheads import formats as F
from rapids_attn.kvheads.evidence import NOT_APPLICABLE

FOLDER = "head_classes"
MANIFEST = "exports.json"
FORMATS = ("duo_attention", "sparse_attention", "head_score", "kv_budget")


@dataclass(frozen=True)
class ExportSettings:
    combine: str = "max"
    share: float = 0.9
    budget: float = 0.5
    context_length: int | None = None
    formats: tuple[str, ...] = FORMATS

    @classmethod
    def from_config(cls, cfg, formats=FORMATS) -> ExportSettings:
        """From ``explain.head_classes.exports`` (:class:`rapids_attn.job.HeadClassExports`)."""
        return cls(cfg.combine, cfg.share, cfg.budget, cfg.context_length, tuple(formats))


def full_attention_values(hc) -> np.ndarray:
    """[layer, query head] in [0, 1]: the mass a streaming cache drops (``1 - streaming``), 1 for a retrieval head
    and a head whose class is not applicable."""
    streaming = np.asarray(hc.scores["streaming"], np.float64)
    v = np.where(np.isfinite(streaming), 1.0 - streaming, 1.0)
    v = np.where((hc.labels == "retrieval") | (hc.labels == NOT_APPLICABLE), 1.0, v)
    return np.clip(v, 0.0, 1.0)


def vertical_slash(hc, share: float, context_length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each head's [layer, head] vertical size, slash size and measured share: the smallest of the three measured
    patterns (module docstring) that holds ``share`` of its attention mass."""
    from rapids_attn.extract.signature import RECENT_WINDOW, SINK_TOKENS

    sc = hc.scores
    small = np.clip(np.nan_to_num(sc["sink"]) + np.nan_to_num(sc["local"]), 0.0, 1.0)
    small = np.where(np.isfinite(sc["local"]), small, np.nan)
    window = np.asarray(sc["streaming"], np.float64)
    diagonals = max(1, hc.evidence.profile_offsets)
    steps = [(1, diagonals, small), (SINK_TOKENS, RECENT_WINDOW, window)]
    shape = small.shape
    vertical = np.full(shape, context_length, np.int64)
    slash = np.full(shape, context_length, np.int64)
    score = np.ones(shape)
    done = np.zeros(shape, bool)
    for v, s, got in steps:
        hit = ~done & np.isfinite(got) & (got >= share)
        vertical[hit], slash[hit], score[hit] = v, s, got[hit]
        done |= hit
    return vertical, slash, score


def check(hc, shape: F.ModelShape) -> None:
    """Refuse an export its consumers would misread: an encoder (no KV cache), a run that captured a subset of the
    model's layers or heads, or one whose streaming class applies to no head."""
    if not hc.evidence.causal:
        raise F.ExportError(
            "head-class exports are for decoders (a KV cache); this run's model reads its inputs both ways"
        )
    shape.check(hc.evidence.layers, hc.evidence.heads, "head-class exports")
    if not np.isfinite(hc.scores["streaming"]).any() or not np.isfinite(hc.scores["retrieval"]).any():
        why = "; ".join(hc.reasons.get(c, "") for c in ("streaming", "retrieval") if hc.reasons.get(c))
        raise F.ExportError(f"head-class exports: the classes do not apply to this run's inputs ({why})")


def write_exports(out: Path, hc, shape: F.ModelShape, settings: ExportSettings, model: str) -> dict:
    """Check (:func:`check`), then write the chosen formats into ``out`` (replaced whole, never half-written).
    Returns the manifest (``exports.json``)."""
    from rapids_attn.extract.signature import RECENT_WINDOW, SINK_TOKENS

    check(hc, shape)
    unknown = sorted(set(settings.formats) - set(FORMATS))
    if not settings.formats:
        raise F.ExportError(f"--format: name at least one of {', '.join(FORMATS)}, or all")
    if unknown:
        raise F.ExportError(f"--format: unknown {', '.join(unknown)}; use {', '.join(FORMATS)} or all")
    ev, st = hc.evidence, hc.stability
    context = int(settings.context_length or int(ev.length.max(initial=0)))
    q_values = full_attention_values(hc)
    kv_values = F.group_heads(q_values, shape, settings.combine)
    same = np.nan_to_num(st.same_class, nan=0.0).reshape(shape.layers, shape.kv_heads, shape.group).min(-1)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    files: dict[str, dict] = {}
    try:
        if "duo_attention" in settings.formats:
            meta = {
                "rapids_attn": {
                    "model": model,
                    "layers": shape.layers,
                    "kv_heads": shape.kv_heads,
                    "query_heads_per_kv_head": shape.group,
                    "value": "1 - streaming score (the attention mass a cache of the sink and recent tokens drops); 1 "
                    "for retrieval heads and heads whose class is not applicable",
                    "combine": settings.combine,
                    "same_class_min": [[round(float(x), 4) for x in row] for row in same],
                    "examples": int(ev.eligible.sum()),
                }
            }
            paths = F.write_duo_attention(stage / "duo_attention", kv_values, SINK_TOKENS, RECENT_WINDOW, meta)
            files["duo_attention"] = {
                "files": [str(p.relative_to(stage)) for p in paths],
                **(
                    {
                        "note": "one layer or one key-value head: np.loadtxt reads the TSV as 1-D; reshape it to "
                        f"[{shape.layers}, {shape.kv_heads}] after loading"
                    }
                    if min(shape.layers, shape.kv_heads) == 1
                    else {}
                ),
                "load": "kvpress DuoAttentionPress (a subclass whose load_attention_pattern reads this folder) or "
                "duo-attention's load_attn_pattern(folder); docs/kv-heads.md",
            }
        if "sparse_attention" in settings.formats:
            v, s, sc = vertical_slash(hc, settings.share, context)
            path = F.write_json(stage / F.SPARSE_CONFIG, F.vertical_slash_config(v, s, sc, shape))
            files["sparse_attention"] = {
                "files": [path.name],
                "share": settings.share,
                "heads_reaching_share": int((sc >= settings.share).sum() - (v == context).sum()),
                "load": "copy into the model folder for vLLM / SGLang dual-chunk attention, or pass to MInference as "
                "its config_path; docs/kv-heads.md",
            }
        if "head_score" in settings.formats:
            path = F.write_json(
                stage / "head_score" / f"{F.safe_name(model)}.json",
                F.head_scores(ev.parts["retrieval"], shape),
                one_line=True,
            )
            files["head_score"] = {
                "files": [str(path.relative_to(stage))],
                "load": "HeadKV / Retrieval_Head: head_score/<model>.json, each head ranked by its list's mean",
            }
        if "kv_budget" in settings.formats:
            # the share of the context, but never under what a streamed head keeps (every head streamed)
            budget = max(round(settings.budget * context), min(context, SINK_TOKENS + RECENT_WINDOW))
            doc = F.keep_spans(kv_values, budget, context, SINK_TOKENS, RECENT_WINDOW)
            path = F.write_json(stage / F.KEEP_FILE, doc)
            files["kv_budget"] = {
                "files": [path.name],
                "budget": budget,
                "context_length": context,
                "load": "rapids_attn.kvheads.formats.keep_indices(doc, layer, kv_head): the token indices a per-head "
                "eviction (mlx-lm and the like) keeps",
            }
        manifest = {
            "model": model,
            "shape": {"layers": shape.layers, "heads": shape.heads, "kv_heads": shape.kv_heads},
            "settings": {**asdict(settings), "formats": list(settings.formats)},
            "sink_size": SINK_TOKENS,
            "recent_size": RECENT_WINDOW,
            "examples": {"all": ev.n_examples, "long_enough": int(ev.eligible.sum()), "min_length": ev.min_length},
            "counts": hc.counts(),
            "stability": {
                "split_half": {
                    "halves": st.halves,
                    "kappa": None if st.kappa is None else round(st.kappa, 4),
                    "agreement": round(st.agreement, 4),
                },
                "bootstrap": st.replicates,
                "heads_below_0.9_same_class": int((np.nan_to_num(st.same_class, nan=1.0) < 0.9).sum()),
            },
            "formats": files,
        }
        (stage / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
        _replace_dir(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return manifest


def _replace_dir(new: Path, dest: Path) -> None:
    """Put the finished folder ``new`` at ``dest``: an earlier one is moved aside first and removed after."""
    old = None
    if dest.exists() or dest.is_symlink():
        if not dest.is_dir():
            raise OSError(21, "Is not a directory", str(dest))
        old = dest.with_name(f".{dest.name}.old-{new.name.rsplit('-', 1)[-1]}")
        dest.rename(old)
    try:
        new.rename(dest)
    except BaseException:
        if old is not None:
            old.rename(dest)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
