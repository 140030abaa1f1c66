"""The user's files are never deleted or overwritten, and every setting preflight can check is checked before
anything is removed (issue 33): each case is run through the CLI against a finished run directory (or a fresh
one) and the files are compared byte for byte before and after."""

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import yaml
from helpers import FULL_REPORT, make_job, pair_rows, snapshot, write_jsonl

from rapids_attn.run import main


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_bert_dir) -> tuple[Path, dict]:
    """One full run (extract, learn, explain with the report, explorer and head views), copied by each test."""
    root = tmp_path_factory.mktemp("finished")
    data = write_jsonl(root / "pairs.jsonl", pair_rows())
    job = make_job(root, tiny_bert_dir, data, explain=FULL_REPORT)
    path = root / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    assert main([str(path)]) == 0
    return root / "run", job


@pytest.fixture
def run(finished, tmp_path) -> tuple[Path, Path]:
    """A copy of the finished run in this test's folder: (its job file, its run directory)."""
    src, job = finished
    run_dir = tmp_path / "run"
    shutil.copytree(src, run_dir, symlinks=True)
    job = {**job, "output": {"dir": str(run_dir)}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path, run_dir


def one_line_exit_2(capsys, argv: list[str], names: str) -> str:
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and len(err) < 600, err
    assert names in err, err
    return err


# -- (1a) a symbolic link where rapids_attn writes: refused, its target untouched ------------------------


@pytest.mark.parametrize(
    "args",
    [["--stages", "explain", "--check"], ["--stages", "explain"], ["--stages", "learn"], []],
    ids=["check", "explain", "learn", "all"],
)
def test_report_linked_to_a_users_folder_is_refused_and_the_folder_kept(capsys, run, tmp_path, args):
    job, run_dir = run
    mine = tmp_path / "my_site"
    mine.mkdir()
    (mine / "index.html").write_text("<p>my own page</p>")
    (mine / "scatter_cluster.png").write_bytes(b"my own picture")
    shutil.rmtree(run_dir / "report")
    (run_dir / "report").symlink_to(mine, target_is_directory=True)
    before, before_run = snapshot(mine), snapshot(run_dir)
    one_line_exit_2(capsys, [job, *args], f"{run_dir}/report is a symbolic link")
    assert snapshot(mine) == before and snapshot(run_dir) == before_run


@pytest.mark.parametrize("where", ["report/headviews", "report/headviews/vendor"])
def test_a_linked_folder_rapids_attn_writes_into_is_refused(capsys, run, tmp_path, where):
    job, run_dir = run
    elsewhere = tmp_path / "elsewhere"
    shutil.move(run_dir / where, elsewhere)
    (run_dir / where).symlink_to(elsewhere, target_is_directory=True)
    before = snapshot(elsewhere)
    one_line_exit_2(capsys, [job, "--check"], f"{run_dir}/{where} is a symbolic link")
    one_line_exit_2(capsys, [job], f"{run_dir}/{where} is a symbolic link")
    assert snapshot(elsewhere) == before


# -- (1b) a run without explain removes only the files rapids_attn wrote, by name -----------------------


@pytest.mark.parametrize("stages", ["learn", "extract"])
def test_a_users_files_in_report_survive_a_run_without_explain(capsys, run, stages):
    job, run_dir = run
    report = run_dir / "report"
    (report / "my_notes.txt").write_text("notes I keep")
    (report / "headviews" / "my_view.html").write_text("<p>mine</p>")
    (report / "drafts").mkdir()
    (report / "drafts" / "figure.png").write_bytes(b"my figure")
    (report / "montage_99.png").write_bytes(b"my montage, named as rapids_attn names its own")
    (report / "headviews" / "cluster9_ex9.html").write_text("<p>my page, named as its pages are</p>")
    kept = ("my_notes.txt", "headviews/my_view.html", "montage_99.png", "headviews/cluster9_ex9.html")
    mine = {report / k: (report / k).read_bytes() for k in kept}
    ours = sorted(p.name for p in report.iterdir() if p.suffix in (".html", ".png"))
    assert "index.html" in ours and "explorer.html" in ours and "scatter_cluster.png" in ours
    assert main([str(job), "--stages", stages]) == 0
    assert "removed the earlier summary.json, maps.parquet" in capsys.readouterr().err
    for p, body in mine.items():
        assert p.read_bytes() == body
    assert (report / "drafts" / "figure.png").read_bytes() == b"my figure"
    left = {str(p.relative_to(report)) for p in report.rglob("*") if p.is_file()}
    assert left == {*kept, "drafts/figure.png", ".rapids_attn-files.json"}  # ours gone (the manifest's), vendor/ too
    assert json.loads((report / ".rapids_attn-files.json").read_text()) == []  # a user's file is never listed
    assert not (run_dir / "summary.json").exists() and not (run_dir / "maps.parquet").exists()
    assert main([str(job), "--stages", "explain"]) == 0  # written again beside the user's files
    assert (report / "index.html").is_file()
    for p, body in mine.items():  # an explain run of its own keeps them too
        assert p.read_bytes() == body


def test_every_file_of_a_full_report_is_one_rapids_attn_names(finished):
    """The by-name list the stale-output removal uses covers everything a full report writes: nothing of ours is
    left behind as a stale page, and nothing else is ours."""
    from rapids_attn.rundir import REPORT_MANIFEST, _own_report_files, read_report_manifest

    report = finished[0] / "report"
    written = {p for p in report.rglob("*") if p.is_file() and p.name != REPORT_MANIFEST}
    assert written and set(_own_report_files(report)) == written
    assert read_report_manifest(report) == {str(p.relative_to(report)) for p in written}  # the manifest says the same


# -- (1c, 3) settings preflight refuses, before anything is removed or written ---------------------------


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--stages", "heads", "--set", "heads.metric=retrieval", "heads.examples=1"], "heads.examples:"),
        (
            ["--stages", "heads", "--set", "heads.metric=retrieval", "heads.max_length=2710"],
            "heads.max_length: 2710 exceeds the model's 128",
        ),
        (["--stages", "relevance", "--set", "relevance.max_length=2710"], "relevance.max_length: 2710 exceeds"),
        (["--stages", "learn,relevance", "--set", "relevance.max_length=129"], "relevance.max_length: 129"),
    ],
    ids=["heads-examples-1", "heads-max-length", "relevance-max-length", "relevance-max-length-after-learn"],
)
def test_a_setting_preflight_refuses_changes_nothing(capsys, run, args, names):
    job, run_dir = run
    before = snapshot(run_dir)
    one_line_exit_2(capsys, [job, *args, "--check"], names)
    one_line_exit_2(capsys, [job, *args], names)
    assert snapshot(run_dir) == before


