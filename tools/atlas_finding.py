"""``python tools/atlas_finding.py ATLAS --base MODEL [--out FILE]``: how far fine-tuning moved each head of a
campaign's atlas, read against fine-tunes of other seeds (docs/campaigns.md, "A finding").

The atlas must have been merged with a fine-tune as ``--reference`` and hold the base model and at least one
fine-tune of another seed (the controls: every other model whose label is not ``--base``). For each model it
prints the share of heads matched to their own (layer, head), the median and mean matched profile distance to the
reference, and the median margin; then how many heads moved farther from base to fine-tune than under every seed
control, the heads that moved most beyond the controls, the class counts per model, and each run's layer RSA
diagonal. ``--out`` keeps the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def finding(atlas: Path, base: str) -> dict:
    m = pd.read_parquet(atlas / "matches.parquet")
    m["model"] = m["run"].str.split("/").str[0]
    if base not in set(m["model"]):
        raise SystemExit(f"--base: {base!r} is not a matched model of {atlas} ({sorted(set(m['model']))})")
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
    heads = pd.read_parquet(atlas / "heads.parquet")
    classes = heads.groupby("model")["class"].value_counts().unstack(fill_value=0)
    layers = json.loads((atlas / "layers.json").read_text())
    return {
        "atlas": str(atlas),
        "base": base,
        "controls": controls,
        "per_model": per_model,
        "heads_beyond_every_control": int((excess > 0).sum()),
        "heads": len(excess),
        "most_moved": [
            {"layer": int(i[0]), "head": int(i[1]), "excess": round(float(v), 3)} for i, v in excess.head(8).items()
        ],
        "classes": {m_: {c: int(n) for c, n in row.items()} for m_, row in classes.iterrows()},
        "layer_rsa_diagonal": {
            k: np.round(np.diag(np.array(v["rsa"])), 3).tolist() for k, v in layers.items() if v.get("rsa")
        },
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python tools/atlas_finding.py", description=__doc__.splitlines()[0])
    p.add_argument("atlas", type=Path)
    p.add_argument("--base", required=True, help="the base model's label")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    f = finding(args.atlas, args.base)
    print(pd.DataFrame(f["per_model"]).T.to_string())
    print(
        f"heads moved farther base -> reference than under every control: {f['heads_beyond_every_control']} of {f['heads']}"
    )
    print(
        "most moved beyond the controls:",
        ", ".join(f"L{h['layer']}H{h['head']} +{h['excess']}" for h in f["most_moved"]),
    )
    print(pd.DataFrame(f["classes"]).T.fillna(0).astype(int).to_string())
    for run, diag in f["layer_rsa_diagonal"].items():
        print(f"{run}: layer RSA with the reference {diag}")
    if args.out:
        args.out.write_text(json.dumps(f, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
