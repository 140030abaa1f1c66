"""Issue 50's campaign: one job over several models, each (model, dataset) an ordinary run directory; run in
sequence with a failing model that stops nothing else, skipped once done, resumed after a killed task, reported
by status (done, failed with its one-line error, interrupted, stale, pending), refused in one line when the
campaign file is wrong, and written out as a Slurm array and a Kubernetes indexed Job."""

import json
import subprocess

import numpy as np
import pytest
import yaml
from helpers import make_job, repeated_rows, write_jsonl

from rapids_attn.campaign.__main__ import main
from rapids_attn.campaign.plan import load_campaign


def _write(path, doc):
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def campaign(tmp_path_factory, tiny_gpt2_dir, tiny_llama_dir):
    tmp = tmp_path_factory.mktemp("campaign")
    data = write_jsonl(tmp / "docs.jsonl", repeated_rows(6, 2))
    job = make_job(tmp, "placeholder", data, cluster={"n_clusters": 2, "k_sweep": None})
    job.pop("output")
    job["model"].pop("name")
    _write(tmp / "job.yaml", job)
    doc = {
        "name": "tiny-family",
        "job": "job.yaml",
        "models": [
            {"name": str(tiny_gpt2_dir), "label": "gpt2", "family": "gpt2", "variant": "base"},
            {"name": str(tiny_llama_dir), "label": "llama", "family": "llama", "variant": "base"},
            {"name": "./no-such-model", "label": "missing"},
        ],
        "datasets": [{"label": "docs"}],
        "output": {"dir": "out"},
    }
    path = _write(tmp / "campaign.yaml", doc)
    return path, doc


def _status(capsys, path):
    capsys.readouterr()
    assert main([str(path), "status", "--json"]) == 0
    return {s["run"]: s for s in json.loads(capsys.readouterr().out)}


@pytest.mark.budget(70, reason="three runs of a campaign, each a process of its own, then a resume and the atlas")
def test_a_campaign_runs_resumes_and_reports(campaign, capsys):
    path, doc = campaign
    c = load_campaign(path)
    assert [r.label for r in c.runs] == ["gpt2/docs", "llama/docs", "missing/docs"]
    assert c.runs[1].run_dir == path.parent / "out" / "runs" / "llama" / "docs"
    assert {s["state"] for s in _status(capsys, path).values()} == {"pending"}
    # in sequence: the missing model fails, the others finish anyway
    assert main([str(path), "run"]) == 1
    out = capsys.readouterr().out
    assert "2 of 3 runs done, 1 failed" in out
    st = _status(capsys, path)
    assert st["gpt2/docs"]["state"] == "done" and st["llama/docs"]["state"] == "done"
    assert st["missing/docs"]["state"] == "failed"
    assert st["missing/docs"]["detail"].startswith("error: model.name: no such model folder"), st["missing/docs"]
    for label in ("gpt2", "llama"):
        summary = json.loads((path.parent / "out" / "runs" / label / "docs" / "summary.json").read_text())
        assert summary["counts"]["examples"] == 6
    # a finished run is skipped: its record and log stay as they were
    log = path.parent / "out" / "logs" / "gpt2" / "docs.log"
    before = log.stat().st_mtime_ns
    assert main([str(path), "run", "--index", "0"]) == 0
    assert log.stat().st_mtime_ns == before
    # a killed task (a record that never ended) reads as interrupted, and running it again finishes it
    rec_path = path.parent / "out" / "tasks" / "llama" / "docs.json"
    rec = json.loads(rec_path.read_text())
    rec_path.write_text(json.dumps({**rec, "rc": None}))
    assert _status(capsys, path)["llama/docs"]["state"] == "interrupted"
    assert main([str(path), "run", "--index", "1"]) == 0
    assert _status(capsys, path)["llama/docs"]["state"] == "done"
    # the campaign changed for a run since it finished: stale
    changed = {**doc, "set": {"extract.image_size": 16}}
    _write(path, changed)
    try:
        assert _status(capsys, path)["gpt2/docs"]["state"] == "stale"
    finally:
        _write(path, doc)
    # a model added at the front moves every index after it: the records follow their runs (named by label)
    _write(path, {**doc, "models": [{"name": "tiny-new", "label": "new"}, *doc["models"]]})
    try:
        st = _status(capsys, path)
        assert st["new/docs"]["state"] == "pending" and st["gpt2/docs"]["state"] == "done"
        assert st["llama/docs"]["state"] == "done" and st["missing/docs"]["state"] == "failed"
    finally:
        _write(path, doc)
    # the campaign's folder moved (or mounted elsewhere on another node): its runs are still done
    import shutil

    moved = path.parent.parent / (path.parent.name + "-moved")
    shutil.copytree(path.parent, moved)
    try:
        st = _status(capsys, moved / path.name)
        assert st["gpt2/docs"]["state"] == "done" and st["llama/docs"]["state"] == "done"
    finally:
        shutil.rmtree(moved)
    # the merge: the done runs' heads in one table, each matched to the reference model's (gpt2, the first)
    import pyarrow.parquet as pq

    assert main([str(path), "merge"]) == 0
    atlas = path.parent / "out" / "atlas"
    info = json.loads((atlas / "atlas.json").read_text())
    assert info["runs"] == ["gpt2/docs", "llama/docs"] and list(info["left_out"]) == ["missing/docs"]
    heads = pq.read_table(atlas / "heads.parquet").to_pandas()
    assert len(heads) == 2 * 2 + 2 * 2 and set(heads["model"]) == {"gpt2", "llama"}
    assert set(heads["depth"]) == {0.0, 1.0} and heads["class"].notna().all()
    assert {"stats:entropy", "detectors:induction_head", "profile:offset -1"} <= set(heads.columns)
    matches = pq.read_table(atlas / "matches.parquet").to_pandas()
    assert len(matches) == 4 and set(matches["run"]) == {"llama/docs"} and set(matches["how"]) == {"within layers"}
    assert (matches["layer"] == matches["reference_layer"]).all()
    assert sorted(matches.groupby("layer")["reference_head"].apply(sorted).sum()) == [0, 0, 1, 1]  # one to one
    layers = json.loads((atlas / "layers.json").read_text())
    assert np.asarray(layers["llama/docs"]["rsa"]).shape == (2, 2)
    families = json.loads((atlas / "families.json").read_text())
    assert set(families) == {"gpt2/docs", "llama/docs"}
    assert sum(sum(v) for v in families["gpt2/docs"]["by_depth"].values()) == 4
    # one clustering of both models' maps (the same embedder): a cluster means the same in each model
    maps = pq.read_table(atlas / "maps.parquet").to_pandas()
    assert len(maps) == 2 * 6 * 2 * 2 and maps.groupby("model").size().to_dict() == {"gpt2": 24, "llama": 24}
    clusters = json.loads((atlas / "clusters.json").read_text())
    assert clusters["maps"] == 48 and sum(c["maps"] for c in clusters["clusters"]) == 48
    for m in ("gpt2", "llama"):
        assert sum(c["share_of_each_model"][m] for c in clusters["clusters"]) == pytest.approx(1.0, abs=1e-3)
    assert info["joint_clusters"]["n_clusters"] == clusters["n_clusters"]
    capsys.readouterr()
    assert main([str(path), "merge", "--reference", "nope"]) == 2
    assert "--reference" in capsys.readouterr().err


