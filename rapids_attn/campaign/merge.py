"""A campaign's finished runs merged into one head atlas (issue 50; docs/campaigns.md), with no re-extraction:
every run's store and head_classes.json read once, so time and memory grow linearly in the runs.

``OUT/atlas/`` holds:

- ``heads.parquet``: one row per (run, layer, head): the model's label, family and variant, the dataset, the
  layer's relative depth (layer / (layers - 1)), the head's long-context class with its score, interval and
  bootstrap stability (head_classes.json), and its profile (the dataset means of every stored statistic, detector
  and profile offset; :func:`rapids_attn.campaign.match.head_profiles`);
- ``matches.parquet``: each run's heads matched to the reference run's on the same dataset (the first model's,
  or ``--reference``): within layers where the two models have one shape, else across all heads with a
  relative-depth cost; the matched distance and, within layers, the margin to the next-nearest head;
- ``layers.json``: per run, its layers' representational similarity to the reference run's layers;
- ``families.json``: per family and dataset, how many heads of each class sit in each quarter of relative depth;
- ``maps.parquet`` and ``clusters.json``: one clustering of a sample of every run's maps together (the same
  number from each run, their stored embeddings: runs of one embedder only), so that a cluster means the same in
  every model; per cluster, each model's share of its sampled maps and the cluster's mean relative depth;
- ``atlas.json``: what was merged, what was left out and why (a run not done), and where each run's KV exports are
  (relative to the atlas folder);
- ``report.html`` and ``explorer.html``: the atlas's static report and interactive explorer, written from the files
  above alone (:mod:`rapids_attn.campaign.atlas_report`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from rapids_attn.campaign.plan import Campaign
from rapids_attn.kvheads.evidence import LABELS as CLASSES  # the head classes, in head_classes.json's order

FOLDER = "atlas"
DEPTH_BINS = 4


def _classes(run_dir: Path) -> dict[tuple[int, int], dict]:
    try:
        doc = json.loads((run_dir / "head_classes.json").read_text())
    except (OSError, ValueError):
        return {}
    return {(h["layer"], h["head"]): h for h in doc.get("heads", [])}


def merge(
    c: Campaign, reference: str | None = None, say=print, maps_per_run: int = 2000, n_clusters: int = 8, seed: int = 0
) -> dict:
    """Merge the campaign's done runs into ``c.out/atlas`` (replaced whole); returns ``atlas.json``'s content."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zarr

    from rapids_attn.campaign import atlas_report
    from rapids_attn.campaign.match import head_profiles, layer_similarity, match_heads, match_within_layers
    from rapids_attn.campaign.tasks import DONE, state_of
    from rapids_attn.errors import UserError

    states = [state_of(c, r) for r in c.runs]
    done = [s.run for s in states if s.state == DONE]
    left_out = {s.run.label: f"{s.state}{': ' + s.detail if s.detail else ''}" for s in states if s.state != DONE}
    if not done:
        raise UserError(f"{c.path}: no run is done yet; python -m rapids_attn.campaign {c.path} status says why")
    labels = sorted({r.label.split("/")[0] for r in done})
    if reference is not None and reference not in labels:
        raise UserError(f"--reference: {reference!r} is not a done run's model; use one of {labels}")
    rows: dict[str, list] = {}
    profiles = {}
    stores = {}
    names = None
    for r in done:
        g = zarr.open_group(str(r.run_dir / "store.zarr"), mode="r")
        p = head_profiles(g)
        if names is None:
            names = p.names
        elif p.names != names:
            raise UserError(f"{r.label}: its store keeps other statistics than the first run's; rerun it")
        profiles[r.label], stores[r.label] = p, g
        classes = _classes(r.run_dir)
        nl = len(p.layers)
        for i, layer in enumerate(p.layers):
            for j, head in enumerate(p.heads):
                h = classes.get((layer, head), {})
                iv = h.get("interval") or [None, None]
                row = {
                    "model": r.label.split("/")[0],
                    "family": r.model.family,
                    "variant": r.model.variant,
                    "dataset": r.dataset.label,
                    "layer": layer,
                    "head": head,
                    "depth": i / max(1, nl - 1),
                    "class": h.get("class"),
                    "class_score": h.get("score"),
                    "class_low": iv[0],
                    "class_high": iv[1],
                    "same_class": h.get("same_class"),
                }
                row.update({n: float(p.features[i, j, k]) for k, n in enumerate(names)})
                for k, v in row.items():
                    rows.setdefault(k, []).append(v)
        say(f"atlas: read {r.label} ({nl} layers x {len(p.heads)} heads)")
    # each run against the reference run of its dataset
    match_rows: dict[str, list] = {}
    layers = {}
    ref_model = reference or done[0].label.split("/")[0]
    for r in done:
        ref = next((x for x in done if x.label == f"{ref_model}/{r.dataset.label}"), None)
        if ref is None or ref.label == r.label:
            continue
        pa_, pb = profiles[r.label], profiles[ref.label]
        if pa_.features.shape[:2] == pb.features.shape[:2]:
            m = match_within_layers(pa_, pb)
            pairs = [
                (
                    (pa_.layers[i], pa_.heads[j]),
                    (pb.layers[i], pb.heads[int(m.match[i, j])]),
                    m.distance[i, j],
                    m.margin[i, j],
                )
                for i in range(len(pa_.layers))
                for j in range(len(pa_.heads))
            ]
            how = "within layers"
        else:
            pairs = [(x, y, d, None) for x, y, d in match_heads(pa_, pb).pairs]
            how = "across all heads, with relative depth"
        for (la, ha), (lb, hb), dist, margin in pairs:
            for k, v in (
                ("run", r.label),
                ("reference", ref.label),
                ("how", how),
                ("layer", la),
                ("head", ha),
                ("reference_layer", lb),
                ("reference_head", hb),
                ("distance", float(dist)),
                ("margin", None if margin is None else float(margin)),
            ):
                match_rows.setdefault(k, []).append(v)
        try:
            layers[r.label] = {
                "reference": ref.label,
                "rsa": layer_similarity(stores[r.label], stores[ref.label]).tolist(),
            }
        except ValueError as e:  # fewer than 3 shared examples
            layers[r.label] = {"reference": ref.label, "rsa": None, "why": str(e)}
        say(f"atlas: matched {r.label} to {ref.label} ({how})")
    families = _families(rows)
    map_rows, clusters = _joint_clusters(done, stores, maps_per_run, n_clusters, seed)
    if map_rows:
        say(f"atlas: clustered {len(map_rows['model']):,} maps of {len(done)} runs together")
    exports = {  # relative to the atlas folder: the atlas names no absolute path (it is shared and copied)
        r.label: os.path.relpath(r.run_dir / "head_classes", c.out / FOLDER)
        for r in done
        if (r.run_dir / "head_classes" / "exports.json").is_file()
    }
    doc = {
        "campaign": c.spec.name,
        "runs": [r.label for r in done],
        "left_out": left_out,
        "reference": ref_model,
        "heads": len(rows.get("model", [])),
        "kv_exports": exports,
        "joint_clusters": {k: v for k, v in clusters.items() if k != "clusters"},
        "files": ["heads.parquet", "matches.parquet", "layers.json", "families.json"]
        + (["maps.parquet", "clusters.json"] if map_rows else [])
        + [atlas_report.REPORT, atlas_report.EXPLORER],
    }
    out = c.out / FOLDER
    c.out.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{FOLDER}.tmp-", dir=c.out))
    try:
        pq.write_table(pa.table(rows), stage / "heads.parquet")
        pq.write_table(
            pa.table(match_rows) if match_rows else pa.table({"run": pa.array([], pa.string())}),
            stage / "matches.parquet",
        )
        (stage / "layers.json").write_text(json.dumps(layers, indent=1))
        (stage / "families.json").write_text(json.dumps(families, indent=1))
        if map_rows:
            pq.write_table(pa.table(map_rows), stage / "maps.parquet")
            (stage / "clusters.json").write_text(json.dumps(clusters, indent=1))
        (stage / "atlas.json").write_text(json.dumps(doc, indent=1))
        atlas_report.write_report(stage)  # from the staged files alone, so the folder appears whole or not at all
        say(f"atlas: wrote {atlas_report.REPORT} and {atlas_report.EXPLORER}")
        if out.exists():
            shutil.rmtree(out)
        stage.rename(out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return doc


def _families(rows: dict[str, list]) -> dict:
    """Per family and dataset: the heads of each class in each quarter of relative depth (summed over the
    family's models), and how many models."""
    out: dict = {}
    n = len(rows.get("model", []))
    for k in range(n):
        fam = rows["family"][k] or rows["model"][k]
        key = f"{fam}/{rows['dataset'][k]}"
        entry = out.setdefault(key, {"models": set(), "by_depth": {c: [0] * DEPTH_BINS for c in CLASSES}})
        entry["models"].add(rows["model"][k])
        cls = rows["class"][k]
        if cls in CLASSES:
            b = min(DEPTH_BINS - 1, int(np.floor(rows["depth"][k] * DEPTH_BINS)))
            entry["by_depth"][cls][b] += 1
    for v in out.values():
        v["models"] = sorted(v["models"])
        v["depth_bins"] = [f"{i / DEPTH_BINS:g}-{(i + 1) / DEPTH_BINS:g}" for i in range(DEPTH_BINS)]
    return out


def _joint_clusters(done, stores: dict, per_run: int, n_clusters: int, seed: int) -> tuple[dict, dict]:
    """One MapClusterer fit over ``per_run`` maps sampled from each run (whole examples, then maps among them,
    seeded): ({model, dataset, example_id, layer, head, depth, cluster} columns, the clusters' summary). Runs of
    different embedders (names or feature sizes) cannot share a space: none, and the summary says why."""
    from rapids_attn.learn.estimator import MapClusterer
    from rapids_attn.store import schema as S
    from rapids_attn.store.schema import Attr

    def embedder(g):
        if str(S.FEATURES) not in g:
            return None
        job = dict(g.attrs.get(Attr.JOB) or {})
        return (str((job.get("embed") or {}).get("name")), int(g[S.FEATURES].shape[-1]))

    kinds = {r.label: embedder(stores[r.label]) for r in done}
    if None in kinds.values():
        return {}, {"why": f"{next(k for k, v in kinds.items() if v is None)} keeps no embeddings"}
    if len(set(kinds.values())) != 1:
        return {}, {"why": f"the runs' embedders differ ({sorted(set(kinds.values()))}): no shared space"}
    rng = np.random.default_rng(seed)
    feats, cols = [], {k: [] for k in ("model", "dataset", "example_id", "layer", "head", "depth")}
    for r in done:
        g = stores[r.label]
        arr = g[S.FEATURES]
        e, nl, nh = arr.shape[:3]
        n_ex = min(e, max(1, -(-per_run // (nl * nh))))
        ex = np.sort(rng.choice(e, size=n_ex, replace=False))
        x = np.asarray(arr.get_orthogonal_selection((ex, slice(None), slice(None), slice(None))), np.float32)
        flat = x.reshape(-1, x.shape[-1])
        pick = np.sort(rng.choice(len(flat), size=min(per_run, len(flat)), replace=False))
        i_ex, i_l, i_h = np.unravel_index(pick, (n_ex, nl, nh))
        ids = [str(v) for v in g[S.EXAMPLE_ID].get_orthogonal_selection(ex)]
        layers = [int(v) for v in g[S.LAYER][:]]
        heads = [int(v) for v in g[S.HEAD][:]]
        feats.append(flat[pick])
        cols["model"] += [r.label.split("/")[0]] * len(pick)
        cols["dataset"] += [r.dataset.label] * len(pick)
        cols["example_id"] += [ids[i] for i in i_ex]
        cols["layer"] += [layers[i] for i in i_l]
        cols["head"] += [heads[i] for i in i_h]
        cols["depth"] += [float(i / max(1, nl - 1)) for i in i_l]
    x = np.concatenate(feats)
    k = int(min(n_clusters, max(1, len(x) - 1)))
    est = MapClusterer(pca_components=int(min(16, x.shape[1], len(x))), n_clusters=k, k_sweep=None, random_state=seed)
    labels = np.asarray(est.fit(x).labels_)
    cols["cluster"] = labels.astype(int).tolist()
    models = sorted(set(cols["model"]))
    model_arr = np.array(cols["model"])
    depth = np.array(cols["depth"])
    summary = {"maps": len(x), "per_run": int(per_run), "n_clusters": k, "embedder": list(next(iter(kinds.values())))}
    summary["clusters"] = [
        {
            "cluster": int(cl),
            "maps": int((labels == cl).sum()),
            "mean_depth": round(float(depth[labels == cl].mean()), 3),
            "share_of_each_model": {
                m: round(float(((labels == cl) & (model_arr == m)).sum() / max(1, (model_arr == m).sum())), 4)
                for m in models
            },
        }
        for cl in sorted(set(labels.tolist()))
    ]
    return cols, summary
