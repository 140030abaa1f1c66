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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rapids_attn.kvheads.evidence import (
    NOT_APPLICABLE,
    ORDER,
    Evidence,
    Stability,
    causal_store,
    labels,
    read_evidence,
    reasons,
    stability,
    windowed_examples,
)
from rapids_attn.stage import ReportSection

__all__ = [
    "FILE",
    "ORDER",
    "HeadClasses",
    "HeadClassesSection",
    "causal_store",
    "classify",
    "compute",
    "windowed_examples",
    "write",
]

FILE = "head_classes.json"


def head_scores(g, min_length: int = 0) -> dict[str, np.ndarray]:
    """[layer, head] means of the three class scores over a store's examples (:mod:`rapids_attn.kvheads.evidence`):
    the sink score the first-token mass over the dataset's rows, a decoder's first rows left out; streaming and
    retrieval means over the examples of at least ``min_length`` tokens."""
    sc = read_evidence(g, min_length).scores()
    return {c: sc[c] for c in ORDER}


def _judged_by(scores: dict[str, np.ndarray], lab: np.ndarray, thresholds: dict[str, float]) -> np.ndarray:
    """[layer, head] the score each head's class is read from: its class's, for ``other`` the score nearest its
    threshold, "" for ``not_applicable``."""
    out = np.full(lab.shape, "", dtype=object)
    for idx in np.ndindex(lab.shape):
        c = lab[idx]
        if c in ORDER:
            out[idx] = c
        elif c != NOT_APPLICABLE:
            finite = [n for n in ORDER if np.isfinite(scores[n][idx])]
            out[idx] = max(finite, key=lambda n: scores[n][idx] / thresholds[n]) if finite else ""
    return out


def _round(x) -> float | None:
    return round(float(x), 4) if x is not None and np.isfinite(x) else None


def classify(scores: dict[str, np.ndarray], layers, heads, thresholds: dict[str, float]) -> list[dict]:
    """One entry per head: layer, head (the model's indices), class, the class's score (for ``other`` the highest
    of the three relative to its threshold; None for ``not_applicable``), and every score (None where
    undefined)."""
    lab = labels(scores, thresholds)
    by = _judged_by(scores, lab, thresholds)
    rows = []
    for i, layer in enumerate(layers):
        for j, head in enumerate(heads):
            rows.append(
                {
                    "layer": int(layer),
                    "head": int(head),
                    "class": str(lab[i, j]),
                    "score": _round(scores[by[i, j]][i, j]) if by[i, j] else None,
                    "scores": {c: _round(scores[c][i, j]) for c in ORDER},
                }
            )
    return rows


@dataclass
class HeadClasses:
    """A store's head classes with their evidence: scores and labels on every example, the bootstrap and the
    split halves, and why a class is undefined where it is."""

    evidence: Evidence
    thresholds: dict[str, float]
    scores: dict[str, np.ndarray]  # the sink, streaming, retrieval and local means, [layer, head]
    labels: np.ndarray  # [layer, head]
    judged_by: np.ndarray  # [layer, head]
    stability: Stability
    reasons: dict[str, str]

    def rows(self) -> list[dict]:
        """head_classes.json's ``heads``: :func:`classify`'s entries with the class score's bootstrap interval
        and the share of resamples that give the same class."""
        ev, st = self.evidence, self.stability
        rows = classify(self.scores, ev.layers, ev.heads, self.thresholds)
        for r, (i, j) in zip(rows, np.ndindex(self.labels.shape), strict=True):
            lo, hi = _round(st.low[i, j]), _round(st.high[i, j])
            r["interval"] = [lo, hi] if lo is not None and hi is not None else None
            r["same_class"] = _round(st.same_class[i, j])
        return rows

    def counts(self) -> dict[str, int]:
        return {c: int((self.labels == c).sum()) for c in (*ORDER, "other", NOT_APPLICABLE)}


def compute(g, thresholds: dict[str, float], min_length: int, replicates: int, seed: int) -> HeadClasses:
    """A store's head classes (``thresholds``: the three class thresholds)."""
    ev = read_evidence(g, min_length)
    scores = ev.scores()
    lab = labels(scores, thresholds)
    by = _judged_by(scores, lab, thresholds)
    st = stability(ev, lab, by, thresholds, replicates, seed)
    return HeadClasses(ev, dict(thresholds), scores, lab, by, st, reasons(ev, scores))


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


