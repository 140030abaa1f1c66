"""The benchmark suite's smoke run (``python -m benchmarks --quick``, from the repository root) on the
real SQuAD file: every case runs in its own process and the report is built from that one run. It
checks what each number means, never how fast anything was (timings belong in docs/benchmarks.md,
not in tests)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, SHARED_SQUAD


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_SQUAD.is_file(), reason="needs ../shared/data/squad-v2-dev-half.json")
@pytest.mark.budget(200, reason="every benchmark case once, each in a process of its own that loads MiniLM (about ten)")
def test_quick_benchmark_runs_every_case(tmp_path):
    """Every case in its own process, once, at --quick's sizes (one round of 2 examples, the capture cases' batch
    of 8). How rounds deal the naive and matched cases their segments and add them up is
    test_rounds_deal_the_segments_and_add_up's, and every table's rows and ratios tests/unit/test_bench_report.py's,
    without processes. Every case's run folder lies in one scratch folder that is gone at the end: nothing is
    left in TMPDIR."""
    out = tmp_path / "bench.json"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--quick",
            "--data",
            str(SHARED_SQUAD),
            "--out",
            str(out),
        ],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert list(tmp.iterdir()) == []
    R = json.loads(out.read_text())
    for key in (
        "pipeline",
        "bare",
        "naive",
        "matched",
        "matched_int8",
        "int8_fidelity",
        "defaults_small",
        "capture",
        "fit",
        "codec",
    ):
        assert key in R, key
    assert not {"pipeline_4x", "pooled", "workers"} & set(R)  # a full run's second size and variants
    pipe, naive = R["pipeline"], R["naive"]
    assert pipe["maps"] == pipe["examples"] * 6 * 12  # MiniLM: every example x layer x head
    assert R["defaults_small"] == pipe and pipe["run_dir"] in R["codec"]["spec"]["store"]
    # one round: the naive and matched cases ran once, on the same segment (all the naive examples)
    assert len(R["naive_runs"]) == len(R["matched_runs"]) == len(R["pipeline_runs"]) == 1
    assert naive["examples"] == 2 and [c["examples"] for c in R["naive_runs"]] == [2]
    for kind in ("matched_runs", "matched_int8_runs"):
        assert [c["examples"] for c in R[kind]] == [2]
        assert [c["spec"]["data"] for c in R[kind]] == [c["spec"]["data"] for c in R["naive_runs"]]
    assert naive["maps"] == sum(c["maps"] for c in R["naive_runs"])
    # the per-round speed-ups, printed from two rounds on, drawn from these real runs as a second round adds them
    from benchmarks.__main__ import report

    two = {**R, **{k: R[k] * 2 for k in ("naive_runs", "matched_runs", "matched_int8_runs", "pipeline_runs")}}
    per_round = report(two).split("speed-ups within each round")[1]
    assert "| 1 |" in per_round and "| 2 |" in per_round
    # the naive baseline and the matched runs saw the same examples and made one map each per head
    assert naive["maps"] == R["matched"]["maps"] == R["matched_int8"]["maps"] == naive["examples"] * 72
    assert naive["dim"] == 2048  # ResNet-50's penultimate layer, as in the prior work
    # the store is smaller per map than the CSV of 2048 floats as text (~36 kB)
    assert sum(pipe["store_bytes"].values()) / pipe["maps"] < naive["bytes"] / naive["maps"] / 10
    # int8 features follow float32 ones map by map (both runs over the same maps, in the same order)
    fid = R["int8_fidelity"]
    assert fid["maps"] == naive["maps"] and fid["cos_mean"] > 0.99
    # hooks hold less than output_attentions for the same batch
    cap = {c["mode"]: c for c in R["capture"]}
    assert cap["hooks"]["batch"] == cap["output_attentions"]["batch"] == 8
    assert cap["hooks"]["peak_over_base"] < cap["output_attentions"]["peak_over_base"]
    # the printed report has every table
    for title in (
        "### Phases",
        "### Against the naive pipeline",
        "### Against the bare forward pass",
        "### Memory",
        "### Scale",
        "### Store codec",
    ):
        assert title in p.stdout, title


@pytest.mark.skipif(not SHARED_SQUAD.is_file(), reason="needs ../shared/data/squad-v2-dev-half.json")
def test_segments_deal_the_sampled_examples_out_once_each(tmp_path):
    from benchmarks.__main__ import write_segments
    from rapids_attn.data import read_examples

    sampled = read_examples(SHARED_SQUAD, format="squad", sample=7, seed=0)
    segments = write_segments(str(SHARED_SQUAD), 7, 3, tmp_path)
    parts = [read_examples(path, format="squad") for path, _ in segments]
    assert [len(x) for x in parts] == [count for _, count in segments] == [3, 2, 2]
    got = sorted(e.id for part in parts for e in part)
    assert got == sorted(e.id for e in sampled)  # disjoint, and together the whole sample
    by_id = {e.id: e for e in sampled}
    assert all(e == by_id[e.id] for part in parts for e in part)  # question, context, title, label kept


@pytest.mark.parametrize("quick", [True, False])
def test_rounds_deal_the_segments_and_add_up(tmp_path, monkeypatch, quick):
    """python -m benchmarks's orchestration with a stand-in for each case's process: two rounds, the short
    cases once per round over all the examples, the naive and matched cases once per segment (each round its
    own, the same for every kind), their sums over the segments, the fidelity case on the matched runs' folders;
    --quick's CNN at 64 pixels and no 4x, pooled or worker runs, a full run's all of them. The real cases run
    once each in test_quick_benchmark_runs_every_case."""
    import benchmarks.__main__ as bench

    calls = []

    def run_case(spec):
        calls.append(spec)
        n = spec.get("examples", 0)
        r = {"spec": spec, "examples": n, "maps": 72 * n, "peak_rss": 1, "run_dir": str(tmp_path / f"run{len(calls)}")}
        if spec["case"] == "naive":
            return {**r, "bytes": 1000 * n, "seconds": {"forward": 1.0, "cnn": 2.0}, "dim": 2048}
        if spec["case"] == "pipeline":
            return {**r, "tokens": 10 * n, "wall": 1.0, "worker_seconds": {"forward": 1.0}, "store_bytes": {"f": 5}}
        return {**r, "seconds": 1.0}

    monkeypatch.setattr(bench, "run_case", run_case)
    monkeypatch.setattr(bench, "report", lambda R: "")
    data = REPO / "rapids_attn" / "data" / "quickstart.json"
    out = tmp_path / "bench.json"
    sizes = ["--repeats", "2", "--examples", "8", "--naive-examples", "2"]
    assert bench.main([*(["--quick"] if quick else []), *sizes, "--data", str(data), "--out", str(out)]) == 0
    R = json.loads(out.read_text())
    assert R["args"]["repeats"] == 2 and R["args"]["input_size"] == (64 if quick else 224)
    for key in ("pipeline_runs", "bare_runs", *(() if quick else ("pooled_runs",))):
        assert [c["examples"] for c in R[key]] == [8, 8], key
    segments = [c["spec"]["data"] for c in R["naive_runs"]]
    assert len(set(segments)) == 2 and [c["examples"] for c in R["naive_runs"]] == [1, 1]
    for kind in ("matched_runs", "matched_int8_runs"):  # each round's matched runs had its naive run's segment
        assert [c["spec"]["data"] for c in R[kind]] == segments and [c["examples"] for c in R[kind]] == [1, 1]
        assert all(c["spec"]["input_size"] == R["args"]["input_size"] for c in R[kind])
    assert R["naive"]["examples"] == 2 and R["naive"]["maps"] == 144 and R["naive"]["bytes"] == 2000
    assert R["naive"]["seconds"] == {"forward": 2.0, "cnn": 4.0}  # the segments' clocks added up
    assert R["matched"]["examples"] == R["matched_int8"]["examples"] == 2 and R["matched"]["wall"] == 2.0
    fidelity = next(c for c in calls if c["case"] == "fidelity")
    assert fidelity["a"] == R["matched"]["run_dirs"] and fidelity["b"] == R["matched_int8"]["run_dirs"]
    assert R["defaults_small"]["examples"] == 2
    if quick:
        assert not {"pooled_runs", "pooled", "pipeline_4x", "workers"} & set(R)
        assert [c["n"] for c in calls if c["case"] == "fit"] == [2000]
    else:
        assert R["pipeline_4x"]["examples"] == 32 and [c["examples"] for c in R["pooled_runs"]] == [8, 8]
        assert [c["spec"]["workers"] for c in R["workers"]] == [1, 2]
        assert [c["n"] for c in calls if c["case"] == "fit"] == [10000, 100000, 1000000]


def test_job_level_job_file_follows_the_protocol(tmp_path):
    """The job the job-level benchmark launches is the quickstart changed only where issue 13's
    protocol says: the sampled data, the default shard size, the report off."""
    from benchmarks.job_level import QUICKSTART, write_job
    from rapids_attn.jobfile import load_job

    data = tmp_path / "squad.json"
    data.write_text("{}")
    cfg = load_job(write_job(QUICKSTART, data, 500, 0, tmp_path / "run", tmp_path / "job.yaml"))
    quick = load_job(QUICKSTART)
    assert (cfg.data.sample, cfg.data.seed, cfg.data.format) == (500, 0, "squad")
    assert cfg.extract.shard_size == "auto" and cfg.explain.report is False  # the default
    assert (cfg.model, cfg.embed, cfg.cluster, cfg.runtime) == (quick.model, quick.embed, quick.cluster, quick.runtime)


def test_job_level_extrapolates_from_the_fixed_cost_and_the_per_question_rate():
    from benchmarks.job_level import extrapolate

    x = extrapolate({"wall": 30.0, "loop": 20.0, "per_question": [9.0, 11.0]}, 500)
    assert x["fixed"] == 10.0 and x["per_question"] == 10.0
    assert x["wall"] == 10.0 + 10.0 * 500 and x["low"] < x["wall"] < x["high"]


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_SQUAD.is_file(), reason="needs ../shared/data/squad-v2-dev-half.json")
@pytest.mark.budget(60, reason="a whole job and the prior pipeline's baseline, each a process of its own")
def test_job_level_benchmark_smoke(tmp_path):
    """python -m benchmarks.job_level at tiny sizes: the job and the baseline both run, on the same
    sampled questions, and a baseline on fewer questions is reported as extrapolated."""
    out = tmp_path / "job_level.json"
    cmd = ["--questions", "3", "--baseline-questions", "1", "--backbone", "resnet18", "--max-length", "32"]
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.job_level", *cmd, "--data", str(SHARED_SQUAD), "--out", str(out)],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    R = json.loads(out.read_text())
    job, base = R["job"], R["baseline"]
    assert job["examples"] == 3 and job["maps"] == 3 * 72 and job["shards"] == 1  # shard size 128
    assert base["examples"] == 1 and base["maps"] == 72 and len(base["per_question"]) == 1
    assert 0 < base["loop"] < base["wall"] and job["seconds"]["extract"] < job["wall"]
    assert R["speedup"] == pytest.approx(R["extrapolated"]["wall"] / job["wall"])
    assert "**extrapolated** to 3 questions" in p.stdout and "### The job's phases" in p.stdout


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_SQUAD.is_file(), reason="needs ../shared/data/squad-v2-dev-half.json")
@pytest.mark.budget(
    100, reason="the job and two bare forwards, each a process of its own, then the in-process forwards"
)
def test_forward_ratio_benchmark_smoke(tmp_path):
    """python -m benchmarks.forward_ratio at 3 questions, --forwards eager: the job and the bare eager forward
    (before and after it, in its own process) run on the same questions, the ratio is bare / job, the phases
    are printed, and the sdpa forward is left out; --in-process times the bare eager and SDPA forwards and the
    blocked capture in one process. Which forwards run when (both by default) and their ratios:
    tests/unit/test_bench_report.py, with stand-ins for the processes."""

    def bench(*args):
        return subprocess.run(
            [sys.executable, "-m", "benchmarks.forward_ratio", "--questions", "3", "--data", str(SHARED_SQUAD), *args],
            check=False,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )

    out = tmp_path / "ratio.json"
    p = bench("--set", "cluster.k_sweep=null", "--forwards", "eager", "--out", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    R = json.loads(out.read_text())
    assert R["job"]["examples"] == 3 and R["job"]["maps"] == 3 * 72
    assert set(R["bare"]) == set(R["ratios"]) == {"eager"}
    runs = R["bare"]["eager"]
    assert len(runs) == 2 and all(r["examples"] == 3 and r["seconds"] > 0 for r in runs)
    assert R["ratios"]["eager"] == pytest.approx(sum(r["seconds"] for r in runs) / 2 / R["job"]["wall"])
    assert "| bare eager forward (before, after: " in p.stdout and "| bare sdpa forward" not in p.stdout
    assert "| worker start (LocalCluster) |" in p.stdout and "cluster.k_sweep=null" in p.stdout
    p = bench("--in-process")
    assert p.returncode == 0, p.stderr[-3000:]
    assert all(f"| {case} |" in p.stdout for case in ("bare eager", "bare sdpa", "blocked capture"))


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_SQUAD.is_file(), reason="needs ../shared/data/squad-v2-dev-half.json")
def test_heads_benchmark_smoke(tmp_path, tiny_bert_dir):
    """python -m benchmarks.heads on a tiny BERT (2 x 2 heads) and 3 sampled questions: every pass runs on
    the same examples, the all-ones hooks change nothing, every ablation changes the partials, and each
    ratio is its pass over the mean of the two unablated runs."""
    out = tmp_path / "heads.json"
    cmd = ["--questions", "3", "--model", str(tiny_bert_dir), "--threads", "1", "--data", str(SHARED_SQUAD)]
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.heads", *cmd, "--out", str(out)],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    R = json.loads(out.read_text())
    assert (R["examples"], R["layers"], R["heads"], R["metric"]) == (3, 2, 2, "retrieval")
    assert R["check"]["hooks_identical"] and R["check"]["ablations"] == R["check"]["ablations_changed"] == 4
    assert R["check"]["importance_finite"] and R["check"]["importance_units"] == 1  # retrieval: one batch
    assert len(R["c_per_ablation"]) == 4
    a = (R["a_before"]["seconds"] + R["a_after"]["seconds"]) / 2
    for key in ("bare", "b_hooks", "c_ablations", "d_importance"):
        assert R["ratios"][key]["mean"] == pytest.approx(R[key]["seconds"] / a)
    assert R["c_ablations"]["seconds"] >= sum(R["c_per_ablation"])
    assert "all 4 single-head ablations" in p.stdout and "(d) one importance pass" in p.stdout


def test_heads_benchmark_refuses_a_missing_model_in_one_line(tmp_path, capsys, monkeypatch):
    from benchmarks.heads import main

    for var in ("OMP_WAIT_POLICY", "HF_HUB_DISABLE_PROGRESS_BARS", "TOKENIZERS_PARALLELISM"):
        monkeypatch.setenv(var, "")  # main sets them (as the job's CLI does); restored after the test
    data = tmp_path / "squad.json"
    data.write_text("{}")
    assert main(["--questions", "3", "--model", str(tmp_path / "nope"), "--data", str(data)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: model.name: no such model folder")


@pytest.mark.slow
@pytest.mark.budget(50, reason="the long-context benchmark's four capture paths in a process of its own")
def test_long_context_benchmark_smoke():
    """python -m benchmarks.long_context at one short length: a row of numbers for all four paths, exit 0."""
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.long_context", "--lengths", "64"],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    row = next(line for line in out.stdout.splitlines() if line.startswith("| 64 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 11
    for c in cells[1:]:
        float(c)  # memory, seconds and the two ratios: every path ran


def test_a_timed_job_imports_this_checkouts_package(tmp_path, monkeypatch):
    """The job runs from its own folder: it must import this checkout's rapids_attn, not another that the
    environment would find first (here a decoy on PYTHONPATH; in practice the editable install's checkout)."""
    from benchmarks.job_level import timed

    decoy = tmp_path / "decoy" / "rapids_attn"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(decoy.parent))
    _, p = timed([sys.executable, "-c", "import rapids_attn; print(rapids_attn.__file__)"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert Path(p.stdout.strip()).resolve() == (REPO / "rapids_attn" / "__init__.py").resolve()


def test_scratch_removes_its_folder_and_restores_tmpdir(tmp_path, monkeypatch):
    """benchmarks.scratch: TMPDIR for this process and its children while it lasts; afterwards the folder is
    gone, even when the benchmark fails, and TMPDIR is what it was."""
    import tempfile

    from benchmarks import scratch

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    with pytest.raises(RuntimeError), scratch() as d:
        assert os.environ["TMPDIR"] == str(d) and d.parent == tmp_path
        made = Path(tempfile.mkdtemp(prefix="bench-"))
        assert made.parent == d
        out = subprocess.run(
            [sys.executable, "-c", "import tempfile; print(tempfile.mkdtemp())"],
            check=True,
            capture_output=True,
            text=True,
        )
        assert Path(out.stdout.strip()).parent == d
        raise RuntimeError("a case failed")
    assert not d.exists() and os.environ["TMPDIR"] == str(tmp_path) and tempfile.tempdir is None
