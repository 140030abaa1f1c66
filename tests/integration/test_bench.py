"""The benchmark suite's smoke run (``python -m benchmarks --quick``, from the repository root) on the
real SQuAD file: every case runs in its own process and the report is built from that one run. It
checks what each number means, never how fast anything was (timings belong in docs/benchmarks.md,
not in tests)."""

import json
import subprocess
import sys

import pytest
from helpers import REPO, SHARED_SQUAD


@pytest.mark.skipif(not SHARED_SQUAD.is_file(), reason="needs ../shared/data/squad-v2-dev-half.json")
def test_quick_benchmark_runs_every_case(tmp_path):
    out = tmp_path / "bench.json"
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--data", str(SHARED_SQUAD), "--out", str(out)],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    R = json.loads(out.read_text())
    for key in (
        "pipeline",
        "pipeline_4x",
        "bare",
        "naive",
        "matched",
        "matched_int8",
        "int8_fidelity",
        "defaults_small",
        "pooled",
        "capture",
        "workers",
        "fit",
        "codec",
    ):
        assert key in R, key
    pipe, naive = R["pipeline"], R["naive"]
    assert pipe["maps"] == pipe["examples"] * 6 * 12  # MiniLM: every example x layer x head
    assert R["pipeline_4x"]["examples"] == 4 * pipe["examples"]
    # --quick runs two rounds: the naive and matched cases ran once per segment, and add up
    assert len(R["naive_runs"]) == len(R["matched_runs"]) == len(R["pipeline_runs"]) == 2
    assert naive["examples"] == 2 and [c["examples"] for c in R["naive_runs"]] == [1, 1]
    for kind in ("matched_runs", "matched_int8_runs"):  # each round's matched runs had its naive run's share
        assert [c["examples"] for c in R[kind]] == [1, 1]
        assert [c["spec"]["data"] for c in R[kind]] == [c["spec"]["data"] for c in R["naive_runs"]]
    assert naive["maps"] == sum(c["maps"] for c in R["naive_runs"])
    assert "speed-ups within each round" in p.stdout
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
    assert cap["hooks"]["batch"] == cap["output_attentions"]["batch"]
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
