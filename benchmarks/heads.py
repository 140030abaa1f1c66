"""``python -m benchmarks.heads`` (from the repository root): what the heads stage costs, as ratios to one
forward pass of the unablated model (issue 14).

In one process, on the same ``--questions`` questions sampled from ``--data`` (``seed`` 0) and the same
loaded model, with the heads stage's own worker code (:class:`rapids_attn.heads.work.HeadsWorker`: the
model the stage loads, ``metric.partials`` under ``HeadIntervention``, ``losses.importance_sums``), it
times

- (a) one unablated metric pass: the metric's partials with no hooks, run before and again after (c),
  since the host is shared and its load drifts;
- (b) the same under ``HeadIntervention`` with an all-ones keep mask: the hooks' own overhead;
- (c) every single-head ablation (layers x heads passes, one keep mask each, as the stage's ``score``
  tasks run them);
- (d) one importance pass (Michel et al.: per-head gates, one forward and backward per batch);
- the bare forward: the model alone on the very batches the metric fed it (recorded during an untimed
  warm-up pass), which shows what the metric adds (tokenising, pooling, copying out).

Each is printed in seconds and as a ratio to (a). One process and one shard: the stage spreads the same
passes over Dask workers (shards of the examples), which changes the wall clock but not the work.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import machine_info
from rapids_attn.devices import ExtractDevices

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO.parent / "shared" / "data" / "squad-v2-dev-half.json"


def _timed(fn):
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    out = fn()
    return {"seconds": time.perf_counter() - t0, "load_before": load, "load_after": os.getloadavg()[0]}, out


def _record_batches(model):
    """A forward pre-hook that keeps every (args, kwargs) the model is called with; returns (batches, handle)."""
    batches: list[tuple[tuple, dict]] = []

    def hook(module, args, kwargs):
        batches.append((args, dict(kwargs)))

    return batches, model.register_forward_pre_hook(hook, with_kwargs=True)


def _same(p: dict, q: dict) -> bool:
    return p.keys() == q.keys() and all(np.array_equal(p[k], q[k]) for k in p)


def measure(args) -> dict:
    import torch

    from rapids_attn.data import read_examples
    from rapids_attn.extract.model import describe_model, load_config
    from rapids_attn.heads.metrics import auto_metric
    from rapids_attn.heads.work import HeadsTask, HeadsWorker
    from rapids_attn.job import ModelConfig

    torch.set_num_threads(args.threads)
    mcfg = ModelConfig(name=args.model)
    info = describe_model(mcfg, check_files=False)
    metric = args.metric if args.metric != "auto" else auto_metric(load_config(mcfg)[1], "squad")
    max_length = args.max_length or info.max_length  # the stage: heads.max_length or the model's limit
    examples = read_examples(args.data, format="squad", sample=args.questions, seed=args.seed)
    L, H = info.n_layers, info.n_heads
    print(f"benchmarks.heads: {len(examples)} questions, {args.model}, {metric}", file=sys.stderr, flush=True)

    def task(kind, conditions=None):
        return HeadsTask(
            mcfg,
            metric,
            kind,
            ExtractDevices("cpu"),
            args.threads,
            max_length,
            args.batch_size,
            tuple(examples),
            conditions,
        )

    t_load, w = _timed(lambda: HeadsWorker(task("score")))
    ones = np.ones((1, L, H), np.float32)

    def unablated():
        return w.metric.partials(w.model, w.tokenizer, examples, w.device, max_length)

    # Untimed warm-up pass (first-call allocations, thread pool start) that records the model's inputs.
    batches, handle = _record_batches(w.model)
    try:
        reference = unablated()
    finally:
        handle.remove()

    def bare():
        with torch.inference_mode():
            for a, kw in batches:
                w.model(*a, **kw)

    R: dict = {"load_model": t_load, "batches": len(batches), "max_length": max_length, "metric": metric}
    R["bare"], _ = _timed(bare)
    R["a_before"], p_a = _timed(unablated)
    R["b_hooks"], r_b = _timed(lambda: w.run(task("score", ones)))
    masks = []
    for layer in range(L):
        for head in range(H):
            keep = np.ones((1, L, H), np.float32)
            keep[0, layer, head] = 0
            masks.append(keep)
    per, changed = [], 0
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    for i, keep in enumerate(masks):
        r = w.run(task("score", keep))
        per.append(r.seconds)
        changed += not _same(r.partials[0], reference)
        print(f"  ablation {i + 1}/{len(masks)}: {r.seconds:.2f}s", file=sys.stderr, flush=True)
    R["c_ablations"] = {"seconds": time.perf_counter() - t0, "load_before": load0, "load_after": os.getloadavg()[0]}
    R["c_per_ablation"] = per
    R["a_after"], _ = _timed(unablated)
    R["d_importance"], r_d = _timed(lambda: w.run(task("importance")))
    scores = w.metric.scores(reference, examples)
    R["check"] = {
        "hooks_identical": _same(r_b.partials[0], reference) and _same(p_a, reference),
        "ablations": len(masks),
        "ablations_changed": changed,
        "importance_units": r_d.count,
        "importance_finite": bool(np.isfinite(r_d.sums).all()),
        "base": {k: float(np.nanmean(v)) for k, v in scores.items()},
    }
    R["examples"] = len(examples)
    R["paragraphs"] = len({e.text_pair for e in examples})
    R["layers"], R["heads"] = L, H
    return R


def ratios(R: dict) -> dict:
    """Every timing over (a): its mean over the runs before and after (c), and each run alone."""
    a = (R["a_before"]["seconds"] + R["a_after"]["seconds"]) / 2
    out = {}
    for key in ("bare", "a_before", "a_after", "b_hooks", "c_ablations", "d_importance"):
        s = R[key]["seconds"]
        out[key] = {"mean": s / a, "before": s / R["a_before"]["seconds"], "after": s / R["a_after"]["seconds"]}
    per = R["c_per_ablation"]
    out["per_ablation"] = {
        "median": statistics.median(per) / a,
        "min": min(per) / a,
        "max": max(per) / a,
    }
    return out


def table(head: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return "\n".join(out + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def report(R: dict) -> str:
    x, n, L, H = R["ratios"], R["examples"], R["layers"], R["heads"]
    args = R["args"]

    def row(name, key):
        r = x[key]
        return [name, f"{R[key]['seconds']:.2f}", f"**{r['mean']:.2f}**", f"{r['before']:.2f}", f"{r['after']:.2f}"]

    p = x["per_ablation"]
    rows = [
        row("(a) unablated metric pass, before (c)", "a_before"),
        row("(a) unablated metric pass, after (c)", "a_after"),
        row("(b) the same under HeadIntervention, all-ones keep mask (hook overhead)", "b_hooks"),
        row(f"(c) all {L * H} single-head ablations ({L} x {H} passes)", "c_ablations"),
        [
            "(c) per ablation: median (min-max)",
            f"{statistics.median(R['c_per_ablation']):.2f}",
            f"**{p['median']:.2f}** ({p['min']:.2f}-{p['max']:.2f})",
            "",
            "",
        ],
        row(f"(d) one importance pass (gates, forward + backward, batches of {args['batch_size']})", "d_importance"),
        row(f"bare forward: the model alone on the metric's {R['batches']} batches", "bare"),
    ]
    c = R["check"]
    m = R["machine"]
    title = (
        f"### Heads stage: {n} questions ({R['paragraphs']} distinct paragraphs), metric {R['metric']}, "
        f"{L} x {H} heads\n"
    )
    checks = (
        f"\n(a) is the metric's pass over the {n} questions and their paragraphs with no hooks; the ratios "
        f"divide by the mean of its two runs. Checks: (b) gave exactly (a)'s partials: "
        f"{c['hooks_identical']}; {c['ablations_changed']} of {c['ablations']} ablations changed them; "
        f"importance over {c['importance_units']:g} units, finite: {c['importance_finite']}; unablated "
        + ", ".join(f"{k} {v:.3f}" for k, v in c["base"].items())
        + "."
    )
    where = (
        f"\nCommand: `python -m benchmarks.heads --questions {n} --model {args['model']} --threads "
        f"{args['threads']}`. Machine: {m['cpus']} CPUs, {m['platform']}, torch {m['torch']} on "
        f"{args['threads']} threads; commit {m['commit']}; {m['date']}. 1-minute load average: "
        f"(a) before {R['a_before']['load_before']:.2f}, (c) {R['c_ablations']['load_before']:.2f} to "
        f"{R['c_ablations']['load_after']:.2f}, (d) after {R['d_importance']['load_after']:.2f} "
        "(a shared host: other work slows any pass)."
    )
    head = ["pass", "seconds", "/ (a) mean", "/ (a) before", "/ (a) after"]
    return "\n".join([title, table(head, rows), checks, where])


def main(argv=None) -> int:
    from rapids_attn.heads.config import HeadsConfig

    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.heads", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    ap.add_argument("--questions", type=int, default=1000, help="questions sampled from --data (seed --seed)")
    ap.add_argument("--model", default="minilm-l6", help="a preset, folder or hub id (default minilm-l6)")
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="SQuAD-format file (default ../shared/data/...)")
    ap.add_argument("--metric", default="auto", choices=["auto", "squad", "lm", "retrieval", "accuracy"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--batch-size", type=int, default=HeadsConfig().batch_size, help="importance batch (heads.batch_size)"
    )
    ap.add_argument("--max-length", type=int, default=None, help="heads.max_length (default: the model's limit)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads (default: every CPU)")
    ap.add_argument("--out", default=None, help="write every raw number here (JSON)")
    args = ap.parse_args(argv)
    # As the job's CLI does (run.configure_process), before torch loads libgomp: OpenMP threads that
    # spin-wait are several times slower whenever the cores are shared.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not Path(args.data).is_file():
        print(f"error: --data: no such file: {args.data}", file=sys.stderr)
        return 2
    if args.questions < 2:
        print(f"error: --questions: need at least 2 (the heads stage's minimum), got {args.questions}", file=sys.stderr)
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
    R["ratios"] = ratios(R)
    if args.out:
        Path(args.out).write_text(json.dumps(R, indent=1))
    print(report(R))
    return 0


if __name__ == "__main__":
    sys.exit(main())
