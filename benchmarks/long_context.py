"""``python -m benchmarks.long_context [--lengths 1024 4096 16384 32768] [--device cpu]`` (from the repository
root): peak memory and time of attention capture against the input's length, on a small Llama-config model
with random weights (2 layers, 8 query heads sharing 2 key heads, hidden 256), batch 1.

Four ways to run the same input, each in its own process so that one's peak is not another's:

- ``sdpa``: the bare forward (PyTorch's scaled-dot-product attention): no maps at all, the floor;
- ``blocked``: the job's default capture (rapids_attn/extract/blocked.py): the model's output from SDPA, and
  every head's image, statistics, profile and detectors accumulated from blocks of query rows
  (extract.attention_block_mb, 64 MiB), never a T x T map;
- ``capture``: the same capture with ``extract.attention_base: capture``: the model's output from the capture's
  own blocks of weights (one wider product per block) instead of a second attention by SDPA;
- ``eager``: the capture before it: eager attention, each layer's [heads, T, T] weights reduced whole.

Memory is the peak above what the process held before the forward: on the CPU the resident set's high-water
mark (``ru_maxrss``), on a GPU ``torch.cuda.max_memory_allocated``. A run the machine cannot hold is not
started: its predicted size (the eager path's float32 scores, weights and softmax temporaries, 3 x heads x
T^2 x 4 bytes per layer) is printed instead, beside the memory the machine has. Prints a markdown table,
then the throughput of ``blocked`` and ``capture`` as a fraction of ``sdpa`` at each length. Results are recorded in
docs/benchmarks.md (its rows; the protocol: docs/decisions/2026-11-24-long-context-memory.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HIDDEN, LAYERS, HEADS, KV_HEADS, VOCAB = 256, 2, 8, 2, 1000


def _model(attention: str, length: int, device: str):
    import torch
    from transformers import LlamaConfig, LlamaModel

    from rapids_attn.extract.blocked import register

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=4 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=max(length, 2048),
        use_cache=False,
    )
    impl = {"sdpa": "sdpa", "eager": "eager", "blocked": register("sdpa"), "capture": register("capture")}[attention]
    torch.manual_seed(0)
    return LlamaModel._from_config(cfg, attn_implementation=impl).eval().to(device)


def one(attention: str, length: int, device: str, repeat: int) -> dict:
    """One measurement in this process: {peak_mb, seconds} (the best of ``repeat`` forwards)."""
    import resource

    import torch

    from rapids_attn.extract.capture import AttentionCapture
    from rapids_attn.extract.maps import LayerReducer, TokenMasks

    torch.set_grad_enabled(False)
    model = _model(attention, length, device)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (1, length), generator=g).to(device)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    masks = TokenMasks.from_ids(ids, torch.tensor([1]), torch.tensor([2]))

    def run():
        if attention == "sdpa":
            with torch.inference_mode():
                model(**batch)
            return
        red = LayerReducer([length], masks, list(range(LAYERS)), list(range(HEADS)), 32, 16, True, device)
        AttentionCapture(model, LAYERS).run(batch, red)

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        run()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    return {"peak_mb": peak / 2**20, "seconds": best}


def _available_bytes(device: str) -> int:
    if device == "cuda":
        import torch

        return torch.cuda.mem_get_info()[0]
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.long_context", description=__doc__)
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384, 32768])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--repeat", type=int, default=1, help="forwards per measurement (the best is kept)")
    p.add_argument("--one", nargs=2, metavar=("ATTENTION", "LENGTH"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if min(args.lengths) < 2:
        p.error(f"--lengths: every length must be at least 2 tokens, got {min(args.lengths)}")
    if args.repeat < 1:
        p.error(f"--repeat: at least 1 forward per measurement, got {args.repeat}")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            p.error("--device cuda: no CUDA device is visible; use --device cpu")
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.device, args.repeat)))
        return 0
    avail = _available_bytes(args.device)
    print(
        f"Llama config: {LAYERS} layers, {HEADS} heads ({KV_HEADS} key heads), hidden {HIDDEN}, batch 1, "
        f"{args.device}; {avail / 2**30:.1f} GiB available"
    )
    print(
        "| tokens | sdpa MiB | blocked MiB | capture MiB | eager MiB | sdpa s | blocked s | capture s | eager s "
        "| blocked / sdpa | capture / sdpa |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    failed = 0
    for n in args.lengths:
        row = {}
        for att in ("sdpa", "blocked", "capture", "eager"):
            need = 3 * HEADS * n * n * 4 if att == "eager" else 0
            if need > 0.6 * avail:
                row[att] = {"skipped": f"not run: needs ~{need / 2**30:.0f} GiB"}
                continue
            cmd = [sys.executable, "-m", "benchmarks.long_context", "--one", att, str(n), "--device", args.device]
            cmd += ["--repeat", str(args.repeat)]
            out = subprocess.run(cmd, check=False, capture_output=True, text=True)
            if out.returncode != 0:
                last = (out.stderr.strip().splitlines() or ["?"])[-1][:80]
                row[att] = {"skipped": f"failed (exit {out.returncode}: {last})"}
                failed += 1
                continue
            row[att] = json.loads(out.stdout.strip().splitlines()[-1])

        def cell(att, key, fmt, row=row):
            r = row[att]
            if "skipped" in r:  # the reason under memory; under seconds, what happened
                return r["skipped"] if key == "peak_mb" else r["skipped"].split(":")[0].split(" (")[0]
            return format(r[key], fmt)

        def ratio(att, row=row):
            ok = "seconds" in row["sdpa"] and "seconds" in row[att]
            return f"{row['sdpa']['seconds'] / row[att]['seconds']:.2f}" if ok else "n/a"

        atts = ("sdpa", "blocked", "capture", "eager")
        print(
            f"| {n:,} | {' | '.join(cell(a, 'peak_mb', '.0f') for a in atts)} "
            f"| {' | '.join(cell(a, 'seconds', '.2f') for a in atts)} | {ratio('blocked')} | {ratio('capture')} |",
            flush=True,
        )
    if failed:
        print(f"{failed} measurement(s) failed: see the table", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
