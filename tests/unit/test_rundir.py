"""rapids_attn deletes or overwrites only what it made: a run directory it has not marked, holding other files,
is refused (exit 2, one line) unless --overwrite, and even then a user's file where rapids_attn writes is
never replaced. Directories of versions before the marker (a rapids_attn store inside) keep working."""

import json
from pathlib import Path

import pytest
import yaml
from helpers import FULL_REPORT, make_job, snapshot

from rapids_attn.run import main
from rapids_attn.rundir import MARKER, OWN_NAMES, RunDirError, check_run_dir, mark_run_dir, read_marker
from rapids_attn.runlock import LOCK_NAME

JOB = {"name": "t", "data": {"path": "x.jsonl"}}


def never_ours():
    return False


# -- the decision, without a run -------------------------------------------------------------------


def test_absent_empty_and_lock_only_directories_are_new(tmp_path):
    assert check_run_dir(tmp_path / "absent", JOB, False, never_ours) == "new"
    (tmp_path / "empty").mkdir()
    assert check_run_dir(tmp_path / "empty", JOB, False, never_ours) == "new"
    (tmp_path / "empty" / LOCK_NAME).write_text("1234\n")  # left by a run killed before it marked the directory
    assert check_run_dir(tmp_path / "empty", JOB, False, never_ours) == "new"


def test_a_marked_directory_is_ours(tmp_path):
    mark_run_dir(tmp_path)
    marker = read_marker(tmp_path)
    assert marker["tool"] == "rapids_attn" and "store.zarr" in marker["outputs"] and "job.yaml" in marker["outputs"]
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "job.yaml").write_text("old: run\n")
    assert check_run_dir(tmp_path, JOB, False, never_ours) == "marked"
    assert MARKER != LOCK_NAME and MARKER in OWN_NAMES and LOCK_NAME in OWN_NAMES


def test_a_directory_with_a_rapids_attn_store_and_no_marker_is_a_legacy_run_dir(tmp_path):
    (tmp_path / "store.zarr").mkdir()
    (tmp_path / "store.zarr" / "zarr.json").write_text("{}")
    (tmp_path / "job.yaml").write_text("name: old\n")
    assert check_run_dir(tmp_path, JOB, False, lambda: True) == "legacy"


def test_other_files_are_refused_unless_overwrite(tmp_path):
    (tmp_path / "notes.txt").write_text("my notes")
    with pytest.raises(RunDirError) as e:
        check_run_dir(tmp_path, JOB, False, never_ours)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"output.dir: {tmp_path} ")
    assert "notes.txt" in msg and "--overwrite" in msg and "new directory" in msg
    assert check_run_dir(tmp_path, JOB, True, never_ours) == "adopted"  # notes.txt is not where we write


@pytest.mark.parametrize("name", ["job.yaml", "summary.json", "maps.parquet", "report", MARKER])
def test_a_users_file_where_rapids_attn_writes_is_refused_even_with_overwrite(tmp_path, name):
    p = tmp_path / name
    if name == "report":
        p.mkdir()
        (p / "index.html").write_text("<p>my own report</p>")
    else:
        p.write_text("name: mine\n")  # for .rapids_attn: a file of that name that is not our marker
    with pytest.raises(RunDirError) as e:
        check_run_dir(tmp_path, JOB, True, never_ours)
    msg = str(e.value)
    assert "\n" not in msg and f"holds {name}," in msg and "even with --overwrite" in msg


def test_a_job_yaml_identical_to_what_the_run_writes_is_not_in_the_way(tmp_path):
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(JOB, sort_keys=False))
    assert check_run_dir(tmp_path, JOB, True, never_ours) == "adopted"


def test_a_file_in_place_of_the_directory_is_refused(tmp_path):
    (tmp_path / "run").write_text("x")
    with pytest.raises(RunDirError, match="is a file, not a directory"):
        check_run_dir(tmp_path / "run", JOB, True, never_ours)


def test_a_lock_file_holding_something_else_is_not_taken_for_ours(tmp_path):
    (tmp_path / LOCK_NAME).write_text("my own text")
    with pytest.raises(RunDirError):
        check_run_dir(tmp_path, JOB, True, never_ours)


# -- through the CLI: --check refuses what the run refuses, and nothing of the user's changes ------------


@pytest.fixture
def job_path(tmp_path, tiny_bert_dir, pair_data) -> Path:
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(make_job(tmp_path, tiny_bert_dir, pair_data, explain=FULL_REPORT)))
    return p


