"""``python -m benchmarks.forward_ratio`` (from the repository root): the whole job against the bare forward
pass of its model over the same inputs, wall clock, side by side in one run (issue 16).

The job is ``--job`` (default ``jobs/quickstart.yaml``: MiniLM, the pattern CNN, two local one-thread
workers) on ``--questions`` SQuAD questions sampled from ``--data`` (``data.sample``, ``data.seed``), with the
default shard size (`auto`: 64 for 500 questions), the report off and the relevance stage off (not part of the default job). Its time
is the wall clock from launching ``python -m rapids_attn.run`` to its exit: process start, preflight, worker
start, model loading, extract, learn and explain all count.

The bare forwards run in their own processes, one per attention (``eager``, ``sdpa``; ``--forwards`` picks), on the same questions
tokenized the same way (the job's tokenizer and max_length), in the job's batches (its shards of
``extract.shard_size`` questions, each grouped by the extractor's least-cost rule under its token budget), with torch on every core (``torch.set_num_threads(os.cpu_count())``) and inference mode: the
model's forward and nothing else, timed from the first batch to the last (model loading excluded). Each
bare forward runs once before the job and once after, so the host's drifting load falls on both sides;
their mean is the figure.

Printed: the three times, the job's throughput as a fraction of each bare forward's (bare seconds / job
seconds), and where the job's time goes, by phase (summary.json: preflight, worker start, model load per
worker, extract's forward / embed / write summed over workers, the extract stage's wall clock, learn,
explain, worker stop). Results are recorded in docs/benchmarks.md (its rows; the
protocol: docs/decisions/2026-11-26-forward-ratio.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.job_level import DEFAULT_DATA, QUICKSTART, REPO, run_job, write_job


def bare_model(mcfg, attention: str):
    """The job's model with plain ``eager`` or ``sdpa`` attention (transformers' own implementations)."""
    import torch
    from transformers import AutoModel

    from rapids_attn.extract.model import resolve_model_name

    model = AutoModel.from_pretrained(
        resolve_model_name(mcfg.name), revision=mcfg.revision, attn_implementation=attention, dtype=torch.float32
    )
    assert model.config._attn_implementation == attention, model.config._attn_implementation
    return model.eval()


def job_batches(tok, data: str, sample: int, seed: int, max_length: int, ecfg, hidden_size: int):
    """The sampled questions as the job batches them on the CPU: its shards of ``extract.shard_size`` consecutive
    questions, each grouped by the extractor's least-cost rule (:class:`BatchCost`): (token counts, batches of
    indices, padded model inputs)."""
    from rapids_attn.data import read_examples
    from rapids_attn.extract.batching import BatchCost, length_batches, tokenize
    from rapids_attn.extract.stage import resolve_shard_size

    examples = list(read_examples(data, format="squad", sample=sample, seed=seed))
    t = tokenize(tok, examples, max_length)
    cost = BatchCost.for_model(hidden_size, "cpu")
    batches = []
    shard = resolve_shard_size(ecfg.shard_size, len(examples))  # the job's: auto by default
    for start in range(0, len(examples), shard):
        lengths = t.lengths[start : start + shard]
        for b in length_batches(lengths, ecfg.token_budget, ecfg.max_batch_size, cost=cost):
            batches.append([start + i for i in b])
    keep = ("input_ids", "attention_mask", "token_type_ids")
    encs = [
        {k: v for k, v in tok.pad(t.batch(i), padding=True, return_tensors="pt").items() if k in keep} for i in batches
    ]
    return t.lengths, batches, encs


def bare_process(spec: dict) -> dict:
    """One bare forward (``--bare``): load the model with ``spec['attention']``, then time its forward over
    the questions in the job's batches."""
    import torch

    from rapids_attn.extract.model import load_tokenizer
    from rapids_attn.job import ExtractConfig, ModelConfig

    torch.set_num_threads(os.cpu_count())
    mcfg, ecfg = ModelConfig(**spec["model"]), ExtractConfig(**spec["extract"])
    tok = load_tokenizer(mcfg)
    model = bare_model(mcfg, spec["attention"])
    lengths, batches, encs = job_batches(
        tok, spec["data"], spec["sample"], spec["seed"], spec["max_length"], ecfg, model.config.hidden_size
    )
    t0 = time.perf_counter()
    with torch.inference_mode():
        for enc in encs:
            model(**enc)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "examples": len(lengths), "batches": len(batches), "tokens": sum(lengths)}


