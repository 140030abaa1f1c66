"""``python -m benchmarks.relevance_batches`` (from the repository root): the relevance stage's worker on the
same questions batched in arrival order and in order of token length, side by side in one process (issue 32).

On ``--questions`` SQuAD questions sampled from ``--data`` (``seed`` 0, file order: the order the stage hands
a worker its shard) and one loaded model (``--model``, default the bundled MiniLM), the stage's own worker
(:class:`rapids_attn.relevance.work.RelevanceWorker`, the stage's defaults: every method, the head atlas,
``relevance.batch_size``, max_length the model's limit capped as the stage caps it) runs one task of all the
questions, once with ``sort_by_length`` off (each batch padded to its longest input in arrival order) and once
on (the default: batches of similar lengths), after an untimed warm-up on two questions. The two runs
alternate for ``--rounds`` rounds (arrival first in odd rounds, sorted first in even ones), since the host is
shared and its load drifts.

Printed per order: the padded tokens the model ran on (batch size x longest input, summed over batches), the
real tokens, the Jensen-Shannon sums' work in query rows x keys (and what it was before issue 32, when every
padded row was computed), the seconds in the head atlas's Jensen-Shannon sums (``HeadDistance.update``, timed around each
call) and the whole run's seconds, each round's and their mean, and the arrival / sorted ratios; and a check
that both orders gave the same result (relevance, roles, lengths, distance sums).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks import machine_info

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO.parent / "shared" / "data" / "squad-v2-dev-half.json"


class _JSTimer:
    """Time every ``HeadDistance.update`` (the Jensen-Shannon sums; it ends in a copy to the host, so the
    device is synchronised) while installed."""

    def __init__(self):
        from rapids_attn.relevance import atlas

        self.cls, self.orig, self.seconds = atlas.HeadDistance, atlas.HeadDistance.update, 0.0

    def __enter__(self):
        orig, timer = self.orig, self

        def update(hd, layers, lengths):
            t0 = time.perf_counter()
            orig(hd, layers, lengths)
            timer.seconds += time.perf_counter() - t0

        self.cls.update = update
        return self

    def __exit__(self, *exc):
        self.cls.update = self.orig


def batch_lengths(lengths: np.ndarray, batch_size: int, sort: bool) -> list[np.ndarray]:
    """Each batch's token lengths as the worker forms its batches (stable sort by length, or arrival order)."""
    order = np.argsort(lengths, kind="stable") if sort else np.arange(len(lengths))
    return [lengths[order[i : i + batch_size]] for i in range(0, len(lengths), batch_size)]


def _run(worker, task) -> dict:
    load = os.getloadavg()[0]
    with _JSTimer() as js:
        t0 = time.perf_counter()
        r = worker.run(task)
        seconds = time.perf_counter() - t0
    batches = batch_lengths(r.lengths.astype(np.int64), task.batch_size, task.sort_by_length)
    padded = sum(len(b) * int(b.max()) for b in batches)
    assert padded == r.padded_tokens, (padded, r.padded_tokens)
    return {
        "seconds": seconds,
        "js_seconds": js.seconds,
        "padded_tokens": int(r.padded_tokens),
        "real_tokens": int(r.lengths.sum()),
        # the JS sums' work: query rows x keys per batch (valid rows only), and before issue 32 (every padded row)
        "js_cells": sum(int(b.sum()) * int(b.max()) for b in batches),
        "js_cells_all_rows": sum(len(b) * int(b.max()) ** 2 for b in batches),
        "load_before": load,
        "load_after": os.getloadavg()[0],
        "result": r,
    }


def _same(a, b) -> dict:
    """How far apart two RelevanceResults are."""
    both = ~np.isnan(a.relevance)
    return {
        "nan_identical": bool(np.array_equal(both, ~np.isnan(b.relevance))),
        "relevance_max_abs": float(np.max(np.abs(a.relevance[both] - b.relevance[both]))) if both.any() else 0.0,
        "roles_identical": bool(np.array_equal(a.roles, b.roles)),
        "lengths_identical": bool(np.array_equal(a.lengths, b.lengths)),
        "distance_max_rel": float(np.max(np.abs(a.distance_sums - b.distance_sums) / np.abs(b.distance_sums).max())),
        "rows_identical": a.distance_rows == b.distance_rows,
    }


