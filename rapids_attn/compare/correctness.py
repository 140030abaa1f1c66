"""Whether an example's attention statistics predict whether the model gets it right (issue 46).

Each example is described by its per-head statistics (the store's ``stats``: every layer x head x statistic, at
full resolution) and labelled by the model's own correctness on it (a right answer, a right class, its paragraph
ranked first). A logistic regression (standardised features, L2) is fitted and scored with cross-validation over
whole groups (SQuAD: articles), so every score is for an article the fit never saw; the result is the
out-of-fold ROC AUC with a bootstrap interval over the examples. Two controls stand beside it: the input's length
alone (attention statistics move with length, and so may correctness), and the statistics with the length added.
The statistics that carry the prediction are the largest standardised coefficients, averaged over the folds.
"""

from __future__ import annotations

import numpy as np


def grouped_auc(
    x: np.ndarray,
    y: np.ndarray,
    groups: np.ndarray,
    *,
    folds: int = 5,
    c: float = 0.1,
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> dict:
    """Out-of-fold ROC AUC of a logistic regression of ``y`` (0/1) on ``x`` [examples, features], folds by group,
    with a percentile bootstrap interval over the examples; and each feature's mean standardised coefficient over
    the folds. Raises ValueError with fewer than two groups or one class."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import GroupKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x = np.asarray(x, np.float64)
    y = np.asarray(y).astype(int)
    groups = np.asarray(groups)
    if len(set(y.tolist())) < 2:
        raise ValueError("every example has the same outcome: nothing to predict")
    k = min(folds, len(set(groups.tolist())))
    if k < 2:
        raise ValueError("grouped cross-validation needs at least two groups")
    x = np.where(np.isfinite(x), x, np.nan)
    fill = np.nanmean(x, 0)
    x = np.where(np.isnan(x), np.where(np.isnan(fill), 0.0, fill), x)
    score = np.full(len(y), np.nan)
    coefs = []
    for train, test in GroupKFold(n_splits=k).split(x, y, groups):
        if len(set(y[train].tolist())) < 2:
            continue
        model = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=2000))
        model.fit(x[train], y[train])
        score[test] = model.decision_function(x[test])
        coefs.append(model[-1].coef_[0])
    ok = np.isfinite(score)
    auc = float(roc_auc_score(y[ok], score[ok]))
    rng = np.random.default_rng(seed)
    idx = np.flatnonzero(ok)
    boot = []
    for _ in range(resamples):
        draw = rng.choice(idx, size=idx.size)
        if y[draw].min() != y[draw].max():
            boot.append(roc_auc_score(y[draw], score[draw]))
    # NaN where too few resamples hold both outcomes to give an interval
    low, high = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2]) if len(boot) >= 0.5 * resamples else (np.nan,) * 2
    return {
        "auc": auc,
        "ci": [float(low), float(high)],
        "level": level,
        "examples": int(ok.sum()),
        "positives": int(y[ok].sum()),
        "folds": k,
        "coef": np.mean(coefs, 0) if coefs else np.zeros(x.shape[1]),
    }


def predicts_correct(
    stats: np.ndarray,
    lengths: np.ndarray,
    right: np.ndarray,
    groups: np.ndarray,
    stat_names: list[str],
    *,
    top: int = 8,
    **kw,
) -> dict:
    """``stats`` [examples, layers, heads, statistics], ``lengths`` [examples] (tokens), ``right`` [examples]
    (0/1), ``groups`` [examples] -> the AUC of the statistics, of the length alone and of both
    (:func:`grouped_auc`), and the ``top`` statistics (layer, head, name, coefficient) that carry the first."""
    n, _, heads, k = stats.shape
    flat = stats.reshape(n, -1)
    keep = np.isfinite(flat).mean(0) >= 0.5  # a statistic defined on at least half of the examples
    length = np.log(np.asarray(lengths, np.float64))[:, None]
    out = {
        "stats": grouped_auc(flat[:, keep], right, groups, **kw),
        "length": grouped_auc(length, right, groups, **kw),
        "stats_and_length": grouped_auc(np.concatenate([flat[:, keep], length], 1), right, groups, **kw),
        "features": int(keep.sum()),
        "rate": float(np.mean(right)),
    }
    coef = np.zeros(flat.shape[1])
    coef[keep] = out["stats"]["coef"]
    order = np.argsort(-np.abs(coef), kind="stable")[:top]
    out["carried_by"] = [
        {
            "layer": int(i // (heads * k)),
            "head": int(i // k % heads),
            "stat": stat_names[i % k],
            "coef": float(coef[i]),
        }
        for i in order
    ]
    for part in ("stats", "length", "stats_and_length"):
        out[part].pop("coef")
    return out
