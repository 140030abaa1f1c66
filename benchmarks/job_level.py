"""``python -m benchmarks.job_level`` (from the repository root): the whole job against the prior pipeline,
wall clock, on the same sampled SQuAD questions (issue 13).

The job side is the quickstart job (``jobs/quickstart.yaml``: MiniLM, the pattern CNN, two local
workers) with the default shard size (`auto`) and the report off, on ``--questions`` questions sampled
from ``--data`` (``data.sample``, ``data.seed: 0``). Its time is the wall clock from launching
``python -m rapids_attn.run job.yaml`` as a subprocess to its exit: process start, preflight, worker
start, model loading, extract, learn and explain (maps.parquet and the findings) all count.

The baseline is the prior work (``benchmarks/naive.py``): batch 1, every input padded to
``--max-length`` (384), ``output_attentions=True``, each padded map resized to 224 x 224 and passed
alone through ResNet-50, its 2,048 features appended to a CSV file. It runs in its own process, timed
the same way, on ``--baseline-questions`` questions drawn (seeded) from the same sample: half of them
before the job and half after, so that the host's drifting load falls on both sides. The baseline
keeps no state between questions, so its cost is a fixed start-up plus a per-question cost; with fewer
questions than the job's, the 500-question time is *extrapolated* from the measured per-question rate
and printed as such.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks import machine_info

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "jobs" / "quickstart.yaml"
DEFAULT_DATA = REPO.parent / "shared" / "data" / "squad-v2-dev-half.json"


def write_job(job: Path, data: Path, questions: int, seed: int, run_dir: Path, out: Path) -> Path:
    """``job``, changed only where the protocol says: the data (a seeded sample of SQuAD questions, one input
    each, as the bare forward reads them, whatever unit the job names), the default shard size, the report off,
    the run directory. Its presets ship in the package, so the copy runs from anywhere."""
    spec = yaml.safe_load(job.read_text())
    spec.setdefault("data", {}).update(
        path=str(data.resolve()), format="squad", sample=questions, seed=seed, squad_unit="question"
    )
    spec.setdefault("extract", {}).pop("shard_size", None)  # the default, auto (64 for 500 questions)
    spec.setdefault("explain", {})["report"] = False
    spec.setdefault("output", {})["dir"] = str(run_dir)
    out.write_text(yaml.safe_dump(spec, sort_keys=False))
    return out


def this_checkout_env() -> dict:
    """The environment with this checkout first on PYTHONPATH: a job run from another folder imports this
    tree's rapids_attn (and so do its workers), not whichever the environment installed (an editable install
    points at one checkout; a benchmark run from a second worktree would time the first's code)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def timed(cmd: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    """Wall seconds from launching ``cmd`` to its exit, and the finished process (stdout captured), with this
    checkout's rapids_attn (:func:`this_checkout_env`)."""
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False, env=this_checkout_env())
    return time.perf_counter() - t0, p