def measure(args) -> dict:
    import torch

    from rapids_attn.data import read_examples
    from rapids_attn.devices import ExtractDevices
    from rapids_attn.extract.model import DEFAULT_MAX_LENGTH_CAP, describe_model
    from rapids_attn.job import ModelConfig
    from rapids_attn.relevance.config import RelevanceConfig
    from rapids_attn.relevance.work import RelevanceTask, RelevanceWorker

    torch.set_num_threads(args.threads)
    cfg = RelevanceConfig()
    mcfg = ModelConfig(name=args.model)
    info = describe_model(mcfg, check_files=False)
    max_length = args.max_length or min(info.max_length, DEFAULT_MAX_LENGTH_CAP)  # as the stage sets it
    examples = read_examples(args.data, format="squad", sample=args.questions, seed=args.seed)
    print(
        f"benchmarks.relevance_batches: {len(examples)} questions, {args.model}, batches of {args.batch_size}",
        file=sys.stderr,
        flush=True,
    )
    task = RelevanceTask(
        mcfg,
        ExtractDevices(args.device),
        args.threads,
        max_length,
        args.batch_size,
        tuple(examples),
        tuple(cfg.methods),
        cfg.query,
        cfg.residual,
        cfg.flow_max_tokens,
        cfg.pagerank_layer,
        cfg.pagerank_heads,
        True,
        "bench",
    )
    t0 = time.perf_counter()
    worker = RelevanceWorker(task)
    R: dict = {"load_model": time.perf_counter() - t0, "max_length": max_length, "device": worker.device}
    worker.run(replace(task, examples=task.examples[:2]))  # untimed warm-up (first-call allocations, thread pool)
    orders = {"arrival": replace(task, sort_by_length=False), "sorted": task}
    runs: dict[str, list] = {"arrival": [], "sorted": []}
    for r in range(args.rounds):
        for name in ("arrival", "sorted") if r % 2 == 0 else ("sorted", "arrival"):
            out = _run(worker, orders[name])
            runs[name].append(out)
            print(
                f"  round {r + 1} {name}: {out['seconds']:.2f}s (JS sums {out['js_seconds']:.2f}s)",
                file=sys.stderr,
                flush=True,
            )
    R["check"] = _same(runs["sorted"][-1].pop("result"), runs["arrival"][-1].pop("result"))
    for v in runs.values():
        for out in v:
            out.pop("result", None)
    R["runs"] = runs
    R["examples"] = len(examples)
    R["layers"], R["heads"] = info.n_layers, info.n_heads
    return R


