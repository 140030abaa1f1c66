"""How much of each full-resolution statistic the clusters explain: eta squared per stat.

    python -m tools.cluster_eta RUN_DIR [RUN_DIR ...] [--keep-probes]

For every run directory, reads ``maps.parquet`` and prints, per statistic of ``STAT_NAMES``, the
share of its variance between clusters (eta squared = between-cluster sum of squares / total sum of
squares), their mean, and the run's silhouette from ``summary.json``. Probe examples (label
``probe``) are left out unless ``--keep-probes``; DBSCAN/HDBSCAN noise (cluster -1) counts as a
cluster of its own. Used for docs/findings-minilm.md ("Pattern CNN against pooled maps").
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from rapids_attn.extract.signature import STAT_NAMES


def eta_squared(values: np.ndarray, groups: np.ndarray) -> float:
    """Between-group sum of squares over the total sum of squares (NaN values left out)."""
    ok = np.isfinite(values)
    v, g = values[ok], groups[ok]
    total = float(((v - v.mean()) ** 2).sum())
    if total == 0:
        return float("nan")
    frame = pd.DataFrame({"v": v, "g": g}).groupby("g")["v"].agg(["mean", "size"])
    between = float((frame["size"] * (frame["mean"] - v.mean()) ** 2).sum())
    return between / total


def run_table(run_dir: Path, keep_probes: bool = False) -> dict:
    maps = pd.read_parquet(run_dir / "maps.parquet")
    if not keep_probes and "label" in maps:
        maps = maps[maps["label"] != "probe"]
    cl = maps["cluster"].to_numpy()
    etas = {s: eta_squared(maps[s].to_numpy(dtype=np.float64), cl) for s in STAT_NAMES}
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "run": str(run_dir),
        "embedder": summary.get("embedding", {}).get("name", "?"),
        "maps": len(maps),
        "eta": etas,
        "mean": float(np.nanmean(list(etas.values()))),
        "silhouette": summary.get("clusters", {}).get("silhouette"),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.cluster_eta", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--keep-probes", action="store_true")
    args = p.parse_args(argv)
    print("| run | embedder | maps | mean eta^2 | " + " | ".join(STAT_NAMES) + " | silhouette |")
    print("|---" * (len(STAT_NAMES) + 5) + "|")
    for run in args.runs:
        t = run_table(run, args.keep_probes)
        sil = f"{t['silhouette']:.3f}" if isinstance(t["silhouette"], float) else "-"
        cells = " | ".join(f"{t['eta'][s]:.2f}" for s in STAT_NAMES)
        print(f"| {run} | {t['embedder']} | {t['maps']} | {t['mean']:.2f} | {cells} | {sil} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
