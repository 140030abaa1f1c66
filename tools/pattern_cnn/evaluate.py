"""The numbers and the figure of docs/pattern-cnn.md.

    python -m tools.pattern_cnn.evaluate [--n-planted 3000] [--planted-seed 2000] \\
        [--figure docs/img/pattern-types.png] [--json PATH]

(a) the shipped network's accuracy and confusion matrix (rows true, columns predicted) on the
    held-out stream recorded in its json (regenerated here), also by length and by causality;
(b) planted types: ``--n-planted`` generated maps of known type (stream ``--planted-seed``, used
    neither for training nor for the held-out set), put through ``rapids_attn.api.analyse_maps``
    (the job's reductions and embedder) and embedded by ``pooled`` (16 x 16), ``resnet18`` with
    random weights, ``pattern-cnn`` (the API's features) and ``pooled`` + profile + stats,
    then written into a store and reduced and clustered by the pipeline's own learn stage
    (``rapids_attn.learn.fit_store``: PCA 32, KMeans with k = number of types, no k sweep, seed 0);
    adjusted Rand index of each clustering against the true types;
(c) the figure: one generated example of each type (docs/img/pattern-types.png);
(d) supervised baselines: logistic regression and gradient-boosted trees on profile + stats (and
    the pooled image), fitted on 10000 training maps, scored on the held-out set: how separable the
    generated types are without the CNN.

Prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from rapids_attn.extract.signature import STAT_NAMES
from rapids_attn.patterns.cnn import load_pattern_cnn
from rapids_attn.patterns.generator import PATTERN_TYPES, sample_map
from tools.pattern_cnn.train import confusion, format_confusion, parallel_features, predict

#: The repository root (tools/pattern_cnn/evaluate.py is two folders below it): the figure goes to its docs/img.
REPO = Path(__file__).resolve().parents[2]
FIGURE = REPO / "docs" / "img" / "pattern-types.png"
LENGTH_BUCKETS = ((8, 16), (17, 64), (65, 256), (257, 512))


# ------------------------------------------------------------------------------------------------
# (a) held-out accuracy


def heldout(model, meta: dict, n: int | None = None, workers: int = 2) -> dict:
    h = meta["heldout"]
    n = h["n"] if n is None else n
    images, profile, stats, labels, lengths, causal = parallel_features(
        h["seed"], n, meta["image_size"], workers, with_info=True
    )
    pred = predict(model, images, profile, stats)
    ok = pred == labels
    by_length = {}
    for lo, hi in LENGTH_BUCKETS:
        m = (lengths >= lo) & (lengths <= hi)
        by_length[f"{lo}-{hi}"] = {"n": int(m.sum()), "accuracy": float(ok[m].float().mean()) if m.any() else None}
    by_causal = {
        name: {"n": int(m.sum()), "accuracy": float(ok[m].float().mean())}
        for name, m in (("bidirectional", ~causal), ("causal", causal))
        if m.any()
    }
    return {
        "seed": h["seed"],
        "n": n,
        "accuracy": float(ok.float().mean()),
        "recorded_accuracy": h["accuracy"],
        "confusion": confusion(labels, pred, len(PATTERN_TYPES)).tolist(),
        "by_length": by_length,
        "by_causality": by_causal,
    }


# ------------------------------------------------------------------------------------------------
# (b) planted types through the pipeline's learn stage


def learn_sections(k: int, pca: int = 32):
    """The learn stage's two job sections: PCA ``pca``, KMeans with ``k`` clusters, no k sweep."""
    from rapids_attn.job import ClusterConfig, ReduceConfig

    return ReduceConfig(pca_components=pca), ClusterConfig(method="kmeans", n_clusters=k, k_sweep=None)


