"""The CLI: exit codes, one-line user errors, --check, --stages, and no store left by a bad job."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import make_job

from rapids_attn.run import main


def failure(err: str) -> str:
    """What the CLI said on stderr, less the run's progress lines (``rapids_attn: preflight: ...``)."""
    return "\n".join(line for line in err.strip().splitlines() if not line.startswith("rapids_attn: "))


def job_file(tmp_path: Path, job: dict) -> Path:
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(job))
    return p


def test_user_error_exits_2_with_one_line(tmp_path, capsys):
    data = tmp_path / "d.txt"
    data.write_text("a\n")
    p = job_file(tmp_path, {"data": {"path": str(data)}, "model": {"name": "minilm-l6"}, "embed": {"nmae": "x"}})
    assert main([str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.startswith("error: ") and "embed.nmae" in err and "'name'" in err


def test_missing_data_file_exits_2_and_writes_nothing(tmp_path, capsys, tiny_bert_dir, pair_data):
    job = make_job(tmp_path, tiny_bert_dir, pair_data)
    job["data"]["path"] = str(tmp_path / "missing.jsonl")
    assert main([str(job_file(tmp_path, job))]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_bad_field_name_exits_2_before_workers(tmp_path, capsys, tiny_bert_dir, pair_data):
    job = make_job(tmp_path, tiny_bert_dir, pair_data)
    job["data"]["text_fields"] = ["question", "contxt"]
    assert main([str(job_file(tmp_path, job))]) == 2
    err = capsys.readouterr().err
    assert "contxt" in err and "context" in err  # names the missing field and the fields that exist
    assert "worker" not in err
    assert not (tmp_path / "run").exists()


def test_layer_out_of_range_is_a_user_error(tmp_path, capsys, tiny_bert_dir, pair_data):
    job = make_job(tmp_path, tiny_bert_dir, pair_data, extract={"layers": [0, 5]})
    assert main([str(job_file(tmp_path, job))]) == 2
    assert "extract.layers: [5] out of range" in capsys.readouterr().err


def test_int8_on_a_gpu_is_refused_in_preflight(tmp_path, capsys, tiny_bert_dir, pair_data):
    job = make_job(
        tmp_path,
        tiny_bert_dir,
        pair_data,
        extract={"device": "cuda"},
        embed={"name": "resnet18", "weights": "random", "precision": "int8"},
    )
    assert main([str(job_file(tmp_path, job))]) == 2
    assert "embed.precision: int8 runs on the CPU only" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_unknown_stage(tmp_path, capsys, tiny_bert_dir, pair_data):
    job = make_job(tmp_path, tiny_bert_dir, pair_data)
    assert main([str(job_file(tmp_path, job)), "--stages", "extract,lern"]) == 2
    assert "did you mean 'learn'" in capsys.readouterr().err


def test_check_validates_without_running(tmp_path, capsys, tiny_bert_dir, pair_data):
    job = make_job(tmp_path, tiny_bert_dir, pair_data)
    assert main([str(job_file(tmp_path, job)), "--check"]) == 0
    assert "ok: 20 examples, 2 layers x 2 heads" in capsys.readouterr().out
    assert not (tmp_path / "run" / "store.zarr").exists()


def test_check_counts_a_parquet_file_and_names_its_bad_row(tmp_path, capsys, tiny_bert_dir, pair_data):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in pair_data.read_text().splitlines()]
    data = tmp_path / "pairs.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data, row_group_size=6)
    job = make_job(tmp_path, tiny_bert_dir, data)
    job["data"]["format"] = "parquet"
    assert main([str(job_file(tmp_path, job)), "--check", "--set", "data.sample=9"]) == 0
    assert "ok: 9 examples, 2 layers x 2 heads, 2 shards" in capsys.readouterr().out
    rows[14]["id"] = ""
    pq.write_table(pa.Table.from_pylist(rows), data, row_group_size=6)
    assert main([str(job_file(tmp_path, job)), "--check"]) == 2
    err = failure(capsys.readouterr().err)
    assert err.count("\n") == 0 and "row 14 of" in err and "pairs.parquet" in err and "'id'" in err


def test_learn_before_extract_is_refused(tmp_path, capsys, tiny_bert_dir, pair_data):
    job = make_job(tmp_path, tiny_bert_dir, pair_data)
    assert main([str(job_file(tmp_path, job)), "--stages", "learn"]) == 2
    assert "run the extract stage first" in capsys.readouterr().err


def test_stages_run_separately_then_explain_rebuilds(tmp_path, capsys, tiny_bert_dir, pair_data):
    p = job_file(tmp_path, make_job(tmp_path, tiny_bert_dir, pair_data))
    assert main([str(p), "--stages", "extract"]) == 0
    assert main([str(p), "--stages", "explain"]) == 2  # nothing clustered yet
    assert "rerun with --stages learn" in capsys.readouterr().err
    assert main([str(p), "--stages", "learn"]) == 0
    assert main([str(p), "--stages", "explain"]) == 0
    assert (tmp_path / "run" / "maps.parquet").is_file()
    assert (tmp_path / "run" / "summary.json").is_file()


def test_a_run_that_creates_the_store_cannot_skip_a_stage_it_needs(tmp_path, capsys, tiny_bert_dir, pair_data):
    p = job_file(tmp_path, make_job(tmp_path, tiny_bert_dir, pair_data))
    assert main([str(p), "--stages", "extract,explain"]) == 2  # no store yet: learn's results cannot exist
    err = failure(capsys.readouterr().err)
    assert err.count("\n") == 0 and "holds no learn results yet; add learn to --stages" in err
    assert not (tmp_path / "run").exists()  # refused in preflight
    assert main([str(p)]) == 0
    store = tmp_path / "run" / "store.zarr"
    before = sorted(str(f.relative_to(store)) for f in store.rglob("*"))
    capsys.readouterr()
    # --overwrite recreates the store, so its complete clustering does not count for this run
    assert main([str(p), "--overwrite", "--stages", "extract,explain"]) == 2
    assert "holds no learn results yet" in capsys.readouterr().err
    assert sorted(str(f.relative_to(store)) for f in store.rglob("*")) == before


def test_a_gpu_extracted_store_is_clustered_on_a_cpu_machine(tmp_path, capsys, tiny_bert_dir, pair_data):
    p = job_file(tmp_path, make_job(tmp_path, tiny_bert_dir, pair_data))
    assert main([str(p), "--stages", "extract"]) == 0
    # the same job with extract.device: cuda (the extraction key ignores the device): learn and explain
    # run no extraction, so the extract device rules do not apply here
    assert main([str(p), "--set", "extract.device=cuda", "--stages", "learn,explain"]) == 0
    assert main([str(p), "--set", "extract.device=cuda", "--stages", "extract"]) == 2
    assert "extract.device: cuda" in capsys.readouterr().err


def test_changed_job_is_refused_unless_overwrite(tmp_path, capsys, tiny_bert_dir, pair_data):
    p = job_file(tmp_path, make_job(tmp_path, tiny_bert_dir, pair_data))
    assert main([str(p)]) == 0
    assert main([str(p), "--set", "extract.image_size=16"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    # learn-only settings do not touch the store: no refusal
    assert main([str(p), "--set", "cluster.n_clusters=2"]) == 0
    assert main([str(p), "--set", "extract.image_size=16", "--overwrite"]) == 0


def test_module_entry_point_runs():
    r = subprocess.run([sys.executable, "-m", "rapids_attn.run", "--help"], capture_output=True, text=True, check=False)
    assert r.returncode == 0 and "--stages" in r.stdout


def test_cli_exit_code_2_from_a_subprocess(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "rapids_attn.run", str(tmp_path / "nope.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 2
    assert r.stderr.strip() == f"error: job: no such file: {tmp_path / 'nope.yaml'}"
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("value", ["0", "-3"])
def test_nonpositive_limit(tmp_path, capsys, tiny_bert_dir, pair_data, value):
    p = job_file(tmp_path, make_job(tmp_path, tiny_bert_dir, pair_data))
    assert main([str(p), "--set", f"data.limit={value}", "--check"]) == 2
    assert "data.limit" in capsys.readouterr().err


# -- failures are one line (issue 12) --------------------------------------------------------------------


def test_verbose_adds_the_traceback_to_a_user_error(tmp_path, capsys, tiny_bert_dir, pair_data):
    p = job_file(tmp_path, make_job(tmp_path, tiny_bert_dir, pair_data, extract={"layers": [0, 5]}))
    assert main([str(p), "--check"]) == 2
    assert "Traceback" not in capsys.readouterr().err
    assert main([str(p), "--check", "-v"]) == 2
    err = failure(capsys.readouterr().err)
    assert err.startswith("Traceback") and "JobConfigError" in err
    assert err.splitlines()[-1].startswith("error: extract.layers: [5] out of range")


def test_disk_full_is_found_wherever_a_library_wrapped_it():
    import errno

    from rapids_attn.run import disk_full

    class Group(Exception):  # an exception group's shape (ExceptionGroup is 3.11+)
        def __init__(self, *exceptions):
            super().__init__("writes failed")
            self.exceptions = exceptions

    full = OSError(errno.ENOSPC, "No space left on device", "/x/store.zarr/features/c/0")
    try:
        try:
            raise full
        except OSError:
            raise RuntimeError("could not write a chunk")  # the implicit context is the point
    except RuntimeError as e:
        wrapped = e
    assert disk_full(wrapped) is full
    quota = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert disk_full(Group(ValueError("x"), Group(quota))) is quota
    assert disk_full(Group(ValueError("x"), RuntimeError("y"))) is None
    assert disk_full(OSError(errno.EACCES, "Permission denied", "/x")) is None
    assert disk_full(KeyboardInterrupt()) is None


def test_sigterm_raises_terminated_and_the_handler_is_restored():
    import os
    import signal
    import time

    from rapids_attn.run import Terminated, sigterm_as_interrupt

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated), sigterm_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises as soon as the signal arrives
    assert signal.getsignal(signal.SIGTERM) == before
    assert issubclass(Terminated, KeyboardInterrupt)  # unwinds (closes the cluster) as Ctrl-C does


@pytest.mark.parametrize("exc, code, line", [(KeyboardInterrupt, 130, "interrupted: "), (None, 143, "terminated ")])
def test_an_interrupt_is_one_line(tmp_path, capsys, monkeypatch, tiny_bert_dir, pair_data, exc, code, line):
    from rapids_attn import pipeline
    from rapids_attn.run import Terminated

    def stop(*a, **k):
        raise (exc or Terminated)()

    monkeypatch.setattr(pipeline, "run_job", stop)
    assert main([str(job_file(tmp_path, make_job(tmp_path, tiny_bert_dir, pair_data)))]) == code
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(line) and err.endswith("rerun the same command to resume")


def test_a_later_set_wins_in_the_order_typed(tmp_path, capsys, tiny_bert_dir, pair_data):
    """``--set a=1 b=2 --set b=3``: argparse keeps the words after the first of each --set apart from the rest;
    the job gets them as typed, so the last value of a field wins."""
    from rapids_attn.run import overrides_in_order

    job = job_file(tmp_path, make_job(tmp_path, tiny_bert_dir, pair_data))
    assert overrides_in_order(["j.yaml", "--set", "a=1", "b=2", "--set=b=3", "--check", "c=4"]) == ["a=1", "b=2", "b=3"]
    for argv, want in [
        (["--set", "data.sample=9", "data.limit=6", "--set", "data.limit=2"], 2),
        (["--set", "data.limit=2", "--set", "data.sample=9", "data.limit=6"], 6),
    ]:
        assert main([str(job), "--check", *argv]) == 0
        assert f"ok: {want} examples" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "started"),
    [([], True), (["--stages", "extract,learn"], True), (["--stages", "learn, explain"], False), (["--check"], False)],
)
def test_the_workers_server_starts_as_soon_as_the_job_is_read(
    tmp_path, capsys, monkeypatch, tiny_bert_dir, pair_data, argv, started
):
    """Before the pipeline's imports (torch): the workers wait for the server's; not for a run without
    worker stages, nor for --check."""
    from rapids_attn import pipeline, processes

    calls = []
    monkeypatch.setattr(processes, "start_worker_server", lambda cfg, modules=None: calls.append("server") or False)
    monkeypatch.setattr(pipeline, "run_job", lambda *a, **k: calls.append("run_job") or {})
    assert main([str(job_file(tmp_path, make_job(tmp_path, tiny_bert_dir, pair_data))), *argv]) == 0
    want = [] if "--check" in argv else ["run_job"]
    assert calls == (["server"] if started else []) + want


def _fork_servers() -> set[int]:
    """The multiprocessing fork servers running on this machine (their command line names the module)."""
    found = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if b"multiprocessing.forkserver" in cmd:
                found.add(int(d.name))
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
def test_a_job_that_ends_early_ends_the_fork_server_it_started(tmp_path, tiny_bert_dir, pair_data):
    """The fork server starts as soon as the job is read and imports torch with SIGINT blocked; a job refused
    after that (a bad stage name here) ends it before exiting, so no server is left importing while holding the
    job's output pipe."""
    job = make_job(tmp_path, tiny_bert_dir, pair_data, runtime={"processes": True, "n_workers": 1})
    before = _fork_servers()
    err = tmp_path / "stderr.txt"
    with err.open("w") as f:  # a file, not a pipe: waiting for the job's exit, not for the pipe's last writer
        p = subprocess.Popen(
            [sys.executable, "-m", "rapids_attn.run", str(job_file(tmp_path, job)), "--stages", "extract,bogus"],
            stdout=f,
            stderr=f,
        )
        assert p.wait(timeout=120) == 2
    left = _fork_servers() - before  # at the job's exit: none of its own is left
    assert "--stages: unknown stage 'bogus'" in err.read_text(), err.read_text()
    assert not left


@pytest.mark.parametrize("verbose", [False, True])
def test_other_libraries_warnings_are_shown_only_with_verbose(verbose):
    """A library's FutureWarning (scikit-learn's, transformers') is not the user's to act on: hidden unless -v,
    in this process and (PYTHONWARNINGS) in the workers it starts."""
    code = (
        "import os, subprocess, sys, warnings\n"
        f"from rapids_attn.run import configure_process; configure_process({verbose})\n"
        "warnings.warn('a library note', FutureWarning)\n"
        "subprocess.run([sys.executable, '-c', \"import warnings; warnings.warn('a worker note', FutureWarning)\"])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    err = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env, timeout=120
    ).stderr
    assert ("a library note" in err) is verbose and ("a worker note" in err) is verbose, err
