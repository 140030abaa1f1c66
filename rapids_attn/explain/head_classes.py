"""The head classes of the long-context literature, over the dataset, and ``head_classes.json``: a per-head
label file a KV-cache or pruning tool can read.

Each head's scores are means over the examples that define them (extract.maps):

- ``sink``: the mass on the first token, averaged over the dataset's rows (the ``first`` statistic, weighted
  by each example's rows). In a decoder the first row sees the first token alone and puts all its mass there
  whatever the head does: it is left out, so one-token inputs carry no weight. Gu et al. 2025 ("When
  Attention Sink Emerges in Language Models") count a head as a sink head when this exceeds 0.3.
- ``streaming``: the mass on the first ``SINK_TOKENS`` tokens and the ``RECENT_WINDOW`` most recent ones,
  over the rows that can see beyond both (StreamingLLM; DuoAttention's streaming heads keep only those
  in their KV cache). Undefined on inputs too short to have such rows. Like ``retrieval``, a mean over
  examples of each example's own mean over such rows: per example, not per row, so a short example weighs
  as much as a long one (the store keeps the detectors per map).
- ``retrieval``: the induction mass at least ``RECENT_WINDOW`` tokens back (attention to the token after an
  earlier copy of the query's token: what a head copying from far context reads), over the mass of the rows
  that have such a target. Wu et al. 2024 ("Retrieval Head Mechanistically Explains Long-Context
  Factuality") call a head a retrieval head when its copy-paste score exceeds 0.1; theirs counts argmax
  copies during generation, ours is its attention-mass analogue over the dataset's own repeats.

A head takes the first class, in the order retrieval, streaming, sink, whose score reaches its threshold
(``explain.head_classes``), else ``other``: a retrieval head needs its full KV cache whatever else it does,
a streaming head only the sink and the window, and a sink head that is not streaming still reads the rest.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rapids_attn.store import schema as S

FILE = "head_classes.json"
ORDER = ("retrieval", "streaming", "sink")


def causal_store(g) -> bool:
    """Whether the store's maps are a decoder's (the extract runs record their workers' causality probe; a
    store written before they did reads as an encoder's)."""
    runs = [r.get("causal") for r in g.attrs.get(S.Attr.EXTRACT_RUNS, []) or []]
    known = [bool(c) for c in runs if c is not None]
    return bool(known) and all(known)


def head_scores(g, detectors: np.ndarray, detector_names: list[str]) -> dict[str, np.ndarray]:
    """[layer, head] means of the three scores: ``detectors`` is the explain stage's per-head detector means
    ([layer, head, detector]); the sink score is the per-head mean of the ``first`` statistic over the
    dataset's rows (each example's mean over its ``seq_len`` rows, weighted by them), a decoder's first rows
    left out (:func:`causal_store`: that row's mass on the first token is 1 for every head)."""
    k = [str(x) for x in g[S.STAT][:]].index("first")
    stats = g[S.STATS]
    rows = np.asarray(g[S.SEQ_LEN][:], np.float64)
    trivial = 1.0 if causal_store(g) else 0.0
    e = stats.shape[0]
    total = np.zeros(stats.shape[1:3])
    count = np.zeros(stats.shape[1:3])
    step = max(1, stats.chunks[0])
    for a in range(0, e, step):
        v = np.asarray(stats[a : a + step, :, :, k], np.float64)  # [examples, layer, head]
        n = rows[a : a + step, None, None]
        keep = ~np.isnan(v) & (n > trivial)
        total += np.where(keep, v * n - trivial, 0.0).sum(0)
        count += np.where(keep, n - trivial, 0.0).sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        sink = np.where(count > 0, total / np.maximum(count, 1e-300), np.nan)
    out = {"sink": sink}
    for name in ("streaming", "retrieval"):
        out[name] = (
            np.asarray(detectors[..., detector_names.index(name)], np.float64)
            if name in detector_names
            else np.full(sink.shape, np.nan)
        )
    return out


def classify(scores: dict[str, np.ndarray], layers, heads, thresholds: dict[str, float]) -> list[dict]:
    """One entry per head: layer, head (the model's indices), class, the class's score (the highest of the
    three relative to its threshold for ``other``), and every score (None where undefined)."""
    rows = []
    for i, layer in enumerate(layers):
        for j, head in enumerate(heads):
            sc = {name: float(scores[name][i, j]) for name in ORDER}
            cls = next((c for c in ORDER if np.isfinite(sc[c]) and sc[c] >= thresholds[c]), "other")
            if cls == "other":
                finite = [c for c in ORDER if np.isfinite(sc[c])]
                near = max(finite, key=lambda c: sc[c] / thresholds[c]) if finite else None
                score = sc[near] if near else None
            else:
                score = sc[cls]
            rows.append(
                {
                    "layer": int(layer),
                    "head": int(head),
                    "class": cls,
                    "score": None if score is None else round(score, 4),
                    "scores": {c: (round(v, 4) if np.isfinite(v) else None) for c, v in sc.items()},
                }
            )
    return rows


def windowed_examples(g) -> int:
    """How many of the store's examples were read as windows (``model.long_inputs: windows``)."""
    return sum(int(r.get("windowed_examples") or 0) for r in g.attrs.get(S.Attr.EXTRACT_RUNS, []) or [])


WINDOWS_NOTE = (
    "examples read as windows: a row saw its window only, so streaming counts a row where its window shows it a "
    "key past the window's first sink_tokens tokens (the model's sink there) and the recent window, and "
    "retrieval a target its window holds; windows of sink_tokens + recent_window tokens or fewer leave "
    "streaming undefined (and of recent_window + 1 or fewer retrieval too), and windows not much longer show a "
    "row so little beyond the recent window that almost any head reads as streaming (use windows of a few "
    "hundred tokens); the sink score reads a row's attention on its window's first token ([CLS] on BERT, "
    "the window's first content token where the tokenizer adds no leading special token, as GPT-2's)"
)


#: windows of this many tokens or fewer show a row too little past the recent window for the streaming and
#: retrieval classes to say much about a head (a random-weight decoder's heads all read as streaming at 69-72)
SHORT_WINDOWS = 256


def short_windows_warning(windowed: int, max_length: int) -> str | None:
    """The explain stage's warning when examples were read as windows too short for the classes to mean much."""
    if not windowed or max_length > SHORT_WINDOWS:
        return None
    return (
        f"head classes: {windowed} example(s) were read as windows of {max_length} tokens; a row there sees at most "
        f"{max_length} keys, so the streaming and retrieval classes describe the windows more than the heads "
        f"(docs/stages.md, 'Head classes for long contexts'); raise model.max_length above {SHORT_WINDOWS} for them"
    )


def write(
    run_dir: Path, rows: list[dict], thresholds: dict[str, float], model: dict, examples: int, windowed: int = 0
) -> dict:
    """Write ``run_dir/head_classes.json`` (atomically) and return the summary's entry: counts per class."""
    from rapids_attn.extract.signature import RECENT_WINDOW, SINK_TOKENS

    doc = {
        "model": model.get("name"),
        "source": model.get("source"),
        "examples": int(examples),
        "windowed_examples": int(windowed),
        "definitions": {
            "sink": "mean over the dataset's rows of the attention on the first token, a decoder's first row "
            "(which sees that token alone) left out (Gu et al. 2025)",
            "streaming": f"mean over examples of each example's mean, over its rows that see beyond both, of the "
            f"attention on the first {SINK_TOKENS} tokens and the {RECENT_WINDOW} most recent (per example, not per "
            "row: a short example weighs as much as a long one)",
            "retrieval": f"mean over examples of each example's attention on the token after an earlier copy of the "
            f"query's token, {RECENT_WINDOW} or more tokens back, over the mass of its rows that have such a target "
            "(per example, not per row)",
            "order": "a head takes the first of retrieval, streaming, sink whose score reaches its threshold",
            **({"windows": WINDOWS_NOTE} if windowed else {}),
        },
        "thresholds": dict(thresholds),
        "sink_tokens": SINK_TOKENS,
        "recent_window": RECENT_WINDOW,
        "heads": rows,
    }
    from rapids_attn.explain.outputs import replace_with_text

    path = Path(run_dir) / FILE
    replace_with_text(path, json.dumps(doc, indent=1))
    counts = {c: sum(r["class"] == c for r in rows) for c in (*ORDER, "other")}
    undefined = {c: sum(r["scores"][c] is None for r in rows) for c in ORDER}
    return {"path": str(path), "thresholds": dict(thresholds), "counts": counts, "undefined": undefined}
