"""A faithful re-implementation of the prior pipeline, to measure against in the same run.

What the closest prior work did (issue 5): one example at a time (batch size 1), every input padded
to the model's maximum length, the full padded attention tensor requested from the model, each map
resized to 224 x 224 and passed through a ResNet one map per call, and the 2048-d (here: the
backbone's) features appended to a CSV file as text. Nothing here is deliberately slowed down: it is
the straightforward way to write that pipeline with the same libraries.
"""

from __future__ import annotations

import csv
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def run_naive(
    model, tokenizer, examples, max_length: int, embedder_net, input_size: int, out_csv: Path, device: str = "cpu"
) -> dict:
    """Returns seconds per phase and the CSV size. ``embedder_net`` maps [1, 3, s, s] -> [1, dim]."""
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1)
    seconds = {"forward": 0.0, "embed": 0.0, "write": 0.0}
    n_maps = 0
    with open(out_csv, "w", newline="") as fh:
        writer = csv.writer(fh)
        for ex in examples:
            t0 = time.perf_counter()
            enc = tokenizer(
                ex.text, ex.text_pair, padding="max_length", truncation=True, max_length=max_length, return_tensors="pt"
            ).to(device)
            with torch.inference_mode():
                att = model(**enc, output_attentions=True).attentions  # L x [1, H, T, T], T = max_length
            t1 = time.perf_counter()
            seconds["forward"] += t1 - t0
            for layer, a in enumerate(att):
                for head in range(a.shape[1]):
                    t2 = time.perf_counter()
                    m = a[0, head][None, None].float()  # the padded map, as the prior work fed it
                    x = F.interpolate(m, size=input_size, mode="bilinear", align_corners=False)
                    x = (x.expand(-1, 3, -1, -1) - mean) / std
                    with torch.inference_mode():
                        f = embedder_net(x)[0].cpu().tolist()
                    t3 = time.perf_counter()
                    writer.writerow([ex.id, layer, head, *f])
                    t4 = time.perf_counter()
                    seconds["embed"] += t3 - t2
                    seconds["write"] += t4 - t3
                    n_maps += 1
    return {"seconds": seconds, "maps": n_maps, "bytes": out_csv.stat().st_size}
