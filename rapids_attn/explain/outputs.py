"""``maps.parquet`` (one row per map) and ``summary.json`` (counts, backend, timings, clusters).

Both are written to a temporary name and renamed into place, so a failed run never leaves a
half-written table that looks complete.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rapids_attn import __version__
from rapids_attn.devices import machine_description
from rapids_attn.rundir import shared_model, shared_path
from rapids_attn.store import schema as S
from rapids_attn.store.schema import Attr, read_strings


def json_safe(obj):
    """NaN and infinities become null (JSON has no NaN); NumPy scalars become Python numbers."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if np.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def replace_with_text(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it, renamed over it; the temporary file is
    removed if either step fails (a directory in the way, no permission)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as e:  # named for the file the user knows, not the temporary one
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(path)) from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: Path, obj: dict) -> None:
    replace_with_text(path, json.dumps(json_safe(obj), indent=2, default=str, allow_nan=False) + "\n")


def write_maps_table(g, path: Path) -> int:
    """One row per map: example index and id, group, label, layer, head, cluster, x, y, stats."""
    feats = g[S.FEATURES]
    e, nl, nh, _ = feats.shape
    rows = feats.chunks[0]
    layers = np.asarray(g[S.LAYER][:], dtype=np.int16)
    heads = np.asarray(g[S.HEAD][:], dtype=np.int16)
    stat_names = [str(s) for s in g[S.STAT][:]]
    ids, groups, labels = (read_strings(g[n]).astype(object) for n in (S.EXAMPLE_ID, S.EXAMPLE_GROUP, S.EXAMPLE_LABEL))
    tmp = path.with_suffix(".parquet.tmp")
    writer = None
    total = 0
    try:
        for start in range(0, e, rows):
            stop = min(start + rows, e)
            m = stop - start
            ex = np.repeat(np.arange(start, stop, dtype=np.int32), nl * nh)
            cols = {
                "example_index": ex,
                "example_id": pa.array(ids[ex], pa.string()),
                "group": pa.array(groups[ex], pa.string()),
                "label": pa.array(labels[ex], pa.string()),
                "layer": np.tile(np.repeat(layers, nh), m),
                "head": np.tile(np.tile(heads, nl), m),
                "cluster": np.asarray(g[S.CLUSTER][start:stop]).reshape(-1),
            }
            xy = np.asarray(g[S.COORDS][start:stop]).reshape(-1, 2)
            cols["x"], cols["y"] = xy[:, 0], xy[:, 1]
            st = np.asarray(g[S.STATS][start:stop]).reshape(-1, len(stat_names))
            for i, name in enumerate(stat_names):
                cols[name] = st[:, i]
            if S.PATTERN in g:
                classes = np.asarray(list(g.attrs.get(Attr.PATTERN_CLASSES, [])) + ["?"], dtype=object)
                pat = np.asarray(g[S.PATTERN][start:stop]).reshape(-1).astype(np.int64)
                cols["pattern"] = pa.array(
                    classes[np.where((pat >= 0) & (pat < len(classes) - 1), pat, -1)], pa.string()
                )
                cols["pattern_prob"] = np.asarray(g[S.PATTERN_PROB][start:stop], dtype=np.float32).reshape(-1)
            if S.DETECTORS in g:
                det = np.asarray(g[S.DETECTORS][start:stop]).reshape(m * nl * nh, -1)
                for i, name in enumerate(str(x) for x in g[S.DETECTOR][:]):
                    cols[name] = det[:, i]
            table = pa.table(cols)
            if writer is None:
                writer = pq.ParquetWriter(tmp, table.schema, compression="zstd")
            writer.write_table(table)
            total += table.num_rows
    finally:
        if writer is not None:
            writer.close()
    tmp.replace(path)
    return total


def build_summary(ctx, g, n_maps: int, data: dict, embed_name: str) -> dict:
    """summary.json's body before the findings: counts, backend and devices, extraction runs, the
    learn stage's result, and the seconds of this run so far. ``data`` is the job's data section."""
    layout = ctx.layout
    seq = np.asarray(g[S.SEQ_LEN][:])
    trunc = np.asarray(g[S.TRUNCATED][:], dtype=bool)
    learn = dict(g.attrs.get(Attr.LEARN, {}))
    runs = list(g.attrs.get(Attr.EXTRACT_RUNS, []))
    extract = ctx.results.get("extract")
    return {
        "rapids_attn_version": __version__,
        "job": ctx.job_name,
        # absolute while the explain stage runs (its report sections read it); the summary it returns names it "."
        # (rapids_attn.rundir.shared_paths), as it names every path inside the run directory
        "run_dir": str(ctx.run_dir),
        "model": shared_model(dict(g.attrs.get(Attr.MODEL, {})), ctx.run_dir),
        "data": {
            "path": shared_path(data.get("path"), ctx.run_dir),  # its name, where it lies outside the run directory
            "format": data.get("format"),
            "fingerprint": getattr(ctx.data, "fingerprint", ""),  # the content hash in the extraction key
        },
        "counts": {
            "examples": int(layout.n_examples),
            "layers": len(layout.layers),
            "heads": len(layout.heads),
            "maps": int(n_maps),
            "truncated_examples": int(trunc.sum()),
            "tokens": int(seq.sum()),
            "mean_tokens": float(seq.mean()) if len(seq) else 0.0,
            "max_tokens": int(seq.max()) if len(seq) else 0,
            "shards": layout.n_shards,
        },
        "embedding": {"name": embed_name, "dim": layout.feature_dim, "image_size": layout.image_size},
        "backend": {
            "extract_devices": sorted({d for r in runs for d in r.get("devices", [])}),
            "learn": learn.get("backend"),
            "learn_reason": learn.get("backend_reason"),
            "multi_gpu_learn": learn.get("multi_gpu", False),
            # where the multi-GPU fit's parts were (parts, rows per worker, distinct GPUs by UUID),
            # or why a planned multi-GPU fit ran on one GPU (a worker, or the job process)
            "multi_gpu_placement": learn.get("fit_placement"),
            "multi_gpu_skipped": learn.get("multi_gpu_skipped"),
            # the worker a single-GPU fit ran on, from its RMM pool (None: in the job process)
            "learn_worker": learn.get("fit_worker"),
            "runtime": dict(ctx.runtime),
            "machine": machine_description(),
        },
        "extract": {"this_run": None if extract is None else extract.to_dict(), "runs": runs},
        "clusters": {
            "method": learn.get("method"),
            "n_clusters": learn.get("n_clusters"),
            "sizes": learn.get("cluster_sizes"),
            "noise_share": learn.get("noise_share"),
            "silhouette": learn.get("silhouette"),
            "silhouette_sample": learn.get("silhouette_sample"),
            # KMeans: ARI of the fit against refits with other seeds (1: the seed does not matter)
            "stability": learn.get("stability"),
            "n_fit": learn.get("n_fit"),
            "pca_components": learn.get("pca_components"),
            "pca_explained_variance": learn.get("pca_explained_variance"),
            "umap": learn.get("umap"),
            "learn_seconds": learn.get("seconds"),
        },
        "seconds": {k: round(v, 3) for k, v in ctx.timings.items()},
    }