# -- (3) where the run directory is: checked by --check ------------------------------------------------


def _job(tmp_path, tiny_bert_dir, data=None, **sections) -> Path:
    data = data or write_jsonl(tmp_path / "pairs.jsonl", pair_rows())
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(make_job(tmp_path, tiny_bert_dir, data, **sections)))
    return path


def test_a_dangling_link_as_output_dir_is_refused_by_check(capsys, tmp_path, tiny_bert_dir):
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "gone", target_is_directory=True)
    job = _job(tmp_path, tiny_bert_dir, output={"dir": str(link / "run")})
    for args in (["--check"], []):
        one_line_exit_2(capsys, [job, *args], f"output.dir: {link} is a symbolic link to {tmp_path / 'gone'}")
    assert not (tmp_path / "gone").exists() and link.is_symlink()


def test_a_read_only_run_directory_is_refused_by_check(capsys, tmp_path, tiny_bert_dir, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_dir.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere: what a read-only directory says to another user, simulated
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p) != run_dir and real(p, mode, **kw))
    job = _job(tmp_path, tiny_bert_dir)
    try:
        one_line_exit_2(capsys, [job, "--check"], f"output.dir: {run_dir} is not writable by this user")
        assert list(run_dir.iterdir()) == []
    finally:
        run_dir.chmod(0o755)


def test_a_run_directory_inside_a_store_is_refused(capsys, run, tmp_path, tiny_bert_dir):
    _, other = run
    (tmp_path / "b").mkdir()
    job = _job(tmp_path / "b", tiny_bert_dir, output={"dir": str(other / "store.zarr" / "nested")})
    before = snapshot(other)
    one_line_exit_2(capsys, [job, "--check"], f"is inside the Zarr store {other / 'store.zarr'}")
    assert snapshot(other) == before


def test_a_run_directory_in_the_model_folder_is_refused_even_with_overwrite(capsys, tmp_path, tiny_bert_dir):
    model = tmp_path / "model"
    shutil.copytree(tiny_bert_dir, model)
    job = _job(tmp_path, model, output={"dir": str(model)})
    before = snapshot(model)
    one_line_exit_2(capsys, [job, "--overwrite", "--stages", "extract"], f"output.dir: {model} is model.name")
    assert snapshot(model) == before


def test_a_run_directory_that_is_the_hf_dataset_folder_is_refused(capsys, tmp_path, tiny_bert_dir):
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "hf"
    datasets.Dataset.from_list(pair_rows()).save_to_disk(str(folder))
    job = make_job(tmp_path, tiny_bert_dir, folder, output={"dir": str(folder / "run")})
    job["data"]["format"] = "hf"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    before = snapshot(folder)
    one_line_exit_2(capsys, [path, "--overwrite", "--check"], f"is inside data.path ({folder})")
    assert snapshot(folder) == before


