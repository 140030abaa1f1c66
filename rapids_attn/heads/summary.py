"""What the heads stage reports: ablation effects with intervals, pruning curves, probing results.

Everything here works on the per-example scores the stage stores (``heads_scores``), so the same
numbers can be recomputed from the store (``summarise_ablation(names, scores, ...)``).

- An ablation's **effect** is the mean over examples of (score with the heads ablated - score of the whole
  model), paired per example, with a 95% t interval over examples; its **cost** is the effect signed so
  that positive is worse (``-effect`` where higher scores are better, as recall or F1; ``effect`` for a loss).
- A **pruning curve** is the headline score (mean over examples) after removing 0, s, 2s, ... heads in an
  order; random orders are averaged (their min and max kept). ``removable`` is the largest number of heads
  removed before the curve first falls more than ``tolerance`` below the whole model (1 point of a score in
  [0, 1]; 0.01 nats of a loss).
"""

from __future__ import annotations

import numpy as np

from rapids_attn.heads.metrics import mean_ci

#: how far below the whole model a pruning curve may go and still count heads as removable
TOLERANCE = 0.01


def summarise_ablation(
    names: list[str], scores: dict[str, np.ndarray], headline: str, n_layers: int, n_heads: int, higher_is_better: bool
) -> dict:
    """names [C] (``base`` first), scores {column: [C, N]} -> the ablation part of the stage's result."""
    y = scores[headline]
    base = y[0]
    sign = -1.0 if higher_is_better else 1.0
    out: dict = {
        "headline": headline,
        "higher_is_better": bool(higher_is_better),
        "base": float(np.nanmean(base)),
        "base_columns": {c: float(np.nanmean(v[0])) for c, v in scores.items()},
    }
    effect = np.full((n_layers, n_heads), np.nan)
    ci = np.full((n_layers, n_heads, 2), np.nan)
    sets = {}
    for i, name in enumerate(names[1:], start=1):
        m, lo, hi = mean_ci(y[i] - base)
        kind, _, rest = name.partition(":")
        if kind == "head":
            layer, head = (int(v) for v in rest.split(":"))
            effect[layer, head], ci[layer, head] = m, (lo, hi)
        else:
            cost_ci = sorted((sign * lo, sign * hi))  # the cost's interval, as for single heads
            sets[name] = {"effect": m, "cost": sign * m, "ci": cost_ci, "score": float(np.nanmean(y[i]))}
    if np.isfinite(effect).any():
        cost = sign * effect
        out["effect"], out["effect_ci"], out["cost"] = effect, ci, cost
        flat = [(float(cost[lh]), lh) for lh in np.ndindex(n_layers, n_heads) if np.isfinite(cost[lh])]
        flat.sort(key=lambda t: -t[0])
        # the cost's interval
        lo, hi = np.minimum(sign * ci[..., 0], sign * ci[..., 1]), np.maximum(sign * ci[..., 0], sign * ci[..., 1])
        out["cost_ci"] = np.stack([lo, hi], -1)
        out["most_costly"] = [
            {"layer": int(lh[0]), "head": int(lh[1]), "cost": c, "ci": [float(lo[lh]), float(hi[lh])]}
            for c, lh in flat[:10]
        ]
        # heads whose removal alone changes the score beyond chance (the cost's interval excludes 0)
        out["significant"] = {"worse": int(np.sum(lo > 0)), "better": int(np.sum(hi < 0))}
    out["sets"] = sets
    return out


def resummarise(g, info: dict) -> dict:
    """The stage's result with its ablation summary, pruning curves (the headline's and every column's) and
    importance-against-ablation agreement recomputed from the store's per-example scores (``heads_scores``)
    and importance arrays by this version's code. The explain stage reads the result this way, so what the
    report says always follows from the stored per-example numbers; ``info`` supplies the metric's direction,
    the sets' members and the probing results, which are kept as they are."""
    arr = g["heads_scores"]
    names, cols = list(arr.attrs["conditions"]), list(arr.attrs["columns"])
    data = np.asarray(arr[:], np.float64)
    scores = {c: data[..., j] for j, c in enumerate(cols)}
    model = dict(g.attrs.get("model") or {})
    n_layers, n_heads = int(model["n_layers"]), int(model["n_heads"])
    hib, headline = bool(info["higher_is_better"]), info["headline"]
    main = [i for i, n in enumerate(names) if not n.startswith("prune:")]
    out = dict(info)
    out.update(
        summarise_ablation(
            [names[i] for i in main], {c: v[main] for c, v in scores.items()}, headline, n_layers, n_heads, hib
        )
    )
    pr = [i for i, n in enumerate(names) if n.startswith("prune:")]
    if pr:
        pr_names, pr_scores = [names[i] for i in pr], {c: v[pr] for c, v in scores.items()}
        out["pruning"] = pruning_curves(pr_names, pr_scores, headline, out["base"], hib)
        out["pruning_columns"] = {
            c: pruning_curves(pr_names, pr_scores, c, out["base_columns"][c], hib) for c in pr_scores
        }
    if "head_importance" in g and out.get("cost") is not None:
        out["importance_vs_ablation"] = rank_agreement(
            out["cost"], g["head_importance_raw"][:], g["head_importance"][:]
        )
    return out


