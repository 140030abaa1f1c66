"""Print the heads stage's findings of a finished run as markdown tables (the numbers behind
docs/findings-minilm.md, "Which heads retrieval needs").

    python -m tools.heads_findings runs/findings_minilm

Everything is recomputed from the store's per-example scores with this version's code
(:func:`rapids_attn.heads.summary.resummarise`), so a run written by an earlier version reads the same
way the report would now; cluster membership (each head's dominant cluster) comes from summary.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import zarr

from rapids_attn.heads.metrics import mean_ci
from rapids_attn.heads.summary import resummarise


def _f(x, d=3):
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.{d}f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    args = ap.parse_args(argv)
    g = zarr.open_group(str(args.run_dir / "store.zarr"), mode="r")
    info = resummarise(g, dict(g.attrs["heads"]))
    summary = json.loads((args.run_dir / "summary.json").read_text())
    scores = g["heads_scores"]
    cols = list(scores.attrs["columns"])
    base = np.asarray(scores[0], np.float64)
    print(f"## {info['metric']} on {info['examples']} examples (ablation: {info['ablation']})\n")
    print("| column | whole model | 95% CI |\n|---|---|---|")
    for j, c in enumerate(cols):
        m, lo, hi = mean_ci(base[:, j])
        print(f"| {c} | {_f(m)} | [{_f(lo)}, {_f(hi)}] |")
    print(f"\nheadline: {info['headline']}; cost = score lost (positive: the task needs the head)\n")
    print("| most costly single heads | cost | 95% CI |\n|---|---|---|")
    for r in info.get("most_costly", []):
        print(f"| L{r['layer']}-H{r['head']} | {_f(r['cost'])} | [{_f(r['ci'][0])}, {_f(r['ci'][1])}] |")
    sig = info.get("significant") or {}
    print(f"\nsingle heads whose cost interval excludes 0: {sig.get('worse')} worse, {sig.get('better')} better\n")
    print("| set | heads | cost | 95% CI | score |\n|---|---|---|---|---|")
    members = {k: v.get("heads", []) for k, v in (summary.get("head_importance", {}).get("by_cluster") or {}).items()}
    for name, s in info.get("sets", {}).items():
        kind, _, rest = name.partition(":")
        n = 12 if kind == "layer" else len((info.get("clusters") or {}).get(rest, []))
        print(f"| {name} | {n} | {_f(s['cost'])} | [{_f(s['ci'][0])}, {_f(s['ci'][1])}] | {_f(s['score'])} |")
    agree = info.get("importance_vs_ablation")
    if agree:
        print(
            f"\nimportance vs ablation cost ({agree['heads']} heads): Spearman {_f(agree['raw']['spearman'])} raw, "
            f"{_f(agree['normalised']['spearman'])} normalised; Kendall {_f(agree['raw']['kendall'])} raw"
        )
    for col, curves in (info.get("pruning_columns") or {}).items():
        print(f"\n### pruning, {col} (removable: heads removed before the score first drops > 0.01)\n")
        orders = list(curves)
        removed = curves[orders[0]]["removed"]
        print("| removed | " + " | ".join(orders) + " |\n|---|" + "---|" * len(orders))
        for k, r in enumerate(removed):
            print(f"| {r} | " + " | ".join(_f(curves[o]["score"][k]) for o in orders) + " |")
        print("| removable | " + " | ".join(str(curves[o]["removable"]) for o in orders) + " |")
    probing = info.get("probing") or {}
    if probing.get("tasks"):
        print(
            "\n| probe task | majority | best head | its accuracy | top-8 heads (nested) | last layer |\n|---|---|---|---|---|---|"
        )
        for t, r in probing["tasks"].items():
            b, bh = r["best_head"], r["best_heads"]
            print(
                f"| {t} | {_f(r['majority'])} | L{b['layer']}-H{b['head']} | {_f(b['accuracy'])} | "
                f"{_f(bh.get('best_heads'))} | {_f(bh.get('reference'))} |"
            )
    if members:
        print("\n| cluster | its heads | mean importance |\n|---|---|---|")
        imp = np.asarray(g["head_importance"][:], np.float64)
        for c, heads in members.items():
            mi = float(np.mean([imp[tuple(h)] for h in heads])) if heads else float("nan")
            print(f"| {c} | {len(heads)} | {_f(mi)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
