"""``python -m benchmarks.campaign_overhead [--repeats 3] [--examples 8] [--records 1000] [--out FILE]`` (from the
repository root): what a campaign (issue 50) adds to each run, and how long ``status`` takes over many runs.

One tiny run (a 2-layer, 2-head BERT with random weights and MiniLM's tokenizer, made by the script; the first
``--examples`` questions of the quickstart data shipped in the package; pooled embeddings, no report) is timed
three ways, the modes alternating within each repeat and every run in a fresh output folder:

- ``direct``: ``python -m rapids_attn.run JOB --set model.name=... --set output.dir=...``;
- ``sequence``: ``python -m rapids_attn.campaign CAMPAIGN run`` over a campaign of that one run;
- ``dask local:2``: ``python -m rapids_attn.campaign CAMPAIGN run --dask local:2`` (a local Dask cluster of two
  worker processes started, the run one task on it, the cluster closed).

The seconds are each command's wall clock from launch to exit; a campaign's overhead is its seconds less the
direct run's of the same repeat, and ``outside the run`` is its seconds less the run's own process's (the task
record's ``seconds``): what the campaign itself costs (its start, the job's validation, the cluster), apart from
the run's noise. The job's runtime is a local cluster of one thread worker, the same in every mode (the Dask mode's
allotment, ``runtime.n_workers`` = the worker's share of the CPUs, is 1 on two CPUs).

``status``: a campaign of ``--records`` runs whose task records (and summary.json) are planted, all done; the wall
clock of ``python -m rapids_attn.campaign CAMPAIGN status`` and the in-process time of reading every run's state.
Prints a table and writes the raw numbers as JSON to ``--out`` (default
``benchmarks/results/campaign-overhead-<date>.json``). Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

_REPO = Path(__file__).resolve().parent.parent
MODES = ("direct", "sequence", "dask local:2")


def tiny_model(out: Path) -> Path:
    """A 2-layer, 2-head BERT (hidden 32) with random weights and MiniLM's WordPiece tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from rapids_attn.extract.model import resolve_model_name

    tok = AutoTokenizer.from_pretrained(resolve_model_name("minilm-l6"))
    cfg = BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    BertModel(cfg).save_pretrained(out)
    tok.model_max_length = 128
    tok.save_pretrained(out)
    return out


def job_doc(examples: int) -> dict:
    return {
        "name": "overhead",
        "extends": ["data/quickstart"],
        "data": {"limit": examples},
        "model": {"name": "placeholder"},
        "extract": {"image_size": 8, "thumbnail_size": 4, "shard_size": 8, "token_budget": 512},
        "embed": {"name": "pooled", "pooled_size": 4},
        "reduce": {"pca_components": 4},
        "cluster": {"method": "kmeans", "n_clusters": 2, "k_sweep": None, "silhouette_sample": 200},
        "relevance": {"enabled": False},
        "explain": {"report": False, "explorer": False, "head_views": 0},
        "runtime": {
            "cluster": "local",
            "n_workers": 1,
            "threads_per_worker": 1,
            "processes": False,
            "learn_backend": "cpu",
            "dashboard_address": ":0",
        },
    }


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=_REPO, check=False, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return seconds


def one_repeat(root: Path, i: int, job: Path, model: Path) -> dict:
    """Each mode once, in a fresh output folder: its seconds and (campaigns) the run's own seconds."""
    row = {}
    for mode in MODES:
        folder = root / f"r{i}-{mode.replace(' ', '-').replace(':', '')}"
        folder.mkdir()
        if mode == "direct":
            cmd = [sys.executable, "-m", "rapids_attn.run", str(job), "--set", f"model.name={model}"]
            row[mode] = {"seconds": timed([*cmd, "--set", f"output.dir={folder / 'run'}"])}
            continue
        campaign = folder / "campaign.yaml"
        doc = {"name": "overhead", "job": str(job), "models": [{"name": str(model), "label": "tiny"}]}
        campaign.write_text(yaml.safe_dump({**doc, "output": {"dir": str(folder / "out")}}, sort_keys=False))
        extra = ["--dask", "local:2"] if mode.startswith("dask") else []
        seconds = timed([sys.executable, "-m", "rapids_attn.campaign", str(campaign), "run", *extra])
        rec = json.loads(next((folder / "out" / "tasks").rglob("*.json")).read_text())
        row[mode] = {
            "seconds": seconds,
            "run_seconds": rec["seconds"],
            "worker": rec.get("worker"),
            "env": rec.get("env"),
        }
    return row


