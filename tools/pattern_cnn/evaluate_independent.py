"""The pattern CNN on maps from a generator it was not trained on (issue 13's generalisation check).

    python -m tools.pattern_cnn.evaluate_independent [--generator independent] [--seeds 0 1] \
        [--per-family 150] [--no-resnet]

Maps come from a generator written apart from the training generator, ``--per-family`` of each of
its families: the ten training types and some the training never made.

- ``independent`` (``tools/pattern_cnn/independent.py``): a softmax-of-scores construction, another
  noise model, length distribution and token-role layout; unseen ``columns``, ``two_back``,
  ``left_window``, ``last``.
- ``mechanistic`` (``tools/pattern_cnn/mechanistic.py``, written by someone who had not read either
  other generator): softmax(Q K^T) of designed circuits (rotary positions, role directions, segment
  vectors, token identity) over a synthetic token sequence; unseen ``duplicate`` and ``induction``.
- ``empirical`` (``tools/pattern_cnn/empirical.py``, written blind to the three others): rows drawn
  around each family's target distribution with heavy per-row variation, rows that switch the pattern
  off, varying sinks, bimodal lengths.

Every map goes through the documented API for maps a user already has
(``rapids_attn.api.analyse_maps``, the job's own reductions and embedder) and the features through
``rapids_attn.api.cluster_features`` (the learn stage's PCA 32 + KMeans, seed 0). Per seed it prints:

1. per known type: recall (named correctly / maps of the type; ``other`` counts as a miss), the
   share labelled ``other``, precision among the known-family maps and among all maps (unseen
   families named as the type are false positives);
2. per unseen family: the share labelled ``other`` and what the named ones were called;
3. ARI of KMeans clusters against the true family, for k = 10 on the known families and k = the
   number of families on all, for the ``pattern-cnn`` features, the CNN's embedding alone (without the side copy of the
   profile and stats), the ``pooled`` baseline and ``resnet18`` with random weights; and, first, the
   ARI of the pattern labels themselves against the true families (no clustering; ``other`` is one
   more label).

The "meets its type's rule" column is the share of a family's maps whose own statistics satisfy the
defining rule of the type it is named after (``rapids_attn.patterns.rules``): where this generator's
idea of a family and the rule disagree (a ``broad`` map with 40% on the first token is ``first`` by
the rule), no labelling that never contradicts the statistics can name the map, so this share bounds
the recall from above.
"""

from __future__ import annotations

import argparse
import importlib
import time
from collections import Counter

import numpy as np
import torch

from rapids_attn.api import analyse_maps, cluster_features
from rapids_attn.embed.pattern import SIDE_STATS
from rapids_attn.extract.signature import PROFILE_OFFSETS
from rapids_attn.patterns.generator import PATTERN_TYPES
from rapids_attn.patterns.rules import rule_table
from tools.pattern_cnn import independent

#: the evaluation generators, by name: modules with KNOWN, UNSEEN, FAMILIES and generate(seed, per_family)
GENERATORS = {
    "independent": "tools.pattern_cnn.independent",
    "mechanistic": "tools.pattern_cnn.mechanistic",
    "empirical": "tools.pattern_cnn.empirical",
}

EMBEDDERS = {
    "pattern-cnn": {},
    "pattern-cnn, embedding only": {},  # the CNN's 128-d embedding without the side copy
    "pooled": {"pooled_size": 16},
    "resnet18 (random weights)": {"weights": "random", "input_size": 64},
}
CHUNK = 48
#: the side copy at the end of pattern-cnn's features (profile, SIDE_STATS, shared columns)
SIDE_WIDTH = len(PROFILE_OFFSETS) + len(SIDE_STATS) + 1