def write(run_dir: Path, hc: HeadClasses, model: dict, examples: int, windowed: int = 0) -> dict:
    """Write ``run_dir/head_classes.json`` (atomically) and return the summary's entry: counts per class, the
    split-half agreement and why a class is undefined where it is."""
    from rapids_attn.extract.signature import RECENT_WINDOW, SINK_TOKENS

    ev, st = hc.evidence, hc.stability
    rows = hc.rows()
    agreement = {
        "halves": st.halves,
        "examples": list(st.half_counts),
        "kappa": _round(st.kappa),
        "agreement": _round(st.agreement),
    }
    applicability = {
        "min_length": ev.min_length,
        "long_examples": int(ev.eligible.sum()),
        "not_applicable": hc.reasons,
    }
    doc = {
        "model": model.get("name"),
        "source": model.get("source"),
        "examples": int(examples),
        "windowed_examples": int(windowed),
        "definitions": {
            "sink": "mean over the dataset's rows of the attention on the first token, a decoder's first row "
            "(which sees that token alone) left out (Gu et al. 2025)",
            "streaming": f"mean over the examples of at least min_length tokens of each example's mean, over its rows "
            f"that see beyond both, of the attention on the first {SINK_TOKENS} tokens and the {RECENT_WINDOW} most "
            "recent (per example, not per row: a short example weighs as much as a long one)",
            "retrieval": f"mean over the examples of at least min_length tokens of each example's attention on the "
            f"token after an earlier copy of the query's token, {RECENT_WINDOW} or more tokens back, over the mass of "
            "its rows that have such a target (per example, not per row)",
            "order": "a head takes the first of retrieval, streaming, sink whose score reaches its threshold; "
            "not_applicable where a score that decision needs is undefined (applicability.not_applicable says why)",
            "interval": f"2.5th-97.5th percentile of the class score over {st.replicates} bootstrap resamples of the "
            "examples (for other: the score nearest its threshold)",
            "same_class": "share of those resamples that give the head the same class",
            "split_half": "the classes of two disjoint halves of the examples and Cohen's kappa of their labels",
            **({"windows": WINDOWS_NOTE} if windowed else {}),
        },
        "thresholds": dict(hc.thresholds),
        "sink_tokens": SINK_TOKENS,
        "recent_window": RECENT_WINDOW,
        "applicability": applicability,
        "split_half": agreement,
        "heads": rows,
    }
    from rapids_attn.explain.outputs import replace_with_text

    path = Path(run_dir) / FILE
    replace_with_text(path, json.dumps(doc, indent=1))
    undefined = {c: sum(r["scores"][c] is None for r in rows) for c in ORDER}
    return {
        "path": str(path),
        "thresholds": dict(hc.thresholds),
        "counts": hc.counts(),
        "undefined": undefined,
        "applicability": applicability,
        "split_half": agreement,
    }


def section_html(hc: HeadClasses, entry: dict) -> str:
    """The report's "Head classes" section: counts, where the classes do not apply and why, the split-half
    agreement, the exports, and every head's class with its interval and stability (collapsed)."""
    from html import escape

    st = hc.stability
    counts = ", ".join(f"{n} {c.replace('_', ' ')}" for c, n in hc.counts().items() if n)
    parts = [
        '<section id="head_classes"><h2>Head classes for long contexts</h2>',
        (
            f"<p>{escape(counts)} (thresholds {escape(json.dumps(hc.thresholds))}; streaming and retrieval read the "
            f"{int(hc.evidence.eligible.sum())} of {hc.evidence.n_examples} examples of at least "
            f"{hc.evidence.min_length} tokens; <code>head_classes.json</code>).</p>"
        ),
    ]
    if hc.reasons:
        items = "".join(f"<li><b>{escape(c)}</b> undefined for {escape(r)}</li>" for c, r in hc.reasons.items())
        parts.append(f"<p>Not applicable where a score the class needs is undefined:</p><ul>{items}</ul>")
    k = "undefined (both halves give every head one class)" if st.kappa is None else f"{st.kappa:.3f}"
    unstable = int((np.nan_to_num(st.same_class, nan=1.0) < 0.9).sum())
    parts.append(
        f"<p>Noise control: two disjoint halves of the examples ({escape(st.halves)}) agree on {st.agreement:.1%} "
        f"of the heads' classes, Cohen's kappa {escape(k)}; over {st.replicates} bootstrap resamples of the "
        f"examples, {unstable} head(s) keep their class in under 90% of them. A head whose interval crosses its "
        "threshold is not a finding at this sample size.</p>"
    )
    ex = entry.get("exports") or {}
    if ex.get("written"):
        parts.append(
            f"<p>Exports for KV-cache tools in <code>head_classes/</code>: {escape(', '.join(ex['formats']))} "
            "(docs/kv-heads.md).</p>"
        )
    elif ex.get("why"):
        parts.append(f"<p>No exports for KV-cache tools: {escape(ex['why'])}.</p>")
    body = []
    for r in hc.rows():
        iv = r["interval"]
        body.append(
            f"<tr><td>{r['layer']}</td><td>{r['head']}</td><td>{escape(r['class'])}</td>"
            f"<td>{'' if r['score'] is None else r['score']}</td>"
            f"<td>{'' if iv is None else f'{iv[0]}-{iv[1]}'}</td>"
            f"<td>{'' if r['same_class'] is None else r['same_class']}</td></tr>"
        )
    parts.append(
        "<details><summary>Every head</summary><table><tr><th>layer</th><th>head</th><th>class</th><th>score</th>"
        "<th>95% interval</th><th>same class</th></tr>" + "".join(body) + "</table></details></section>"
    )
    return "".join(parts)


class HeadClassesSection(ReportSection):
    """The explain stage's own section (it computes the classes itself: nothing to read)."""

    anchor = "head_classes"
    title = "Head classes"

    def read(self, g, summary, findings, arrays, earlier):
        return None

    def html(self, state, figures):
        return "" if state is None else section_html(*state)