def cluster_with_pipeline(features: np.ndarray, k: int, tmp: Path, stats=None, profile=None) -> tuple[np.ndarray, dict]:
    """Write ``features`` [N, d] as a store of N examples x 1 layer x 1 head, run the learn stage."""
    import zarr

    from rapids_attn.devices import resolve_learn_backend
    from rapids_attn.job import StoreConfig
    from rapids_attn.learn import fit_store
    from rapids_attn.store import schema as S
    from rapids_attn.store.zarr_store import StoreLayout, create_store, write_shard

    reduce, cluster = learn_sections(k)
    store = StoreConfig()
    n, d = features.shape
    layout = StoreLayout(
        n_examples=n,
        layers=[0],
        heads=[0],
        feature_dim=d,
        image_size=32,
        thumb_size=0,
        shard_size=256,
        stat_names=list(STAT_NAMES),
        features_dtype=store.features_dtype,
        compression_level=store.compression_level,
    )
    path = tmp / "store.zarr"
    ids = [f"m{i}" for i in range(n)]
    create_store(path, layout, {}, "planted", {}, ids, [""] * n, [""] * n)
    for s in range(layout.n_shards):
        a, b = layout.shard_rows(s)
        arrays = {S.FEATURES: features[a:b].reshape(b - a, 1, 1, d).astype(store.features_dtype)}
        if stats is not None:
            arrays[S.STATS] = stats[a:b].reshape(b - a, 1, 1, -1).astype(np.float32)
        if profile is not None:
            arrays[S.PROFILE] = profile[a:b].reshape(b - a, 1, 1, -1).astype(np.float32)
        write_shard(str(path), layout, s, arrays)
    g = zarr.open_group(str(path), mode="r+")
    info = fit_store(g, reduce, cluster, resolve_learn_backend("cpu"), seed=0)
    return np.asarray(g[S.CLUSTER][:]).reshape(-1), info


def standardise(x: np.ndarray) -> np.ndarray:
    return (x - x.mean(0)) / np.maximum(x.std(0), 1e-12)


def _over_max(q: torch.Tensor) -> torch.Tensor:
    """Each row divided by its maximum."""
    return q / q.amax(1, keepdim=True)


def planted(n: int, seed: int, workers: int = 2, weights_dir=None) -> list[dict]:
    """Maps ``0 .. n-1`` of stream ``seed`` through the documented API for maps a user already has
    (``rapids_attn.api.analyse_maps``: the job's reductions and embedder); the baselines embed the
    API's own images, profile and stats. With ``weights_dir``, the pattern-cnn row embeds the API's
    images, profile and stats with those weights instead of the shipped ones."""
    from sklearn.metrics import adjusted_rand_score

    from rapids_attn.embed.backbone import BackboneEmbedder
    from rapids_attn.embed.pattern import SIDE_SCALE, SIDE_STATS, PatternCNNEmbedder
    from rapids_attn.embed.pooled import PooledEmbedder
    from rapids_attn.extract.signature import PROFILE_OFFSETS
    from rapids_attn.patterns.generator import generate
    from tools.pattern_cnn.evaluate_independent import analyse

    samples = generate(seed, n)
    truth = np.asarray([s.label for s in samples])
    r = analyse(samples)  # rapids_attn.api.analyse_maps, in chunks of similar length
    del samples
    images, profile, stats = (torch.from_numpy(r[k]) for k in ("images", "profile", "stats"))

    def pattern_cnn() -> torch.Tensor:
        if weights_dir is None:
            return torch.from_numpy(r["features"])
        return PatternCNNEmbedder(weights_dir=weights_dir).embed(images, profile, stats).features

    rows = []
    embedders = [
        ("pooled", "PooledEmbedder(32, 16) on the image", lambda: PooledEmbedder(32, 16)(images)),
        (
            "resnet18 (random weights)",
            'BackboneEmbedder("resnet18", "random", 64, 256) on the image',
            lambda: BackboneEmbedder("resnet18", "random", 64, 256)(images),
        ),
        (
            "pattern-cnn",
            f"`analyse_maps` features: the CNN's embedding, then {SIDE_SCALE:g} x [profile, 8 stats, shared columns]",
            pattern_cnn,
        ),
        (
            "pattern-cnn, embedding only",
            "the CNN's penultimate layer alone (the features before rules v2)",
            lambda: pattern_cnn()[:, : -(len(PROFILE_OFFSETS) + len(SIDE_STATS) + 1)],
        ),
        (
            "pooled + profile + stats",
            "[pooled 256, profile 9, stats 10], every column standardised",
            lambda: torch.from_numpy(
                standardise(torch.cat([PooledEmbedder(32, 16)(images), profile, stats], 1).numpy())
            ),
        ),
        (
            "pooled + profile + stats, raw",
            "the same columns, not standardised (the stats' units dominate PCA)",
            lambda: torch.cat([PooledEmbedder(32, 16)(images), profile, stats], 1),
        ),
        (
            "pooled / max",
            "the pooled image divided by its maximum (what the CNN's trunk sees)",
            lambda: _over_max(PooledEmbedder(32, 16)(images)),
        ),
        (
            "profile + stats",
            "[profile 9, stats 10], every column standardised",
            lambda: torch.from_numpy(standardise(torch.cat([profile, stats], 1).numpy())),
        ),
    ]
    k = len(PATTERN_TYPES)
    for name, what, fn in embedders:
        t0 = time.perf_counter()
        feats = fn().float().numpy()
        t_embed = time.perf_counter() - t0
        with tempfile.TemporaryDirectory() as tmp:
            pred, info = cluster_with_pipeline(feats, k, Path(tmp), r["stats"], r["profile"])
        ari = float(adjusted_rand_score(truth, pred))
        rows.append(
            {
                "embedder": name,
                "input": what,
                "dim": int(feats.shape[1]),
                "ari": ari,
                "silhouette": info["silhouette"],
                "pca_explained_variance": info["pca_explained_variance"],
                "embed_seconds": round(t_embed, 1),
            }
        )
        print(f"  {name}: ARI {ari:.3f} (dim {feats.shape[1]}, embedded in {t_embed:.1f}s)", file=sys.stderr)
    return rows


