"""Whole jobs on real LocalClusters with worker processes: the quickstart, SQuAD v2 (500 questions),
and the existing-scheduler runtime. Every example job validates; those that run on a CPU run."""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import REPO, SHARED_SQUAD

from rapids_attn.jobfile import load_job

JOBS = sorted((REPO / "jobs").glob("*.yaml"))


def run_cli(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rapids_attn.run", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        check=False,
        text=True,
        timeout=1200,
    )


def check_report(run: Path, summary: dict) -> None:
    """The report opens without a server: every image it names is a PNG beside it, no URL is
    fetched, and each cluster section names its dominant layers and heads and its signature."""
    import re
    from html import escape

    html = (run / "report" / "index.html").read_text()
    assert "http://" not in html and "https://" not in html
    srcs = re.findall(r'<img[^>]+src="([^"]+)"', html)
    assert len(srcs) >= 5
    for src in srcs:
        assert (run / "report" / src).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", src
    for c in summary["clusters"]["descriptions"]:
        assert c["dominant_description"].startswith("mostly layer")
        assert escape(c["dominant_description"]) in html
        assert "overall" in c["summary"] and escape(c["summary"]) in html
    for link in re.findall(r'href="(headviews/[^"]+)"', html):
        assert (run / "report" / link).is_file()


@pytest.mark.parametrize("job", JOBS, ids=[p.stem for p in JOBS])
def test_every_example_job_validates(job):
    cfg = load_job(job)
    assert cfg.name
    assert cfg.data.path


