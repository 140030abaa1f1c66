"""``python -m benchmarks.campaign_merge [--models 100] [--examples 100] [--out FILE]`` (from the repository root):
the time and peak memory of a campaign's merge (issue 50) over planted run folders standing in for many models.

Each planted run has a store with the arrays the merge reads (statistics, detectors, profile, example ids; random
values in range), a head_classes.json and a finished task record, at one of three shapes in turn: 12 x 12 (144
heads, BERT-base), 24 x 16 (384) and 32 x 32 (1,024, an 8B decoder). The merge reads every run once, matches each
to the reference (the first model: within layers where the shape is the same, else across all heads) and compares
their layers (RSA over the shared examples), and clusters 2,000 maps of each run together (their 64-d embeddings). Prints a table (models, heads, seconds, seconds per run, peak memory)
and writes the raw numbers as JSON to ``--out``. Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import yaml

SHAPES = ((12, 12), (24, 16), (32, 32))


def plant(root: Path, models: int, examples: int) -> Path:
    from benchmarks.kv_heads import plant as plant_store
    from rapids_attn.campaign.plan import load_campaign
    from rapids_attn.campaign.tasks import write_record
    from rapids_attn.store import schema as S

    job = root / "job.yaml"
    job.write_text(yaml.safe_dump({"name": "x", "data": {"path": "x.jsonl"}, "model": {"name": "x"}}))
    doc = {
        "name": "bench",
        "job": "job.yaml",
        "models": [{"name": f"m{i}", "family": f"f{i % 5}"} for i in range(models)],
        "output": {"dir": "out"},
    }
    path = root / "campaign.yaml"
    path.write_text(yaml.safe_dump(doc))
    c = load_campaign(path, validate_jobs=False)
    for r in c.runs:
        nl, nh = SHAPES[r.index % len(SHAPES)]
        r.run_dir.mkdir(parents=True)
        g = plant_store(r.run_dir / "store.zarr", examples, nl, nh, (300, 600), 8, seed=r.index)
        g.create_array(S.EXAMPLE_ID, data=np.array([f"e{i}" for i in range(examples)]))
        rng = np.random.default_rng(r.index)
        feats = rng.normal(size=(examples, nl, nh, 64)).astype(np.float16)
        g.create_array(S.FEATURES, data=feats, chunks=(64, nl, nh, 64))
        g.attrs[S.Attr.JOB] = {"embed": {"name": "pattern-cnn"}}
        heads = [
            {"layer": i, "head": j, "class": "other", "score": 0.5, "interval": [0.4, 0.6], "same_class": 0.9}
            for i in range(nl)
            for j in range(nh)
        ]
        (r.run_dir / "head_classes.json").write_text(json.dumps({"heads": heads}))
        (r.run_dir / "summary.json").write_text("{}")
        write_record(c, r, {"index": r.index, "spec": r.spec_hash, "rc": 0, "seconds": 1.0})
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.campaign_merge", description=__doc__.splitlines()[0])
    p.add_argument("--models", type=int, default=100)
    p.add_argument("--examples", type=int, default=100)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*does not have a Zarr V3 specification")
    from benchmarks import machine_info
    from rapids_attn.campaign.merge import merge
    from rapids_attn.campaign.plan import load_campaign

    with tempfile.TemporaryDirectory(prefix="rapids-attn-bench-merge-") as tmp:
        t0 = time.perf_counter()
        path = plant(Path(tmp), args.models, args.examples)
        planted = time.perf_counter() - t0
        c = load_campaign(path, validate_jobs=False)
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        doc = merge(c, say=lambda s: None)
        seconds = time.perf_counter() - t0
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    row = {
        "models": args.models,
        "examples": args.examples,
        "heads": doc["heads"],
        "seconds": round(seconds, 1),
        "seconds_per_run": round(seconds / args.models, 2),
        "peak_rss_mb": round(peak_mb),
        "peak_rss_before_mb": round(rss0 / 1024),
        "planting_seconds": round(planted, 1),
    }
    print("| models | examples each | heads | merge s | s per run | peak RSS MiB |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {row['models']} | {row['examples']} | {row['heads']:,} | {row['seconds']} | {row['seconds_per_run']} | "
        f"{row['peak_rss_mb']} |"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"machine": machine_info(), "rows": [row]}, indent=1) + "\n")
        print(f"raw results: {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
