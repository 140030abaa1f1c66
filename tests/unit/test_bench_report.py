"""The benchmarks' orchestration and printed tables on stub results, without a case's process: ``python -m
benchmarks`` (every table and every row, from made-up case results whose ratios are known) and ``python -m
benchmarks.forward_ratio`` (which bare forwards run, when, and their ratios). The real cases run once each in
tests/integration/test_bench.py's smoke runs, at their smallest sizes."""

import json

import pytest
from helpers import REPO

QUICKSTART_DATA = REPO / "rapids_attn" / "data" / "quickstart.json"

#: maps/s of each embedder's pipeline run (worker clocks), and of the bare forward and the naive baseline
RATE = {"pattern-cnn": 96.0, "pooled": 192.0, "float32": 24.0, "int8": 48.0, "bare": 192.0, "naive": 8.0}


def stub_case(spec: dict) -> dict:
    """A case's result with the fields the report reads, at the rates in RATE: 72 maps an example (MiniLM),
    10 bytes a map in the store, 36,000 in the naive CSV, peak memory 10 MiB an example."""
    n = spec.get("examples", 0)
    maps = 72 * n
    r = {"spec": spec, "examples": n, "maps": maps}
    case = spec["case"]
    if case == "pipeline":
        embed = spec.get("embed", "pattern-cnn")
        sec = maps / RATE[spec.get("precision", embed)]
        return {
            **r,
            "wall": 10.0,
            "seconds": {"extract": 8.0 / max(spec.get("workers", 0), 1)},
            "worker_seconds": {"tokenize": 0.0, "forward": sec / 2, "embed": sec / 4, "write": sec / 4},
            "learn_seconds": {"read_sample": 0.5, "fit": 1.0, "assign": 0.25},
            "tokens": 10 * n,
            "store_bytes": {"features": 8 * maps, "stats": 2 * maps},
            "peak_rss": 10 * n * 2**20,
            "gpu_peak": None,
            "devices": ["cpu"],
            "run_dir": f"/runs/{embed}-{spec.get('precision', '')}-{spec['data'][-6:]}",
        }
    if case == "bare":
        return {**r, "seconds": maps / RATE["bare"], "peak_rss": 1, "gpu_peak": None}
    if case == "naive":
        sec = maps / RATE["naive"]
        seconds = {"forward": sec / 2, "embed": sec / 4, "write": sec / 4}
        return {**r, "seconds": seconds, "bytes": 36000 * maps, "dim": 2048, "peak_rss": 1, "gpu_peak": None}
    if case == "fidelity":
        cos = {"cos_mean": 0.999, "cos_p01": 0.99, "cos_min": 0.98}
        return {
            "spec": spec,
            "maps": 72 * len(spec["a"]),
            **cos,
            "k": 8,
            "ari_int8_vs_fp32": 0.9,
            "ari_fp32_reseeded": 0.8,
        }
    if case == "capture":
        over = {"hooks": 10, "output_attentions": 40}[spec["mode"]] * 2**20
        return {**r, "mode": spec["mode"], "batch": min(n, 32), "longest": 100, "peak_over_base": over, "seconds": 0.5}
    if case == "fit":
        return {"spec": spec, "n": spec["n"], "backend": spec["backend"], "pca": 0.1, "kmeans": 0.2, "total": 0.3}
    if case == "codec":
        result = {"rows": 16, "codec": "zstd-3", "bytes": {"features": 5760, "stats": 0}, "write": 0.1, "read": 0.05}
        return {"spec": spec, "maps": 576, "results": [result]}
    raise AssertionError(case)


def run_bench(monkeypatch, tmp_path, capsys, *args):
    import benchmarks.__main__ as bench

    calls = []
    monkeypatch.setattr(bench, "run_case", lambda spec: calls.append(spec) or stub_case(spec))
    out = tmp_path / "bench.json"
    assert bench.main([*args, "--data", str(QUICKSTART_DATA), "--out", str(out)]) == 0
    return json.loads(out.read_text()), capsys.readouterr().out, calls


def rows(printed: str) -> set[str]:
    return {line for line in printed.splitlines() if line.startswith("| ")}


def test_report_prints_every_table_with_its_ratios(tmp_path, monkeypatch, capsys):
    """A full run's shape (two rounds, the pooled embedder, the 4x memory run, two worker counts): every row,
    each ratio drawn from the runs of this one report."""
    R, printed, calls = run_bench(
        monkeypatch, tmp_path, capsys, "--repeats", "2", "--examples", "8", "--fit-sizes", "2000"
    )
    assert len(calls) == 2 * 6 + 1 + 1 + 2 + 2 + 1 + 1  # 2 rounds x 6 cases, fidelity, 4x, capture, workers, fit, codec
    assert "### Phases (8 examples, 576 maps, device cpu; the median of 2 runs)" in printed
    got = rows(printed)
    for row in (
        # the naive baseline against every pipeline: maps/s, speed-up, bytes a map, smaller by
        "| naive baseline (batch 1, padded, resnet50 @224, 2048-d CSV) | 8.0 | 1.0x | 36,000 | 1.0x |",
        "| rapids_attn, matched (resnet50 @224, float32, batched) | 24.0 | 3.0x | 10 | 3,600x |",
        "| rapids_attn, matched (resnet50 @224, int8: embed.precision int8) | 48.0 | 6.0x | 10 | 3,600x |",
        "| rapids_attn, defaults (pattern-cnn) | 96.0 | 12.0x | 10 | 3,600x |",
        "| rapids_attn, pooled 16x16 embedder | 192.0 | 24.0x | 10 | 3,600x |",
        # each round's speed-ups, over its own segment (4 of the 8 examples)
        "| 1 | 8.0 | 3.0x | 6.0x | 12.0x |",
        "| 2 | 8.0 | 3.0x | 6.0x | 12.0x |",
        "| bare forward (attention outputs on, nothing captured) | 192 | 1.00 |",
        "| pipeline extract+embed+write | 96 | 0.50 |",
        "| job over 8 examples | 80 MB | 1.00 |",
        "| job over 32 examples (4x) | 320 MB | 4.00 |",
        "| hooks | 8 x 100 | 10 MB | 0.50 |",
        "| output_attentions | 8 x 100 | 40 MB | 0.50 |",
        "| 1 | 8.0 | 72 | 1.00x |",  # workers: extract wall, maps/s, speed-up over one worker
        "| 2 | 4.0 | 144 | 2.00x |",
        "| 2,000 | cpu | 0.10 | 0.20 | 0.30 |",
        "| 16 | zstd-3 | 10 | 0.10 | 0.05 |",
    ):
        assert row in got, row
    assert "Every run, in maps/s: pipeline 96, 96; bare forward 192, 192." in printed
    assert "Naive time split: forward 36.0 s, CNN 18.0 s, CSV 18.0 s." in printed  # 576 maps at 8 maps/s
    assert "cosine mean 0.9990" in printed and "agree at ARI 0.900, against 0.800" in printed
    assert R["naive"]["examples"] == 8 and len(R["naive_runs"]) == 2 and R["naive"]["maps"] == 576


