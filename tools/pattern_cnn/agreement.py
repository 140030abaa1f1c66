"""Do a run's pattern labels agree with the statistics that define them?

    python -m tools.pattern_cnn.agreement RUN_DIR [--relabel] [--argmax] [--with-probes]

RUN_DIR is a run made with ``embed.name: pattern-cnn``. For each label the store holds it prints
the number and share of maps, the share whose stats satisfy the label's defining rule
(rapids_attn/patterns/rules.py; ``other`` claims nothing), and the median of the label's defining
statistic beside its median over all maps. Then the share of named (non-``other``) labels that agree.

``--relabel`` (automatic for a store made before ``other`` existed) labels the stored maps again
with today's rule: logits from the stored features through the shipped classifier (the features are
stored in float16, so a borderline map may differ from what a new run would give), calibrated with
the shipped temperature. ``--argmax`` also tables the network's own top type for every map, before
the rule and the probability threshold: how often the CNN alone would contradict the statistics.
The probe examples are left out unless ``--with-probes``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import zarr

from rapids_attn.data.probe import PROBE_GROUP
from rapids_attn.extract.signature import STAT_NAMES
from rapids_attn.patterns.cnn import load_pattern_cnn
from rapids_attn.patterns.rules import LABELS, OTHER, agrees, label
from rapids_attn.store import schema as S
from rapids_attn.store.zarr_store import decode_thumbnails, read_strings

#: The statistic each label is judged on (``near``: the profile's sum, the mass at offsets -4..4).
DEFINING = {
    "self": "self",
    "prev": "prev",
    "next": "next",
    "first": "first",
    "sep": "sep",
    "punct": "punct",
    "band": "near",
    "broad": "entropy_norm",
    "block": "entropy_norm",
    "hetero": "max",
}


def load(run_dir: Path, with_probes: bool = False) -> dict:
    g = zarr.open_group(str(Path(run_dir) / "store.zarr"), mode="r")
    if S.PATTERN not in g:
        raise SystemExit(f"{run_dir}: the store has no pattern array; it was not made with embed.name: pattern-cnn")
    keep = slice(None) if with_probes else read_strings(g[S.EXAMPLE_GROUP]) != PROBE_GROUP
    stats = np.asarray(g[S.STATS][:], dtype=np.float32)[keep].reshape(-1, len(STAT_NAMES))
    profile = np.asarray(g[S.PROFILE][:], dtype=np.float32)[keep].reshape(len(stats), -1)
    classes = [str(c) for c in g.attrs[S.Attr.PATTERN_CLASSES]]
    # the shared-columns clause of the diffuse rules reads the maps' thumbnails (None: not checked)
    images = None
    if S.THUMBNAILS in g:
        t = decode_thumbnails(g[S.THUMBNAILS][:])[keep]
        images = t.reshape(len(stats), *t.shape[-2:])
    stored = np.asarray(g[S.PATTERN][:], dtype=np.int64)[keep].reshape(-1)
    # the stored indices in today's LABELS
    to_labels = np.asarray([LABELS.index(c) for c in classes], dtype=np.int64)
    return {
        "group": g,
        "keep": keep,
        "stats": stats,
        "profile": profile,
        "images": images,
        "classes": classes,
        "pattern": to_labels[stored],
    }


@torch.inference_mode()
def stored_logits(d: dict) -> tuple[torch.Tensor, dict]:
    """The shipped classifier on the stored features (float16 in the store), and the weights' meta."""
    g = d["group"]
    model, meta = load_pattern_cnn("cpu")
    feats = torch.from_numpy(np.asarray(g[S.FEATURES][:], dtype=np.float32)[d["keep"]].reshape(len(d["stats"]), -1))
    return model.classifier(feats[:, : model.embed_dim]), meta  # the CNN's embedding leads the features


def relabel(d: dict) -> np.ndarray:
    logits, meta = stored_logits(d)
    pattern, _ = label(
        logits,
        torch.from_numpy(d["stats"]),
        torch.from_numpy(d["profile"]),
        float(meta.get("temperature", 1.0)),
        images=_tensor(d["images"]),
    )
    return pattern.numpy()


def _tensor(x: np.ndarray | None) -> torch.Tensor | None:
    return None if x is None else torch.from_numpy(x)


def table(pattern: np.ndarray, stats: np.ndarray, profile: np.ndarray, images=None) -> tuple[str, float, int]:
    ok = agrees(torch.from_numpy(pattern), torch.from_numpy(stats), torch.from_numpy(profile), _tensor(images)).numpy()
    col = {name: stats[:, i] for i, name in enumerate(STAT_NAMES)} | {"near": profile.sum(1)}
    lines = [
        "| label | maps | share | agree with rule | defining stat | its median (label) | its median (all maps) |",
        "|---|---|---|---|---|---|---|",
    ]
    for k, name in enumerate(LABELS):
        m = pattern == k
        if not m.any():
            continue
        if name == OTHER:
            lines.append(f"| {name} | {int(m.sum())} | {m.mean():.1%} | (claims nothing) | | | |")
            continue
        x = col[DEFINING[name]]
        lines.append(
            f"| {name} | {int(m.sum())} | {m.mean():.1%} | {ok[m].mean():.1%} | {DEFINING[name]} "
            f"| {np.nanmedian(x[m]):.3f} | {np.nanmedian(x):.3f} |"
        )
    named = pattern != LABELS.index(OTHER)
    rate = float(ok[named].mean()) if named.any() else float("nan")
    return "\n".join(lines), rate, int(named.sum())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--relabel", action="store_true", help="label the stored maps again with today's rule")
    ap.add_argument("--argmax", action="store_true", help="also the network's top type, before the rule")
    ap.add_argument("--with-probes", action="store_true", help="include the probe examples")
    args = ap.parse_args(argv)
    d = load(args.run_dir, args.with_probes)
    n = len(d["pattern"])
    runs = [("stored labels", d["pattern"])]
    if args.relabel or OTHER not in d["classes"]:
        runs.append(("relabelled from the stored features with today's rule", relabel(d)))
    if args.argmax:
        runs.append(("the network's top type, before the rule and threshold", stored_logits(d)[0].argmax(1).numpy()))
    for title, pattern in runs:
        text, rate, named = table(pattern, d["stats"], d["profile"], d["images"])
        print(f"## {title}: {args.run_dir}, {n} maps\n\n{text}\n")
        print(
            f"named labels: {named} of {n} ({named / max(n, 1):.1%}); agreeing with their defining rule: {rate:.2%}\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
