"""Train the pattern CNN on generated maps, on the CPU.

    python -m tools.pattern_cnn.train [--seed 0] [--n-train 50000] [--epochs 12] \\
        [--out rapids_attn/patterns/weights]

1. generates ``--n-train`` labelled maps from stream ``seed`` and featurises them with the pipeline's
   own functions (area_resize, offset_profile, map_stats), two processes in parallel;
2. generates ``--n-heldout`` maps from stream ``seed + 1000`` (never seen in training);
3. trains PatternCNN (AdamW, one-cycle learning rate, batch 256) with torch.manual_seed(seed) and a
   seeded batch order;
4. writes ``pattern_cnn.safetensors`` and ``pattern_cnn.json`` (classes, image size, normalisation
   constants, seeds, held-out accuracy and confusion matrix, the accuracy on the first
   ``SMALL_HELDOUT`` held-out maps that the unit test reproduces, training time and command) and
   prints the accuracy and the confusion matrix.

Same seed, same thread count, same machine type: the same weights (data generation is per-map
seeded, so the worker count does not matter; floating-point reductions may differ across CPUs).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from rapids_attn.patterns.cnn import WEIGHTS_DIR, PatternCNN, save_pattern_cnn
from rapids_attn.patterns.generator import GENERATOR_VERSION, PATTERN_TYPES, generate_features

HELDOUT_OFFSET = 1000  # held-out maps come from stream seed + 1000
SMALL_HELDOUT = 1000  # the unit test re-generates this many held-out maps and checks the accuracy


def _features_job(args):
    seed, count, start, image_size, with_info = args
    torch.set_num_threads(1)
    return generate_features(seed, count, image_size, start=start, with_info=with_info)


def parallel_features(
    seed: int, count: int, image_size: int = 32, workers: int = 2, chunk: int = 1000, with_info: bool = False
):
    """generate_features(seed, count) computed in ``workers`` processes (the same result whatever
    their number: every map is seeded by its own index). Call it under ``if __name__ == "__main__"``
    (the workers are spawned)."""
    jobs = [(seed, min(chunk, count - a), a, image_size, with_info) for a in range(0, count, chunk)]
    if workers <= 1 or len(jobs) == 1:
        parts = [_features_job(j) for j in jobs]
    else:
        with mp.get_context("spawn").Pool(workers) as pool:
            parts = pool.map(_features_job, jobs)
    return tuple(torch.cat([p[i] for p in parts]) for i in range(len(parts[0])))


@torch.inference_mode()
def predict(model: PatternCNN, images, profile, stats, batch_size: int = 4096):
    model.eval()
    out = []
    for a in range(0, images.shape[0], batch_size):
        out.append(model(images[a : a + batch_size], profile[a : a + batch_size], stats[a : a + batch_size]).argmax(1))
    return torch.cat(out)


def confusion(true: torch.Tensor, pred: torch.Tensor, k: int) -> np.ndarray:
    """Rows: true type; columns: predicted type."""
    c = np.zeros((k, k), dtype=np.int64)
    np.add.at(c, (true.numpy(), pred.numpy()), 1)
    return c


def format_confusion(c: np.ndarray, classes=PATTERN_TYPES) -> str:
    """A markdown table, rows true, columns predicted, with each row's recall."""
    head = "| true \\ predicted | " + " | ".join(classes) + " | recall |"
    sep = "|---" * (len(classes) + 2) + "|"
    rows = [head, sep]
    for i, name in enumerate(classes):
        recall = c[i, i] / max(c[i].sum(), 1)
        rows.append(f"| **{name}** | " + " | ".join(str(v) for v in c[i]) + f" | {recall:.3f} |")
    return "\n".join(rows)


def train(
    seed: int = 0,
    n_train: int = 50000,
    epochs: int = 12,
    n_heldout: int = 5000,
    batch_size: int = 256,
    lr: float = 3e-3,
    image_size: int = 32,
    embed_dim: int = 128,
    width: int = 24,
    workers: int = 2,
    out: Path | None = WEIGHTS_DIR,
    command: str | None = None,
    log=print,
) -> tuple[PatternCNN, dict]:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        return _train(
            seed, n_train, epochs, n_heldout, batch_size, lr, image_size, embed_dim, width, workers, out, command, log
        )
    finally:
        torch.set_num_threads(threads)