def supervised_baselines(meta: dict, n_train: int = 10000, workers: int = 2) -> list[dict]:
    """How separable the generated types are without the image branch or without a CNN: classifiers
    fitted on the first ``n_train`` training maps, scored on the recorded held-out set."""
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from rapids_attn.embed.pooled import PooledEmbedder

    tr = parallel_features(meta["training"]["seed"], n_train, 32, workers)
    te = parallel_features(meta["heldout"]["seed"], meta["heldout"]["n"], 32, workers)

    def side(f):
        return torch.cat([f[1], f[2]], 1).numpy()

    def both(f):
        p = PooledEmbedder(32, 16)(f[0])
        return np.hstack([side(f), (p / p.amax(1, keepdim=True)).numpy()])

    rows = []
    for inputs, fx in (("profile + stats", side), ("profile + stats + pooled image / max", both)):
        xtr, xte = fx(tr), fx(te)
        for model_name, model in (
            ("logistic regression", make_pipeline(StandardScaler(), LogisticRegression(max_iter=3000))),
            ("gradient-boosted trees", HistGradientBoostingClassifier(max_iter=200, random_state=0)),
        ):
            model.fit(xtr, tr[3].numpy())
            rows.append(
                {
                    "inputs": inputs,
                    "model": model_name,
                    "n_train": n_train,
                    "accuracy": float(model.score(xte, te[3].numpy())),
                }
            )
    return rows


# ------------------------------------------------------------------------------------------------
# (c) the figure


def _example(dominant: str, causal: bool, n: int, seed: int = 3000, min_weight: float = 0.7):
    """The first map of stream ``seed`` with this type, causality and length whose dominant
    component carries at least ``min_weight`` (an easy-to-read example, mixtures included)."""
    for i in range(500):
        s = sample_map(seed, i, dominant=dominant, causal=causal, n=n)
        if s.mixture[dominant] >= min_weight:
            return s
    return s