def analyse(maps: list) -> dict[str, np.ndarray]:
    """Run ``analyse_maps`` (pattern-cnn) on the maps (anything with ``attn``, ``n``, ``sep``, ``punct``
    and ``causal``: this generator's maps or the training generator's ``MapSample``), grouped by
    causality and padded in chunks of similar length. Returns, in the order of ``maps``: features,
    stats, profile, images, names."""
    out: dict[str, list] = {}
    order = sorted(range(len(maps)), key=lambda k: (maps[k].causal, maps[k].n))
    rows: list[int] = []
    for causal in (False, True):
        idx = [k for k in order if maps[k].causal == causal]
        for a in range(0, len(idx), CHUNK):
            part = [maps[k] for k in idx[a : a + CHUNK]]
            t = max(m.n for m in part)
            w = np.zeros((len(part), 1, t, t), np.float32)
            sep = np.zeros((len(part), t), bool)
            punct = np.zeros((len(part), t), bool)
            for b, m in enumerate(part):
                w[b, 0, : m.n, : m.n] = m.attn
                sep[b, : m.n], punct[b, : m.n] = m.sep, m.punct
            r = analyse_maps(w, [m.n for m in part], sep=sep, punct=punct, causal=causal)
            got = {"features": r.features, "stats": r.stats, "profile": r.profile, "images": r.images}
            got["names"] = r.pattern_names()
            for key, v in got.items():
                out.setdefault(key, []).append(v[:, 0])
            rows += idx[a : a + CHUNK]
    inverse = np.argsort(np.asarray(rows))
    return {k: np.concatenate(v)[inverse] for k, v in out.items()}


def embed_images(r: dict[str, np.ndarray], name: str, settings: dict, batch: int = 256) -> np.ndarray:
    """The baselines' features of the API's images, by the job's own embedder factory: what
    ``analyse_maps(..., embedder=name, **settings)`` computes, without reducing the maps again."""
    from rapids_attn.embed import build_embedder
    from rapids_attn.job import EmbedConfig

    size = r["images"].shape[-1]
    emb = build_embedder(EmbedConfig(name=name.split(" ")[0], **settings), size, "cpu")
    parts = []
    for a in range(0, len(r["images"]), batch):
        sl = slice(a, a + batch)
        f, _ = emb.embed(*(torch.from_numpy(r[k][sl]) for k in ("images", "profile", "stats")))
        parts.append(f.float().numpy())
    return np.concatenate(parts)


def own_rule(r: dict[str, np.ndarray]) -> np.ndarray:
    """[N, 10] bool: does each map satisfy each type's defining rule (``rules.rule_table`` on the API's
    stats, profile and images)? A known-family map that fails its own type's rule cannot be named
    that type by a labeller that never contradicts the statistics, whatever the network says."""
    return rule_table(*(torch.from_numpy(r[k]) for k in ("stats", "profile", "images"))).numpy()


