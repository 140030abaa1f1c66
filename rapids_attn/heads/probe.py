"""Head-wise probing (Transformer Anatomy): one cross-validated linear probe per head for an example label.

Inputs are per-head outputs pooled per example, ``x [N, L, H, d]`` (float16 or float32), and integer classes
``y [N]``. Rows whose class is ``-1`` are excluded (``task_labels`` marks examples that way when their class
cannot be probed), so the caller can pass the whole ``x``.

The probe is ``StandardScaler`` then multinomial ``LogisticRegression`` (lbfgs) with ``C = PROBE_C = 1.0``,
scikit-learn's default L2 strength on standardised features, fixed rather than tuned so that every head is
measured the same way. Folds are ``StratifiedKFold(folds, shuffle=True, random_state=seed)`` made once and
used for every head, for the majority baseline and for the reference representation.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping

import numpy as np
from joblib import Parallel, delayed
from sklearn.dummy import DummyClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

PROBE_TASKS = ("label", "wh_word", "length")
PROBE_C = 1.0
LENGTH_BINS = 6
WH_WORDS = ("what", "who", "when", "where", "why", "how", "which")
_WH = re.compile(r"\b(what|whom|whose|who|when|where|why|how|which)\b", re.IGNORECASE)
OTHER = "other"


def task_labels(task: str, examples_meta: Mapping, folds: int = 5) -> tuple[np.ndarray, list[str]] | None:
    """Classes of one probing task: ``(y [N] int, class names)``, or None when the task has under two classes.

    ``examples_meta`` is a mapping of per-example sequences, all of length N: ``"text"`` (the question, str),
    ``"label"`` (the example's label, ``""`` for none; the job's ``label_field`` lands here) and ``"n_tokens"``
    (tokens the model saw). A task needs only its own key.

    - ``label``: the label strings; examples with ``""`` get ``-1``.
    - ``wh_word``: the first wh-word of the text, on word boundaries, case-insensitive (``whom``/``whose``
      count as ``who``); ``other`` when there is none.
    - ``length``: SentEval's Length, ``n_tokens`` cut into ``LENGTH_BINS`` equal-frequency bins. Examples of
      the same length always share a bin, so a cut falls between distinct lengths, at the one whose cumulative
      count is nearest each quantile; with few distinct lengths there are fewer bins (never an empty one).
      Names are ``"lo-hi"`` token ranges.

    Rare classes, so that stratified ``folds``-fold CV works: for ``label`` and ``wh_word`` every class with
    fewer than ``folds`` examples is merged into ``other``; if ``other`` is still too small its examples get
    ``-1`` (excluded). For ``length`` a bin under ``folds`` examples is merged into its smaller neighbour.
    """
    if task == "length":
        return _length_labels(np.asarray(examples_meta["n_tokens"], dtype=np.int64), folds)
    if task == "wh_word":
        names = [_wh_word(t) for t in examples_meta["text"]]
    elif task == "label":
        names = [str(v) for v in examples_meta["label"]]
    else:
        raise ValueError(f"unknown probing task {task!r}; known: {', '.join(PROBE_TASKS)}")
    counts = Counter(n for n in names if n)
    names = [n if not n or counts[n] >= folds else OTHER for n in names]
    counts = Counter(n for n in names if n)
    classes = sorted(c for c, k in counts.items() if k >= folds)
    if len(classes) < 2:
        return None
    index = {c: i for i, c in enumerate(classes)}
    return np.array([index.get(n, -1) for n in names], dtype=np.int64), classes


def _wh_word(text: str) -> str:
    m = _WH.search(text or "")
    if not m:
        return OTHER
    word = m.group(1).lower()
    return "who" if word in ("whom", "whose") else word


def _length_labels(n_tokens: np.ndarray, folds: int) -> tuple[np.ndarray, list[str]] | None:
    values, counts = np.unique(n_tokens, return_counts=True)
    if len(values) < 2:
        return None
    cum = np.cumsum(counts)
    targets = np.arange(1, LENGTH_BINS) * len(n_tokens) / LENGTH_BINS
    cuts = {int(np.argmin(np.abs(cum - t))) for t in targets}  # bin ends: index of last value in a bin
    ends = sorted(c for c in cuts if c < len(values) - 1) + [len(values) - 1]
    bins = [[s, e] for s, e in zip([0] + [e + 1 for e in ends[:-1]], ends, strict=True)]

    def size(b: list[int]) -> int:
        return int(cum[b[1]] - (cum[b[0] - 1] if b[0] else 0))

    while len(bins) > 1 and min(size(b) for b in bins) < folds:
        i = min(range(len(bins)), key=lambda j: size(bins[j]))
        if i == 0 or (i < len(bins) - 1 and size(bins[i + 1]) < size(bins[i - 1])):
            j = i + 1
        else:
            j = i - 1
        lo, hi = min(i, j), max(i, j)
        bins[lo : hi + 1] = [[bins[lo][0], bins[hi][1]]]
    if len(bins) < 2:
        return None
    starts = np.array([values[b[0]] for b in bins])
    y = np.searchsorted(starts, n_tokens, side="right") - 1
    return y.astype(np.int64), [f"{values[b[0]]}-{values[b[1]]}" for b in bins]


def _probe(max_iter: int, C: float = PROBE_C):
    return make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=max_iter))


def _prepare(x: np.ndarray, y: np.ndarray, folds: int) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim != 4 or len(x) != len(y):
        raise ValueError(f"x must be [N, L, H, d] with N = len(y); got x {x.shape}, y {y.shape}")
    keep = y >= 0
    x, y = x[keep], y[keep]
    counts = np.bincount(y)
    counts = counts[counts > 0]
    if len(counts) < 2 or counts.min() < folds:
        raise ValueError(f"probing needs >= 2 classes of >= {folds} examples each; class sizes {counts.tolist()}")
    return x, y


def _splits(y: np.ndarray, folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    return list(StratifiedKFold(folds, shuffle=True, random_state=seed).split(np.zeros(len(y)), y))


def _head_scores(x: np.ndarray, y: np.ndarray, splits, max_iter: int, n_jobs: int | None) -> np.ndarray:
    """Per-fold accuracy of every head: [L, H, folds]. One BLAS/OpenMP thread per probe: at d ~ 32 threads
    cost more than they save (a tiny fit ran 2-3x slower with 2 threads on 2 cores); parallelism is over heads (``n_jobs``)."""
    _, n_layers, n_heads, _ = x.shape
    with threadpool_limits(1):
        scores = Parallel(n_jobs=n_jobs)(
            delayed(cross_val_score)(_probe(max_iter), x[:, layer, head].astype(np.float32), y, cv=splits)
            for layer in range(n_layers)
            for head in range(n_heads)
        )
    return np.asarray(scores).reshape(n_layers, n_heads, len(splits))


def probe_heads(
    x: np.ndarray, y: np.ndarray, folds: int = 5, seed: int = 0, max_iter: int = 1000, n_jobs: int | None = None
) -> dict:
    """One cross-validated linear probe per head, all on the same stratified folds.

    Returns ``accuracy`` and ``accuracy_std`` ([L, H], mean and std over folds), ``majority`` (the
    most-frequent-class baseline on the same folds), ``folds``, ``n`` (examples used) and ``classes``.
    ``n_jobs`` runs heads in parallel (joblib; None is one process).
    """
    x, y = _prepare(x, y, folds)
    splits = _splits(y, folds, seed)
    scores = _head_scores(x, y, splits, max_iter, n_jobs)
    majority = cross_val_score(DummyClassifier(strategy="most_frequent"), np.zeros((len(y), 1)), y, cv=splits)
    return {
        "accuracy": scores.mean(axis=-1),
        "accuracy_std": scores.std(axis=-1),
        "majority": float(majority.mean()),
        "folds": folds,
        "n": len(y),
        "classes": len(np.unique(y)),
    }


def best_heads_probe(
    x: np.ndarray,
    y: np.ndarray,
    reference: np.ndarray,
    top_k: int,
    accuracy: np.ndarray,
    folds: int = 5,
    seed: int = 0,
    inner_folds: int = 3,
    max_iter: int = 1000,
    n_jobs: int | None = None,
) -> dict:
    """The concatenated top-k heads against a reference representation (``reference [N, D]``, e.g. the last
    layer's mean-pooled hidden state), on the same outer folds.

    Selection is nested: in each outer fold the heads are ranked by ``inner_folds``-fold probe accuracy on
    that fold's training rows only, and the top ``top_k`` are concatenated, fitted there and scored on the
    held-out rows. ``accuracy`` (``probe_heads`` on all the data) is never used to select; it only gives
    ``heads_by_accuracy``, the whole-data top-k, for display. ``heads_chosen`` lists the ``top_k`` heads chosen
    most often across the outer folds as ``(layer, head)``.
    """
    reference = np.asarray(reference)
    if len(reference) != len(y):
        raise ValueError(f"reference has {len(reference)} rows, y has {len(y)}")
    keep = np.asarray(y) >= 0
    x, y = _prepare(x, y, folds)
    reference = reference[keep].astype(np.float32)
    _, n_layers, n_heads, _ = x.shape
    top_k = min(top_k, n_layers * n_heads)
    splits = _splits(y, folds, seed)
    best, chosen = [], Counter()
    for train, test in splits:
        inner = min(inner_folds, int(np.bincount(y[train])[np.unique(y[train])].min()))
        inner_scores = _head_scores(x[train], y[train], _splits(y[train], inner, seed), max_iter, n_jobs)
        order = np.argsort(-inner_scores.mean(axis=-1), axis=None, kind="stable")[:top_k]
        heads = [divmod(int(i), n_heads) for i in order]
        chosen.update(heads)
        feats = np.concatenate([x[:, layer, head] for layer, head in heads], axis=1).astype(np.float32)
        best.append(_probe(max_iter).fit(feats[train], y[train]).score(feats[test], y[test]))
    ref = cross_val_score(_probe(max_iter), reference, y, cv=splits)
    whole = np.argsort(-np.asarray(accuracy), axis=None, kind="stable")[:top_k]
    return {
        "best_heads": float(np.mean(best)),
        "best_heads_std": float(np.std(best)),
        "reference": float(ref.mean()),
        "reference_std": float(ref.std()),
        "k": top_k,
        "heads_chosen": [head for head, _ in chosen.most_common(top_k)],
        "heads_by_accuracy": [divmod(int(i), n_heads) for i in whole],
    }