def status_time(root: Path, records: int) -> dict:
    """``status`` over ``records`` planted, finished runs: the command's wall clock, and reading the states."""
    from rapids_attn.campaign.plan import load_campaign
    from rapids_attn.campaign.tasks import state_of, write_record

    root.mkdir()
    (root / "job.yaml").write_text(yaml.safe_dump({"name": "x", "data": {"path": "x.jsonl"}, "model": {"name": "x"}}))
    doc = {"name": "many", "job": "job.yaml", "models": [{"name": f"m{i}"} for i in range(records)]}
    path = root / "campaign.yaml"
    path.write_text(yaml.safe_dump({**doc, "output": {"dir": "out"}}))
    c = load_campaign(path, validate_jobs=False)
    for r in c.runs:
        r.run_dir.mkdir(parents=True)
        (r.run_dir / "summary.json").write_text("{}")
        write_record(c, r, {"index": r.index, "spec": r.spec_hash, "rc": 0, "seconds": 1.0, "host": "h"})
    t0 = time.perf_counter()
    c = load_campaign(path, validate_jobs=False)
    states = [state_of(c, r) for r in c.runs]
    in_process = time.perf_counter() - t0
    assert all(s.state == "done" for s in states), {s.state for s in states}
    command = [timed([sys.executable, "-m", "rapids_attn.campaign", str(path), "status"]) for _ in range(3)]
    return {"records": records, "status_seconds": command, "read_states_seconds": round(in_process, 3)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.campaign_overhead", description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--examples", type=int, default=8)
    p.add_argument("--records", type=int, default=1000)
    p.add_argument(
        "--out",
        type=Path,
        default=_REPO / "benchmarks" / "results" / f"campaign-overhead-{time.strftime('%Y-%m-%d')}.json",
    )
    args = p.parse_args(argv)
    from benchmarks import machine_info, scratch

    with scratch("rapids-attn-bench-campaign-") as tmp:
        model = tiny_model(tmp / "tiny-bert")
        job = tmp / "job.yaml"
        job.write_text(yaml.safe_dump(job_doc(args.examples), sort_keys=False))
        timed(
            [
                sys.executable,
                "-m",
                "rapids_attn.run",
                str(job),
                "--set",
                f"model.name={model}",
                "--set",
                f"output.dir={tmp / 'warm'}",
            ]
        )  # fmt: skip  (a first run: the file caches warm)
        rows = []
        for i in range(args.repeats):
            rows.append(one_repeat(tmp, i, job, model))
            print(f"repeat {i + 1}/{args.repeats}: " + ", ".join(f"{m} {rows[-1][m]['seconds']:.1f} s" for m in MODES),
                  file=sys.stderr, flush=True)  # fmt: skip
        status = status_time(tmp / "status", args.records)

    def median(mode: str, key: str = "seconds") -> float:
        return statistics.median(r[mode][key] for r in rows)

    direct = median("direct")
    summary = []
    for mode in MODES:
        s = median(mode)
        entry = {"mode": mode, "seconds_per_run": round(s, 1), "overhead_seconds": round(s - direct, 1)}
        entry["ratio"] = round(s / direct, 2)
        if mode != "direct":
            entry["outside_the_run_seconds"] = round(statistics.median(r[mode]["seconds"] - r[mode]["run_seconds"] for r in rows), 1)  # fmt: skip
        summary.append(entry)
    print(f"| mode | s per run (median of {args.repeats}) | overhead s | ratio | outside the run s |")
    print("|---|---:|---:|---:|---:|")
    for e in summary:
        print(
            f"| {e['mode']} | {e['seconds_per_run']} | {e['overhead_seconds']:+} | {e['ratio']} | "
            f"{e.get('outside_the_run_seconds', '')} |"
        )
    st = status["status_seconds"]
    print(
        f"\nstatus over {status['records']:,} runs: {statistics.median(st):.1f} s (the command, median of {len(st)}), "
        f"{status['read_states_seconds']} s reading the states"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "machine": machine_info(),
        "examples": args.examples,
        "repeats": rows,
        "summary": summary,
        "status": status,
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"raw results: {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
