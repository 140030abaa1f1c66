"""``python -m benchmarks.cnn``: one CNN at 224 x 224, every CPU execution strategy PyTorch offers.

At matched settings (issue 5) the naive pipeline and ours both spend almost all their time in
ResNet-50 at 224 x 224, so the matched speed-up is bounded by how fast that network can run here.
This measures it, side by side in one process on the same inputs: eager at batch 1 (what the naive
pipeline does), channels-last batches, batch-norm folding, TorchScript freezing, oneDNN tensors,
inductor with freezing (``--compile``: needs a C++ compiler, ~20 s to compile), and the int8
network of ``embed.precision: int8``. Prints a markdown table; results are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
import warnings


def _rate(fn, x, batch: int) -> float:
    import torch

    with torch.inference_mode():
        fn(x[:batch])  # warm-up: kernel selection, lazy initialisation
        t0 = time.perf_counter()
        for start in range(0, x.shape[0], batch):
            fn(x[start : start + batch])
        return x.shape[0] / (time.perf_counter() - t0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cnn", description=__doc__.splitlines()[0])
    ap.add_argument("--backbone", default="resnet50")
    ap.add_argument("--maps", type=int, default=48, help="images per strategy")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--compile", action="store_true", help="also torch.compile with inductor freezing")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    warnings.filterwarnings("ignore")
    import torch
    import torch.nn.functional as F

    from rapids_attn.embed.backbone import BackboneEmbedder, _build_network, _strip_head
    from rapids_attn.patterns.generator import generate_features

    torch.set_num_threads(args.threads)
    emb = BackboneEmbedder(args.backbone, "random", 224, 1024)  # what embed uses: folded, channels-last
    plain = _strip_head(_build_network(args.backbone, "random"))[0].eval()  # the same weights, as built
    net = copy.deepcopy(plain).to(memory_format=torch.channels_last)
    maps = generate_features(11, args.maps, image_size=32)[0]
    x_cl = emb._prepare(maps)  # the network's real input: [n, 3, 224, 224], channels-last
    x = x_cl.contiguous()
    ref = None
    rows = []

    def add(name: str, fn, inp, batch: int):
        nonlocal ref
        r = _rate(fn, inp, batch)
        with torch.inference_mode():
            out = fn(inp[:8]).float()
        if ref is None:
            ref = out
        cos = F.cosine_similarity(out, ref).min().item()
        rows.append((name, batch, r, cos))
        print(f"  {name} batch {batch}: {r:.1f} maps/s", file=sys.stderr, flush=True)

    add("eager, NCHW (the naive pipeline)", plain, x, 1)
    add("eager, NCHW", plain, x, 8)
    add("eager, channels-last", net, x_cl, 1)
    add("eager, channels-last", net, x_cl, 8)
    add("eager, channels-last", net, x_cl, 16)
    add("batch norms folded, channels-last (embed, float32)", emb.net, x_cl, emb.chunk)
    from torch.fx.experimental.optimization import fuse

    with torch.inference_mode():
        frozen = torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.trace(copy.deepcopy(net), x_cl[:8])))
    add("TorchScript freeze + optimize_for_inference", frozen, x_cl, 8)
    from torch.utils import mkldnn

    mk = mkldnn.to_mkldnn(fuse(copy.deepcopy(plain)))
    add("oneDNN tensors (to_mkldnn), folded", lambda t: mk(t.to_mkldnn()).to_dense(), x, 8)
    if args.compile:
        import torch._inductor.config as inductor

        inductor.freezing = True
        compiled = torch.compile(copy.deepcopy(net))
        add("torch.compile, inductor freezing", compiled, x_cl, 8)
    q = BackboneEmbedder(args.backbone, "random", 224, 1024, precision="int8")
    add("int8, oneDNN (embed.precision: int8)", q.net, x_cl, q.chunk)

    base = rows[0][2]
    print(f"### {args.backbone} at 224 x 224 on the CPU ({args.threads} threads, {args.maps} maps per row)\n")
    print("| strategy | batch | maps/s | vs naive | min cosine to naive's features |")
    print("|---|---|---|---|---|")
    for name, batch, r, cos in rows:
        print(f"| {name} | {batch} | {r:.1f} | {r / base:.2f}x | {cos:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
