"""``python -m benchmarks`` (from the repository root): speed, memory and storage, measured side by side
in one run.

Each case runs in a fresh process (its peak memory is its own) on the same examples and model;
the ratios in the tables come from cases of this one run, never from numbers taken elsewhere.
Prints markdown tables and writes every raw number to ``--out`` (JSON). Results and their reading
are recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import run_in_process, scratch

#: The repository root: each case runs as ``python -m benchmarks.case`` from here.
REPO = Path(__file__).resolve().parent.parent
#: The checkout's sibling ``shared/`` folder holds about half of the SQuAD v2 dev set.
DEFAULT_DATA = REPO.parent / "shared" / "data" / "squad-v2-dev-half.json"


def run_case(spec: dict) -> dict:
    t0 = time.perf_counter()
    r = run_in_process("benchmarks.case", json.dumps(spec))
    print(
        f"  {spec['case']:<9} {json.dumps({k: v for k, v in spec.items() if k not in ('case', 'data', 'store')})}"
        f"  ({time.perf_counter() - t0:.0f}s)",
        file=sys.stderr,
        flush=True,
    )
    return r


def mb(x) -> str:
    return "n/a" if x is None else f"{x / 2**20:,.0f} MB"


def table(head: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="SQuAD-format file (default: ../shared/data/...)")
    ap.add_argument(
        "--examples", type=int, default=None, help="examples for the pipeline and bare-forward cases (default 64)"
    )
    ap.add_argument(
        "--naive-examples",
        type=int,
        default=None,
        help="examples for the naive baseline and matched runs (default: --examples, the same examples; "
        "fewer are a different, smaller sample whose length mix differs)",
    )
    ap.add_argument(
        "--backbone",
        default="resnet50",
        help="the baseline's CNN (the prior work: ResNet-50, 2048-d); the matched run uses it too",
    )
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--model", default="minilm-l6")
    ap.add_argument("--fit-sizes", default=None, help="maps for the fit cases (default 10000,100000,1000000)")
    ap.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="rounds (default 3; 1 with --quick): each runs the short cases (pipeline, bare forward, pooled) over "
        "all the examples and the naive and matched cases over a 1/repeats share of them; the short "
        "cases report their median run, the naive and matched ones their sum",
    )
    ap.add_argument(
        "--input-size",
        type=int,
        default=None,
        help="the CNN's input side for the naive baseline and the matched runs (default 224, the prior work's)",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: every case once, at its smallest size (the defaults become 2 examples for every case, "
        "one round, a 2,000-map fit, the CNN at 64 pixels); no second size or variant of the pipeline case "
        "(no 4x memory run, no pooled embedder, no worker scaling)",
    )
    ap.add_argument("--out", default="bench.json")
    args = ap.parse_args(argv)
    # --quick changes the defaults only: a size given on the command line stays
    for key, full, quick in (
        ("examples", 64, 2),
        ("fit_sizes", "10000,100000,1000000", "2000"),
        ("input_size", 224, 64),
    ):
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.naive_examples is None:
        args.naive_examples = args.examples
    if not Path(args.data).is_file():
        print(f"error: --data: no such file: {args.data}", file=sys.stderr)
        return 2
    with scratch():  # every case's run folder, removed at the end
        return _run(args)


def _run(args) -> int:
    base = {"data": str(Path(args.data).resolve()), "device": args.device, "model": args.model}
    n, nn = args.examples, args.naive_examples
    print(f"rapids_attn benchmark: {n} examples ({nn} for the naive baseline), device {args.device}", file=sys.stderr)
    R: dict = {
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
        "args": vars(args),
    }
    # The host is shared and its load drifts over minutes: every ratio compares cases run in the same
    # rounds. Each round runs the defaults pipeline and the bare forward over all n examples, then the
    # naive baseline and the matched runs over one segment (a round-robin share) of the nn examples, so
    # a slow spell slows both sides of a ratio. Rates over the segments are total maps / total seconds.
    seg_dir = Path(tempfile.mkdtemp(prefix="bench-segments-"))
    segments = write_segments(args.data, nn, max(1, min(args.repeats, nn)), seg_dir)
    matched = {"case": "pipeline", "embed": args.backbone, "input_size": args.input_size}
    kinds = {
        "naive": {"case": "naive", "input_size": args.input_size, "backbone": args.backbone},
        "matched": {**matched, "precision": "float32"},
    }
    if args.device == "cpu":
        kinds["matched_int8"] = {**matched, "precision": "int8"}
    # the pooled embedder is the pipeline case once more with another embedder: a smoke run does without
    short = ("pipeline_runs", "bare_runs") if args.quick else ("pipeline_runs", "bare_runs", "pooled_runs")
    for key in (*short, *(k + "_runs" for k in kinds)):
        R[key] = []
    for i in range(max(1, args.repeats)):
        R["pipeline_runs"].append(run_case({**base, "case": "pipeline", "examples": n}))
        R["bare_runs"].append(run_case({**base, "case": "bare", "examples": n}))
        if "pooled_runs" in R:
            R["pooled_runs"].append(run_case({**base, "case": "pipeline", "examples": n, "embed": "pooled"}))
        if i < len(segments):  # (fewer examples than rounds: fewer segments)
            path, count = segments[i]
            for key, spec in kinds.items():
                R[key + "_runs"].append(run_case({**base, **spec, "data": path, "examples": count}))
    R["pipeline"] = _median(R["pipeline_runs"], _map_rate)
    R["bare"] = _median(R["bare_runs"], lambda b: b["maps"] / b["seconds"])
    if "pooled_runs" in R:
        R["pooled"] = _median(R["pooled_runs"], _map_rate)
    R["naive"] = _sum_naive(R["naive_runs"])
    for key in kinds:
        if key != "naive":
            R[key] = _sum_pipeline(R[key + "_runs"])
    if "matched_int8" in R:
        R["int8_fidelity"] = run_case(
            {
                "case": "fidelity",
                "a": [c["run_dir"] for c in R["matched_runs"]],
                "b": [c["run_dir"] for c in R["matched_int8_runs"]],
            }
        )
    if not args.quick:  # the same case at 4x the examples: a second size, which a smoke run does without
        R["pipeline_4x"] = run_case({**base, "case": "pipeline", "examples": 4 * n})
    R["defaults_small"] = R["pipeline"] if nn == n else run_case({**base, "case": "pipeline", "examples": nn})
    # the capture cases' one batch: at least 8 examples (at --quick's 2, what the hooks save is within the noise)
    R["capture"] = [
        run_case({**base, "case": "capture", "examples": max(n, 8), "mode": m, "batch": 32})
        for m in ("hooks", "output_attentions")
    ]
    if not args.quick:  # the pipeline case in worker processes, at two counts: a scaling run, not a smoke run's
        R["workers"] = [run_case({**base, "case": "pipeline", "examples": n, "workers": w}) for w in (1, 2)]
    R["fit"] = [run_case({"case": "fit", "n": int(s), "backend": "cpu"}) for s in args.fit_sizes.split(",")]
    if args.device == "cuda":
        R["fit_gpu"] = [run_case({"case": "fit", "n": int(s), "backend": "gpu"}) for s in args.fit_sizes.split(",")]
    R["codec"] = run_case({"case": "codec", "store": str(Path(R["pipeline"]["run_dir"]) / "store.zarr")})
    shutil.rmtree(seg_dir, ignore_errors=True)
    Path(args.out).write_text(json.dumps(R, indent=1))
    print(report(R))
    return 0


def write_segments(data: str, n: int, parts: int, out_dir: Path) -> list[tuple[str, int]]:
    """The n examples every case samples (seed 0), dealt round-robin into ``parts`` SQuAD files
    (so each holds a like mix of lengths); returns (path, count) for each."""
    from rapids_attn.data import read_examples

    ids = [e.id for e in read_examples(data, format="squad", sample=n, seed=0)]
    root = json.loads(Path(data).read_text(encoding="utf-8-sig"))
    out = []
    for i in range(parts):
        keep = set(ids[i::parts])
        articles = []
        for article in root["data"]:
            paragraphs = [{**p, "qas": [q for q in p["qas"] if str(q["id"]) in keep]} for p in article["paragraphs"]]
            paragraphs = [p for p in paragraphs if p["qas"]]
            if paragraphs:
                articles.append({**article, "paragraphs": paragraphs})
        path = out_dir / f"segment-{i}.json"
        path.write_text(json.dumps({"version": root.get("version", ""), "data": articles}))
        out.append((str(path), len(keep)))
    return out


def _sum_runs(runs: list[dict], sums: tuple[str, ...], clocks: tuple[str, ...]) -> dict:
    """Runs over the segments as one run over all of them: counts and clocks (dicts of seconds or
    bytes) added up, the peak memory the largest, each segment's spec and run folder listed."""
    out = {
        "spec": {**runs[0]["spec"], "data": [r["spec"]["data"] for r in runs]},
        "segments": len(runs),
        "peak_rss": max(r["peak_rss"] for r in runs),
    }
    out.update({k: runs[0][k] for k in ("dim", "devices", "learn_backend") if k in runs[0]})
    out.update({k: sum(r[k] for r in runs) for k in sums})
    out.update({k: {key: sum(r[k].get(key, 0) for r in runs) for key in runs[0][k]} for k in clocks})
    if "run_dir" in runs[0]:
        out["run_dirs"] = [r["run_dir"] for r in runs]
    return out


