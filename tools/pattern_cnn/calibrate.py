"""Fit the pattern CNN's temperature and measure what abstaining costs on generated maps.

    python -m tools.pattern_cnn.calibrate [--fit-seed 3000] [--n-fit 4000] [--eval-seed 1000] \\
        [--n-eval 2000] [--write]

- The temperature T minimises the negative log-likelihood of softmax(logits / T) on ``--n-fit``
  generated maps of stream ``--fit-seed`` (used neither by training, stream 0, nor by the held-out
  set, stream 1000, nor by evaluate.py's planted maps, stream 2000).
- The expected calibration error (15 equal-width bins of the top probability) before and after, on
  ``--n-eval`` maps of the held-out stream ``--eval-seed``.
- The labelling rule (rapids_attn/patterns/rules.py) on those held-out maps: the share labelled
  ``other``, and the accuracy of the named labels, per true type.
- ``--write`` stores ``temperature`` and the fit's provenance in rapids_attn/patterns/weights/pattern_cnn.json.
"""

from __future__ import annotations

import argparse
import itertools
import json

import numpy as np
import torch
from scipy.optimize import minimize_scalar

from rapids_attn.patterns.cnn import META_FILE, load_pattern_cnn
from rapids_attn.patterns.generator import PATTERN_TYPES
from rapids_attn.patterns.rules import LABELS, MIN_PROB, OTHER_INDEX, label
from tools.pattern_cnn.train import parallel_features


@torch.inference_mode()
def logits_of(model, seed: int, n: int, workers: int = 2):
    images, profile, stats, labels = parallel_features(seed, n, 32, workers)
    return model(images, profile, stats).float(), profile, stats, labels


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor) -> float:
    def nll(log_t: float) -> float:
        return float(torch.nn.functional.cross_entropy(logits / np.exp(log_t), labels))

    return float(np.exp(minimize_scalar(nll, bounds=(-3.0, 3.0), method="bounded").x))


def ece(prob: torch.Tensor, correct: torch.Tensor, bins: int = 15) -> float:
    """Expected calibration error: sum over equal-width confidence bins of |accuracy - confidence| x share."""
    prob, correct = prob.double(), correct.double()
    edges = torch.linspace(0, 1, bins + 1, dtype=torch.float64)
    total = 0.0
    for lo, hi in itertools.pairwise(edges):
        m = (prob > lo) & (prob <= hi)
        if m.any():
            total += float(m.double().mean() * (correct[m].mean() - prob[m].mean()).abs())
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fit-seed", type=int, default=3000)
    ap.add_argument("--n-fit", type=int, default=4000)
    ap.add_argument("--eval-seed", type=int, default=1000)
    ap.add_argument("--n-eval", type=int, default=2000)
    ap.add_argument("--write", action="store_true", help="record the temperature in pattern_cnn.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    model, meta = load_pattern_cnn("cpu")
    if args.fit_seed in (meta["training"]["seed"], meta["heldout"]["seed"]):
        raise SystemExit(f"--fit-seed {args.fit_seed} is a stream the training used; pick another")
    fit_logits, _, _, fit_labels = logits_of(model, args.fit_seed, args.n_fit)
    t = fit_temperature(fit_logits, fit_labels)
    logits, profile, stats, labels = logits_of(model, args.eval_seed, args.n_eval)
    before = torch.softmax(logits, 1).max(1)
    after = torch.softmax(logits / t, 1).max(1)
    correct = before.indices == labels
    ece_before, ece_after = ece(before.values, correct), ece(after.values, correct)
    print(f"temperature {t:.4f} (fitted on {args.n_fit} maps of stream {args.fit_seed})")
    print(f"ECE on {args.n_eval} maps of stream {args.eval_seed}: {ece_before:.4f} before, {ece_after:.4f} after")
    pattern, _ = label(logits, stats, profile, t)
    named = pattern != OTHER_INDEX
    print(f"\nthe labelling rule (min calibrated prob {MIN_PROB}) on the same maps:\n")
    print("| true type | maps | labelled other | named correctly | named wrongly |\n|---|---|---|---|---|")
    for c, name in enumerate(PATTERN_TYPES):
        m = labels == c
        k = int(m.sum())
        print(
            f"| {name} | {k} | {int((m & ~named).sum())} | {int((m & named & (pattern == labels)).sum())} "
            f"| {int((m & named & (pattern != labels)).sum())} |"
        )
    acc_named = float((pattern[named] == labels[named]).float().mean()) if named.any() else float("nan")
    print(
        f"| all | {len(labels)} | {int((~named).sum())} ({float((~named).float().mean()):.1%}) "
        f"| accuracy of named labels {acc_named:.4f} | argmax accuracy {float(correct.float().mean()):.4f} |"
    )
    if args.write:
        meta = json.loads(META_FILE.read_text())
        meta["temperature"] = round(t, 6)
        meta["calibration"] = {
            "method": "temperature scaling, NLL minimised over log T (scipy bounded)",
            "fit_seed": args.fit_seed,
            "n_fit": args.n_fit,
            "eval_seed": args.eval_seed,
            "n_eval": args.n_eval,
            "ece_bins": 15,
            "ece_before": round(ece_before, 6),
            "ece_after": round(ece_after, 6),
            "labels": list(LABELS),
            "min_prob": MIN_PROB,
            "command": "python -m tools.pattern_cnn.calibrate --write",
        }
        META_FILE.write_text(json.dumps(meta, indent=1) + "\n")
        print(f"\nwrote temperature to {META_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
