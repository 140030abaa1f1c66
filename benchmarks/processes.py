"""``python -m benchmarks.processes`` (from the repository root): what each piece of the process machinery
(``rapids_attn/processes.py``) buys the whole job, measured side by side.

Two jobs, each run from launch to exit (``benchmarks.job_level.timed``: process start, preflight, workers,
stages, exit): the quickstart job as shipped (``jobs/quickstart.yaml``: 46 examples, relevance on), and the
same job on ``--questions`` SQuAD questions sampled from ``--data`` (``benchmarks.job_level.write_job``: one
input each, the default shard size, the report off) with the relevance stage off, so that extract and learn,
where the pieces act, are most of its time. Each is run with every piece on and with each piece off alone
(``RAPIDS_ATTN_WITHOUT=<piece>``), the variants in turn within a round, so the host's drifting load falls on
all of them alike, after one untimed run of each job. The table gives each variant's wall clocks and the median's difference from all-on
(positive: the piece saves that much).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import yaml

from benchmarks import machine_info, scratch
from benchmarks.job_level import DEFAULT_DATA, QUICKSTART, timed, write_job
from rapids_attn.processes import PIECES, WITHOUT_ENV


def run_variant(job: Path, run_dir: Path, off: str | None) -> dict:
    """One run of ``job`` (its output in ``run_dir``) with the piece ``off`` turned off (None: all on)."""
    env_before = os.environ.get(WITHOUT_ENV)
    os.environ[WITHOUT_ENV] = off or ""
    try:
        wall, p = timed([sys.executable, "-m", "rapids_attn.run", str(job), "--overwrite"], job.parent)
    finally:
        if env_before is None:
            os.environ.pop(WITHOUT_ENV, None)
        else:
            os.environ[WITHOUT_ENV] = env_before
    if p.returncode != 0:
        raise RuntimeError(f"the job failed with {off or 'every piece'} off (exit {p.returncode}):\n{p.stderr[-3000:]}")
    s = json.loads((run_dir / "summary.json").read_text())
    stages = {k: v for k, v in s["seconds"].items() if isinstance(v, int | float)}
    return {"wall": wall, "stages": stages, "outside": wall - sum(stages.values()), "maps": s["counts"]["maps"]}


def jobs(tmp: Path, data: Path, questions: int) -> dict[str, tuple[Path, Path]]:
    """The two jobs, written into ``tmp``: name -> (job file, run directory)."""
    qs = yaml.safe_load(QUICKSTART.read_text())
    qs.setdefault("output", {})["dir"] = str(tmp / "quickstart")
    (tmp / "quickstart.yaml").write_text(yaml.safe_dump(qs, sort_keys=False))
    # the presets it extends ship in the package: the copy runs from anywhere
    out = {"quickstart": (tmp / "quickstart.yaml", tmp / "quickstart")}
    if questions:
        job = write_job(QUICKSTART, data, questions, 0, tmp / "squad", tmp / "squad.yaml")
        spec = yaml.safe_load(job.read_text())
        spec.setdefault("relevance", {})["enabled"] = False
        job.write_text(yaml.safe_dump(spec, sort_keys=False))
        out[f"{questions} questions"] = (job, tmp / "squad")
    return out


def report(R: dict) -> str:
    lines = []
    for name, runs in R["runs"].items():
        on = statistics.median(r["wall"] for r in runs["all on"])
        lines += [f"\n{name} ({runs['all on'][0]['maps']:,} maps): wall clock from launch to exit, s", ""]
        lines += ["| variant | runs | median | saved by the piece |", "|---|---|---|---|"]
        for variant, rs in runs.items():
            walls = [r["wall"] for r in rs]
            med = statistics.median(walls)
            saved = "" if variant == "all on" else f"{med - on:+.1f}"
            lines.append(f"| {variant} | {' / '.join(f'{w:.1f}' for w in walls)} | {med:.1f} | {saved} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.processes", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="SQuAD-format file (default: ../shared/data/...)")
    ap.add_argument("--questions", type=int, default=500, help="the second job's questions (0: the quickstart only)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--pieces", default=",".join(PIECES), help="the pieces to turn off, one at a time")
    ap.add_argument("--out", default="processes.json")
    args = ap.parse_args(argv)
    data = Path(args.data)
    if args.questions and not data.is_file():
        print(f"error: --data: no such file: {data}", file=sys.stderr)
        return 2
    pieces = [p.strip() for p in args.pieces.split(",") if p.strip()]
    unknown = sorted(set(pieces) - set(PIECES))
    if unknown:
        print(
            f"error: --pieces: no piece named {', '.join(unknown)}; the pieces are {', '.join(PIECES)}", file=sys.stderr
        )
        return 2
    variants = [None, *pieces]
    R: dict = {"machine": machine_info(), "args": vars(args), "runs": {}}
    with scratch("bench-processes-") as tmp:
        todo = jobs(tmp, data, args.questions)
        for name in todo:
            R["runs"][name] = {("all on" if v is None else f"without {v}"): [] for v in variants}
        for job, run_dir in todo.values():  # untimed: the page cache and the model's files warm for every variant
            run_variant(job, run_dir, None)
        for r in range(args.rounds):
            for v in variants:
                for name, (job, run_dir) in todo.items():
                    res = run_variant(job, run_dir, v)
                    R["runs"][name]["all on" if v is None else f"without {v}"].append(res)
                    print(
                        f"round {r + 1}: {name}, {v or 'all on'}: {res['wall']:.1f} s",
                        file=sys.stderr,
                        flush=True,
                    )
    Path(args.out).write_text(json.dumps(R, indent=1))
    print(report(R))
    return 0


if __name__ == "__main__":
    sys.exit(main())