def rank_agreement(cost: np.ndarray, raw: np.ndarray, normalised: np.ndarray) -> dict:
    """How the gradient importance ranks heads against the single-head ablation cost: Spearman's rho and
    Kendall's tau over the heads, for the raw and the per-layer normalised importance."""
    from scipy import stats

    c = np.asarray(cost, np.float64).ravel()
    ok = np.isfinite(c)
    out: dict = {"heads": int(ok.sum())}
    for name, v in (("raw", raw), ("normalised", normalised)):
        v = np.asarray(v, np.float64).ravel()[ok]
        if ok.sum() < 2 or np.ptp(v) == 0 or np.ptp(c[ok]) == 0:  # a constant ranks nothing: undefined
            out[name] = {"spearman": float("nan"), "kendall": float("nan")}
            continue
        out[name] = {
            "spearman": float(stats.spearmanr(v, c[ok]).statistic),
            "kendall": float(stats.kendalltau(v, c[ok]).statistic),
        }
    return out


def pruning_curves(
    names: list[str], scores: dict[str, np.ndarray], headline: str, base: float, higher_is_better: bool
) -> dict:
    """names ``prune:<order>:<removed>`` -> {order: {removed: [...], score: [...], removable: int}}; random
    orders are merged into ``random`` (mean, min, max over orders)."""
    y = scores[headline]
    raw: dict[str, dict[int, float]] = {}
    for i, name in enumerate(names):
        _, order, removed = name.split(":")
        raw.setdefault(order, {})[int(removed)] = float(np.nanmean(y[i]))
    merged: dict[str, dict] = {}
    randoms = [o for o in raw if o.startswith("random")]
    for order, pts in raw.items():
        if order in randoms:
            continue
        xs = sorted(pts)
        merged[order] = {"removed": xs, "score": [pts[x] for x in xs]}
    if randoms:
        xs = sorted(raw[randoms[0]])
        table = np.array([[raw[o][x] for x in xs] for o in randoms])
        merged["random"] = {
            "removed": xs,
            "score": table.mean(0).tolist(),
            "min": table.min(0).tolist(),
            "max": table.max(0).tolist(),
            "orders": len(randoms),
        }
    for curve in merged.values():
        curve["removable"] = removable(curve["removed"], curve["score"], base, higher_is_better)
    return merged


def removable(removed: list[int], score: list[float], base: float, higher_is_better: bool, tol: float = TOLERANCE):
    """The most heads removed before the score first falls more than ``tol`` below ``base``."""
    best = 0
    for r, s in zip(removed, score, strict=True):
        worse = (base - s) if higher_is_better else (s - base)
        if not np.isfinite(s) or worse > tol:
            break
        best = r
    return int(best)


def run_probes(capture: dict, meta: dict, probing, seed: int) -> dict:
    """Head-wise probes for each task the examples support: {"tasks": {task: {...}}, "skipped": {task: why}}.
    ``meta``: per-example ``text``, ``label`` and ``n_tokens`` (:func:`rapids_attn.heads.probe.task_labels`)."""
    from rapids_attn.heads.probe import best_heads_probe, probe_heads, task_labels

    x, hidden = capture["heads"], capture["hidden"]
    out: dict = {"tasks": {}, "skipped": {}, "folds": int(probing.folds)}
    for task in probing.tasks:
        if task == "label" and not any(str(v) for v in meta["label"]):
            out["skipped"][task] = "the examples have no labels (set data.label_field)"
            continue
        labels = task_labels(task, meta, probing.folds)
        if labels is None:
            out["skipped"][task] = (
                f"the examples give fewer than two classes of at least {probing.folds} examples (heads.probing.folds)"
            )
            continue
        y, classes = labels
        try:
            res = probe_heads(x, y, folds=probing.folds, seed=seed)
            acc = np.asarray(res["accuracy"])
            best = best_heads_probe(x, y, hidden, min(probing.top_k, acc.size), acc, folds=probing.folds, seed=seed)
        except ValueError:  # too few examples per class for the folds (scikit-learn's message is its own): go on
            out["skipped"][task] = (
                f"too few examples of each class for {probing.folds}-fold cross-validation and the best-heads probe "
                "inside it (raise heads.examples or lower heads.probing.folds)"
            )
            continue
        top = np.dstack(np.unravel_index(np.argsort(-acc, axis=None)[:5], acc.shape))[0]
        out["tasks"][task] = {
            "classes": list(classes),
            "accuracy": acc,
            "accuracy_std": np.asarray(res["accuracy_std"]),
            "majority": float(res["majority"]),
            "best_head": {"layer": int(top[0][0]), "head": int(top[0][1]), "accuracy": float(acc[tuple(top[0])])},
            "top_heads": [[int(a), int(b)] for a, b in top],
            "best_heads": best,
        }
    return out
