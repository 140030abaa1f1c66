"""``python -m benchmarks.kv_eval --model M --pattern RUN/head_classes/duo_attention [options]``: do our head
classes preserve accuracy when kvpress streams the heads they rank lowest? (issue 49; docs/kv-heads.md)

A needle-in-a-haystack sweep with kvpress's ``DuoAttentionPress``: a haystack of real text (SQuAD contexts, or any
text file) cut to each ``--lengths`` in tokens, one needle sentence ("The secret number of the day is N.") placed
at each ``--depths`` share of it, the question asked after it, and the answer generated greedily by kvpress's
``kv-press-text-generation`` pipeline. Each head ranking streams the key-value heads it ranks lowest at each
``--ratios`` (kvpress's ``head_compression_ratio``), with the same sink and window (those of ``--pattern``'s
config.json):

- ``ours``: ``--pattern``'s ``full_attention_heads.tsv``, read as kvpress reads duo-attention's;
- ``random``: seeded uniform values of the same shape (the control: a ranking that knows nothing);
- ``on-the-fly``: kvpress's own ``on_the_fly_scoring`` (it downloads BookSum from the hub, and uses its own
  sink 128 and window 256);
- ``none``: no compression (once per length and depth; the ceiling).

A trial is correct when the answer contains the needle's number. Prints a markdown table of accuracy per
ranking and ratio (with the number of trials), and writes every trial to ``--out`` (JSON). Needs kvpress (its own
environment: ``pip install kvpress``, which pins transformers<5.3) and a model that answers questions; the figures
in docs/kv-heads.md say where it has run. Its harness runs in the consumer tier on a tiny random model
(tests/consumers/test_kv_eval.py), where accuracy means nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from io import StringIO
from pathlib import Path

import numpy as np

RANKINGS = ("ours", "random", "on-the-fly", "none")
NEEDLE = "The secret number of the day is {n}."
QUESTION = "What is the secret number of the day? Answer with the number only."


def read_pattern(folder: Path) -> tuple[int, int, np.ndarray]:
    """(sink_size, recent_size, [layer, key-value head] scores), read the way kvpress reads duo-attention's files."""
    config = json.loads((folder / "config.json").read_text())
    scores = np.clip(np.loadtxt(StringIO((folder / "full_attention_heads.tsv").read_text()), delimiter="\t"), 0, 1)
    return int(config["sink_size"]), int(config["recent_size"]), np.atleast_2d(scores)


def make_press(ranking: str, ratio: float, pattern: Path, seed: int):
    from kvpress import DuoAttentionPress

    if ranking == "none":
        return None
    if ranking == "on-the-fly":
        return DuoAttentionPress(head_compression_ratio=ratio, on_the_fly_scoring=True)
    sink, recent, scores = read_pattern(pattern)
    if ranking == "random":
        scores = np.random.default_rng(seed).uniform(size=scores.shape)

    class FilePress(DuoAttentionPress):
        def load_attention_pattern(self, model):  # kvpress's hook: the pattern of a model it does not ship
            return sink, recent, scores

    return FilePress(head_compression_ratio=ratio)


def haystack_text(path: Path) -> str:
    """A SQuAD JSON's contexts joined, or a text file's text."""
    if path.suffix == ".json":
        doc = json.loads(path.read_text())
        return "\n\n".join(p["context"] for a in doc["data"] for p in a["paragraphs"])
    return path.read_text()


def build_context(tokenizer, hay_ids: list[int], length: int, depth: float, needle: str) -> str:
    """``length`` tokens of the haystack with the needle sentence inserted at ``depth`` of it."""
    n_needle = len(tokenizer.encode(needle, add_special_tokens=False))
    body = hay_ids[: max(1, length - n_needle)]
    cut = round(depth * len(body))
    before = tokenizer.decode(body[:cut])
    after = tokenizer.decode(body[cut:])
    return f"{before} {needle} {after}"


def run(args) -> list[dict]:
    import kvpress  # noqa: F401 - registers the kv-press-text-generation pipeline
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype="auto", attn_implementation="sdpa")
    model = model.to(args.device).eval()
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tok, device=args.device)
    hay = tok.encode(haystack_text(Path(args.haystack)), add_special_tokens=False)
    rng = np.random.default_rng(args.seed)
    trials = []
    for length in args.lengths:
        if len(hay) < length:
            raise SystemExit(f"--haystack: {len(hay)} tokens, fewer than --lengths {length}; pass a longer text")
        for depth in args.depths:
            for k in range(args.needles):
                number = int(rng.integers(1000, 10000))
                context = build_context(tok, hay, length, depth, NEEDLE.format(n=number))
                for ranking in args.rankings:
                    for ratio in [0.0] if ranking == "none" else args.ratios:
                        press = make_press(ranking, ratio, Path(args.pattern), args.seed + k)
                        t0 = time.perf_counter()
                        with torch.inference_mode():
                            answer = pipe(context, question=QUESTION, press=press, max_new_tokens=args.max_new_tokens)
                        trials.append(
                            {
                                "length": length,
                                "depth": depth,
                                "trial": k,
                                "ranking": ranking,
                                "ratio": ratio,
                                "number": number,
                                "answer": answer["answer"],
                                "correct": str(number) in answer["answer"],
                                "compression": None if press is None else float(press.compression_ratio),
                                "seconds": round(time.perf_counter() - t0, 3),
                            }
                        )
    return trials


def table(trials: list[dict]) -> str:
    rows = ["| ranking | ratio | accuracy | trials | KV compression |", "|---|---:|---:|---:|---:|"]
    keys = sorted({(t["ranking"], t["ratio"]) for t in trials}, key=lambda k: (RANKINGS.index(k[0]), k[1]))
    for ranking, ratio in keys:
        ts = [t for t in trials if t["ranking"] == ranking and t["ratio"] == ratio]
        acc = sum(t["correct"] for t in ts) / len(ts)
        comp = [t["compression"] for t in ts if t["compression"] is not None]
        rows.append(
            f"| {ranking} | {ratio:g} | {acc:.2f} | {len(ts)} | {np.mean(comp):.3f} |"
            if comp
            else f"| {ranking} | {ratio:g} | {acc:.2f} | {len(ts)} | 0 |"
        )
    return "\n".join(rows)


def main(argv=None) -> int:
    default_hay = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad-v2-dev-half.json"
    p = argparse.ArgumentParser(prog="python -m benchmarks.kv_eval", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a causal LM folder or hub id")
    p.add_argument("--pattern", required=True, help="the duo_attention folder of a run's head_classes/")
    p.add_argument("--rankings", nargs="+", default=["ours", "random", "none"], choices=RANKINGS)
    p.add_argument("--ratios", nargs="+", type=float, default=[0.25, 0.5, 0.75])
    p.add_argument("--lengths", nargs="+", type=int, default=[4096])
    p.add_argument("--depths", nargs="+", type=float, default=[0.1, 0.5, 0.9])
    p.add_argument("--needles", type=int, default=5, help="trials per length and depth")
    p.add_argument("--haystack", default=str(default_hay), help="a SQuAD JSON or a text file")
    p.add_argument("--max-new-tokens", type=int, default=12)
    p.add_argument("--device", default="cuda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    trials = run(args)
    print(table(trials))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "trials": trials}, indent=1)
        )
        print(f"raw results: {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