def test_a_quick_run_runs_every_case_once_and_leaves_out_the_variants(tmp_path, monkeypatch, capsys):
    """--quick: one round of 2 examples, each case once; no 4x run, pooled embedder or worker counts, and the
    report prints every table without their rows."""
    R, printed, calls = run_bench(monkeypatch, tmp_path, capsys, "--quick")
    kinds = [(c["case"], c.get("embed"), c.get("precision"), c.get("mode")) for c in calls]
    assert len(kinds) == len(set(kinds)) == 10  # pipeline, bare, naive, 2 matched, fidelity, 2 capture, fit, codec
    assert {c["case"] for c in calls} == {"pipeline", "bare", "naive", "fidelity", "capture", "fit", "codec"}
    assert all(c["examples"] == (8 if c["case"] == "capture" else 2) for c in calls if "examples" in c)
    assert (R["args"]["repeats"], R["args"]["input_size"], R["args"]["fit_sizes"]) == (1, 64, "2000")
    assert not {"pipeline_4x", "pooled", "pooled_runs", "workers"} & set(R)
    for title in ("### Phases", "### Against the naive pipeline", "### Against the bare forward pass", "### Memory"):
        assert title in printed, title
    assert "### Scale" in printed and "### Store codec" in printed
    got = rows(printed)
    assert "| job over 2 examples | 20 MB | 1.00 |" in got and not any("(4x)" in r or "pooled" in r for r in got)
    assert "| rapids_attn, defaults (pattern-cnn) | 96.0 | 12.0x | 10 | 3,600x |" in got
    assert "| workers |" not in printed and "within each round" not in printed


@pytest.mark.parametrize("forwards", [[], ["eager"]])
def test_forward_ratio_runs_each_bare_forward_before_and_after_the_job(tmp_path, monkeypatch, capsys, forwards):
    """python -m benchmarks.forward_ratio with stand-ins for its processes: each chosen bare forward (both by
    default) once before the job and once after, on the job's questions; each ratio is its mean over the job's
    wall clock; --set lands in the job file."""
    import benchmarks.forward_ratio as fr
    from rapids_attn.extract import model

    order = []

    def run_bare(spec):
        order.append(spec["attention"])
        assert spec["sample"] == 3 and spec["max_length"] == 512
        return {"seconds": {"eager": 4.0, "sdpa": 2.0}[spec["attention"]] + len(order) / 10, "examples": 3}

    def run_job(job_yaml, run_dir):
        import yaml

        spec = yaml.safe_load(job_yaml.read_text())
        assert spec["cluster"]["k_sweep"] is None and spec["relevance"]["enabled"] is False
        assert spec["data"]["sample"] == 3 and spec["output"]["dir"] == str(run_dir)
        order.append("job")
        seconds = {"preflight": 1.0, "cluster_start": 2.0, "extract": 5.0, "learn": 1.0}
        return {"wall": 10.0, "seconds": seconds, "worker_seconds": {"forward": 6.0}, "workers": 2, "examples": 3}

    monkeypatch.setattr(fr, "run_bare", run_bare)
    monkeypatch.setattr(fr, "run_job", run_job)
    monkeypatch.setattr(
        model, "describe_model", lambda *a, **k: type("Info", (), {"max_length": 512, "attention": "eager"})
    )
    data, out = tmp_path / "squad.json", tmp_path / "ratio.json"
    data.write_text("{}")
    args = ["--questions", "3", "--data", str(data), "--set", "cluster.k_sweep=null", "--out", str(out)]
    assert fr.main([*args, *(["--forwards", *forwards] if forwards else [])]) == 0
    atts = forwards or ["eager", "sdpa"]
    assert order == [*atts, "job", *atts]
    R, printed = json.loads(out.read_text()), capsys.readouterr().out
    assert set(R["bare"]) == set(R["ratios"]) == set(atts)
    for att in atts:
        assert len(R["bare"][att]) == 2
        assert R["ratios"][att] == pytest.approx(sum(r["seconds"] for r in R["bare"][att]) / 2 / 10.0)
        assert f"| bare {att} forward (before, after: " in printed
    assert ("| bare sdpa forward" in printed) == ("sdpa" in atts)
    assert (
        "| the whole job, wall clock | 10.0 | 1.00 |" in printed and "| worker start (LocalCluster) | 2.0 |" in printed
    )
    assert "cluster.k_sweep=null" in printed