@pytest.mark.slow
@pytest.mark.budget(
    170, reason="the README's quickstart as a user runs it, on two worker processes, then once more to resume"
)
def test_quickstart_end_to_end(tmp_path):
    r = run_cli(REPO / "jobs" / "quickstart.yaml", "--set", f"output.dir={tmp_path / 'qs'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "qs"
    s = json.loads((run / "summary.json").read_text())
    n = s["counts"]["examples"]
    t = pq.read_table(run / "maps.parquet")
    assert t.num_rows == n * 6 * 12 and n >= 40
    assert t.column("cluster").null_count == 0
    assert min(t.column("cluster").to_pylist()) >= 0
    assert s["backend"]["runtime"]["n_workers"] == 2
    assert "dashboard:" in r.stderr
    check_report(run, s)
    # issue 49: the quickstart's inputs (at most ~110 tokens) are too short for the long-context classes, which
    # say so instead of labelling most heads streaming; an encoder gets no KV-cache exports, and the report says why
    hc = s["head_classes"]
    assert hc["counts"]["not_applicable"] == 6 * 12 and hc["applicability"]["long_examples"] == 0
    assert "no example has 256 tokens or more" in hc["applicability"]["not_applicable"]["streaming"]
    assert (
        hc["exports"]["written"] is False and "encoder" in hc["exports"]["why"] and not (run / "head_classes").exists()
    )
    html = (run / "report" / "index.html").read_text()
    assert 'id="head_classes"' in html and "no example has 256 tokens or more" in html
    # a second run resumes: nothing left to extract
    r2 = run_cli(REPO / "jobs" / "quickstart.yaml", "--set", f"output.dir={run}", cwd=tmp_path)
    assert r2.returncode == 0, r2.stderr[-3000:]
    s2 = json.loads((run / "summary.json").read_text())
    assert s2["extract"]["this_run"]["shards_run"] == 0


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_SQUAD.is_file(), reason=f"{SHARED_SQUAD} not present")
@pytest.mark.budget(
    170, reason="500 real questions on two worker processes: the learn stage's sampled paths need over 5,000 maps"
)
def test_squad_v2_half_500_questions_on_two_workers(tmp_path):
    """The quickstart job over 500 real SQuAD questions on two worker processes, as a user's first real run.
    What it proves, and why 500: the real data file read and sampled (labels answerable and impossible, many
    article groups); eight shards of 64 (extract.shard_size=64), so each worker takes several shards and both
    do; 36,000 maps, more than the fit's sweep and silhouette samples (5,000 each), so the sampled paths of the
    learn stage run, not the whole-data ones that small tests take; and every map clustered into the job's 8
    clusters. Far fewer questions would leave shards to one worker or the samples unused."""
    r = run_cli(
        REPO / "jobs" / "quickstart.yaml",
        "--set",
        f"data.path={SHARED_SQUAD}",
        "data.sample=500",
        f"output.dir={tmp_path / 'squad'}",
        "extract.shard_size=64",
        # the quickstart's relevance stage on 8 of the questions, not 200: this test is about the extraction over
        # two workers and the fit on real data; with 200 it ran past 1,200 s on a loaded host, with 8 80 s (issue 32)
        "relevance.examples=8",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((tmp_path / "squad" / "summary.json").read_text())
    assert s["counts"]["examples"] == 500
    assert s["counts"]["maps"] == 500 * 72
    assert s["backend"]["runtime"]["n_workers"] == 2
    assert len(s["extract"]["runs"][-1]["workers"]) == 2  # both workers did shards
    t = pq.read_table(tmp_path / "squad" / "maps.parquet", columns=["group", "label", "cluster"]).to_pandas()
    assert set(t["label"]) == {"answerable", "impossible"}
    assert t["group"].nunique() > 1
    assert t["cluster"].nunique() == 8


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_SQUAD.is_file(), reason=f"{SHARED_SQUAD} not present")
@pytest.mark.budget(
    160, reason="every stage of the findings job through the CLI, each at the smallest size that runs it"
)
def test_findings_job_with_pattern_cnn_and_probes(tmp_path):
    """jobs/findings_minilm.yaml at a small size: pattern-cnn embedder, repeated-token probes,
    group-balanced fit; the induction detector is defined on the probes and the report names it."""
    r = run_cli(
        REPO / "jobs" / "findings_minilm.yaml",
        "--set",
        "data.sample=40",
        "data.probe.count=6",
        "extract.shard_size=16",
        "cluster.k_sweep=[4, 6]",
        "cluster.n_clusters=auto",
        # every stage the job names runs, at a size that shows it runs (tests/unit/heads and tests/unit/relevance
        # check their figures): at the job's own sizes (80 and 200 examples) this test ran past 1,200 s on a
        # loaded host, against 80 s with every stage kept but small (issue 32)
        "heads.examples=8",
        "heads.pruning.steps=4",
        "heads.pruning.random_orders=1",
        "relevance.examples=8",
        f"output.dir={tmp_path / 'f'}",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((tmp_path / "f" / "summary.json").read_text())
    assert s["counts"]["examples"] == 46
    assert s["embedding"]["name"] == "pattern-cnn"
    assert 4 <= s["clusters"]["n_clusters"] <= 6 and s["clusters"]["k_sweep"]["chosen"] == s["clusters"]["n_clusters"]
    det = s["head_detectors"]
    assert det["examples"]["induction_cond"] >= 6  # defined at least on every probe
    assert det["examples"]["induction_head"] == 46  # TransformerLens's score: defined on every example
    # recall@1 and rr rank each question's paragraph among the heads stage's sample only, and say so
    scope = s["head_importance"]["scope"]
    assert scope["candidates"] <= 8 and "not the whole data" in scope["pool"]
    assert "ranked against the" in (tmp_path / "f" / "report" / "index.html").read_text(encoding="utf-8")
    t = pq.read_table(tmp_path / "f" / "maps.parquet", columns=["pattern", "pattern_prob", "group"]).to_pandas()
    assert t["pattern"].notna().all() and t["pattern_prob"].between(0, 1).all()
    assert (t["group"] == "probe:repeated-tokens").sum() == 6 * 72
    assert all(c["pattern"] for c in s["clusters"]["descriptions"])
    check_report(tmp_path / "f", s)


@pytest.mark.slow
@pytest.mark.budget(80, reason="a whole job on two worker processes, each reading its own rows of the file")
def test_parquet_job_workers_read_their_own_rows(tmp_path):
    """The quickstart's questions as a Parquet file (small row groups) on two worker processes: each worker reads
    its shards' rows from the file, and the store's ids, groups and labels are the file's, row for row."""
    import pyarrow as pa
    import zarr

    from rapids_attn.data import read_examples
    from rapids_attn.store.schema import read_strings

    examples = read_examples(REPO / "rapids_attn" / "data" / "quickstart.json")
    table = pa.table(
        {
            "qid": [e.id for e in examples],
            "question": [e.text for e in examples],
            "context": [e.text_pair for e in examples],
            "title": [e.group for e in examples],
            "label": [e.label for e in examples],
        }
    )
    data = tmp_path / "quickstart.parquet"
    pq.write_table(table, data, row_group_size=10)
    r = run_cli(
        REPO / "jobs" / "quickstart.yaml",
        "--set",
        f"data.path={data}",
        "data.format=auto",
        "data.text_fields=[question, context]",
        "data.id_field=qid",
        "data.group_field=title",
        "data.label_field=label",
        "extract.shard_size=8",
        "embed.name=pooled",
        f"output.dir={tmp_path / 'pq'}",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((tmp_path / "pq" / "summary.json").read_text())
    assert s["counts"]["examples"] == len(examples) and s["backend"]["runtime"]["n_workers"] == 2
    assert len(s["extract"]["runs"][-1]["workers"]) == 2  # both worker processes read and ran shards
    g = zarr.open_group(str(tmp_path / "pq" / "store.zarr"), mode="r")
    assert list(read_strings(g["example_id"])) == [e.id for e in examples]
    assert list(read_strings(g["example_group"])) == [e.group for e in examples]
    assert list(read_strings(g["example_label"])) == [e.label for e in examples]


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_SQUAD.is_file(), reason=f"{SHARED_SQUAD} not present")
@pytest.mark.budget(40, reason="whole SQuAD articles, 2,048 tokens each, through the blocked capture in a job")
def test_long_documents_job_on_a_small_decoder(tmp_path):
    """jobs/long_documents.yaml with a local random-weight Llama (4 query heads on 2 key heads, 4,096 positions)
    in place of the hub model: whole SQuAD articles as inputs past the old 1,024-token cap, the blocked capture,
    and head_classes.json."""
    from helpers import save_tiny_llama

    model_dir = save_tiny_llama(tmp_path / "decoder", heads=4, kv_heads=2, positions=4096, causal_lm=True)
    run = tmp_path / "long"
    r = run_cli(
        REPO / "jobs" / "long_documents.yaml",
        "--set",
        f"model.name={model_dir}",
        f"data.path={SHARED_SQUAD}",
        "data.limit=4",
        "model.max_length=2048",
        f"output.dir={run}",
        "runtime.n_workers=1",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((run / "summary.json").read_text())
    assert s["counts"]["examples"] == 4 and s["counts"]["maps"] == 4 * 2 * 4
    import zarr

    g = zarr.open_group(str(run / "store.zarr"), mode="r")
    assert g.attrs["model"]["attention"] == "blocked"
    assert int(g["seq_len"][:].min()) == 2048  # every article is longer than 2,048 of this tokenizer's tokens
    classes = json.loads((run / "head_classes.json").read_text())
    heads = classes["heads"]
    assert len(heads) == 2 * 4
    assert {h["class"] for h in heads} <= {"sink", "streaming", "retrieval", "other"}  # 2,048 tokens: all apply
    assert all(0 <= h["layer"] < 2 and 0 <= h["head"] < 4 for h in heads)
    # the exports for KV-cache tools (issue 49), checked against the model's 2 layers x 4 heads on 2 KV heads
    import numpy as np

    tsv = np.loadtxt(run / "head_classes" / "duo_attention" / "full_attention_heads.tsv", delimiter="\t")
    assert tsv.shape == (2, 2) and ((tsv >= 0) & (tsv <= 1)).all()
    sparse = json.loads((run / "head_classes" / "sparse_attention_config.json").read_text())
    assert len(sparse) == 2 and all(sorted(layer, key=int) == ["0", "1", "2", "3"] for layer in sparse)
    assert s["head_classes"]["exports"]["written"] is True
