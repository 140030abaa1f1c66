"""``python -m rapids_attn.campaign CAMPAIGN.yaml {run,status,scripts} ...`` (docs/campaigns.md)

- ``run [--index I ...] [--parallel N] [--force]``: the runs (all, or those indices), skipping the finished ones;
  a failing run stops nothing else. Exit 0 when every run asked for is done, 1 when one failed, 2 for a bad
  campaign file (one line, nothing run).
- ``run --dask ADDRESS|SCHEDULER_FILE|local[:N] [--gpus G] [--tls FOLDER] [--plain-tcp]``: the runs as tasks of one
  shared Dask cluster, one run per worker at a time, each inside its worker's CPUs or GPU group
  (:mod:`rapids_attn.campaign.cluster`); the same records, logs, states and exit codes.
- ``status [--json]``: each run's state (done, running, failed with its one-line error, interrupted, stale,
  pending).
- ``merge [--reference MODEL]``: the done runs merged into ``OUT/atlas/`` (heads, matches to the reference model,
  layer similarity, per-family class depths; :mod:`rapids_attn.campaign.merge`).
- ``scripts [--image IMG] [--gpus N] [--parallel P]``: ``campaign.slurm`` (a Slurm array) and ``campaign-k8s.yaml``
  (a Kubernetes indexed Job) in the campaign's output folder, each task ``run --index`` its array index.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rapids_attn.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m rapids_attn.campaign",
        description="Run one job over many models and datasets, each an ordinary run directory.",
    )
    p.add_argument("campaign", help="the campaign's YAML file")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the campaign's runs (finished ones are skipped)")
    r.add_argument("--index", type=int, nargs="+", help="only these runs (a batch scheduler's array index)")
    r.add_argument("--parallel", type=int, default=1, help="runs at once on this machine (default 1)")
    r.add_argument("--force", action="store_true", help="run finished runs again")
    r.add_argument(
        "--dask",
        metavar="ADDRESS|local[:N]",
        help="run them on one Dask cluster: a scheduler's address (tls://host:8786) or file, or local:N (N workers "
        "here); one run per worker at a time",
    )
    r.add_argument(
        "--gpus", type=int, default=0, help="with --dask: GPUs per run (each worker's GPU group; default: CPU runs)"
    )
    r.add_argument("--tls", type=Path, help="with --dask ADDRESS: the cluster's TLS folder (python -m rapids_attn.tls)")
    r.add_argument("--plain-tcp", action="store_true", help="with --dask ADDRESS: join a tcp:// scheduler unencrypted")
    s = sub.add_parser("status", help="each run's state")
    s.add_argument("--json", action="store_true", help="as JSON")
    m = sub.add_parser("merge", help="merge the done runs into one head atlas")
    m.add_argument("--reference", help="the model label every run is matched to (default: the first model)")
    k = sub.add_parser("scripts", help="write a Slurm array script and a Kubernetes indexed Job")
    k.add_argument("--image", default="rapids-attn:latest", help="the container image (docker/Dockerfile)")
    k.add_argument("--gpus", type=int, default=1, help="GPUs per task")
    k.add_argument("--parallel", type=int, help="tasks at once (default: all)")
    return p


def main(argv: list[str] | None = None) -> int:
    from rapids_attn.campaign.plan import load_campaign
    from rapids_attn.campaign.tasks import DONE, FAILED, run_tasks, state_of

    args = build_parser().parse_args(argv)
    try:
        c = load_campaign(args.campaign, validate_jobs=args.command == "run")
        if args.command == "run":
            bad = [i for i in (args.index or []) if not 0 <= i < len(c.runs)]
            if bad:
                raise UserError(f"--index: {bad[0]} is not a run of this campaign (0-{len(c.runs) - 1})")
            if args.parallel < 1:
                raise UserError("--parallel: at least 1")
            say = lambda s: print(s, flush=True)
            if args.dask is None:
                if args.gpus or args.tls or args.plain_tcp:
                    raise UserError("--gpus, --tls and --plain-tcp go with --dask")
                states = run_tasks(c, args.index, args.parallel, args.force, say=say)
            else:
                from rapids_attn.campaign.cluster import parse_target, run_on_cluster

                if args.parallel != 1:
                    raise UserError("--parallel: not with --dask (the cluster's workers run one run each at a time)")
                target = parse_target(args.dask, args.gpus, args.tls, args.plain_tcp)
                states = run_on_cluster(c, args.index, target, args.force, say=say)
            failed = [s for s in states if s.state == FAILED]
            done = sum(s.state == DONE for s in states)
            print(f"campaign {c.spec.name}: {done} of {len(states)} runs done, {len(failed)} failed")
            return 1 if failed or done < len(states) else 0
        if args.command == "status":
            states = [state_of(c, r) for r in c.runs]
            if args.json:
                print(
                    json.dumps(
                        [
                            {"index": s.run.index, "run": s.run.label, "state": s.state, "detail": s.detail}
                            for s in states
                        ],
                        indent=1,
                    )
                )
            else:
                for s in states:
                    print(f"{s.run.index:>4}  {s.run.label:<40} {s.state:<12} {s.detail}")
                counts = {}
                for s in states:
                    counts[s.state] = counts.get(s.state, 0) + 1
                print(f"campaign {c.spec.name}: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
            return 0
        if args.command == "merge":
            from rapids_attn.campaign.merge import merge

            doc = merge(c, args.reference, say=lambda s: print(s, flush=True))
            print(
                f"wrote {c.out / 'atlas'}: {doc['heads']} heads of {len(doc['runs'])} runs matched to "
                f"{doc['reference']}" + (f"; left out: {', '.join(doc['left_out'])}" if doc["left_out"] else "")
            )
            return 0
        from rapids_attn.campaign.scripts import k8s_job, slurm_script

        c.out.mkdir(parents=True, exist_ok=True)
        c.logs_dir.mkdir(parents=True, exist_ok=True)
        (c.out / "campaign.slurm").write_text(slurm_script(c, args.gpus, parallel=args.parallel))
        (c.out / "campaign-k8s.yaml").write_text(k8s_job(c, args.image, args.gpus, args.parallel))
        print(f"wrote {c.out / 'campaign.slurm'} and {c.out / 'campaign-k8s.yaml'} ({len(c.runs)} tasks)")
        return 0
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