@pytest.mark.parametrize(
    "change, words",
    [
        ({"modelz": []}, ["modelz"]),
        ({"models": [{"name": "a/b", "label": "x"}, {"name": "c/d", "label": "x"}]}, ["x/docs", "named twice"]),
        ({"set": {"extract.no_such_field": 1}}, ["run 0", "no_such_field"]),
        ({"job": "nope.yaml"}, ["no such job file"]),
    ],
)
def test_a_bad_campaign_is_refused_in_one_line_and_runs_nothing(campaign, change, words, capsys, tmp_path):
    path, doc = campaign
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**doc, "job": str(path.parent / "job.yaml"), "output": {"dir": "o"}, **change}))
    capsys.readouterr()
    assert main([str(bad), "run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    for w in words:
        assert w in err[0], err
    assert not (tmp_path / "o").exists()


def test_scripts_for_a_batch_scheduler(campaign, capsys):
    path, _ = campaign
    assert main([str(path), "scripts", "--image", "example/rapids-attn:1", "--parallel", "2"]) == 0
    out = path.parent / "out"
    slurm = (out / "campaign.slurm").read_text()
    assert "#SBATCH --array=0-2%2" in slurm and 'run --index "$SLURM_ARRAY_TASK_ID"' in slurm
    assert subprocess.run(["bash", "-n", str(out / "campaign.slurm")], check=False).returncode == 0
    job = yaml.safe_load((out / "campaign-k8s.yaml").read_text())
    spec = job["spec"]
    assert spec["completions"] == 3 and spec["completionMode"] == "Indexed" and spec["parallelism"] == 2
    container = spec["template"]["spec"]["containers"][0]
    assert container["image"] == "example/rapids-attn:1"
    assert container["command"][:2] == ["sh", "-c"] and '"$JOB_COMPLETION_INDEX"' in container["command"][2]
    assert str(path) in container["command"][2]


def test_parallel_tasks_run_at_once_and_report_in_index_order(campaign, monkeypatch):
    """--parallel N: N tasks at a time through the same run_task (stubbed here: no processes)."""
    import threading
    import time

    from rapids_attn.campaign import tasks

    path, _ = campaign
    c = load_campaign(path, validate_jobs=False)
    live, peak, lock = [0], [0], threading.Lock()

    def fake(c_, r, force=False):
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        time.sleep(0.2)
        with lock:
            live[0] -= 1
        return tasks.TaskState(r, tasks.DONE)

    monkeypatch.setattr(tasks, "run_task", fake)
    states = tasks.run_tasks(c, None, parallel=2, say=lambda s: None)
    assert [s.run.index for s in states] == [0, 1, 2] and peak[0] == 2


def test_the_example_campaign_validates():
    """jobs/campaigns/minilm.yaml: its eight runs' jobs (four models x two data samples) validate; paths are the
    campaign file's."""
    from helpers import REPO

    c = load_campaign(REPO / "jobs" / "campaigns" / "minilm.yaml")
    assert [r.label for r in c.runs] == [
        f"{m}/{d}"
        for m in ("minilm", "minilm-squad", "minilm-squad-seed1", "minilm-squad-seed2")
        for d in ("squad300", "squad300r")
    ]
    sets = dict(o.split("=", 1) for o in c.runs[0].overrides)
    assert sets["data.limit"] == "300" and sets["model.name"] == "minilm-l6"
    other = dict(o.split("=", 1) for o in c.runs[1].overrides)
    assert other["data.sample"] == "300" and other["data.seed"] == "1" and "data.limit" not in other
    assert c.out.resolve() == (REPO / "runs" / "campaign-minilm").resolve()
