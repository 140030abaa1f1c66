"""Leave one family out: how a pattern CNN labels a type it was never trained on.

    python -m tools.pattern_cnn.leave_one_out [--n-train 8000] [--epochs 5] [--n-eval 3000]

For each of the ten training types (and once with nothing left out, the reference), a small CNN
(``PatternCNN``, the shipped architecture and training recipe: AdamW, one-cycle lr 3e-3, label
smoothing 0.05, batch 256, seed 0) is trained on the first ``--n-train`` maps of the training stream
0 *without* that type, for ``--epochs`` epochs. Its softmax temperature is fitted on maps of stream
3000 (without the type), its logit for the left-out type is masked, and maps are labelled by the
shipped rule (``rapids_attn.patterns.rules.label``: the CNN's type if its defining statistics hold
and its calibrated probability is >= 0.5, else ``other``). Printed per left-out type: how its maps in
the held-out stream 1000 were labelled, and the accuracy of the named labels on the other nine.

These are reduced-budget networks (the shipped one saw 50,000 maps for 12 epochs), so the reference
row gives their accuracy with nothing left out.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import torch
import torch.nn.functional as F

from rapids_attn.patterns.cnn import PatternCNN
from rapids_attn.patterns.generator import PATTERN_TYPES
from rapids_attn.patterns.rules import LABELS, OTHER_INDEX, label
from tools.pattern_cnn.calibrate import fit_temperature
from tools.pattern_cnn.train import parallel_features


def train_without(data, leave_out: int | None, epochs: int, seed: int = 0, batch_size: int = 256, lr: float = 3e-3):
    images, profile, stats, labels = data
    keep = labels != leave_out if leave_out is not None else torch.ones_like(labels, dtype=torch.bool)
    images, profile, stats, labels = images[keep], profile[keep], stats[keep], labels[keep]
    n = len(labels)
    torch.manual_seed(seed)
    model = PatternCNN(len(PATTERN_TYPES))
    side = torch.cat([profile, stats], 1)
    model.set_normalisation(side.mean(0), side.std(0))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    steps = epochs * -(-n // batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.15)
    order = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        model.train()
        perm = torch.randperm(n, generator=order)
        for a in range(0, n, batch_size):
            idx = perm[a : a + batch_size]
            loss = F.cross_entropy(model(images[idx], profile[idx], stats[idx]), labels[idx], label_smoothing=0.05)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    return model.eval()


@torch.inference_mode()
def masked_logits(model, images, profile, stats, leave_out: int | None) -> torch.Tensor:
    z = model(images, profile, stats).float()
    if leave_out is not None:
        z[:, leave_out] = -torch.inf
    return z


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.pattern_cnn.leave_one_out", description=__doc__)
    p.add_argument("--n-train", type=int, default=8000)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--n-fit", type=int, default=2000, help="maps of stream 3000 for the temperature")
    p.add_argument("--n-eval", type=int, default=3000, help="maps of the held-out stream 1000")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    t0 = time.perf_counter()
    train = parallel_features(0, args.n_train, 32, args.workers)
    fit = parallel_features(3000, args.n_fit, 32, args.workers)
    ev = parallel_features(1000, args.n_eval, 32, args.workers)
    print(
        f"data: {args.n_train} training maps (stream 0), {args.n_fit} for the temperature (stream 3000), "
        f"{args.n_eval} held-out (stream 1000), {time.perf_counter() - t0:.0f}s; {args.epochs} epochs each\n"
    )
    print(
        "| left out | its maps | labelled other | named as | named-label accuracy, other nine | other rate, other nine | T | s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for leave_out in (None, *range(len(PATTERN_TYPES))):
        t1 = time.perf_counter()
        model = train_without(train, leave_out, args.epochs)
        keep_fit = fit[3] != leave_out if leave_out is not None else torch.ones_like(fit[3], dtype=torch.bool)
        t = fit_temperature(masked_logits(model, *fit[:3], leave_out)[keep_fit], fit[3][keep_fit])
        pattern, _ = label(masked_logits(model, *ev[:3], leave_out), ev[2], ev[1], t)
        truth = ev[3]
        held = truth == leave_out if leave_out is not None else torch.zeros_like(truth, dtype=torch.bool)
        rest = ~held
        named = rest & (pattern != OTHER_INDEX)
        acc = float((pattern[named] == truth[named]).float().mean())
        other_rest = float((pattern[rest] == OTHER_INDEX).float().mean())
        if leave_out is None:
            name, cells = "(nothing)", "| - | - | - |"
        else:
            got = Counter(LABELS[int(i)] for i in pattern[held])
            k = int(held.sum())
            as_ = ", ".join(f"{n} {c}" for n, c in got.most_common() if n != "other") or "-"
            name = PATTERN_TYPES[leave_out]
            cells = f"| {k} | {got['other'] / k:.1%} | {as_} |"
        print(f"| {name} {cells} {acc:.4f} | {other_rest:.1%} | {t:.3f} | {time.perf_counter() - t1:.0f} |", flush=True)
    print(f"\ntotal {time.perf_counter() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
