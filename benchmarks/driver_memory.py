"""``python -m benchmarks.driver_memory`` (from the repository root): the driver's peak memory against dataset size.

Generates seeded datasets of 10^4, 10^5 and 10^6 examples (JSONL and Parquet) in a temporary folder
and, in a fresh process per size and path, runs the **driver side** of a job: preflight (the data
pass, the model's config, the device plan, the layout), creating the store, and building and
pickling every shard task; no worker starts and no model runs. Two paths, side by side:

- ``index``: what a job does now: one streaming pass, the workers read their own rows;
- ``whole``: every example read into one list (``read_examples``), the store's ids, groups and labels
  written from the driver, and each task carrying its shard's examples (what a job did before).

Prints a markdown table of peak RSS (``ru_maxrss``) and seconds per case, and writes every number to
``--out``. The result is recorded in docs/benchmarks.md (its row; the protocol:
docs/decisions/2026-11-22-in-process-suite.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import run_in_process, scratch

REPO = Path(__file__).resolve().parent.parent
FIELDS = {"text_fields": ["text"], "id_field": "id", "group_field": "topic", "label_field": "label"}


# -------------------------------------------------------------------------------------------- data


def generate(n: int, seed: int, out_dir: Path, formats: list[str]) -> dict[str, Path]:
    """``n`` seeded examples (id, text of 12-30 words, topic, label) as JSONL and/or Parquet (row groups of
    10,000 rows); written in blocks, so generating 10^6 holds one block at a time."""
    import numpy as np

    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i:04d}" for i in range(5000)])
    paths = {fmt: out_dir / f"data-{n}.{fmt}" for fmt in formats}
    writer = None
    jsonl = open(paths["jsonl"], "w", encoding="utf-8") if "jsonl" in paths else None  # noqa: SIM115 - closed below
    try:
        for start in range(0, n, 10_000):
            m = min(10_000, n - start)
            lengths = rng.integers(12, 31, size=m)
            words = vocab[rng.integers(0, len(vocab), size=int(lengths.sum()))]
            cuts = np.cumsum(lengths)[:-1]
            block = {
                "id": [f"ex-{i:08d}" for i in range(start, start + m)],
                "text": [" ".join(w) for w in np.split(words, cuts)],
                "topic": [f"topic-{t}" for t in rng.integers(0, 50, size=m)],
                "label": [str(x) for x in rng.integers(0, 2, size=m)],
            }
            if jsonl is not None:
                keys = list(block)
                jsonl.writelines(json.dumps(dict(zip(keys, row))) + "\n" for row in zip(*block.values()))
            if "parquet" in paths:
                import pyarrow as pa
                import pyarrow.parquet as pq

                table = pa.table(block)
                if writer is None:
                    writer = pq.ParquetWriter(paths["parquet"], table.schema)
                writer.write_table(table, row_group_size=10_000)
    finally:
        if jsonl is not None:
            jsonl.close()
        if writer is not None:
            writer.close()
    return paths


# -------------------------------------------------------------------------------------- one case


def _cfg(data: Path, run_dir: Path, shard_size: int):
    from rapids_attn.jobfile import load_job

    raw = {
        "name": "driver-memory",
        "data": {"path": str(data), **FIELDS},
        "model": {"name": "minilm-l6"},
        "extract": {"shard_size": shard_size},
        "runtime": {"cluster": "local", "n_workers": 1, "learn_backend": "cpu"},
        "output": {"dir": str(run_dir)},
    }
    return load_job(None, raw=raw)


def case(spec: dict) -> dict:
    """One driver run in this process; returns its numbers."""
    import pickle

    # everything the driver imports, first: the peak after this is the floor under every case
    import pyarrow.parquet  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import zarr  # noqa: F401

    from rapids_attn.extract.stage import ExtractStage
    from rapids_attn.pipeline import preflight

    floor = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    run_dir = Path(tempfile.mkdtemp(prefix="drvmem-"))
    cfg = _cfg(Path(spec["data"]), run_dir, spec["shard_size"])
    t0 = time.perf_counter()
    if spec["path"] == "index":
        ctx = preflight(cfg, ("extract",)).ctx
        _, _, tasks = ExtractStage.from_job(cfg).prepare(ctx)
        n = len(ctx.data)
    else:
        tasks, n = _whole(cfg, run_dir)
    task_bytes = sum(len(pickle.dumps(t)) for t in tasks)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    shutil.rmtree(run_dir, ignore_errors=True)
    return {
        **spec,
        "examples": n,
        "tasks": len(tasks),
        "task_bytes": task_bytes,
        "seconds": seconds,
        "peak_rss": peak,
        "floor_rss": floor,
    }


def _whole(cfg, run_dir: Path):
    """The driver as it was: every example in a list, metadata written from here, texts in the tasks."""
    from rapids_attn.data import Rows, read_examples
    from rapids_attn.devices import resolve_devices
    from rapids_attn.extract.model import describe_model
    from rapids_attn.extract.shard import ShardTask
    from rapids_attn.extract.stage import plan_layout
    from rapids_attn.store import schema as S
    from rapids_attn.store.zarr_store import create_store

    d = cfg.data
    examples = read_examples(d.path, d.format, d.text_fields, d.id_field, d.group_field, d.label_field)
    info = describe_model(cfg.model)
    devices = resolve_devices(cfg.extract, cfg.model, cfg.embed, cfg.runtime, ("extract",))
    layout = plan_layout(cfg.extract, cfg.embed, cfg.store, len(examples), info.n_layers, info.n_heads, "minilm-l6")
    key = cfg.extraction_key()
    g = create_store(run_dir / "store.zarr", layout, cfg.to_dict(), key, {})
    for spec, attr in ((S.EXAMPLE_ID, "id"), (S.EXAMPLE_GROUP, "group"), (S.EXAMPLE_LABEL, "label")):
        S.create_array(g, spec, (len(examples),), data=[getattr(e, attr) for e in examples])  # one chunk, as then
    tasks = []
    for s in range(layout.n_shards):
        a, b = layout.shard_rows(s)
        rows = Rows(None, inline=tuple(examples[a:b]))
        args = (cfg.model, cfg.extract, cfg.embed, devices.extract, 1, key, str(run_dir / "store.zarr"), layout, s)
        tasks.append(ShardTask(*args, rows, info.max_length))
    return tasks, len(examples)


def run_case(spec: dict) -> dict:
    r = run_in_process("benchmarks.driver_memory", "--case", json.dumps(spec))
    print(
        f"  {spec['format']:<8} {spec['path']:<6} {r['examples']:>9,}: {r['peak_rss'] / 2**20:,.0f} MB, "
        f"{r['seconds']:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    return r


# ---------------------------------------------------------------------------------------- report


def report(results: list[dict]) -> str:
    sizes = sorted({r["examples"] for r in results})
    head = ["format", "driver", *(f"{n:,} examples" for n in sizes)]
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for fmt in dict.fromkeys(r["format"] for r in results):
        for path in ("index", "whole"):
            rs = {r["examples"]: r for r in results if r["format"] == fmt and r["path"] == path}
            if rs:
                cells = [
                    f"{rs[n]['peak_rss'] / 2**20:,.0f} MB, {rs[n]['seconds']:.1f} s" if n in rs else "" for n in sizes
                ]
                out.append(f"| {fmt} | {path} | " + " | ".join(cells) + " |")
    floor = min(r["floor_rss"] for r in results)
    tb = {(r["path"], r["examples"]): r["task_bytes"] for r in results if r["format"] == results[0]["format"]}
    n = max(sizes)
    lines = [
        "\n".join(out),
        "",
        (
            "Peak RSS of the driver process (ru_maxrss) and the seconds from preflight to the last pickled task. "
            f"After its imports alone (torch, transformers, pyarrow, zarr) a process peaks at {floor / 2**20:,.0f} MB."
        ),
    ]
    if ("index", n) in tb and ("whole", n) in tb:
        lines.append(
            f"Pickled tasks at {n:,} examples: {tb[('index', n)] / 2**20:,.1f} MB (index) against "
            f"{tb[('whole', n)] / 2**20:,.1f} MB (whole)."
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.driver_memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000,1000000", help="examples per generated dataset")
    ap.add_argument("--formats", default="jsonl,parquet")
    ap.add_argument("--paths", default="index,whole", help="index (the job now), whole (the list, as before)")
    ap.add_argument("--shard-size", type=int, default=128, help="extract.shard_size (auto gives 128 at these sizes)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="driver_memory.json")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.case:
        print("RESULT " + json.dumps(case(json.loads(args.case))), flush=True)
        return 0
    with scratch("drvmem-"):  # every case's run folder, removed at the end
        return _run(args)


def _run(args) -> int:
    formats = args.formats.split(",")
    sizes = [int(s) for s in args.sizes.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="drvmem-data-"))
    results = []
    try:
        for n in sizes:
            t0 = time.perf_counter()
            paths = generate(n, args.seed, tmp, formats)
            print(f"generated {n:,} examples in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
            for fmt, data in paths.items():
                for path in args.paths.split(","):
                    spec = {"format": fmt, "path": path, "data": str(data), "shard_size": args.shard_size}
                    results.append(run_case(spec))
            for data in paths.values():
                data.unlink()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    machine = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}
    Path(args.out).write_text(json.dumps({"machine": machine, "args": vars(args), "results": results}, indent=1))
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