def table(head: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return "\n".join(out + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def report(R: dict) -> str:
    args, m, runs = R["args"], R["machine"], R["runs"]

    def mean(name, key):
        return statistics.mean(x[key] for x in runs[name])

    def each(name, key):
        return " / ".join(f"{x[key]:.2f}" for x in runs[name])

    a, s = runs["arrival"][0], runs["sorted"][0]
    rows = []
    for name, x in (("arrival", a), ("sorted", s)):
        rows.append(
            [
                name,
                x["padded_tokens"],
                x["real_tokens"],
                f"{x['real_tokens'] / x['padded_tokens']:.2f}",
                f"{x['js_cells'] / 1e6:.2f}M",
                f"**{mean(name, 'js_seconds'):.2f}** ({each(name, 'js_seconds')})",
                f"**{mean(name, 'seconds'):.2f}** ({each(name, 'seconds')})",
            ]
        )
    rows.append(
        [
            "arrival / sorted",
            f"{a['padded_tokens'] / s['padded_tokens']:.2f}",
            "1.00",
            "",
            f"{a['js_cells'] / s['js_cells']:.2f}",
            f"**{mean('arrival', 'js_seconds') / mean('sorted', 'js_seconds'):.2f}**",
            f"**{mean('arrival', 'seconds') / mean('sorted', 'seconds'):.2f}**",
        ]
    )
    c = R["check"]
    title = (
        f"### Relevance worker: {R['examples']} SQuAD questions in arrival order and sorted by length, "
        f"{args['model']} ({R['layers']} x {R['heads']} heads), batches of {args['batch_size']}, "
        f"max_length {R['max_length']}, on {R['device']}\n"
    )
    checks = (
        f"\nSeconds: mean of {args['rounds']} alternated rounds (each round's in brackets). Same result both ways: "
        f"lengths {c['lengths_identical']}, roles {c['roles_identical']}, NaN places {c['nan_identical']}, relevance "
        f"within {c['relevance_max_abs']:.1e}, distance sums within {c['distance_max_rel']:.1e} of their largest, "
        f"rows {c['rows_identical']}. JS cells: the Jensen-Shannon sums' query rows x keys, summed over batches "
        f"(each pair of the {R['layers'] * R['heads']} heads costs this many entries); before issue 32 every padded "
        f"row was computed too: {a['js_cells_all_rows'] / 1e6:.2f}M cells in arrival order, "
        f"{a['js_cells_all_rows'] / s['js_cells']:.2f} x the sorted run's."
    )
    loads = [x["load_before"] for v in runs.values() for x in v] + [x["load_after"] for v in runs.values() for x in v]
    where = (
        f"\nCommand: `python -m benchmarks.relevance_batches --questions {args['questions']} --model {args['model']} "
        f"--threads {args['threads']}`. Machine: {m['cpus']} CPUs, {m['platform']}, torch {m['torch']} on "
        f"{args['threads']} threads; commit {m['commit']}; {m['date']}. Model load {R['load_model']:.1f}s (excluded). "
        f"1-minute load average {min(loads):.2f}-{max(loads):.2f} (a shared host: other work slows any run)."
    )
    head = ["order", "padded tokens", "real tokens", "real / padded", "JS cells", "JS-sum seconds", "whole-run seconds"]
    return "\n".join([title, table(head, rows), checks, where])


def main(argv=None) -> int:
    from rapids_attn.relevance.config import RelevanceConfig

    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.relevance_batches", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    ap.add_argument("--questions", type=int, default=24, help="questions sampled from --data (seed --seed; default 24)")
    ap.add_argument("--model", default="minilm-l6", help="a preset, folder or hub id (default minilm-l6)")
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="SQuAD-format file (default ../shared/data/...)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--batch-size", type=int, default=RelevanceConfig().batch_size, help="relevance.batch_size (default 8)"
    )
    ap.add_argument("--max-length", type=int, default=None, help="relevance.max_length (default: the model's limit)")
    ap.add_argument("--rounds", type=int, default=2, help="alternated rounds of both orders (default 2)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "worker"], help="extract.device (default cpu)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads (default: every CPU)")
    ap.add_argument("--out", default=None, help="write every raw number here (JSON)")
    args = ap.parse_args(argv)
    # As the job's CLI does (run.configure_process), before torch loads libgomp.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not Path(args.data).is_file():
        print(f"error: --data: no such file: {args.data}", file=sys.stderr)
        return 2
    if args.questions < 1 or args.rounds < 1:
        print("error: --questions and --rounds: need at least 1", file=sys.stderr)
        return 2
    import torch

    from rapids_attn.errors import UserError

    try:
        R = measure(args)
    except UserError as e:  # a model or data the stage would refuse: one line, as the CLI says it
        print(f"error: {e}", file=sys.stderr)
        return 2
    R["args"] = vars(args)
    R["machine"] = machine_info(torch=torch.__version__)
    if args.out:
        Path(args.out).write_text(json.dumps(R, indent=1))
    print(report(R))
    return 0


if __name__ == "__main__":
    sys.exit(main())