def _sum_naive(runs: list[dict]) -> dict:
    return _sum_runs(runs, ("examples", "maps", "bytes"), ("seconds",))


def _sum_pipeline(runs: list[dict]) -> dict:
    return _sum_runs(runs, ("examples", "maps", "tokens", "wall"), ("worker_seconds", "store_bytes"))


def _median(runs: list[dict], key) -> dict:
    """The run with the median ``key`` (the lower middle one for an even count)."""
    return sorted(runs, key=key)[(len(runs) - 1) // 2]


def _phase_rate(p: dict) -> dict:
    """Seconds per phase. extract = tokenize + forward with capture, crop, stats and resize (worker
    clocks); reduce = reading the fit sample + fitting PCA; cluster = fitting the clusterer on the
    sample; assign = transforming and labelling every map (the k sweep is reported apart)."""
    ws, ls = p["worker_seconds"], p["learn_seconds"]
    return {
        "extract": ws["tokenize"] + ws["forward"],
        "embed": ws["embed"],
        "write": ws["write"],
        "reduce": ls["read_sample"] + ls.get("reduce_fit", 0.0),
        "cluster": ls.get("cluster_fit", ls["fit"]),
        "assign": ls["assign"],
        "k sweep": ls.get("k_sweep", 0.0),
    }


def _map_rate(p: dict) -> float:
    ws = p["worker_seconds"]
    return p["maps"] / sum(ws.values())


def report(R: dict) -> str:
    out = []
    p = R["pipeline"]
    rates = _phase_rate(p)
    rows = [
        [k, f"{sec:.2f}", f"{p['maps'] / sec:,.0f}" if sec else "-", f"{p['examples'] / sec:,.1f}" if sec else "-"]
        for k, sec in rates.items()
    ]
    reps = len(R.get("pipeline_runs", [p]))
    out.append(
        f"### Phases ({p['examples']} examples, {p['maps']:,} maps, device {','.join(p['devices'])}; "
        f"the median of {reps} runs)\n"
    )
    out.append(table(["phase", "seconds", "maps/s", "examples/s"], rows))
    total_bytes = sum(p["store_bytes"].values())
    out.append(
        f"\nEnd to end {p['wall']:.1f} s; peak RSS {mb(p['peak_rss'])}; GPU peak {mb(p['gpu_peak'])}; "
        f"store {total_bytes / p['maps']:,.0f} bytes/map "
        f"(features {p['store_bytes'].get('features', 0) / p['maps']:,.0f}).\n"
    )

    nv, m, ds, bare = R["naive"], R["matched"], R["defaults_small"], R["bare"]
    naive_rate = nv["maps"] / sum(nv["seconds"].values())
    bare_rate = bare["maps"] / bare["seconds"]
    rows = [
        [
            f"naive baseline (batch 1, padded, {nv['spec']['backbone']} @{nv['spec']['input_size']}, {nv['dim']}-d CSV)",
            f"{naive_rate:,.1f}",
            "1.0x",
            f"{nv['bytes'] / nv['maps']:,.0f}",
            "1.0x",
        ],
    ]
    mi = R.get("matched_int8")
    backbone = m["spec"]["embed"]
    for label, c in (
        (f"rapids_attn, matched ({backbone} @{m['spec']['input_size']}, float32, batched)", m),
        (f"rapids_attn, matched ({backbone} @{m['spec']['input_size']}, int8: embed.precision int8)", mi),
        ("rapids_attn, defaults (pattern-cnn)", ds),
        ("rapids_attn, pooled 16x16 embedder", R.get("pooled")),
    ):
        if c is None:
            continue
        if c["examples"] != nv["examples"]:
            label += f" ({c['examples']} examples, not the same ones)"
        rows.append(
            [
                label,
                f"{_map_rate(c):,.1f}",
                f"{_map_rate(c) / naive_rate:,.1f}x",
                f"{sum(c['store_bytes'].values()) / c['maps']:,.0f}",
                f"{(nv['bytes'] / nv['maps']) / (sum(c['store_bytes'].values()) / c['maps']):,.0f}x",
            ]
        )
    if ds["examples"] != p["examples"]:
        rows.append(
            [
                f"rapids_attn, defaults, {p['examples']} examples (not the same examples)",
                f"{_map_rate(p):,.1f}",
                f"{_map_rate(p) / naive_rate:,.1f}x",
                f"{sum(p['store_bytes'].values()) / p['maps']:,.0f}",
                f"{(nv['bytes'] / nv['maps']) / (sum(p['store_bytes'].values()) / p['maps']):,.0f}x",
            ]
        )
    out.append(f"### Against the naive pipeline (same {nv['examples']} examples, same model)\n")
    out.append(table(["pipeline", "maps/s", "speed-up", "bytes/map", "smaller by"], rows))
    nr = R.get("naive_runs", [])
    if len(nr) > 1:
        out.append(
            f"\nEach of the {len(nr)} rounds ran the naive and matched cases over its own share of the examples "
            f"(the rates above add them up; each share's run has its own cold first batch) and the defaults "
            f"over all {p['examples']}; speed-ups within each round:\n"
        )
        head = ["round", "naive maps/s", "matched float32", "matched int8", "defaults"]
        body = []
        for i, c in enumerate(nr):
            base_rate = c["maps"] / sum(c["seconds"].values())
            cells = [str(i + 1), f"{base_rate:,.1f}"]
            for key in ("matched_runs", "matched_int8_runs", "pipeline_runs"):
                runs = R.get(key)
                cells.append(f"{_map_rate(runs[i]) / base_rate:,.1f}x" if runs else "-")
            body.append(cells)
        out.append(table(head, body))
    nvs = nv["seconds"]
    out.append(
        f"\nNaive time split: forward {nvs['forward']:.1f} s, CNN {nvs['embed']:.1f} s, CSV {nvs['write']:.1f} s."
    )
    ms = m["worker_seconds"]
    out.append(
        f"Matched float32 split: extract {ms['tokenize'] + ms['forward']:.1f} s, CNN {ms['embed']:.1f} s, "
        f"write {ms['write']:.1f} s."
    )
    fid = R.get("int8_fidelity")
    if fid:
        out.append(
            f"\nint8 against float32 features ({fid['maps']:,} real maps, both stored as float16): cosine mean "
            f"{fid['cos_mean']:.4f}, 1st percentile {fid['cos_p01']:.4f}, min {fid['cos_min']:.4f}; clusters "
            f"(k={fid['k']}) agree at ARI {fid['ari_int8_vs_fp32']:.3f}, against {fid['ari_fp32_reseeded']:.3f} for "
            "float32 features clustered again with another KMeans seed."
        )
    out.append("")

    out.append(
        f"### Against the bare forward pass ({bare['examples']} examples, same batches; medians of {reps} "
        "alternating runs)\n"
    )
    if reps > 1:
        out.append(
            "Every run, in maps/s: pipeline "
            + ", ".join(f"{_map_rate(c):,.0f}" for c in R["pipeline_runs"])
            + "; bare forward "
            + ", ".join(f"{c['maps'] / c['seconds']:,.0f}" for c in R["bare_runs"])
            + ".\n"
        )
    frac = _map_rate(p) / bare_rate
    out.append(
        table(
            ["", "maps/s", "fraction"],
            [
                ["bare forward (attention outputs on, nothing captured)", f"{bare_rate:,.0f}", "1.00"],
                ["pipeline extract+embed+write", f"{_map_rate(p):,.0f}", f"{frac:.2f}"],
            ],
        )
    )

    p4 = R.get("pipeline_4x")  # not in a --quick run
    cap = {c["mode"]: c for c in R["capture"]}
    out.append("\n### Memory\n")
    mem_rows = [[f"job over {p['examples']} examples", mb(p["peak_rss"]), "1.00"]]
    if p4:
        mem_rows.append(
            [f"job over {p4['examples']} examples (4x)", mb(p4["peak_rss"]), f"{p4['peak_rss'] / p['peak_rss']:.2f}"]
        )
    out.append(table(["run", "peak RSS", "ratio"], mem_rows))
    h, o = cap.get("hooks"), cap.get("output_attentions")
    if h and o:
        out.append(
            "\n"
            + table(
                ["capture (one batch)", "batch x longest", "peak over base", "seconds"],
                [
                    [k, f"{c['batch']} x {c['longest']}", mb(c["peak_over_base"]), f"{c['seconds']:.2f}"]
                    for k, c in cap.items()
                ],
            )
        )

    out.append("\n### Scale\n")
    w = R.get("workers")  # not in a --quick run
    if w:
        out.append(
            table(
                ["workers", "extract wall (s)", "maps/s (wall)", "speed-up"],
                [
                    [
                        c["spec"]["workers"],
                        f"{c['seconds']['extract']:.1f}",
                        f"{c['maps'] / c['seconds']['extract']:,.0f}",
                        f"{w[0]['seconds']['extract'] / c['seconds']['extract']:.2f}x",
                    ]
                    for c in w
                ],
            )
        )
    fit_rows = [
        [f"{c['n']:,}", c["backend"], f"{c['pca']:.2f}", f"{c['kmeans']:.2f}", f"{c['total']:.2f}"]
        for c in R["fit"] + R.get("fit_gpu", [])
    ]
    out.append("\n" + table(["maps", "backend", "PCA (s)", "KMeans (s)", "total (s)"], fit_rows))
    cd = R["codec"]
    out.append(f"\n### Store codec and chunk rows ({cd['maps']:,} maps of real features + stats)\n")
    out.append(
        table(
            ["rows/chunk", "codec", "bytes/map", "write (s)", "read (s)"],
            [
                [
                    c["rows"],
                    c["codec"],
                    f"{sum(c['bytes'].values()) / cd['maps']:,.0f}",
                    f"{c['write']:.2f}",
                    f"{c['read']:.2f}",
                ]
                for c in cd["results"]
            ],
        )
    )
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
