"""Change told apart from training noise (issue 46): what fine-tuning changed in each head, measured against what
another training seed changes.

A fine-tune's change of a head (base model against fine-tune, per example, :mod:`rapids_attn.compare.pairwise`'s
map distances) mixes what the task taught with what any run of training moves: the seed draws the new head's
weights, the batches' order and dropout. With several fine-tunes of one job (``finetune.seed`` and
``finetune.control_seeds``: same data, same schedule, other seeds) the second part is measurable as the
seed-to-seed change, fine-tune against fine-tune over the same examples. Per head and per layer:

- **change**: the mean over fine-tunes and examples of base-vs-fine-tune distance;
- **floor**: the mean over pairs of fine-tunes and examples of fine-tune-vs-fine-tune distance;
- **excess**: change minus floor, with a percentile interval from a bootstrap that resamples the examples, the
  fine-tunes behind the change and the pairs behind the floor together (a two-level bootstrap: questions and
  seeds), and a one-sided p-value (the share of resampled excesses at or below 0);
- **changed**: the heads whose excess is above 0 with the false-discovery rate across heads held at
  ``compare.fdr`` (Benjamini-Hochberg over every head's p-value).

The distances are Jensen-Shannon divergence (nats) and one minus Kovaleva et al.'s cosine, both 0 for the same map.
With a control fine-tune on shuffled labels (``finetune.shuffled_labels``) each head's change is also set beside
the control's (training without the task), with the same bootstrap over examples and fine-tunes.

The seed level of the interval is as coarse as the seeds are few: three fine-tunes give three changes and three
pairs to resample, so the interval is only a rough guide to what a fourth seed would do; more seeds make it honest.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: the distances the floor is measured in: map measure -> how a per-example value becomes a distance
DISTANCES = {"jsd": lambda v: v, "cosine": lambda v: 1.0 - v}
#: p-values of the bootstrap are multiples of 1 / (resamples + 1): at least this many resamples per head and unit
#: of the FDR, so the smallest p-value can pass Benjamini-Hochberg's first step
RESAMPLES_PER_TEST = 20
CHUNK = 2000


def floor_pairs(base: str, tunes: list[str], control: str | None = None) -> list[tuple[str, str]]:
    """Every pair of models the floor needs, as (a, b) labels: the base with each fine-tune, each two fine-tunes,
    the base with the shuffled-label control."""
    pairs = [(base, t) for t in tunes]
    pairs += [(a, b) for i, a in enumerate(tunes) for b in tunes[i + 1 :]]
    if control is not None:
        pairs.append((base, control))
    return pairs


def benjamini_hochberg(p: np.ndarray, q: float) -> tuple[np.ndarray, np.ndarray]:
    """(rejected, adjusted p-values) of Benjamini and Hochberg's step-up procedure at false-discovery rate ``q``,
    over every finite value of ``p`` (any shape; NaN stays NaN and is never rejected)."""
    p = np.asarray(p, dtype=np.float64)
    flat = p.ravel()
    ok = np.flatnonzero(np.isfinite(flat))
    adj = np.full(flat.shape, np.nan)
    rejected = np.zeros(flat.shape, dtype=bool)
    m = ok.size
    if m:
        order = ok[np.argsort(flat[ok], kind="stable")]
        ranked = flat[order] * m / np.arange(1, m + 1)
        adj[order] = np.minimum(np.minimum.accumulate(ranked[::-1])[::-1], 1.0)
        below = np.flatnonzero(flat[order] <= q * np.arange(1, m + 1) / m)
        if below.size:
            rejected[order[: below[-1] + 1]] = True
    return rejected.reshape(p.shape), adj.reshape(p.shape)


def _weights(rng, size: int, draws: int, units: int) -> np.ndarray:
    """[draws, units] resampling weights: each row the counts of ``size`` draws with replacement, over ``size``."""
    idx = rng.integers(0, units, size=(draws, size)) + units * np.arange(draws)[:, None]
    return np.bincount(idx.ravel(), minlength=draws * units).reshape(draws, units) / size


@dataclass
class Bootstrapped:
    """Each unit's (head's or layer's) change, floor and excess: the point estimates, the resampled excesses'
    percentile interval and one-sided p-value."""

    change: np.ndarray  # [units, 3]: mean, low, high
    floor: np.ndarray
    excess: np.ndarray
    p: np.ndarray  # [units]
    resamples: int


def bootstrap_excess(change: np.ndarray, floor: np.ndarray, level: float, resamples: int, seed: int) -> Bootstrapped:
    """``change`` [fine-tunes, examples, units] and ``floor`` [pairs, examples, units] (distances per example) ->
    each unit's change, floor and excess (change minus floor) with percentile intervals, and the one-sided p-value
    of excess > 0, from one bootstrap that resamples the examples (shared by both terms: the same questions),
    the fine-tunes and the pairs."""
    change, floor = np.asarray(change, np.float64), np.asarray(floor, np.float64)
    s, n, _ = change.shape
    pcount = floor.shape[0]
    rng = np.random.default_rng(seed)
    got_c, got_f = [], []
    for start in range(0, resamples, CHUNK):
        r = min(CHUNK, resamples - start)
        ex = _weights(rng, n, r, n)  # [r, n]
        per_tune = np.einsum("rn,snk->rsk", ex, change)
        per_pair = np.einsum("rn,pnk->rpk", ex, floor)
        got_c.append(np.einsum("rs,rsk->rk", _weights(rng, s, r, s), per_tune))
        got_f.append(np.einsum("rp,rpk->rk", _weights(rng, pcount, r, pcount), per_pair))
    bc, bf = np.concatenate(got_c), np.concatenate(got_f)
    lo, hi = (1 - level) / 2, (1 + level) / 2

    def bounds(point, boot):
        q = np.quantile(boot, [lo, hi], axis=0)
        return np.stack([point, q[0], q[1]], -1)

    c, f = change.mean((0, 1)), floor.mean((0, 1))
    excess = bc - bf
    p = (1.0 + (excess <= 0).sum(0)) / (resamples + 1.0)
    return Bootstrapped(bounds(c, bc), bounds(f, bf), bounds(c - f, excess), p, resamples)


def _rank_agreement(per_tune: np.ndarray, top: int = 10) -> dict:
    """How alike the fine-tunes rank the heads by change: the mean Spearman correlation over pairs of fine-tunes,
    and the mean share of their top-``top`` heads two fine-tunes have in common."""
    from scipy.stats import spearmanr

    s = per_tune.shape[0]
    rho, shared = [], []
    for i in range(s):
        for j in range(i + 1, s):
            rho.append(float(spearmanr(per_tune[i], per_tune[j]).statistic))
            a = set(np.argsort(-per_tune[i], kind="stable")[:top].tolist())
            b = set(np.argsort(-per_tune[j], kind="stable")[:top].tolist())
            shared.append(len(a & b) / top)
    return {
        "spearman": float(np.mean(rho)) if rho else None,
        "top_shared": float(np.mean(shared)) if shared else None,
        "top": top,
    }


def noise_floor(
    distances: dict[tuple[str, str], np.ndarray],
    base: str,
    tunes: list[str],
    control: str | None = None,
    *,
    level: float = 0.95,
    fdr: float = 0.05,
    resamples: int = 1000,
    seed: int = 0,
    measure: str = "jsd",
) -> dict:
    """The floor analysis of one distance ``measure``. ``distances`` maps each pair of :func:`floor_pairs` (either
    order) to its per-example distances [examples, layers, heads]. Returns the summary: per layer and per head the
    change, floor and excess with intervals, p-values, Benjamini-Hochberg adjusted p-values and the heads called
    changed, how alike the fine-tunes rank heads, and against the control where there is one."""
    if len(tunes) < 2:
        raise ValueError("a floor needs two fine-tunes or more (finetune.control_seeds)")

    def get(a, b):
        return distances[(a, b)] if (a, b) in distances else distances[(b, a)]

    change = np.stack([get(base, t) for t in tunes])  # [S, n, L, H]
    pairs = [(a, b) for i, a in enumerate(tunes) for b in tunes[i + 1 :]]
    floor = np.stack([get(a, b) for a, b in pairs])
    s, n, layers, heads = change.shape
    units = layers * heads
    reps = max(resamples, int(np.ceil(RESAMPLES_PER_TEST * units / fdr)))
    h = bootstrap_excess(change.reshape(s, n, units), floor.reshape(len(pairs), n, units), level, reps, seed)
    lay = bootstrap_excess(change.mean(-1), floor.mean(-1), level, max(resamples, reps // heads), seed)
    called, adjusted = benjamini_hochberg(h.p, fdr)
    per_tune = change.mean(1).reshape(s, units)
    out = {
        "measure": measure,
        "fine_tunes": list(tunes),
        "pairs": [list(p) for p in pairs],
        "examples": int(n),
        "level": level,
        "fdr": fdr,
        "resamples": int(reps),
        "layers": [
            {
                "layer": li,
                "change": lay.change[li].tolist(),
                "floor": lay.floor[li].tolist(),
                "excess": lay.excess[li].tolist(),
                "p": float(lay.p[li]),
            }
            for li in range(layers)
        ],
        "heads": {
            "change": h.change.reshape(layers, heads, 3).tolist(),
            "floor": h.floor.reshape(layers, heads, 3).tolist(),
            "excess": h.excess.reshape(layers, heads, 3).tolist(),
            "p": h.p.reshape(layers, heads).tolist(),
            "p_adjusted": adjusted.reshape(layers, heads).tolist(),
            "changed": called.reshape(layers, heads).tolist(),
        },
        "n_changed": int(called.sum()),
        "n_heads": int(units),
        # the heads whose change the floor explains: excess interval reaching 0 or below
        "n_within_floor": int((h.excess[:, 1] <= 0).sum()),
        "changed": sorted(
            (
                {
                    "layer": int(k // heads),
                    "head": int(k % heads),
                    "change": h.change[k].tolist(),
                    "floor": h.floor[k].tolist(),
                    "excess": h.excess[k].tolist(),
                    "p_adjusted": float(adjusted[k]),
                }
                for k in np.flatnonzero(called)
            ),
            key=lambda r: -r["excess"][0],
        ),
        "agreement": _rank_agreement(per_tune),
        "per_fine_tune": [
            {"label": t, "change": float(per_tune[i].mean()), "layers": change[i].mean((0, 2)).tolist()}
            for i, t in enumerate(tunes)
        ],
    }
    if control is not None:
        ctrl = get(base, control)[None]  # [1, n, L, H]: one control fine-tune
        # the fine-tunes' change against the control's: the same bootstrap, the control as its one "pair"
        c = bootstrap_excess(change.reshape(s, n, units), ctrl.reshape(1, n, units), level, reps, seed)
        task, task_adj = benjamini_hochberg(c.p, fdr)
        out["control"] = {
            "label": control,
            "change": c.floor.reshape(layers, heads, 3).tolist(),
            "excess": c.excess.reshape(layers, heads, 3).tolist(),
            "p_adjusted": task_adj.reshape(layers, heads).tolist(),
            # changed beyond the seed floor and beyond training on shuffled labels
            "task_specific": (task & called).reshape(layers, heads).tolist(),
            "n_task_specific": int((task & called).sum()),
            "layers": ctrl[0].mean((0, 2)).tolist(),
        }
    return out


def causal_check(
    floor: dict, cost: np.ndarray, cost_ci: np.ndarray | None = None, permutations: int = 10000, seed: int = 0
) -> dict:
    """Whether the heads fine-tuning changed beyond the floor are the heads that matter to the fine-tune: each
    head's single-ablation cost (the heads stage, on its headline measure) against its excess over the floor. The
    Spearman correlation of excess and cost over the heads, the mean cost of the heads called changed against the
    others with a permutation p-value (the changed set's labels shuffled among the heads), and how many changed
    heads cost beyond chance on their own (the cost's interval above 0)."""
    from scipy.stats import spearmanr

    excess = np.asarray(floor["heads"]["excess"], np.float64)[..., 0].ravel()
    changed = np.asarray(floor["heads"]["changed"], bool).ravel()
    cost = np.asarray(cost, np.float64).ravel()
    ok = np.isfinite(cost) & np.isfinite(excess)
    out: dict = {"heads": int(ok.sum()), "changed": int((changed & ok).sum())}
    if ok.sum() < 3:
        return out
    out["spearman"] = float(spearmanr(excess[ok], cost[ok]).statistic)
    c, ch = cost[ok], changed[ok]
    if 0 < ch.sum() < ch.size:
        diff = float(c[ch].mean() - c[~ch].mean())
        rng = np.random.default_rng(seed)
        k = int(ch.sum())
        perm = np.argsort(rng.random((permutations, c.size)), axis=1)[:, :k]
        null = c[perm].mean(1) - (c.sum() - c[perm].sum(1)) / (c.size - k)
        out.update(
            mean_cost_changed=float(c[ch].mean()),
            mean_cost_others=float(c[~ch].mean()),
            difference=diff,
            p=float((1 + (null >= diff).sum()) / (permutations + 1)),
            permutations=permutations,
        )
    if cost_ci is not None:
        low = np.asarray(cost_ci, np.float64)[..., 0].ravel()
        out["changed_costly"] = int((changed & ok & (low > 0)).sum())
        out["others_costly"] = int((~changed & ok & (low > 0)).sum())
    return out
