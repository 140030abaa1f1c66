"""Each head's long-context class scores, per example, read from a store; their dataset means, bootstrap intervals
and split-half agreement; and where the classes apply.

The store keeps every map's statistics and detectors (extract), so the scores are means over examples computed
here from those per-example values, for any weighting of the examples: all of them (the point estimate), a
bootstrap resample (counts per example) or one half of a split. Every weighting is one matrix product over
[example, layer x head] arrays, so 200 resamples of 6,000 examples x 1,024 heads are a few seconds on a CPU.

Applicability (issue 49): the streaming and retrieval scores assume inputs long enough that a streaming cache
(the first ``SINK_TOKENS`` tokens and the ``RECENT_WINDOW`` most recent) would drop something. They are means over
the examples of at least ``min_length`` tokens (the tokens a row could see: an example read as windows counts its
window's length); with none, the score is undefined and a head whose class depends on it is ``not_applicable``,
with the reason. The sink score (mass on the first token) applies at any length.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rapids_attn.store import schema as S

ORDER = ("retrieval", "streaming", "sink")
OTHER = "other"
NOT_APPLICABLE = "not_applicable"
LABELS = (*ORDER, OTHER, NOT_APPLICABLE)
#: the per-example scores the classes and the exports read besides the sink score's sums: the streaming and
#: retrieval detectors and the mass on the offset profile's diagonals (the exports' slash sizing)
PARTS = ("streaming", "retrieval", "local")


def causal_store(g) -> bool:
    """Whether the store's maps are a decoder's (the extract runs record their workers' causality probe; a
    store written before they did reads as an encoder's)."""
    runs = [r.get("causal") for r in g.attrs.get(S.Attr.EXTRACT_RUNS, []) or []]
    known = [bool(c) for c in runs if c is not None]
    return bool(known) and all(known)


def windowed_examples(g) -> int:
    """How many of the store's examples were read as windows (``model.long_inputs: windows``)."""
    return sum(int(r.get("windowed_examples") or 0) for r in g.attrs.get(S.Attr.EXTRACT_RUNS, []) or [])


@dataclass
class Evidence:
    """Per-example values of one store's heads ([example, layer, head] each), and what the classes need to know
    about the examples."""

    layers: list[int]
    heads: list[int]
    causal: bool
    min_length: int
    length: np.ndarray  # [example] the tokens a row could see (a windowed example: at most its window)
    groups: np.ndarray  # [example] the dataset's group (SQuAD: the article)
    sink_num: np.ndarray  # [example, layer, head] the first-token mass times the counted rows
    sink_den: np.ndarray  # [example, layer, head] the counted rows (a decoder's first row left out)
    parts: dict[str, np.ndarray] = field(default_factory=dict)  # PARTS -> [example, layer, head], NaN: undefined
    profile_offsets: int = 0  # diagonals the ``local`` part sums (the offset profile's keys at or before the query)

    @property
    def eligible(self) -> np.ndarray:
        return self.length >= self.min_length

    @property
    def n_examples(self) -> int:
        return len(self.length)

    def scores(self, weights: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Weighted means per head: ``weights`` [example] or [replicate, example] (None: every example once) ->
        ``{"sink", *PARTS}`` each [layer, head] (or [replicate, layer, head]); NaN where no weighted example
        defines the score."""
        e = self.n_examples
        w = np.ones(e) if weights is None else np.asarray(weights, np.float64)
        flat = w.ndim == 1
        w2 = w[None] if flat else w
        shape = (len(w2), len(self.layers), len(self.heads))

        def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
            n = (w2 @ num.reshape(e, -1)).reshape(shape)
            d = (w2 @ den.reshape(e, -1)).reshape(shape)
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(d > 0, n / np.maximum(d, 1e-300), np.nan)

        out = {"sink": ratio(self.sink_num, self.sink_den)}
        for name, x in self.parts.items():
            ok = np.isfinite(x)
            out[name] = ratio(np.where(ok, x, 0.0), ok.astype(np.float64))
        return {k: v[0] for k, v in out.items()} if flat else out


def read_evidence(g, min_length: int) -> Evidence:
    """The per-example values from a store's ``stats``, ``detectors`` and ``profile``, read a chunk of examples at
    a time; ``streaming``, ``retrieval`` and ``local`` NaN on examples shorter than ``min_length``."""
    stat_names = [str(x) for x in g[S.STAT][:]]
    det_names = [str(x) for x in g[S.DETECTOR][:]] if str(S.DETECTOR) in g else []
    offsets = [int(x) for x in g[S.OFFSET][:]] if str(S.OFFSET) in g else []
    causal = causal_store(g)
    rows = np.asarray(g[S.SEQ_LEN][:], np.int64)
    length = rows.copy()
    if windowed_examples(g):
        window = (g.attrs.get(S.Attr.MODEL) or {}).get("max_length")
        if window:
            length = np.minimum(length, int(window))
    groups = (
        np.array([str(x) for x in g[S.EXAMPLE_GROUP][:]], dtype=object)
        if str(S.EXAMPLE_GROUP) in g
        else np.full(len(rows), "", dtype=object)
    )
    stats = g[S.STATS]
    e, nl, nh = stats.shape[:3]
    k_first = stat_names.index("first")
    trivial = 1.0 if causal else 0.0
    sink_num = np.zeros((e, nl, nh))
    sink_den = np.zeros((e, nl, nh))
    parts = {name: np.full((e, nl, nh), np.nan, np.float32) for name in PARTS}
    # the offset profile's diagonals a decoder's row can attend (key at or before the query); an encoder's: all
    local_cols = [i for i, o in enumerate(offsets) if o <= 0 or not causal]
    step = max(1, stats.chunks[0])
    for a in range(0, e, step):
        b = min(e, a + step)
        first = np.asarray(stats[a:b, :, :, k_first], np.float64)
        n = rows[a:b, None, None].astype(np.float64)
        keep = np.isfinite(first) & (n > trivial)
        sink_num[a:b] = np.where(keep, first * n - trivial, 0.0)
        sink_den[a:b] = np.where(keep, n - trivial, 0.0)
        long_enough = (length[a:b] >= min_length)[:, None, None]
        for name in ("streaming", "retrieval"):
            if name in det_names:
                v = np.asarray(g[S.DETECTORS][a:b, :, :, det_names.index(name)], np.float32)
                parts[name][a:b] = np.where(long_enough, v, np.nan)
        if local_cols:
            prof = np.asarray(g[S.PROFILE][a:b], np.float32)[..., local_cols]
            parts["local"][a:b] = np.where(long_enough, prof.sum(-1), np.nan)
    return Evidence(
        layers=[int(x) for x in g[S.LAYER][:]],
        heads=[int(x) for x in g[S.HEAD][:]],
        causal=causal,
        min_length=int(min_length),
        length=length,
        groups=groups,
        sink_num=sink_num,
        sink_den=sink_den,
        parts=parts,
        profile_offsets=len(local_cols),
    )


# --- the classes ---------------------------------------------------------------------------------------------


def class_scores(scores: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The three class scores from :meth:`Evidence.scores`."""
    return {c: scores[c] for c in ORDER}


def labels(scores: dict[str, np.ndarray], thresholds: dict[str, float]) -> np.ndarray:
    """Each head's class ([...] of str, any leading shape): the first of retrieval, streaming, sink whose score
    reaches its threshold; ``not_applicable`` where a score the decision needs is undefined (a head that is not a
    retrieval head cannot be called streaming or other when its retrieval score is unknown); else ``other``."""
    shape = np.shape(scores["sink"])
    out = np.full(shape, OTHER, dtype=object)
    decided = np.zeros(shape, bool)
    for c in ORDER:
        s = np.asarray(scores[c], np.float64)
        undefined = ~np.isfinite(s) & ~decided
        out[undefined] = NOT_APPLICABLE
        decided |= undefined
        hit = np.isfinite(s) & (s >= thresholds[c]) & ~decided
        out[hit] = c
        decided |= hit
    return out


def reasons(ev: Evidence, scores: dict[str, np.ndarray]) -> dict[str, str]:
    """Why a score is undefined for some heads: one line per class score, only for those with undefined heads."""
    from rapids_attn.extract.signature import RECENT_WINDOW, SINK_TOKENS

    out = {}
    n_long = int(ev.eligible.sum())
    for c in ORDER:
        n = int((~np.isfinite(scores[c])).sum())
        if not n:
            continue
        if c in ("streaming", "retrieval") and n_long == 0:
            why = (
                f"no example has {ev.min_length} tokens or more (the longest has {int(ev.length.max(initial=0))}); "
                f"the {c} class assumes inputs well past the first {SINK_TOKENS} and the {RECENT_WINDOW} most recent "
                "tokens (explain.head_classes.min_length)"
            )
        elif c == "retrieval":
            why = (
                f"none of the {n_long} example(s) of {ev.min_length}+ tokens repeats a token {RECENT_WINDOW} or more "
                "tokens after its first copy"
            )
        elif c == "streaming":
            why = f"none of the {n_long} example(s) of {ev.min_length}+ tokens has a row that sees beyond the window"
        else:
            why = "no example has a row past a decoder's first" if ev.causal else "no example has a finite map"
        out[c] = f"{n} head(s): {why}"
    return out


# --- stability -------------------------------------------------------------------------------------------------


def bootstrap_weights(n: int, replicates: int, seed: int) -> np.ndarray:
    """[replicate, example] counts of a resample with replacement of ``n`` examples."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n, np.full(n, 1.0 / n), size=replicates).astype(np.float64) if n else np.zeros((0, 0))


def split_halves(ev: Evidence, seed: int) -> tuple[np.ndarray, np.ndarray, str]:
    """Two disjoint halves of the examples (0/1 weights) and how they were drawn: by the dataset's groups (SQuAD's
    articles: another sample of the data, not of its sentences) when there are at least four, else by example."""
    rng = np.random.default_rng(seed + 1)
    names = np.unique(ev.groups)
    if len(names) >= 4 and len(names) < ev.n_examples:
        pick = set(rng.permutation(names)[: len(names) // 2].tolist())
        a = np.isin(ev.groups, list(pick))
        how = f"by group: {len(pick)} of {len(names)} groups against the other {len(names) - len(pick)}"
    else:
        a = np.zeros(ev.n_examples, bool)
        a[rng.permutation(ev.n_examples)[: ev.n_examples // 2]] = True
        how = f"by example: {int(a.sum())} against {ev.n_examples - int(a.sum())}"
    return a.astype(np.float64), (~a).astype(np.float64), how


def kappa(a: np.ndarray, b: np.ndarray) -> float | None:
    """Cohen's kappa of two labelings of the same heads; None where undefined (both constant and equal: chance
    agreement is 1)."""
    a, b = np.asarray(a).ravel(), np.asarray(b).ravel()
    cats = sorted(set(a.tolist()) | set(b.tolist()))
    if len(a) == 0:
        return None
    po = float((a == b).mean())
    pe = sum(float((a == c).mean()) * float((b == c).mean()) for c in cats)
    if pe >= 1.0 - 1e-12:
        return None
    return (po - pe) / (1.0 - pe)


@dataclass
class Stability:
    """The bootstrap's per-head interval of the class score and share of replicates giving the same class, and the
    split-half agreement of the class labels."""

    replicates: int
    low: np.ndarray  # [layer, head] 2.5th percentile of the head's class score (NaN: not applicable)
    high: np.ndarray
    same_class: np.ndarray  # [layer, head] share of replicates with the full sample's class
    halves: str
    half_counts: tuple[int, int]
    kappa: float | None
    agreement: float
    half_labels: tuple[np.ndarray, np.ndarray]


def stability(
    ev: Evidence, full_labels: np.ndarray, score_of: np.ndarray, thresholds: dict, replicates: int, seed: int
) -> Stability:
    """``full_labels`` [layer, head] the classes on every example; ``score_of`` [layer, head] the name of the score
    each head's class is judged by (its class, the nearest-threshold score for ``other``, "" where none)."""
    nl, nh = full_labels.shape
    low = np.full((nl, nh), np.nan)
    high = np.full((nl, nh), np.nan)
    same = np.full((nl, nh), np.nan)
    if replicates > 0 and ev.n_examples > 1:
        w = bootstrap_weights(ev.n_examples, replicates, seed)
        boot = ev.scores(w)
        lab = labels(boot, thresholds)  # [replicate, layer, head]
        same = (lab == full_labels[None]).mean(0)
        for c in ORDER:
            m = score_of == c
            if m.any():
                with np.errstate(invalid="ignore"), _quiet():
                    lo, hi = np.nanpercentile(boot[c][:, m], [2.5, 97.5], axis=0)
                low[m], high[m] = lo, hi
    wa, wb, how = split_halves(ev, seed)
    la, lb = labels(ev.scores(wa), thresholds), labels(ev.scores(wb), thresholds)
    return Stability(
        replicates=int(replicates),
        low=low,
        high=high,
        same_class=same,
        halves=how,
        half_counts=(int(wa.sum()), int(wb.sum())),
        kappa=kappa(la, lb),
        agreement=float((la == lb).mean()),
        half_labels=(la, lb),
    )


class _quiet:
    """Silence numpy's all-NaN slice warning (a head whose score no replicate defines)."""

    def __enter__(self):
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc):
        return self._w.__exit__(*exc)