def in_process(data: str, questions: int, seed: int, rounds: int = 2) -> dict:
    """``--in-process``: on one thread, in this process, over the job's batches of ``questions`` questions: the
    bare eager forward, the bare SDPA forward, the blocked capture (the model's output, from the job's default
    ``attention_base``, plus every map's image, statistics, profile and detectors, as a worker computes them), and
    extract as a worker runs it (the capture and the pattern CNN over every map), alternated ``rounds`` times; the
    best round of each."""
    import torch

    from rapids_attn.extract.capture import AttentionCapture
    from rapids_attn.extract.maps import LayerReducer, TokenMasks, punctuation_ids, separator_ids
    from rapids_attn.extract.model import load_model, load_tokenizer
    from rapids_attn.job import ExtractConfig, ModelConfig

    torch.set_num_threads(1)
    mcfg, ecfg = ModelConfig(name="minilm-l6"), ExtractConfig()
    tok = load_tokenizer(mcfg)
    sep, punct = separator_ids(tok), punctuation_ids(tok)
    models = {a: bare_model(mcfg, a) for a in ("eager", "sdpa")}
    models["blocked"] = load_model(mcfg, "cpu", "float32", attention="blocked", base=ecfg.attention_base)
    lengths, batches, encs = job_batches(tok, data, questions, seed, 512, ecfg, models["blocked"].config.hidden_size)
    n_layers = models["blocked"].config.num_hidden_layers
    n_heads = models["blocked"].config.num_attention_heads

    def bare(m):
        with torch.inference_mode():
            for e in encs:
                m(**e)

    from rapids_attn.embed import build_embedder
    from rapids_attn.job import EmbedConfig

    cnn = build_embedder(EmbedConfig(), 32, "cpu", "float32")

    def capture(embed: bool = False):
        for e, idx in zip(encs, batches, strict=True):
            masks = TokenMasks.from_ids(e["input_ids"], sep, punct, host_ids=e["input_ids"])
            red = LayerReducer(
                [lengths[i] for i in idx], masks, list(range(n_layers)), list(range(n_heads)), 32, 16, False, "cpu"
            )
            AttentionCapture(models["blocked"], n_layers).run(e, red)
            if embed:  # as a worker does after each batch: the pattern CNN over every map's image
                m = red.images.shape[0] * n_layers * n_heads
                cnn.embed(red.images.reshape(m, 32, 32), red.profile.reshape(m, -1), red.stats.reshape(m, -1))

    cases = {
        "bare eager": lambda: bare(models["eager"]),
        "bare sdpa": lambda: bare(models["sdpa"]),
        "blocked capture": capture,
        "extract (capture + pattern CNN)": lambda: capture(embed=True),
    }
    seconds: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):
        for name, f in cases.items():
            t0 = time.perf_counter()
            f()
            seconds[name].append(time.perf_counter() - t0)
    return {"questions": len(lengths), "batches": len(batches), "seconds": seconds}


def run_bare(spec: dict) -> dict:
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.forward_ratio", "--bare", json.dumps(spec)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"the bare forward failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(lines[-1][7:])


