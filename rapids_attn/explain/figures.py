"""The report's figures: one PNG per function, written into ``out_dir``; each returns its file name.

Figures are drawn with matplotlib's object API: a ``matplotlib.figure.Figure`` attached to an
explicit Agg canvas, never through ``pyplot``. That is the safe form of ``matplotlib.use("Agg")``:
rendering is headless and thread-safe whatever backend is configured, there is no global figure
state to leak or close, and the backend a caller (a notebook, say) has chosen is left alone.

Cluster colours come from :func:`cluster_colors`, the one palette of :mod:`rapids_attn.explain.palette`, so a
cluster has the same colour in the scatter, in the dominant-cluster grid and in the explorer.
:class:`FigureFiles` holds the names of a report's figures, which :mod:`rapids_attn.explain.report` renders and
:mod:`rapids_attn.explain.sections` links to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import BoundaryNorm, PowerNorm, to_rgba
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from rapids_attn.explain.palette import NOISE, cluster_colour

if TYPE_CHECKING:
    from rapids_attn.explain.findings import HeadTable, KSweep, ScatterSample

DPI = 100
NOISE_COLOR = to_rgba(NOISE)
UNKNOWN_COLOR = (1.0, 1.0, 1.0, 1.0)
#: perceptual colour map for attention thumbnails (bright = more attention)
THUMB_CMAP = "viridis"
#: square-root colour scale for thumbnails: one dominant column (attention to [CLS] or [SEP]) would
#: otherwise leave the rest of the map uniformly dark
THUMB_GAMMA = 0.5
#: cells above this many get no number written in them (it would be unreadable)
MAX_ANNOTATED_CELLS = 400


@dataclass
class FigureFiles:
    """File names of the rendered figures, relative to the report folder."""

    grid: str
    detectors: str
    scatter: dict[str, str] = field(default_factory=dict)  # "cluster" / "layer"; empty without arrays
    occupancy: dict[int, str] = field(default_factory=dict)  # by cluster position in Findings.clusters
    montage: dict[int, str] = field(default_factory=dict)  # likewise; empty without thumbnails
    k_sweep: str | None = None  # None when the learn stage ran no sweep
    #: each report section's figures (the heads stage's heatmaps and pruning curves, ...), in the sections' order
    sections: list[list[str]] = field(default_factory=list)

    def names(self) -> list[str]:
        """Every figure file named here."""
        names = [*self.scatter.values(), *self.occupancy.values(), *self.montage.values(), self.grid, self.detectors]
        return names + ([self.k_sweep] if self.k_sweep else []) + [n for figs in self.sections for n in figs]


# ---------------------------------------------------------------------------------------------
# helpers


def new_figure(width: float, height: float) -> Figure:
    """A figure of this size in inches on its own Agg canvas (no pyplot state)."""
    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def save(fig: Figure, out_dir, name: str) -> str:
    """Write ``fig`` as ``out_dir/name`` (PNG) and return ``name``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / name, dpi=DPI, format="png", bbox_inches="tight", pad_inches=0.1)
    return name


def cluster_colors(cluster_ids) -> dict[int, tuple]:
    """An RGBA colour per cluster id, in the ids' order: the one palette
    (:func:`rapids_attn.explain.palette.cluster_colour`, the explorer's too), so a cluster's colour depends on its
    id alone; noise (-1) grey."""
    return {int(c): to_rgba(cluster_colour(c)) for c in cluster_ids}


def _text_color(rgba) -> str:
    r, g, b, _ = to_rgba(rgba)
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"


