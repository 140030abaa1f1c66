"""``python -m benchmarks.explorer RUN_DIR [--maps 10000 50000 100000]`` (from the repository root): how the
interactive explorer (report/explorer.html) holds up as the number of maps it shows grows.

The explorer shows a seeded sample of ``explain.explorer_sample`` maps (50,000 by default). A browser's
cost depends on how many points and tooltips it holds, not on what they show, so this benchmark takes a
finished run's store and repeats its examples (their real coordinates, jittered, clusters, patterns and
thumbnails) until it holds each requested number of maps, writes the explorer with the project's own
``write_explorer``, and opens it in headless Chromium with every non-file request blocked (tools/check_explorer):
file size, seconds to write it, seconds from navigation to the first rendered map view, from a mouse move to
a visible tooltip, and from a cluster choice to both views filtered. Needs Playwright's Python package and a
Chromium (tools/check_explorer). Results are recorded in docs/benchmarks.md (its row; the protocol:
docs/decisions/2026-11-24-explorer-size.md).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr

from rapids_attn.explain.explorer import write_explorer
from rapids_attn.store import schema as S

#: the arrays the explorer reads, per example (first axis) or whole
PER_EXAMPLE = (S.COORDS, S.CLUSTER, S.PATTERN, S.THUMBNAILS, S.EXAMPLE_ID)


def tiled_group(g, n_maps: int, seed: int = 0):
    """An in-memory group holding ``g``'s examples repeated until it has at least ``n_maps`` maps; each copy's
    coordinates moved by a small seeded jitter and its example ids suffixed, so no two points coincide."""
    from zarr.storage import MemoryStore

    n_ex, n_l, n_h = g[S.CLUSTER].shape
    reps = -(-n_maps // (n_ex * n_l * n_h))
    take = -(-n_maps // (n_l * n_h))
    out = zarr.open_group(store=MemoryStore(), mode="w")
    out.attrs.update(dict(g.attrs))
    rng = np.random.default_rng(seed)
    for name in (S.LAYER, S.HEAD):
        out.create_array(str(name), data=np.asarray(g[name][:]))
    for name in PER_EXAMPLE:
        if name not in g:
            continue
        v = np.asarray(g[name][:])
        if name == S.EXAMPLE_ID:
            ids = [f"{x}#{r}" for r in range(reps) for x in v.tolist()][:take]
            out.create_array(str(name), data=np.array(ids, dtype=v.dtype))
            continue
        v = np.concatenate([v] * reps)[:take]
        if name == S.COORDS:
            scale = 0.02 * np.nanstd(v.reshape(-1, 2), axis=0)
            v = (v + rng.normal(size=v.shape) * scale).astype(np.float32)
        out.create_array(str(name), data=v, chunks=(1, *v.shape[1:]))
    return out, take


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.explorer", description=__doc__)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--maps", type=int, nargs="+", default=[10_000, 50_000, 100_000])
    p.add_argument("--chromium", default="/usr/bin/chromium")
    args = p.parse_args(argv)
    from tools.check_explorer import check

    g = zarr.open_group(str(args.run_dir / "store.zarr"), mode="r")
    print("| maps shown | file MB | write s | load s | hover s | filter s | checks |")
    print("|---|---|---|---|---|---|---|")
    for n in args.maps:
        tiled, n_ex = tiled_group(g, n)
        texts = {i: f"example {i}: " + "lorem ipsum " * 12 for i in range(n_ex)}  # a typical question's length
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            path = write_explorer(Path(tmp), tiled, texts, None, n, 0)
            wrote = time.perf_counter() - t0
            r = check(path)
            print(
                f"| {n:,} | {path.stat().st_size / 2**20:.1f} | {wrote:.1f} | {r.get('load_s', float('nan')):.1f} "
                f"| {r.get('hover_s', float('nan')):.2f} | {r.get('filter_s', float('nan')):.2f} "
                f"| {len(r['lines']) - len(r['failures'])}/{len(r['lines'])} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
