"""Real maps by predicted type, from a run made with ``embed.name: pattern-cnn``.

``python -m tools.pattern_cnn.real_maps RUN_DIR [--png docs/img/minilm-by-type.png]`` prints a
markdown table (share of maps, mean probability, layers and heads where the type dominates) and
draws a grid of random real thumbnails per predicted type, so a reader can judge the labels.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import zarr

from rapids_attn.data.probe import PROBE_GROUP
from rapids_attn.store import schema as S
from rapids_attn.store.zarr_store import decode_thumbnails, read_strings

#: The figure of docs/pattern-cnn.md, in the checkout this file belongs to (tools/pattern_cnn/ is two below it).
FIGURE = Path(__file__).resolve().parents[2] / "docs" / "img" / "minilm-by-type.png"


def summarise(run_dir: Path, per_type: int = 8, seed: int = 0):
    g = zarr.open_group(str(run_dir / "store.zarr"), mode="r")
    classes = list(g.attrs[S.Attr.PATTERN_CLASSES])
    pat = np.asarray(g[S.PATTERN][:], dtype=np.int64)  # [E, L, H]
    prob = np.asarray(g[S.PATTERN_PROB][:], dtype=np.float32)
    real = read_strings(g[S.EXAMPLE_GROUP]) != PROBE_GROUP
    pat, prob = pat[real], prob[real]
    ex_index = np.flatnonzero(real)
    layers, heads = [int(x) for x in g[S.LAYER][:]], [int(x) for x in g[S.HEAD][:]]
    rng = np.random.default_rng(seed)
    rows, picks = [], {}
    total = pat.size
    for k, name in enumerate(classes):
        sel = np.argwhere(pat == k)  # [m, 3]: example (in real), layer, head
        if not len(sel):
            continue
        per_head = np.zeros((len(layers), len(heads)))
        np.add.at(per_head, (sel[:, 1], sel[:, 2]), 1)
        share_of_head = per_head / pat.shape[0]
        top = np.dstack(np.unravel_index(np.argsort(-share_of_head, axis=None), share_of_head.shape))[0][:3]
        rows.append(
            {
                "type": name,
                "maps": len(sel),
                "share": len(sel) / total,
                "mean_prob": float(prob[pat == k].mean()),
                "heads": ", ".join(
                    f"L{layers[a]}-H{heads[b]} ({share_of_head[a, b]:.0%})" for a, b in top if share_of_head[a, b] > 0
                ),
            }
        )
        chosen = sel[rng.choice(len(sel), min(per_type, len(sel)), replace=False)]
        picks[name] = [(int(ex_index[e]), int(la), int(he), float(prob[e, la, he])) for e, la, he in chosen]
    return g, rows, picks, layers, heads


def draw(g, picks: dict, layers, heads, out_png: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = list(picks)
    cols = max(len(v) for v in picks.values())
    fig = Figure(figsize=(1.3 * cols + 1.2, 1.45 * len(names)), dpi=90)
    FigureCanvasAgg(fig)
    for r, name in enumerate(names):
        for c, (ex, la, he, p) in enumerate(picks[name]):
            ax = fig.add_subplot(len(names), cols, r * cols + c + 1)
            t = decode_thumbnails(g[S.THUMBNAILS][ex, la, he])
            ax.imshow(np.sqrt(t / max(t.max(), 1e-9)), cmap="viridis", interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"L{layers[la]}H{heads[he]} ex{ex} p={p:.2f}", fontsize=6)
            if c == 0:
                ax.set_ylabel(name, fontsize=9)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.pattern_cnn.real_maps", description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--png", type=Path, default=FIGURE)
    args = ap.parse_args(argv)
    g, rows, picks, layers, heads = summarise(args.run_dir)
    print("| predicted type | maps | share | mean prob | heads where it dominates (share of the head's maps) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['type']} | {r['maps']:,} | {r['share']:.1%} | {r['mean_prob']:.2f} | {r['heads']} |")
    draw(g, picks, layers, heads, args.png)
    print(f"\n![real maps by predicted type]({args.png.name})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