def phases(job: dict) -> list[tuple[str, float]]:
    s, w = job["seconds"], job["worker_seconds"]
    n = max(int(job["workers"] or 1), 1)
    rows = [
        ("process start and imports (wall - stage clocks)", job["wall"] - sum(s.values())),
        ("preflight", s.get("preflight", 0.0)),
        ("worker start (LocalCluster)", s.get("cluster_start", 0.0)),
        ("extract stage, wall clock", s.get("extract", 0.0)),
        (f"  model load, summed over {n} workers", w.get("load", 0.0)),
        (f"  forward and reductions, summed over {n} workers", w.get("forward", 0.0)),
        (f"  embedding (CNN), summed over {n} workers", w.get("embed", 0.0)),
        (f"  tokenize and write, summed over {n} workers", w.get("tokenize", 0.0) + w.get("write", 0.0)),
        (
            "  idle worker time (workers x extract wall - their busy seconds)",
            n * s.get("extract", 0.0) - sum(w.values()),
        ),
        ("learn (PCA, KMeans sweep, stability)", s.get("learn", 0.0)),
        ("worker stop", s.get("cluster_stop", 0.0)),
        ("explain", s.get("explain", 0.0)),
    ]
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.forward_ratio", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="SQuAD JSON (default: ../shared/data/...)")
    ap.add_argument("--questions", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--job", default=str(QUICKSTART))
    ap.add_argument("--out", default=None, help="write every raw number here (JSON)")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change a job field (YAML value), e.g. --set cluster.k_sweep=null: what one phase costs",
    )
    ap.add_argument(
        "--forwards",
        nargs="+",
        choices=["eager", "sdpa"],
        default=["eager", "sdpa"],
        help="which bare forwards to run beside the job (both by default; eager alone halves a long run's time)",
    )
    ap.add_argument("--bare", default=None, help=argparse.SUPPRESS)
    ap.add_argument(
        "--in-process",
        action="store_true",
        help="instead: on one thread in one process, the bare eager and SDPA forwards against the blocked capture",
    )
    args = ap.parse_args(argv)
    if args.in_process:
        r = in_process(args.data, args.questions, args.seed)
        best = {k: min(v) for k, v in r["seconds"].items()}
        print(
            f"{r['questions']} SQuAD questions, {r['batches']} batches, one thread, best of {len(r['seconds']['bare eager'])}\n"
        )
        print("| | seconds | bare eager / this |")
        print("|---|---|---|")
        for name, sec in best.items():
            print(f"| {name} | {sec:.2f} | {best['bare eager'] / sec:.2f} |")
        return 0
    if args.bare:
        print("RESULT " + json.dumps(bare_process(json.loads(args.bare))), flush=True)
        return 0
    data = Path(args.data)
    if not data.is_file():
        print(f"error: --data: no such file: {data}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        run_dir = tmp / "run"
        job_yaml = write_job(Path(args.job), data, args.questions, args.seed, run_dir, tmp / "job.yaml")
        spec_job = yaml.safe_load(job_yaml.read_text())
        spec_job.setdefault("relevance", {})["enabled"] = False  # not a default stage
        for item in args.set:
            key, _, value = item.partition("=")
            *path, leaf = key.split(".")
            node = spec_job
            for part in path:
                node = node.setdefault(part, {})
            node[leaf] = yaml.safe_load(value)
        job_yaml.write_text(yaml.safe_dump(spec_job, sort_keys=False))
        from rapids_attn.jobfile import load_job

        cfg = load_job(job_yaml)
        from rapids_attn.extract.model import describe_model

        info = describe_model(cfg.model, check_files=False, attention=cfg.extract.attention)
        spec = {
            "data": str(data.resolve()),
            "sample": args.questions,
            "seed": args.seed,
            "model": cfg.model.model_dump(mode="json"),
            "extract": cfg.extract.model_dump(mode="json"),
            "max_length": info.max_length,
        }
        bare: dict[str, list[dict]] = {att: [] for att in dict.fromkeys(args.forwards)}
        for att, runs in bare.items():
            runs.append(run_bare({**spec, "attention": att}))
            print(f"  bare {att} forward: {runs[-1]['seconds']:.1f} s", file=sys.stderr, flush=True)
        job = run_job(job_yaml, run_dir)
        print(f"  job: {job['wall']:.1f} s", file=sys.stderr, flush=True)
        for att, runs in bare.items():
            runs.append(run_bare({**spec, "attention": att}))
            print(f"  bare {att} forward: {runs[-1]['seconds']:.1f} s", file=sys.stderr, flush=True)
    mean = {att: statistics.fmean(r["seconds"] for r in runs) for att, runs in bare.items()}
    print(
        f"{args.questions} SQuAD questions (sample seed {args.seed}), {Path(args.job).name} with relevance off"
        f"{''.join(', ' + x for x in args.set)}; "
        f"{os.cpu_count()} CPUs; capture: {info.attention}\n"
    )
    print("| | seconds | job throughput / this one's |")
    print("|---|---|---|")
    for att, runs in bare.items():
        each = ", ".join(f"{r['seconds']:.1f}" for r in runs)
        print(f"| bare {att} forward (before, after: {each}) | {mean[att]:.1f} | {mean[att] / job['wall']:.2f} |")
    print(f"| the whole job, wall clock | {job['wall']:.1f} | 1.00 |")
    print("\n| phase of the job | seconds |")
    print("|---|---|")
    for name, sec in phases(job):
        print(f"| {name} | {sec:.1f} |")
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "args": vars(args),
                    "machine": {
                        "platform": platform.platform(),
                        "cpus": os.cpu_count(),
                        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    },
                    "bare": bare,
                    "job": job,
                    "ratios": {att: mean[att] / job["wall"] for att in mean},
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