def label_tables(
    truth: np.ndarray,
    names: np.ndarray,
    known=independent.KNOWN,
    unseen=independent.UNSEEN,
    rules: np.ndarray | None = None,
) -> str:
    lines = [
        (
            "| known type | maps | recall | labelled other | precision (known maps) | precision (all maps) "
            "| meets its type's rule |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    known_maps = np.isin(truth, known)
    for t in known:
        m = truth == t
        hit = int((m & (names == t)).sum())
        named_k = int((known_maps & (names == t)).sum())
        named_all = int((names == t).sum())
        prec_k = f"{hit / named_k:.3f}" if named_k else "-"
        prec_a = f"{hit / named_all:.3f} ({named_all})" if named_all else "-"
        meets = f"{rules[m, PATTERN_TYPES.index(t)].mean():.1%}" if rules is not None else "-"
        lines.append(
            f"| {t} | {int(m.sum())} | {hit / m.sum():.3f} | {(names[m] == 'other').mean():.1%} | {prec_k} "
            f"| {prec_a} | {meets} |"
        )
    kn = names[known_maps]
    named = kn != "other"
    if rules is not None:
        own = rules[known_maps, [PATTERN_TYPES.index(t) for t in truth[known_maps]]]
        meets = f"{own.mean():.1%}"
    else:
        meets = "-"
    lines.append(
        f"| all known | {int(known_maps.sum())} | {(kn == truth[known_maps]).mean():.3f} | {(~named).mean():.1%} "
        f"| {(kn[named] == truth[known_maps][named]).mean():.3f} | | {meets} |"
    )
    lines += ["", "| unseen family | maps | labelled other | named as |", "|---|---|---|---|"]
    for f in unseen:
        m = truth == f
        named = Counter(names[m][names[m] != "other"].tolist())
        as_ = ", ".join(f"{k} {v}" for k, v in named.most_common()) or "-"
        lines.append(f"| {f} | {int(m.sum())} | {(names[m] == 'other').mean():.1%} | {as_} |")
    return "\n".join(lines)


def rule_ceiling(truth: np.ndarray, rules: np.ndarray, known: np.ndarray) -> np.ndarray:
    """The best any labelling that never contradicts the statistics could do: each known-family map's
    true family where the map meets that type's rule (``rules``, from ``own_rule``), ``other``
    elsewhere, unseen families included."""
    meets = np.zeros(len(truth), bool)
    meets[known] = rules[known, [PATTERN_TYPES.index(t) for t in truth[known]]]
    return np.where(meets, truth, "other")


def label_ari(names: np.ndarray, truth: np.ndarray, subset: np.ndarray | None = None) -> float:
    """ARI of the pattern labels themselves (no clustering) against the true families."""
    from sklearn.metrics import adjusted_rand_score

    m = np.ones(len(truth), bool) if subset is None else subset
    return float(adjusted_rand_score(truth[m], names[m]))


def ari(features: np.ndarray, truth: np.ndarray, k: int) -> float:
    from sklearn.metrics import adjusted_rand_score

    labels, _ = cluster_features(features, n_clusters=k, pca_components=32, seed=0, stability_seeds=0)
    return float(adjusted_rand_score(truth, labels))


def evaluate_seed(seed: int, per_family: int, embedders: dict, generator: str = "independent") -> tuple[str, dict]:
    gen = importlib.import_module(GENERATORS[generator])
    t0 = time.perf_counter()
    maps = gen.generate(seed, per_family)
    truth = np.asarray([m.family for m in maps])
    t_gen = time.perf_counter() - t0
    known = np.isin(truth, gen.KNOWN)
    r = analyse(maps)
    rules = own_rule(r)
    text = label_tables(truth, r["names"], gen.KNOWN, gen.UNSEEN, rules)
    ceiling = rule_ceiling(truth, rules, known)
    aris = {
        "labels (the 11 names, other included; no clustering)": (
            label_ari(r["names"], truth, known),
            label_ari(r["names"], truth),
        ),
        "ceiling: the true family where its rule holds, else other": (
            label_ari(ceiling, truth, known),
            label_ari(ceiling, truth),
        ),
    }
    for name, settings in embedders.items():
        if name.startswith("pattern-cnn"):
            feats = r["features"] if name == "pattern-cnn" else r["features"][:, :-SIDE_WIDTH]
        else:
            feats = embed_images(r, name, settings)
        aris[name] = (ari(feats[known], truth[known], len(gen.KNOWN)), ari(feats, truth, len(gen.FAMILIES)))
    lines = [
        (
            f"## {generator} generator, seed {seed}: {len(maps)} maps ({per_family} per family, "
            f"{int(sum(m.causal for m in maps))} causal, n median {int(np.median([m.n for m in maps]))}, "
            f"max {max(m.n for m in maps)}; generated in {t_gen:.0f}s)"
        ),
        "",
        text,
        "",
        (
            f"| embedder | ARI, {len(gen.KNOWN)} known families (k = {len(gen.KNOWN)}) "
            f"| ARI, all {len(gen.FAMILIES)} families (k = {len(gen.FAMILIES)}) |"
        ),
        "|---|---|---|",
        *[f"| {n} | {a:.3f} | {b:.3f} |" for n, (a, b) in aris.items()],
    ]
    return "\n".join(lines), aris


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.pattern_cnn.evaluate_independent", description=__doc__)
    p.add_argument("--generator", choices=sorted(GENERATORS), default="independent")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--per-family", type=int, default=150)
    p.add_argument("--no-resnet", action="store_true", help="skip the random-weights resnet18 baseline")
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    embedders = {k: v for k, v in EMBEDDERS.items() if not (args.no_resnet and k.startswith("resnet"))}
    t0 = time.perf_counter()
    for seed in args.seeds:
        text, _ = evaluate_seed(seed, args.per_family, embedders, args.generator)
        print(text + "\n", flush=True)
    print(f"total {time.perf_counter() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
