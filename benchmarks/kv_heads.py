"""``python -m benchmarks.kv_heads [--out FILE]`` (from the repository root): the time of the head-class exports
over an existing run (issue 49), with no re-extraction: reading the per-example evidence from the store, the
classes, the bootstrap (200 resamples) and split halves, and writing the four formats.

The stores are planted at the shapes of real runs (the store's schema arrays: stats, detectors, profile,
seq_len, groups; random values in range), so the time is the export's alone, whatever model made the maps:

- ``minilm-squad``: MiniLM's 6 x 12 heads over the 6,078 SQuAD questions (``min_length`` 0 so every example
  counts, as an encoder run's would; the exports' model check is given a decoder shape of the same size);
- ``8b-50``: an 8B grouped-query decoder's 32 layers x 32 query heads on 8 key-value heads, 50 long samples
  (the issue's target: classes in at most 60 s on an H100, the forward included; the forward is not measured
  here: it needs the GPU, which this benchmark does not use);
- ``8b-2000``: the same model over 2,000 samples.

Prints a markdown table (seconds per part, best of ``--repeat``) and writes the raw numbers as JSON to ``--out``.
Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

CASES = {
    "minilm-squad": {
        "examples": 6078,
        "layers": 6,
        "heads": 12,
        "kv_heads": 12,
        "length": (120, 384),
        "min_length": 0,
        "groups": 16,
    },
    "8b-50": {
        "examples": 50,
        "layers": 32,
        "heads": 32,
        "kv_heads": 8,
        "length": (2048, 8192),
        "min_length": 256,
        "groups": 50,
    },
    "8b-2000": {
        "examples": 2000,
        "layers": 32,
        "heads": 32,
        "kv_heads": 8,
        "length": (512, 8192),
        "min_length": 256,
        "groups": 40,
    },
}


def plant(path: Path, examples: int, layers: int, heads: int, length, groups: int, seed: int = 0, **_):
    """A store with the arrays the exports read, chunked by 64 examples like an extract run's shards."""
    import zarr

    from rapids_attn.extract.signature import DETECTOR_NAMES, PROFILE_OFFSETS, STAT_NAMES
    from rapids_attn.store import schema as S

    rng = np.random.default_rng(seed)
    g = zarr.open_group(str(path), mode="w")
    e, shape = examples, (examples, layers, heads)
    chunk = (64, layers, heads)
    stats = rng.uniform(0, 1, (*shape, len(STAT_NAMES))).astype(np.float32)
    det = rng.beta(2, 2, (*shape, len(DETECTOR_NAMES))).astype(np.float32)
    det[..., DETECTOR_NAMES.index("retrieval")] *= 0.3
    prof = (rng.dirichlet(np.ones(len(PROFILE_OFFSETS) + 1), shape)[..., :-1] * 0.5).astype(np.float16)
    g.create_array(S.STATS, data=stats, chunks=(*chunk, len(STAT_NAMES)))
    g.create_array(S.DETECTORS, data=det, chunks=(*chunk, len(DETECTOR_NAMES)))
    g.create_array(S.PROFILE, data=prof, chunks=(*chunk, len(PROFILE_OFFSETS)))
    g.create_array(S.STAT, data=np.array(STAT_NAMES))
    g.create_array(S.DETECTOR, data=np.array(DETECTOR_NAMES))
    g.create_array(S.OFFSET, data=np.array(PROFILE_OFFSETS, np.int32))
    g.create_array(S.SEQ_LEN, data=rng.integers(length[0], length[1], e).astype(np.int32))
    g.create_array(S.EXAMPLE_GROUP, data=np.array([f"g{i % groups}" for i in range(e)]))
    g.create_array(S.LAYER, data=np.arange(layers, dtype=np.int32))
    g.create_array(S.HEAD, data=np.arange(heads, dtype=np.int32))
    g.attrs[S.Attr.EXTRACT_RUNS] = [{"shards": 1, "causal": True}]
    return g


def measure(name: str, spec: dict, repeat: int) -> dict:
    from rapids_attn.explain import head_classes as HC
    from rapids_attn.kvheads import export as X
    from rapids_attn.kvheads.evidence import read_evidence
    from rapids_attn.kvheads.formats import ModelShape

    thresholds = {"sink": 0.3, "streaming": 0.9, "retrieval": 0.1}
    shape = ModelShape(spec["layers"], spec["heads"], spec["kv_heads"], name)
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="rapids-attn-bench-kv-") as tmp:
        g = plant(Path(tmp) / "s.zarr", **spec)
        for _ in range(repeat):
            t = {}
            t0 = time.perf_counter()
            read_evidence(g, spec["min_length"])
            t["read"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            hc = HC.compute(g, thresholds, spec["min_length"], 200, 0)
            t["classes+bootstrap"] = time.perf_counter() - t0 - t["read"]  # compute() reads the evidence again
            t0 = time.perf_counter()
            X.write_exports(Path(tmp) / "head_classes", hc, shape, X.ExportSettings(), name)
            t["write"] = time.perf_counter() - t0
            t["total"] = t["read"] + t["classes+bootstrap"] + t["write"]
            best = {k: min(v, best.get(k, v)) for k, v in t.items()}
    return {"case": name, **spec, "seconds": best}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.kv_heads", description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="*", default=list(CASES))
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--out", type=Path, help="write the raw numbers here (JSON)")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*does not have a Zarr V3 specification")
    from benchmarks import machine_info

    rows = [measure(c, CASES[c], args.repeat) for c in args.cases]
    print("| case | examples | layers x heads (kv) | read s | classes + 200 bootstraps s | write s | total s |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for r in rows:
        s = r["seconds"]
        print(
            f"| {r['case']} | {r['examples']:,} | {r['layers']} x {r['heads']} ({r['kv_heads']}) | {s['read']:.2f} | "
            f"{s['classes+bootstrap']:.2f} | {s['write']:.2f} | {s['total']:.2f} |"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"machine": machine_info(), "rows": rows}, indent=1) + "\n")
        print(f"raw results: {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