def test_data_where_the_run_writes_is_refused(capsys, tmp_path, tiny_bert_dir):
    (tmp_path / "run" / "report").mkdir(parents=True)
    data = write_jsonl(tmp_path / "run" / "report" / "pairs.jsonl", pair_rows())
    job = _job(tmp_path, tiny_bert_dir, data)
    one_line_exit_2(capsys, [job, "--overwrite", "--check"], "/run/report is where the run writes, and data.path")
    assert data.is_file()


# -- (4) a pickle that runs code as the weights: refused in preflight, never run --------------------------


class _Payload:
    def __init__(self, flag: Path):
        self.flag = flag

    def __reduce__(self):
        return (os.system, (f"touch {self.flag}",))


@pytest.mark.parametrize(
    ("protocol", "says"),
    [
        (2, "holds more than tensors (torch.load with weights_only=True refuses it: a pickle that would run code)"),
        (4, "is not one torch.load(weights_only=True) reads (damaged, or a pickle holding more than tensors"),
    ],
)
def test_a_bin_that_weights_only_refuses_is_refused_in_preflight(capsys, tmp_path, tiny_bert_dir, protocol, says):
    """Protocol 2 reaches the payload's global, which torch names; protocol 4's framing is refused before it."""
    model = tmp_path / "model"
    shutil.copytree(tiny_bert_dir, model)
    (model / "model.safetensors").unlink()
    flag = tmp_path / "ran"
    (model / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(flag), protocol=protocol))
    job = _job(tmp_path, model)
    for args in (["--check"], []):
        one_line_exit_2(capsys, [job, *args], f"model.name: the weights file {model / 'pytorch_model.bin'} {says}")
    assert not flag.exists() and not (tmp_path / "run").exists()


def test_a_whole_bin_still_passes(capsys, tmp_path, tiny_bert_dir):
    """The check reads a torch.save archive as transformers will: a model saved as .bin is accepted."""
    import torch
    from transformers import BertModel

    model = tmp_path / "model"
    shutil.copytree(tiny_bert_dir, model)
    torch.save(BertModel.from_pretrained(model).state_dict(), model / "pytorch_model.bin")  # torch.save's archive
    (model / "model.safetensors").unlink()
    assert (model / "pytorch_model.bin").is_file()
    assert main([str(_job(tmp_path, model)), "--check"]) == 0


# -- found on a second hostile pass: a linked lock, a pipe as data, a run directory no one can make ----------


def test_a_linked_lock_file_is_refused_and_its_target_kept(capsys, run, tmp_path):
    """The lock is opened to write the holder's pid: through a link that replaced a user's file with a pid."""
    from rapids_attn.runlock import LOCK_NAME, run_lock

    job, run_dir = run
    mine = tmp_path / "diary.txt"
    mine.write_text("my diary\n")
    (run_dir / LOCK_NAME).unlink(missing_ok=True)
    (run_dir / LOCK_NAME).symlink_to(mine)
    for args in (["--stages", "explain", "--check"], ["--stages", "explain"], ["--stages", "learn"]):
        one_line_exit_2(capsys, [job, *args], f"{run_dir / LOCK_NAME} is a symbolic link")
    with pytest.raises(Exception, match="is a symbolic link"), run_lock(run_dir):  # the lock itself refuses too
        pass
    assert mine.read_text() == "my diary\n" and (run_dir / LOCK_NAME).is_symlink()


def test_a_pipe_as_data_is_refused_not_waited_on(capsys, tmp_path, tiny_bert_dir):
    fifo = tmp_path / "pairs.jsonl"
    os.mkfifo(fifo)
    job = _job(tmp_path, tiny_bert_dir, fifo)
    one_line_exit_2(capsys, [job, "--check"], f"data.path: {fifo} is not a regular file or folder")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_run_directory_that_cannot_be_made_is_refused_by_check(capsys, tmp_path, tiny_bert_dir):
    """/proc takes no new folder whatever the user (root's permission bits say it may): tried, not assumed."""
    job = _job(tmp_path, tiny_bert_dir, output={"dir": "/proc/rapids_attn_run"})
    one_line_exit_2(capsys, [job, "--check"], "output.dir: /proc/rapids_attn_run cannot be made under /proc")


def test_a_bin_of_random_bytes_is_refused_as_no_weights_file(capsys, tmp_path, tiny_bert_dir):
    model = tmp_path / "model"
    shutil.copytree(tiny_bert_dir, model)
    (model / "model.safetensors").unlink()
    (model / "pytorch_model.bin").write_bytes(bytes(range(7, 256)) * 40)
    err = one_line_exit_2(capsys, [_job(tmp_path, model), "--check"], "is not one torch.load(weights_only=True) reads")
    assert "damaged" in err and "save the model again" in err