def _refused(capsys, job_path, run_dir, *args) -> str:
    before = snapshot(run_dir)
    capsys.readouterr()
    assert main([str(job_path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: ") and str(run_dir) in err
    assert snapshot(run_dir) == before and sorted(p.name for p in run_dir.iterdir()) == sorted(before)
    return err


def test_a_users_folder_is_refused_by_check_and_run_and_kept_even_with_overwrite(capsys, job_path, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("my notes")
    (run / "job.yaml").write_text("name: my own job\n")
    err = _refused(capsys, job_path, run, "--check")
    assert "not made by rapids_attn" in err and "--overwrite" in err
    assert _refused(capsys, job_path, run) == err  # --check says what the run says
    err = _refused(capsys, job_path, run, "--overwrite")
    assert "holds job.yaml" in err and "even with --overwrite" in err


def test_overwrite_writes_beside_a_users_files_and_marks_the_directory(capsys, job_path, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("my notes")
    _refused(capsys, job_path, run, "--stages", "extract")
    assert main([str(job_path), "--stages", "extract", "--check", "--overwrite"]) == 0  # as the run will decide
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]  # --check wrote nothing
    assert main([str(job_path), "--stages", "extract", "--overwrite"]) == 0
    assert (run / "notes.txt").read_text() == "my notes"
    assert read_marker(run) is not None and (run / "store.zarr" / "zarr.json").is_file()
    assert main([str(job_path), "--stages", "extract"]) == 0  # marked: no --overwrite needed any more


def test_a_run_dir_made_before_the_marker_is_reused_and_marked(job_path, tmp_path):
    run = tmp_path / "run"
    assert main([str(job_path), "--stages", "extract"]) == 0
    assert json.loads((run / MARKER).read_text())["tool"] == "rapids_attn"
    (run / MARKER).unlink()  # as an earlier version left it: store.zarr and job.yaml, no marker
    (run / "notes.txt").write_text("mine")
    assert main([str(job_path), "--check"]) == 0
    assert main([str(job_path), "--stages", "extract"]) == 0
    assert read_marker(run) is not None and (run / "notes.txt").read_text() == "mine"


def test_every_output_of_a_full_run_is_on_the_own_list(job_path, tmp_path):
    """The list of what rapids_attn may replace covers everything a run writes (so nothing it writes is a
    'user file' to a later run, and nothing else is ever touched)."""
    run = tmp_path / "run"
    assert main([str(job_path)]) == 0
    written = {p.name for p in run.iterdir()}
    assert {"store.zarr", "job.yaml", "summary.json", "maps.parquet", "report", MARKER} <= written
    assert written <= OWN_NAMES, written - OWN_NAMES


def test_a_rerun_that_changes_the_store_removes_the_stale_explain_outputs(capsys, job_path, tmp_path):
    """After a full run, --stages learn (or extract) changes the store but not summary.json, maps.parquet or
    the report: those described the store before, so they go; a user's file beside them stays."""
    run = tmp_path / "run"
    assert main([str(job_path)]) == 0
    (run / "notes.txt").write_text("mine")
    assert {"summary.json", "maps.parquet", "report"} <= {p.name for p in run.iterdir()}
    capsys.readouterr()
    assert main([str(job_path), "--stages", "learn"]) == 0
    err = capsys.readouterr().err
    assert "removed the earlier summary.json, maps.parquet, head_classes.json, report" in err
    assert not {"summary.json", "maps.parquet", "report"} & {p.name for p in run.iterdir()}
    assert (run / "notes.txt").read_text() == "mine" and (run / "store.zarr").is_dir()
    assert main([str(job_path), "--stages", "explain"]) == 0  # the fix it names
    assert (run / "summary.json").is_file() and (run / "report" / "index.html").is_file()
    assert main([str(job_path), "--stages", "explain"]) == 0  # explain alone changes no store: nothing removed
    assert "removed" not in capsys.readouterr().err


def test_stale_outputs_are_removed_only_from_a_marked_directory(tmp_path):
    from rapids_attn.learn.stage import LearnStage
    from rapids_attn.rundir import remove_stale_outputs

    (tmp_path / "summary.json").write_text("{}")
    assert remove_stale_outputs(tmp_path, (LearnStage,)) == []  # not marked: not ours to remove
    assert (tmp_path / "summary.json").is_file()
