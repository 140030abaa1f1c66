"""``python tools/atlas_finding.py ATLAS --base MODEL [--out FILE]``: how far fine-tuning moved each head of a
campaign's atlas, read against fine-tunes of other seeds (docs/campaigns.md, "A finding").

The atlas must have been merged with a fine-tune as ``--reference`` and hold the base model and at least one
fine-tune of another seed (the controls: every other model whose label is not ``--base``). For each model it
prints the share of heads matched to their own (layer, head), the median and mean matched profile distance to the
reference, and the median margin; then how many heads moved farther from base to fine-tune than under every seed
control, the heads that moved most beyond the controls, the class counts per model, and each run's layer RSA
diagonal: on each dataset of the campaign. With two datasets (two samples of the data) it says how far the finding
replicates (heads beyond every control in both, the rank correlation of each head's excess), and, from the
profiles at the same (layer, head), how far another data sample moves one model's heads (the data floor) against
how far another seed or the fine-tuning moves them. ``--out`` keeps the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def _finding_on(m: pd.DataFrame, heads: pd.DataFrame, layers: dict, base: str) -> dict:
    """The finding on one dataset's runs: ``m`` its matches, ``heads`` its heads, ``layers`` its layers.json."""
    m = m.copy()
    m["identity"] = (m["layer"] == m["reference_layer"]) & (m["head"] == m["reference_head"])
    per_model = {
        model: {
            "heads": len(g),
            "matched_to_itself": round(float(g["identity"].mean()), 3),
            "median_distance": round(float(g["distance"].median()), 3),
            "mean_distance": round(float(g["distance"].mean()), 3),
            "median_margin": round(float(g["margin"].median()), 3),
        }
        for model, g in m.groupby("model")
    }
    dist = m.pivot_table(index=["layer", "head"], columns="model", values="distance")
    controls = [c for c in dist.columns if c != base]
    if not controls:
        raise SystemExit("the atlas holds no control (a fine-tune of another seed) besides the base model")
    floor = dist[controls].max(axis=1)
    excess = (dist[base] - floor).sort_values(ascending=False)
    classes = heads.groupby("model")["class"].value_counts().unstack(fill_value=0)
    return {
        "controls": controls,
        "per_model": per_model,
        "heads_beyond_every_control": int((excess > 0).sum()),
        "heads": len(excess),
        "beyond": sorted(f"L{int(i[0])}H{int(i[1])}" for i, v in excess.items() if v > 0),
        "excess": {f"L{int(i[0])}H{int(i[1])}": round(float(v), 3) for i, v in excess.items()},
        "most_moved": [
            {"layer": int(i[0]), "head": int(i[1]), "excess": round(float(v), 3)} for i, v in excess.head(8).items()
        ],
        "classes": {m_: {c: int(n) for c, n in row.items()} for m_, row in classes.iterrows()},
        "layer_rsa_diagonal": {
            k: np.round(np.diag(np.array(v["rsa"])), 3).tolist() for k, v in layers.items() if v.get("rsa")
        },
    }


def _same_position(heads: pd.DataFrame, base: str, reference: str) -> dict:
    """Distances between head profiles at the same (layer, head), every feature z-scored over all rows of the
    atlas (all models, all datasets): the reference model on one data sample against another (the data floor),
    each control and the base model against the reference on the same sample. Medians over heads."""
    feats = [c for c in heads.columns if c.startswith(("stats:", "detectors:", "profile:"))]
    z = heads[feats].astype(float)
    sd = z.std(ddof=0).replace(0, 1)
    z = ((z - z.mean()) / sd).fillna(0.0)
    key = heads.set_index(["model", "dataset", "layer", "head"]).index
    z.index = key
    datasets = sorted(heads["dataset"].unique())
    models = sorted(heads["model"].unique())

    def d(a, b):
        x, y = z.xs(a, level=(0, 1)), z.xs(b, level=(0, 1))
        return np.sqrt(((x - y.loc[x.index]) ** 2).sum(axis=1))

    out: dict = {"features": len(feats), "across_samples": {}, "to_reference": {}}
    for model in models:
        for i, da in enumerate(datasets):
            for db in datasets[i + 1 :]:
                out["across_samples"][f"{model}: {da} vs {db}"] = round(float(d((model, da), (model, db)).median()), 3)
    for ds in datasets:
        for model in models:
            if model != reference:
                out["to_reference"][f"{model} ({ds})"] = round(float(d((model, ds), (reference, ds)).median()), 3)
    return out


def finding(atlas: Path, base: str) -> dict:
    m = pd.read_parquet(atlas / "matches.parquet")
    m["model"] = m["run"].str.split("/").str[0]
    m["dataset"] = m["run"].str.split("/").str[1]
    if base not in set(m["model"]):
        raise SystemExit(f"--base: {base!r} is not a matched model of {atlas} ({sorted(set(m['model']))})")
    heads = pd.read_parquet(atlas / "heads.parquet")
    layers = json.loads((atlas / "layers.json").read_text())
    reference = json.loads((atlas / "atlas.json").read_text())["reference"]
    per_dataset = {
        ds: _finding_on(
            m[m["dataset"] == ds],
            heads[heads["dataset"] == ds],
            {k: v for k, v in layers.items() if k.endswith("/" + ds)},
            base,
        )
        for ds in sorted(m["dataset"].unique())
    }
    out = {"atlas": str(atlas), "base": base, "reference": reference, "datasets": per_dataset}
    if len(per_dataset) >= 2:
        a, b = list(per_dataset.values())[:2]
        ea, eb = pd.Series(a["excess"]), pd.Series(b["excess"])
        both, either = set(a["beyond"]) & set(b["beyond"]), set(a["beyond"]) | set(b["beyond"])
        out["replication"] = {
            "datasets": list(per_dataset)[:2],
            "beyond_in_both": len(both),
            "beyond_in_either": len(either),
            "excess_spearman": round(float(ea.corr(eb.loc[ea.index], method="spearman")), 3),
            "top8_shared": len(
                {f"L{h['layer']}H{h['head']}" for h in a["most_moved"]}
                & {f"L{h['layer']}H{h['head']}" for h in b["most_moved"]}
            ),
        }
    out["same_position"] = _same_position(heads, base, reference)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python tools/atlas_finding.py", description=__doc__.splitlines()[0])
    p.add_argument("atlas", type=Path)
    p.add_argument("--base", required=True, help="the base model's label")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    f = finding(args.atlas, args.base)
    for ds, x in f["datasets"].items():
        print(f"== {ds}: matched to {f['reference']}/{ds}")
        print(pd.DataFrame(x["per_model"]).T.to_string())
        print(
            f"heads moved farther base -> reference than under every control: {x['heads_beyond_every_control']} of {x['heads']}"
        )
        print(
            "most moved beyond the controls:",
            ", ".join(f"L{h['layer']}H{h['head']} +{h['excess']}" for h in x["most_moved"]),
        )
        print(pd.DataFrame(x["classes"]).T.fillna(0).astype(int).to_string())
        for run, diag in x["layer_rsa_diagonal"].items():
            print(f"{run}: layer RSA with the reference {diag}")
    if "replication" in f:
        print("replication across the two samples:", f["replication"])
    print("same-position median distances (all rows z-scored):", json.dumps(f["same_position"], indent=1))
    if args.out:
        args.out.write_text(json.dumps(f, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
