"""``python -m benchmarks.compare`` (from the repository root): what comparing two models map to map costs
against extracting one (issue 37's target: at most 2.2x).

On ``--questions`` SQuAD questions sampled from ``--data`` (seed 0), tokenized and batched as the extract stage
batches them (``extract.batching.length_batches``, the default budgets), the quickstart job's model (MiniLM) in
this one process, on every core:

- **extract**: one model's extraction of a batch, ``Extractor.run_batch`` (the blocked capture over the job's
  ``extract.attention_base``: the forward, the capture's reductions: images, statistics, profile, detectors;
  the pattern CNN's embedding is the stage's next step and is left out, so the ratio is against the capture
  alone, the harder target);
- **compare**: the two steps of ``rapids_attn.compare.pairwise.compare_batch``, timed apart, of that model
  against a copy with perturbed weights, both loaded as the compare stage loads them (``load_model`` over
  ``forward_base``'s attention): the two forwards keeping queries and keys, then the pairwise pass (cosine and
  Jensen-Shannon block by block).

The two alternate batch by batch (``--rounds`` passes over all batches, after one untimed pass), so the host's
load falls on both alike; the table gives the seconds per example of each and their ratio.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

from benchmarks import machine_info, scratch
from benchmarks.job_level import DEFAULT_DATA, QUICKSTART


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="SQuAD-format file (default: ../shared/data/...)")
    ap.add_argument("--questions", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="compare.json")
    args = ap.parse_args(argv)
    if not Path(args.data).is_file():
        print(f"error: --data: no such file: {args.data}", file=sys.stderr)
        return 2
    import torch

    from rapids_attn.compare.pairwise import QueryKeys, forward_base, pair_sums
    from rapids_attn.extract.batching import length_batches, tokenize
    from rapids_attn.extract.capture import AttentionCapture
    from rapids_attn.extract.model import load_model
    from rapids_attn.extract.shard import Extractor, ShardTask
    from rapids_attn.job import ExtractConfig
    from rapids_attn.jobfile import load_job
    from rapids_attn.pipeline import preflight

    torch.set_num_threads(os.cpu_count())
    with scratch("bench-compare-") as tmp:
        sets = [
            f"data.path={Path(args.data).resolve()}",
            "data.format=squad",
            f"data.sample={args.questions}",
            "data.seed=0",
            "data.squad_unit=question",
            f"output.dir={tmp / 'run'}",
        ]
        cfg = load_job(QUICKSTART, sets)
        plan = preflight(cfg, ("extract",)).ctx
        ex = Extractor(ShardTask.from_job(cfg, plan.layout, plan.model.max_length))
        examples = plan.data.read(range(len(plan.data)))
        t = tokenize(ex.tokenizer, examples, plan.model.max_length)
        e = ExtractConfig()
        batches = length_batches(t.lengths, e.token_budget, e.max_batch_size, e.attention_budget)
        # both compared models as the stage's workers load them (rapids_attn.compare.work): the forwards over
        # forward_base's attention; the second model's weights perturbed
        base = forward_base(e.attention_base)
        dtype = str(next(ex.model.parameters()).dtype).removeprefix("torch.")
        mine = load_model(cfg.model, "cpu", dtype, "blocked", base)
        other = copy.deepcopy(mine)
        with torch.no_grad():
            g = torch.Generator().manual_seed(0)
            for p in other.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=g, dtype=p.dtype))
        cap_a, cap_b = (AttentionCapture(m, plan.model.n_layers) for m in (mine, other))

        def padded(idx):
            enc = ex.tokenizer.pad(t.batch(idx), padding=True, return_tensors="pt")
            return {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}

        def run(kind, idx):
            """Seconds of one batch: extract's; or compare's, as (the two forwards, the pairwise pass), the two
            steps of compare_batch timed apart."""
            t0 = time.perf_counter()
            if kind == "extract":
                ex.run_batch(**t.batch(idx))
                return {"extract": time.perf_counter() - t0}
            with torch.inference_mode():
                batch = padded(idx)
                a, b = QueryKeys(), QueryKeys()
                cap_a.run(batch, a)
                cap_b.run(batch, b)
                t1 = time.perf_counter()
                pair_sums(a, b, batch["attention_mask"].sum(-1))
            return {"forwards": t1 - t0, "pairwise": time.perf_counter() - t1}

        for idx in batches:  # untimed: allocator pools, lazy imports
            run("extract", idx)
            run("compare", idx)
        sec = {"extract": 0.0, "forwards": 0.0, "pairwise": 0.0}
        for _ in range(args.rounds):
            for i, idx in enumerate(batches):
                order = ("extract", "compare") if i % 2 == 0 else ("compare", "extract")
                for kind in order:
                    for k, v in run(kind, idx).items():
                        sec[k] += v
        sec["compare"] = sec["forwards"] + sec["pairwise"]
    n = len(examples) * args.rounds
    R = {
        "machine": machine_info(torch=torch.__version__, threads=torch.get_num_threads()),
        "args": vars(args),
        "examples": len(examples),
        "batches": len(batches),
        "tokens": int(sum(t.lengths)),
        "seconds": sec,
    }
    Path(args.out).write_text(json.dumps(R, indent=1))
    per = {k: v / n for k, v in sec.items()}
    print(f"{len(examples)} questions, {len(batches)} batches, {R['tokens']:,} tokens, {args.rounds} rounds\n")
    print("| | s per example | ratio to extract |\n|---|---|---|")
    for k in ("extract", "compare", "forwards", "pairwise"):
        name = k if k in ("extract", "compare") else f"- of which {k}"
        print(f"| {name} | {per[k]:.4f} | {per[k] / per['extract']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
