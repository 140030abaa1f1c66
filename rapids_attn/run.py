"""``python -m rapids_attn.run job.yaml [--set a.b=value ...] [--stages extract,learn,explain] [--overwrite]``

The only place that exits. Exit codes: 0 success; 2 a problem with the job or its inputs (one
line on stderr naming the field, file or line and how to fix it, no traceback); 1 an internal
failure (with its traceback).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

from rapids_attn.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m rapids_attn.run",
        description="Run a rapids_attn job: extract attention maps, embed, store in Zarr, reduce, cluster.",
    )
    p.add_argument("job", help="the job's YAML file (see jobs/ for examples)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a job field, e.g. --set data.limit=100 (repeatable; values parsed as YAML)",
    )
    p.add_argument(
        "--stages", default=None, help="comma-separated subset of extract,learn,explain (default: all, in that order)"
    )
    p.add_argument("--overwrite", action="store_true", help="replace a store made by a different job")
    p.add_argument("--check", action="store_true", help="validate the job and its inputs, then stop")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    return p


def configure_process(verbose: bool) -> None:
    """Process-wide settings, made here and nowhere else (library code leaves the process as it found it).

    - OpenMP threads that spin-wait make scikit-learn's KMeans 30x slower whenever the cores are
      shared (Dask workers, other jobs): passive waiting avoids it. Set before sklearn/torch load
      libgomp; an explicit OMP_WAIT_POLICY in the environment wins (docs/benchmarks.md).
    - Hugging Face progress bars (one per worker per model load) are noise next to the job's own
      progress bar; the variable also reaches the worker processes the job starts.
    - Logging: warnings only, and distributed's, bokeh's and tornado's loggers quiet unless -v.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    if not verbose:
        import distributed  # noqa: F401  (it sets its loggers' levels on import; quiet them after)

        for name in ("distributed", "bokeh", "tornado"):
            logging.getLogger(name).setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # allow "--set a=1 b=2": trailing KEY=VALUE words after --set
    stray = [x for x in extra if "=" in x and not x.startswith("-")]
    unknown = [x for x in extra if x not in stray]
    if unknown:
        print(f"error: unknown argument {unknown[0]}; see --help", file=sys.stderr)
        return 2
    configure_process(args.verbose)
    try:
        from rapids_attn.job import load_job
        from rapids_attn.pipeline import parse_stages, preflight, run_job

        cfg = load_job(args.job, args.overrides + stray)
        stages = parse_stages(args.stages)
        if args.check:
            ctx = preflight(cfg, stages).ctx
            print(
                f"ok: {len(ctx.data)} examples, {len(ctx.layout.layers)} layers x {len(ctx.layout.heads)} heads, "
                f"{ctx.layout.n_shards} shards, feature dim {ctx.layout.feature_dim} -> {ctx.run_dir}"
            )
            return 0
        t0 = time.perf_counter()
        summary = run_job(cfg, stages, overwrite=args.overwrite)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted: finished shards are kept; rerun the same command to resume", file=sys.stderr)
        return 130
    counts = summary.get("counts")
    took = time.perf_counter() - t0
    if counts:
        clusters = summary["clusters"]
        sil = clusters.get("silhouette")
        print(
            f"done in {took:.1f}s: {counts['examples']} examples, {counts['maps']:,} maps, "
            f"{clusters['n_clusters']} clusters ({clusters['method']}, silhouette "
            f"{'n/a' if sil is None else f'{sil:.3f}'}), {counts['truncated_examples']} truncated"
        )
        print(f"outputs: {cfg.run_dir}/maps.parquet, {cfg.run_dir}/summary.json, {cfg.run_dir}/store.zarr")
        if summary.get("report"):
            print(f"report:  {summary['report']}  (open it in a browser; no server needed)")
    else:
        print(f"done in {took:.1f}s: stages {','.join(stages)}")
        print(json.dumps({k: v for k, v in summary.items() if k != "stages"}, default=str)[:2000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