def _train(seed, n_train, epochs, n_heldout, batch_size, lr, image_size, embed_dim, width, workers, out, command, log):
    t_start = time.perf_counter()
    images, profile, stats, labels = parallel_features(seed, n_train, image_size, workers)
    t_data = time.perf_counter() - t_start
    log(f"generated and featurised {n_train} training maps (stream {seed}) in {t_data:.1f}s")
    h_seed = seed + HELDOUT_OFFSET
    t0 = time.perf_counter()
    h_images, h_profile, h_stats, h_labels = parallel_features(h_seed, n_heldout, image_size, workers)
    t_heldout = time.perf_counter() - t0
    log(f"generated {n_heldout} held-out maps (stream {h_seed}) in {t_heldout:.1f}s")

    torch.manual_seed(seed)
    model = PatternCNN(len(PATTERN_TYPES), image_size, embed_dim, width)
    side = torch.cat([profile, stats], dim=1)
    model.set_normalisation(side.mean(0), side.std(0))
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    steps_per_epoch = -(-n_train // batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=epochs * steps_per_epoch, pct_start=0.15)
    order_gen = torch.Generator().manual_seed(seed)
    t1 = time.perf_counter()
    for epoch in range(epochs):
        model.train()
        perm = torch.randperm(n_train, generator=order_gen)
        total, correct, seen = 0.0, 0, 0
        for a in range(0, n_train, batch_size):
            idx = perm[a : a + batch_size]
            logits = model(images[idx], profile[idx], stats[idx])
            loss = F.cross_entropy(logits, labels[idx], label_smoothing=0.05)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(idx)
            correct += int((logits.argmax(1) == labels[idx]).sum())
            seen += len(idx)
        h_acc = float((predict(model, h_images, h_profile, h_stats) == h_labels).float().mean())
        log(
            f"epoch {epoch + 1}/{epochs}: loss {total / seen:.4f}, train acc {correct / seen:.4f}, "
            f"held-out acc {h_acc:.4f} ({time.perf_counter() - t1:.0f}s)"
        )
    t_train = time.perf_counter() - t1

    pred = predict(model, h_images, h_profile, h_stats)
    acc = float((pred == h_labels).float().mean())
    small = min(SMALL_HELDOUT, n_heldout)
    acc_small = float((pred[:small] == h_labels[:small]).float().mean())
    conf = confusion(h_labels, pred, len(PATTERN_TYPES))
    total_s = time.perf_counter() - t_start
    meta = {
        "name": "pattern-cnn",
        "classes": list(PATTERN_TYPES),
        "image_size": image_size,
        "architecture": {"embed_dim": embed_dim, "width": width, "parameters": n_params},
        "normalisation": {
            "inputs": "profile (offsets -4..4) then stats (STAT_NAMES)",
            "mean": model.side_mean.tolist(),
            "std": model.side_std.tolist(),
        },
        "training": {
            "seed": seed,
            "n_train": n_train,
            "epochs": epochs,
            "batch_size": batch_size,
            "lr": lr,
            "optimizer": "AdamW(weight_decay=1e-4), OneCycleLR, label_smoothing=0.05",
            "torch_threads": torch.get_num_threads(),
            "data_workers": workers,
            "generator_version": GENERATOR_VERSION,
        },
        "heldout": {
            "seed": h_seed,
            "n": n_heldout,
            "accuracy": acc,
            "confusion": conf.tolist(),
            "confusion_axes": "rows true, columns predicted, in the order of classes",
        },
        "heldout_small": {"seed": h_seed, "n": small, "accuracy": acc_small},
        "seconds": {
            "data": round(t_data, 1),
            "heldout_data": round(t_heldout, 1),
            "train": round(t_train, 1),
            "total": round(total_s, 1),
        },
        "machine": {
            "cpu_count": mp.cpu_count(),
            "processor": platform.processor() or platform.machine(),
            "torch": torch.__version__,
        },
        "command": command or "python -m tools.pattern_cnn.train",
    }
    if out is not None:
        w, m = save_pattern_cnn(model, meta, Path(out))
        log(f"wrote {w} ({w.stat().st_size / 1e6:.2f} MB) and {m}")
    log(f"held-out accuracy: {acc:.4f} on {n_heldout} maps (stream {h_seed}); first {small}: {acc_small:.4f}")
    log(
        f"time: {total_s:.0f}s in all ({t_data:.0f}s training data, {t_heldout:.0f}s held-out data, "
        f"{t_train:.0f}s training), {n_params} parameters"
    )
    log("confusion matrix (rows true, columns predicted):\n" + format_confusion(conf))
    return model, meta


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.pattern_cnn.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-train", type=int, default=50000)
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--n-heldout", type=int, default=5000)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--embed-dim", type=int, default=128)
    p.add_argument("--width", type=int, default=24)
    p.add_argument("--workers", type=int, default=2, help="processes generating the data")
    p.add_argument("--out", type=Path, default=WEIGHTS_DIR)
    args = p.parse_args(argv)
    command = "python -m tools.pattern_cnn.train " + " ".join(sys.argv[1:] if argv is None else argv)
    train(
        args.seed,
        args.n_train,
        args.epochs,
        args.n_heldout,
        args.batch_size,
        args.lr,
        32,
        args.embed_dim,
        args.width,
        args.workers,
        args.out,
        command.strip(),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