def grid_axes(ax, layers, heads):
    """Label a layer-by-head grid's axes and draw white lines between its cells."""
    ax.set_xticks(range(len(heads)))
    ax.set_xticklabels([str(h) for h in heads], fontsize=7 if len(heads) > 16 else 8)
    ax.set_yticks(range(len(layers)))
    ax.set_yticklabels([str(layer) for layer in layers], fontsize=7 if len(layers) > 16 else 8)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(np.arange(-0.5, len(heads), 1), minor=True)
    ax.set_yticks(np.arange(-0.5, len(layers), 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=0.6)
    ax.tick_params(which="minor", length=0)


def grid_size(n_layers: int, n_heads: int, panels: int = 1) -> tuple[float, float]:
    """The size in inches of a figure with ``panels`` layer-by-head grids side by side."""
    cell = 0.42 if n_layers * n_heads <= 400 else max(0.12, 0.42 * (400 / (n_layers * n_heads)) ** 0.5)
    w = min(18.0, max(3.5, n_heads * cell + 1.6)) * panels
    h = min(14.0, max(2.4, n_layers * cell + 1.2))
    return w, h


def finite_max(a: np.ndarray) -> float:
    """The largest finite value of ``a``; 0 when it has none."""
    a = np.asarray(a, dtype=np.float64)
    finite = a[np.isfinite(a)]
    return float(finite.max()) if finite.size else 0.0


def show_thumb(ax, thumb, title: str, fontsize: float = 8):
    t = np.asarray(thumb, dtype=np.float64)
    m = finite_max(t)
    ax.imshow(
        t / m if m > 0 else np.zeros_like(t),
        cmap=THUMB_CMAP,
        norm=PowerNorm(THUMB_GAMMA, vmin=0.0, vmax=1.0),
        interpolation="nearest",
    )
    ax.set_title(title, fontsize=fontsize)
    ax.set_xticks([])
    ax.set_yticks([])


# ---------------------------------------------------------------------------------------------
# figures


def scatter_png(
    out_dir,
    scatter: ScatterSample,
    color_by: str = "cluster",
    *,
    colors: dict | None = None,
    coords_label: str | None = None,
) -> str:
    """All sampled maps in the 2-D coordinates, coloured by cluster (legend) or by layer (colour bar)."""
    if color_by not in ("cluster", "layer"):
        raise ValueError(f"color_by must be 'cluster' or 'layer', not {color_by!r}")
    x = np.asarray(scatter.x, dtype=np.float64)
    y = np.asarray(scatter.y, dtype=np.float64)
    values = np.asarray(getattr(scatter, color_by)).astype(np.int64)
    n = len(x)
    # draw in a fixed random order so a big cluster does not bury the small ones drawn before it
    order = np.random.default_rng(0).permutation(n)
    size = 3.0 if n > 5000 else 6.0 if n > 1000 else 12.0
    fig = new_figure(6.4, 5.2)
    ax = fig.add_subplot(1, 1, 1)
    if color_by == "cluster":
        ids = list(colors) if colors else sorted(set(values.tolist()), key=lambda c: (c == -1, c))
        cmap = colors or cluster_colors(ids)
        rgba = np.array([cmap.get(int(v), NOISE_COLOR) for v in values]) if n else np.zeros((0, 4))
        noise = values[order] == -1
        o_noise, o_rest = order[noise], order[~noise]  # noise underneath
        if len(o_noise):
            ax.scatter(x[o_noise], y[o_noise], s=size, c=rgba[o_noise], linewidths=0, alpha=0.5, rasterized=True)
        if len(o_rest):
            ax.scatter(x[o_rest], y[o_rest], s=size, c=rgba[o_rest], linewidths=0, alpha=0.7, rasterized=True)
        present = [c for c in (list(cmap) if colors else ids) if c in set(values.tolist())]
        handles = [
            Line2D(
                [],
                [],
                marker="o",
                linestyle="",
                markersize=6,
                color=cmap.get(c, NOISE_COLOR),
                label="noise" if c == -1 else str(c),
            )
            for c in present
        ]
        if handles:
            ncol = 1 if len(handles) <= 12 else 2 if len(handles) <= 30 else 3
            ax.legend(
                handles=handles,
                title="cluster",
                fontsize=7,
                title_fontsize=8,
                ncol=ncol,
                loc="upper left",
                bbox_to_anchor=(1.01, 1.0),
                frameon=False,
            )
        ax.set_title(f"{n:,} sampled maps, coloured by cluster", fontsize=10)
    else:
        layers = sorted(set(values.tolist())) or [0]
        lo, hi = layers[0], layers[-1]
        cmap = matplotlib.colormaps["viridis"].resampled(hi - lo + 1)
        norm = BoundaryNorm(np.arange(lo - 0.5, hi + 1.5), cmap.N)
        sc = ax.scatter(
            x[order], y[order], s=size, c=values[order], cmap=cmap, norm=norm, linewidths=0, alpha=0.7, rasterized=True
        )
        cb = fig.colorbar(sc, ax=ax, fraction=0.05, pad=0.02)
        cb.set_label("layer")
        step = max(1, (hi - lo + 1) // 12)
        cb.set_ticks(list(range(lo, hi + 1, step)))
        ax.set_title(f"{n:,} sampled maps, coloured by layer", fontsize=10)
    label = coords_label or "coordinate"
    ax.set_xlabel(f"{label} 1")
    ax.set_ylabel(f"{label} 2")
    ax.tick_params(labelsize=8)
    return save(fig, out_dir, f"scatter_{color_by}.png")


def dominant_grid_png(
    out_dir, heads_table: HeadTable, cluster_ids, *, layers=None, heads=None, colors: dict | None = None
) -> str:
    """Layer x head grid: each cell coloured by the head's dominant cluster, the id written in it;
    a second panel shows how consistently the head falls in one cluster (1 = a fixed pattern)."""
    dom = np.asarray(heads_table.dominant_cluster, dtype=np.int64)
    cons = np.asarray(heads_table.consistency, dtype=np.float64)
    n_layers, n_heads = dom.shape
    layers = list(layers) if layers is not None else list(range(n_layers))
    heads = list(heads) if heads is not None else list(range(n_heads))
    cmap = colors or cluster_colors(cluster_ids)
    rgba = np.array([[cmap.get(int(v), UNKNOWN_COLOR) for v in row] for row in dom]).reshape(n_layers, n_heads, 4)
    annotate = n_layers * n_heads <= MAX_ANNOTATED_CELLS
    fs = 8 if n_heads <= 12 else 6
    w, h = grid_size(n_layers, n_heads, panels=2)
    fig = new_figure(w, h)
    ax1 = fig.add_subplot(1, 2, 1)
    ax1.imshow(rgba, aspect="equal", interpolation="nearest")
    grid_axes(ax1, layers, heads)
    ax1.set_title("dominant cluster of each head", fontsize=10)
    if annotate:
        for i in range(n_layers):
            for j in range(n_heads):
                ax1.text(
                    j,
                    i,
                    "N" if dom[i, j] == -1 else str(dom[i, j]),
                    ha="center",
                    va="center",
                    fontsize=fs,
                    color=_text_color(rgba[i, j]),
                )
    ax2 = fig.add_subplot(1, 2, 2)
    im = ax2.imshow(cons, cmap="Greys", vmin=0.0, vmax=1.0, aspect="equal", interpolation="nearest")
    grid_axes(ax2, layers, heads)
    ax2.grid(which="minor", color="#cccccc", linewidth=0.6)
    ax2.set_title("consistency (1 = same cluster on every example)", fontsize=10)
    if annotate:
        for i in range(n_layers):
            for j in range(n_heads):
                if np.isfinite(cons[i, j]):
                    ax2.text(
                        j,
                        i,
                        f"{cons[i, j]:.2f}"[1:] if 0 <= cons[i, j] < 1 else f"{cons[i, j]:.0f}",
                        ha="center",
                        va="center",
                        fontsize=fs - 1,
                        color="white" if cons[i, j] > 0.55 else "black",
                    )
    cb = fig.colorbar(im, ax=ax2, fraction=0.04, pad=0.02)
    cb.set_label("consistency")
    return save(fig, out_dir, "dominant_grid.png")


def occupancy_png(out_dir, k_index: int, occupancy, layers, heads, *, cluster_id: int | None = None) -> str:
    """Layer x head heatmap for one cluster: the fraction of each head's maps that fall in it (0..1,
    the same scale for every cluster)."""
    occ = np.asarray(occupancy, dtype=np.float64)
    n_layers, n_heads = occ.shape
    w, h = grid_size(n_layers, n_heads)
    fig = new_figure(w + 0.8, h)
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(occ, cmap="magma_r", vmin=0.0, vmax=1.0, aspect="equal", interpolation="nearest")
    grid_axes(ax, list(layers), list(heads))
    ax.grid(which="minor", color="#dddddd", linewidth=0.6)
    name = "noise" if cluster_id == -1 else f"cluster {cluster_id if cluster_id is not None else k_index}"
    ax.set_title(f"{name}: share of each head's maps", fontsize=10)
    if n_layers * n_heads <= MAX_ANNOTATED_CELLS:
        fs = 7 if n_heads <= 12 else 5
        for i in range(n_layers):
            for j in range(n_heads):
                v = occ[i, j]
                if np.isfinite(v) and v >= 0.005:
                    ax.text(
                        j,
                        i,
                        f"{100 * v:.0f}",
                        ha="center",
                        va="center",
                        fontsize=fs,
                        color="white" if v > 0.5 else "black",
                    )
    cb = fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02)
    cb.set_label("share of the head's maps")
    return save(fig, out_dir, f"occupancy_{k_index:02d}.png")


def montage_png(
    out_dir, k_index: int, mean_thumb, exemplar_thumbs, exemplar_info, *, cluster_id: int | None = None
) -> str:
    """The cluster's mean map (large) beside its exemplar thumbnails, each captioned
    "L4 H7 ex12" and each scaled to its own maximum so faint maps stay visible."""
    ex = np.asarray(exemplar_thumbs, dtype=np.float64) if exemplar_thumbs is not None else np.zeros((0, 1, 1))
    info = list(exemplar_info or [])
    keep = [i for i in range(len(ex)) if np.isfinite(ex[i]).any()]
    m = len(keep)
    cols = max(1, min(6, int(np.ceil(m / 2)))) if m else 0  # two rows beside the mean map
    rows = int(np.ceil(m / cols)) if m else 0
    rows_grid = max(2, rows)
    fig = new_figure(2.6 + 1.25 * cols, max(2.9, 1.3 * rows_grid + 0.3))
    gs = fig.add_gridspec(rows_grid, 2 + cols, width_ratios=[1, 1] + [1] * cols, wspace=0.25, hspace=0.45)
    ax = fig.add_subplot(gs[0:2, 0:2])
    name = "noise" if cluster_id == -1 else f"cluster {cluster_id if cluster_id is not None else k_index}"
    if mean_thumb is not None:
        show_thumb(ax, mean_thumb, f"{name}: mean map", fontsize=9)
        ax.set_xlabel("key (attended to)", fontsize=8)
        ax.set_ylabel("query", fontsize=8)
    else:
        ax.axis("off")
    for slot, i in enumerate(keep):
        r, c = divmod(slot, cols)
        a = fig.add_subplot(gs[r, 2 + c])
        cap = "?"
        if i < len(info) and info[i] is not None:
            e, layer, head = (int(v) for v in tuple(info[i])[:3])
            cap = f"L{layer} H{head} ex{e}"
        show_thumb(a, ex[i], cap, fontsize=7)
    fig.text(
        0.5,
        0.0,
        "each map scaled to its own maximum, square-root colour scale (bright = most attention); "
        "rows = queries, columns = keys",
        ha="center",
        va="top",
        fontsize=7,
        color="#444444",
    )
    return save(fig, out_dir, f"montage_{k_index:02d}.png")


def k_sweep_png(out_dir, k_sweep: KSweep) -> str:
    """Inertia and silhouette against k; the chosen k marked."""
    k = np.asarray(k_sweep.k, dtype=np.float64)
    series = []
    for key, label in (("inertia", "inertia (within-cluster sum of squares)"), ("silhouette", "silhouette")):
        vals = getattr(k_sweep, key)
        if len(vals):
            v = np.array([np.nan if x is None else x for x in vals], dtype=np.float64)
            series.append((key, label, v))
    chosen = k_sweep.chosen
    fig = new_figure(6.0, 2.3 * max(1, len(series)) + 0.4)
    axes = [fig.add_subplot(len(series) or 1, 1, i + 1) for i in range(max(1, len(series)))]
    for ax, (key, label, v) in zip(axes, series):
        ax.plot(k, v, marker="o", markersize=4, color="#1f77b4" if key == "inertia" else "#2ca02c")
        ax.axvline(float(chosen), color="#d62728", linestyle="--", linewidth=1, label=f"chosen k = {chosen}")
        hit = np.nonzero(k == float(chosen))[0]
        if len(hit) and np.isfinite(v[hit[0]]):
            ax.plot(
                [k[hit[0]]], [v[hit[0]]], marker="o", markersize=8, markerfacecolor="none", markeredgecolor="#d62728"
            )
        ax.legend(fontsize=7, frameon=False)
        ax.set_ylabel(key)
        ax.set_title(label, fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("k (number of clusters)")
    if len(k):
        for ax in axes:
            ax.set_xticks(k if len(k) <= 20 else k[:: int(np.ceil(len(k) / 20))])
    fig.tight_layout()
    return save(fig, out_dir, "k_sweep.png")


def detectors_png(out_dir, scores: dict, names: list[str], layers, heads) -> str:
    """One layer x head heatmap per head detector (TransformerLens's previous-token, duplicate-token and
    induction scores, then the conditional ones): each head's score averaged over the examples where the
    detector is defined (grey: never)."""
    n = len(names)
    first = np.asarray(scores[names[0]], dtype=np.float64)
    n_layers, n_heads = first.shape
    w, h = grid_size(n_layers, n_heads, panels=n)
    fig = new_figure(w + 0.6 * n, h)
    for i, name in enumerate(names):
        ax = fig.add_subplot(1, n, i + 1)
        v = np.asarray(scores[name], dtype=np.float64)
        cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#cccccc")  # NaN: undefined for that head
        im = ax.imshow(np.ma.masked_invalid(v), cmap=cmap, vmin=0.0, vmax=1.0, aspect="equal", interpolation="nearest")
        grid_axes(ax, list(layers), list(heads))
        ax.set_title(name, fontsize=10)
        if n_layers * n_heads <= MAX_ANNOTATED_CELLS:
            for r in range(n_layers):
                for c in range(n_heads):
                    if np.isfinite(v[r, c]) and v[r, c] >= 0.3:
                        ax.text(
                            c,
                            r,
                            f"{v[r, c]:.2f}"[1:] if v[r, c] < 1 else "1",
                            ha="center",
                            va="center",
                            fontsize=6,
                            color="black" if v[r, c] > 0.6 else "white",
                        )
        fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02)
    return save(fig, out_dir, "detectors.png")