def figure(path: Path = FIGURE, n_small: int = 40, n_large: int = 300) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rapids_attn.extract.maps import area_resize

    k = len(PATTERN_TYPES)
    fig, axes = plt.subplots(3, k, figsize=(1.45 * k, 4.9))
    row_titles = [f"n = {n_small}", f"n = {n_small}, causal", f"n = {n_large}: 32 x 32 image"]
    for j, t in enumerate(PATTERN_TYPES):
        for r in range(3):
            ax = axes[r, j]
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 1 and t == "next":
                ax.text(0.5, 0.5, "no causal\nvariant", ha="center", va="center", fontsize=7, transform=ax.transAxes)
                ax.set_facecolor("#eeeeee")
                continue
            s = _example(t, causal=(r == 1), n=(n_large if r == 2 else n_small))
            a = torch.from_numpy(s.attn)
            img = area_resize(a[None], 32)[0] if r == 2 else a
            ax.imshow(img.numpy(), cmap="viridis", vmin=0, vmax=float(img.max()), interpolation="nearest")
            if r < 2:  # separator (red) and punctuation (orange) positions under the map
                for pos, c in ((np.flatnonzero(s.punct), "#ff8c00"), (np.flatnonzero(s.sep), "red")):
                    ax.scatter(pos, np.full(len(pos), s.n + 1.2), marker="^", s=6, c=c, clip_on=False, linewidths=0)
                ax.set_xlim(-0.5, s.n - 0.5)
                ax.set_ylim(s.n - 0.5, -0.5)
            if r == 0:
                ax.set_title(t, fontsize=9)
    for r in range(3):
        axes[r, 0].set_ylabel(row_titles[r], fontsize=7)
    fig.suptitle(
        "Generated attention maps, one per type (rows: queries, columns: keys; "
        "red / orange marks: separator / punctuation tokens)",
        fontsize=8,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------


def markdown(result: dict) -> str:
    h = result["heldout"]
    out = [
        (
            f"### Held-out accuracy\n\n{h['accuracy']:.4f} on {h['n']} maps of stream {h['seed']} "
            f"(recorded at training: {h['recorded_accuracy']:.4f})\n"
        ),
        "Rows true, columns predicted:\n",
        format_confusion(np.array(h["confusion"])),
        "",
        "| subset | maps | accuracy |",
        "|---|---|---|",
    ]
    for name, v in {**{f"n in {k}": v for k, v in h["by_length"].items()}, **h["by_causality"]}.items():
        out.append(f"| {name} | {v['n']} | {v['accuracy']:.4f} |")
    p = result["planted"]
    out += [
        "",
        (
            f"### Planted types: {p['n']} maps of stream {p['seed']}, learn stage (PCA 32, KMeans k = "
            f"{len(PATTERN_TYPES)}, seed 0)\n"
        ),
        "| embedder | input | dim | ARI vs true type | silhouette |",
        "|---|---|---|---|---|",
    ]
    for r in p["rows"]:
        sil = f"{r['silhouette']:.3f}" if r["silhouette"] is not None else "-"
        out.append(f"| {r['embedder']} | {r['input']} | {r['dim']} | **{r['ari']:.3f}** | {sil} |")
    if "baselines" in result:
        out += [
            "",
            (
                f"### Supervised baselines (fitted on {result['baselines'][0]['n_train']} training maps, "
                "scored on the held-out set)\n"
            ),
            "| inputs | classifier | held-out accuracy |",
            "|---|---|---|",
        ]
        for r in result["baselines"]:
            out.append(f"| {r['inputs']} | {r['model']} | {r['accuracy']:.4f} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.pattern_cnn.evaluate", description=__doc__.split("\n\n")[0])
    p.add_argument("--n-planted", type=int, default=3000)
    p.add_argument("--planted-seed", type=int, default=2000)
    p.add_argument("--n-heldout", type=int, default=None, help="default: the recorded held-out set")
    p.add_argument("--figure", type=Path, default=FIGURE)
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--no-baselines", action="store_true", help="skip the supervised baselines (d)")
    p.add_argument("--weights", type=Path, default=None, help="a weights folder (default: the shipped one)")
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    model, meta = load_pattern_cnn("cpu", args.weights)
    t0 = time.perf_counter()
    result = {"heldout": heldout(model, meta, args.n_heldout, args.workers)}
    result["planted"] = {
        "n": args.n_planted,
        "seed": args.planted_seed,
        "rows": planted(args.n_planted, args.planted_seed, args.workers, args.weights),
    }
    if not args.no_baselines:
        result["baselines"] = supervised_baselines(meta, workers=args.workers)
    if args.figure is not None:
        path = figure(args.figure)
        result["figure"] = {"path": str(path), "bytes": path.stat().st_size}
        print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)", file=sys.stderr)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