def run_job(job_yaml: Path, run_dir: Path) -> dict:
    load = os.getloadavg()[0]
    wall, p = timed([sys.executable, "-m", "rapids_attn.run", str(job_yaml)], job_yaml.parent)
    if p.returncode != 0:
        raise RuntimeError(f"the job failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    s = json.loads((run_dir / "summary.json").read_text())
    run = s["extract"]["runs"][-1]
    return {
        "wall": wall,
        "load_before": load,
        "load_after": os.getloadavg()[0],
        "seconds": s["seconds"],  # stage clocks: preflight, extract, learn, explain
        "worker_seconds": run["worker_seconds"],
        "learn_seconds": s["clusters"]["learn_seconds"],
        "examples": s["counts"]["examples"],
        "maps": s["counts"]["maps"],
        "shards": s["counts"]["shards"],
        "workers": s["backend"]["runtime"].get("n_workers"),
    }


def baseline_process(spec: dict) -> dict:
    """The baseline's own process (``--baseline-process``): load what the prior work loads, then run it
    over the chosen questions; per-question seconds are stamped as the loop takes each one."""
    import torch

    from benchmarks.naive import run_naive
    from rapids_attn.data import read_examples
    from rapids_attn.embed.backbone import _build_network, _strip_head
    from rapids_attn.extract.model import load_model, load_tokenizer
    from rapids_attn.job import ModelConfig

    torch.set_num_threads(os.cpu_count())
    keep = set(spec["ids"])
    examples = list(read_examples(spec["data"], format="squad", sample=spec["sample"], seed=spec["seed"]))
    examples = [e for e in examples if e.id in keep]
    mcfg = ModelConfig(**spec["model"])
    model, tok = load_model(mcfg, "cpu", "float32"), load_tokenizer(mcfg)
    net, dim = _strip_head(_build_network(spec["backbone"], "random"))  # the weights do not change the cost
    net = net.eval()
    stamps: list[float] = []

    def stamped():
        for e in examples:
            stamps.append(time.perf_counter())
            yield e

    csv = Path(spec["csv"])
    r = run_naive(model, tok, stamped(), spec["max_length"], net, 224, csv, "cpu")
    stamps.append(time.perf_counter())
    csv.unlink()
    per_q = [b - a for a, b in itertools.pairwise(stamps)]
    return {**r, "examples": len(examples), "dim": dim, "loop": stamps[-1] - stamps[0], "per_question": per_q}


def run_baseline(spec: dict, tmp: Path) -> dict:
    load = os.getloadavg()[0]
    spec = {**spec, "csv": str(tmp / "baseline.csv")}
    wall, p = timed([sys.executable, "-m", "benchmarks.job_level", "--baseline-process", json.dumps(spec)], REPO)
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"the baseline failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return {"wall": wall, "load_before": load, "load_after": os.getloadavg()[0], **json.loads(lines[-1][7:])}


def combine(runs: list[dict]) -> dict:
    """Baseline runs over parts of the questions as one process over all of them: its fixed start-up
    (the runs' mean of wall - loop) plus every question's own seconds."""
    fixed = statistics.fmean(r["wall"] - r["loop"] for r in runs)
    loop = sum(r["loop"] for r in runs)
    out = {k: sum(r[k] for r in runs) for k in ("examples", "maps", "bytes")}
    out["seconds"] = {k: sum(r["seconds"][k] for r in runs) for k in runs[0]["seconds"]}
    per_q = [t for r in runs for t in r["per_question"]]
    load = (runs[0]["load_before"], runs[-1]["load_after"])
    return {
        **out,
        "wall": fixed + loop,
        "loop": loop,
        "per_question": per_q,
        "dim": runs[0]["dim"],
        "load_before": load[0],
        "load_after": load[1],
        "runs": runs,
    }


def extrapolate(b: dict, questions: int) -> dict:
    """The baseline's time for ``questions``: its fixed part (process start, loading: wall - loop) plus
    the measured mean per question times ``questions``, with a rough 95% interval from the spread."""
    per = b["per_question"]
    mean = statistics.fmean(per)
    sd = statistics.stdev(per) if len(per) > 1 else 0.0
    fixed = b["wall"] - b["loop"]
    half = 1.96 * sd / len(per) ** 0.5 * questions
    est = fixed + mean * questions
    return {
        "fixed": fixed,
        "per_question": mean,
        "per_question_sd": sd,
        "wall": est,
        "low": est - half,
        "high": est + half,
    }


def table(head: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return "\n".join(out + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def report(R: dict) -> str:
    j, b, x, q = R["job"], R["baseline"], R["extrapolated"], R["args"]["questions"]
    nb = b["examples"]
    measured = nb == j["examples"]
    bl = f"baseline (batch 1, padded to {R['args']['max_length']}, {R['args']['backbone']} @224 per map, CSV)"
    rows = [
        [
            f"rapids_attn job (quickstart, default shards, report off; {j['workers']} workers)",
            j["examples"],
            f"{j['wall']:.1f}",
            f"{j['wall'] / j['examples']:.3f}",
            f"{j['maps'] / j['wall']:,.1f}",
            "1.0x",
        ],
        [
            f"{bl}, measured"
            + (
                f" (in {len(b['runs'])} processes, before and after the job: one start-up + every question)"
                if len(b["runs"]) > 1
                else ""
            ),
            nb,
            f"{b['wall']:.1f}",
            f"{b['loop'] / nb:.3f} (loop)",
            f"{b['maps'] / b['wall']:,.1f}",
            "-" if not measured else "",  # fewer questions than the job: not a ratio
        ],
    ]
    if measured:
        rows[1][-1] = f"**{b['wall'] / j['wall']:.1f}x**"
    else:
        rows.append(
            [
                f"{bl}, **extrapolated** to {q} questions",
                f"{q} (extrapolated)",
                f"{x['wall']:.0f} (95%: {x['low']:.0f}-{x['high']:.0f})",
                f"{x['per_question']:.3f}",
                f"{j['maps'] / j['examples'] * q / x['wall']:,.1f}",
                f"**{x['wall'] / j['wall']:.1f}x** (extrapolated; {x['low'] / j['wall']:.1f}-{x['high'] / j['wall']:.1f}x)",
            ]
        )
    out = [
        f"### Job level: {q} sampled questions, wall clock from launch to exit\n",
        table(["pipeline", "questions", "wall s", "s/question", "maps/s", "job is faster by"], rows),
    ]
    if not measured:
        out.append(
            f"\nThe baseline ran on {nb} of the {q} questions (seeded). It is batch 1 with no state between "
            f"questions, so its cost is a fixed start-up ({x['fixed']:.1f} s: process start, model and "
            f"ResNet load) plus {x['per_question']:.2f} s per question (sd {x['per_question_sd']:.2f} s); "
            f"the {q}-question time above is that, **extrapolated**, not measured."
        )
    sec = {**j["seconds"], **{f"extract worker: {k}": v for k, v in j["worker_seconds"].items()}}
    sec.update({f"learn: {k}": v for k, v in j["learn_seconds"].items()})
    out.append("\n### The job's phases (summary.json `seconds`; worker clocks are summed over the workers)\n")
    out.append(
        table(
            ["phase", "seconds"],
            [[k, f"{v:.2f}"] for k, v in sec.items()]
            + [
                [
                    "outside the stages (process start, imports, writing outputs)",
                    f"{j['wall'] - sum(j['seconds'].values()):.2f}",
                ]
            ],
        )
    )
    m = R["machine"]
    out.append(
        f"\nMachine: {m['cpus']} CPUs, {m['platform']}; commit {m['commit']}; {m['date']}. 1-minute load "
        f"average before/after: job {j['load_before']:.2f}/{j['load_after']:.2f}, baseline "
        f"{b['load_before']:.2f}/{b['load_after']:.2f} (a shared host: other work slows either side)."
    )
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.job_level", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    ap.add_argument(
        "--data", default=str(DEFAULT_DATA), help="SQuAD-format file (default: ../shared/data/squad-v2-dev-half.json)"
    )
    ap.add_argument(
        "--questions", type=int, default=500, help="questions sampled for the job (data.sample, seed --seed)"
    )
    ap.add_argument(
        "--baseline-questions",
        type=int,
        default=None,
        help="questions for the baseline, a seeded subset of the same sample (default: all of them); "
        "fewer: the full time is extrapolated from its per-question rate",
    )
    ap.add_argument("--seed", type=int, default=0, help="data.seed of the sample, and of the baseline's subset")
    ap.add_argument("--job", default=str(QUICKSTART), help="the job (default: jobs/quickstart.yaml)")
    ap.add_argument(
        "--max-length", type=int, default=384, help="the baseline pads every input to this (prior work: 384)"
    )
    ap.add_argument("--backbone", default="resnet50", help="the baseline's CNN (prior work: ResNet-50, 2048-d)")
    ap.add_argument("--out", default=None, help="write every raw number here (JSON)")
    ap.add_argument("--baseline-process", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    # As the CLI does for the job (rapids_attn/run.py), before torch loads, and inherited by the baseline's
    # process: OpenMP threads that spin while waiting make a batch-1 loop on a busy host many times slower.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if args.baseline_process:
        print("RESULT " + json.dumps(baseline_process(json.loads(args.baseline_process))), flush=True)
        return 0
    nb = args.questions if args.baseline_questions is None else args.baseline_questions
    if not Path(args.data).is_file():
        print(f"error: --data: no such file: {args.data}", file=sys.stderr)
        return 2
    if not 0 < nb <= args.questions:
        print(f"error: --baseline-questions must be 1..--questions ({args.questions}), got {nb}", file=sys.stderr)
        return 2
    from rapids_attn.data import read_examples
    from rapids_attn.jobfile import load_job

    sample = read_examples(args.data, format="squad", sample=args.questions, seed=args.seed)
    ids = random.Random(args.seed).sample([e.id for e in sample], nb) if nb < len(sample) else [e.id for e in sample]
    R: dict = {"args": {**vars(args), "baseline_questions": nb}, "machine": machine_info()}
    with tempfile.TemporaryDirectory(prefix="bench-job-") as d:
        tmp = Path(d)
        job_yaml = write_job(Path(args.job), Path(args.data), args.questions, args.seed, tmp / "run", tmp / "job.yaml")
        model = load_job(job_yaml).model.model_dump(exclude_none=True)
        spec = {
            "data": str(Path(args.data).resolve()),
            "sample": args.questions,
            "seed": args.seed,
            "model": model,
            "backbone": args.backbone,
            "max_length": args.max_length,
        }
        # The host's load drifts over minutes: half the baseline's questions run before the job and
        # half after, so a slow spell does not fall on one side only.
        halves = [ids[0::2], ids[1::2]] if nb > 1 else [[], ids]
        runs = []
        if halves[0]:
            print(f"baseline: {len(halves[0])} questions", file=sys.stderr, flush=True)
            runs.append(run_baseline({**spec, "ids": halves[0]}, tmp))
        print(f"job: {len(sample)} questions, python -m rapids_attn.run {job_yaml}", file=sys.stderr, flush=True)
        R["job"] = run_job(job_yaml, tmp / "run")
        print(f"baseline: {len(halves[1])} questions", file=sys.stderr, flush=True)
        runs.append(run_baseline({**spec, "ids": halves[1]}, tmp))
        R["baseline"] = combine(runs)
    R["extrapolated"] = extrapolate(R["baseline"], args.questions)
    R["speedup"] = R["extrapolated"]["wall"] / R["job"]["wall"]
    if args.out:
        Path(args.out).write_text(json.dumps(R, indent=1))
    print(report(R))
    return 0


if __name__ == "__main__":
    sys.exit(main())
