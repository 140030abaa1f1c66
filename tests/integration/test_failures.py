"""Every failure prints one line (issue 12): Ctrl-C, SIGTERM, a full disk, and errors raised on a worker.

The jobs run as a user runs them: ``python -m rapids_attn.run`` in a subprocess, on a LocalCluster of
worker processes. Ctrl-C in a terminal sends SIGINT to the whole foreground process group, the
workers included: the job runs in a session of its own here and the signal goes to that group.
Faults on a worker are injected with a Dask worker preload (a file named in
``DASK_DISTRIBUTED__WORKER__PRELOAD``, run in each worker process only). What "one line" means: stderr,
split at line breaks and tqdm's carriage returns, holds the job's own start line
(``rapids_attn: N worker(s)...``), progress-bar frames, the job's own ``warning: ...`` lines (which a
successful run prints as well) and exactly one other line, the failure.
Resuming after a fault (kill -9, Ctrl-C, a real full disk on a tmpfs) and the identity of the resumed
store are in test_faults.py; here, what the user reads and the exit code.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
import zarr
from helpers import CORPUS, held_after_first_shard, make_job, write_jsonl

from rapids_attn.run import INTERRUPTED, TERMINATED, main

FULL = "no space left on device writing "
RESUME = "free space and rerun the same command to resume (finished shards are kept)"
# a tqdm frame: "extract:  25%|██▌  | 1/4 [00:24<01:13, ...]", or with nothing to do "extract: 0shard [00:00, ...]"
PROGRESS = re.compile(r"^[\w ]+:\s+(\d+%\||\d+\w+ \[)")


def failure_lines(stderr: str) -> list[str]:
    """stderr without what a successful run prints there too: the start line, progress-bar frames and
    the job's own one-line warnings."""
    lines = [x.strip() for x in re.split(r"[\r\n]+", stderr)]
    return [x for x in lines if x and not x.startswith(("rapids_attn: ", "warning: ")) and not PROGRESS.match(x)]


def many_rows(path: Path, n: int) -> Path:
    return write_jsonl(
        path,
        [
            {"id": f"q{i}", "question": f"question {i}?", "context": CORPUS[i % 5], "topic": f"t{i % 3}"}
            for i in range(n)
        ],
    )


def process_job(tmp_path: Path, model: Path, n: int = 12, shard_size: int = 6, **runtime) -> Path:
    """A job file on two worker processes (as the quickstart runs)."""
    job = make_job(
        tmp_path,
        model,
        many_rows(tmp_path / "rows.jsonl", n),
        extract={"shard_size": shard_size},
        runtime={"processes": True, "n_workers": 2, **runtime},
    )
    job["data"]["label_field"] = None
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def cli(*args) -> list[str]:
    return [sys.executable, "-m", "rapids_attn.run", *map(str, args)]


def run(job: Path, *args, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        cli(job, *args),
        cwd=job.parent,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def shards_done(store: Path) -> list[bool]:
    try:
        return [bool(x) for x in zarr.open_group(str(store), mode="r")["shards_done"][:]]
    except (FileNotFoundError, KeyError, ValueError):
        return []


def worker_fault(tmp_path: Path, body: str) -> dict:
    """The environment that makes every worker process run ``body`` (a module's code) as it starts (distributed
    may run a preload more than once: ``body`` must not wrap what it patched)."""
    preload = tmp_path / "fault_preload.py"
    preload.write_text(body)
    return {"DASK_DISTRIBUTED__WORKER__PRELOAD": json.dumps([str(preload)])}


# -- Ctrl-C and SIGTERM ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "sig, to_group, code, line",
    [
        (signal.SIGINT, True, 130, INTERRUPTED),  # Ctrl-C in a terminal: the whole process group
        (signal.SIGTERM, True, 143, TERMINATED),  # a process manager stopping the job's group
        (signal.SIGTERM, False, 143, TERMINATED),  # kill <pid>
    ],
    ids=["ctrl-c", "sigterm-group", "sigterm-pid"],
)
@pytest.mark.budget(45, reason="a job through the CLI, stopped by a signal")
def test_an_interrupted_run_prints_one_line_and_keeps_its_shards(tmp_path, tiny_bert_dir, sig, to_group, code, line):
    job = process_job(tmp_path, tiny_bert_dir, n=120, shard_size=1)
    store = tmp_path / "run" / "store.zarr"
    hold = held_after_first_shard(tmp_path)  # a signal after the first shard lands mid-extraction
    p = subprocess.Popen(
        cli(job),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, **hold.env},
    )
    try:
        deadline = time.monotonic() + 300
        while not any(shards_done(store)) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert p.poll() is None, "the job ended before a shard was done"
        (os.killpg if to_group else os.kill)(p.pid, sig)
        # communicate() reads stderr to its end: until the workers, which share it, have exited too
        _, err = p.communicate(timeout=120)
    finally:
        hold.release()
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == code, err[-3000:]
    assert failure_lines(err) == [line], err[-3000:]
    assert "Traceback" not in err
    done = shards_done(store)
    assert 0 < sum(done) < len(done) == 120  # finished shards kept, the rest left to do


# -- errors raised on a worker -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.budget(45, reason="a job through the CLI on a worker process that fails")
def test_a_user_error_on_a_worker_is_one_line_without_distributed_logs(tmp_path, tiny_bert_dir):
    job = process_job(tmp_path, tiny_bert_dir)
    env = worker_fault(
        tmp_path,
        "import rapids_attn.extract.shard as shard\n"
        "from rapids_attn.errors import ModelError\n"
        "def refuse(task):\n"
        "    raise ModelError('model.name: cannot load the weights of planted: no model.safetensors')\n"
        "shard.get_extractor = refuse\n",
    )
    r = run(job, env=env)
    assert r.returncode == 2, r.stderr[-3000:]
    assert failure_lines(r.stderr) == ["error: model.name: cannot load the weights of planted: no model.safetensors"], (
        r.stderr[-3000:]
    )
    # -v: the traceback (the worker's, re-raised here), and distributed's log of the failed task
    r = run(job, "-v", env=env)
    assert r.returncode == 2
    assert "Traceback" in r.stderr and "Compute Failed" in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: model.name: cannot load the weights")


@pytest.mark.slow
@pytest.mark.budget(45, reason="a job through the CLI on a worker process that fails")
def test_an_internal_error_on_a_worker_keeps_its_traceback_without_distributed_logs(tmp_path, tiny_bert_dir):
    job = process_job(tmp_path, tiny_bert_dir)
    env = worker_fault(
        tmp_path,
        "import rapids_attn.extract.shard as shard\n"
        "def broken(task):\n"
        "    raise ZeroDivisionError('planted bug')\n"
        "shard.get_extractor = broken\n",
    )
    r = run(job, env=env)
    assert r.returncode == 1
    assert "Traceback" in r.stderr and r.stderr.strip().endswith("ZeroDivisionError: planted bug")
    assert "Compute Failed" not in r.stderr and "distributed." not in r.stderr


# -- a full disk -----------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.budget(45, reason="a job through the CLI on a worker process whose disk fills")
def test_a_full_disk_on_a_worker_is_one_line_naming_the_store(tmp_path, tiny_bert_dir):
    """A worker process's write fails with ENOSPC from its second shard on; distributed re-raises it in the
    job process, which names the store and says that rerunning resumes. The rerun does."""
    job = process_job(tmp_path, tiny_bert_dir, n=12, shard_size=3, n_workers=1)
    env = worker_fault(
        tmp_path,
        "import errno\n"
        "import rapids_attn.extract.shard as shard\n"
        "from rapids_attn.store.zarr_store import write_shard\n"
        "def full(path, layout, s, arrays):\n"
        "    if s > 0:\n"
        "        raise OSError(errno.ENOSPC, 'No space left on device')\n"
        "    write_shard(path, layout, s, arrays)\n"
        "shard.write_shard = full\n",
    )
    r = run(job, env=env)
    store = tmp_path / "run" / "store.zarr"
    assert r.returncode == 2, r.stderr[-3000:]
    assert failure_lines(r.stderr) == [f"error: {FULL}{store}; {RESUME}"], r.stderr[-3000:]
    assert shards_done(store) == [True, False, False, False]
    r = run(job)
    assert r.returncode == 0, r.stderr[-3000:]
    assert all(shards_done(store))


@pytest.fixture
def small_job(tmp_path, tiny_bert_dir, pair_data) -> Path:
    """make_job's in-process job (worker threads: a monkeypatch here reaches them)."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(make_job(tmp_path, tiny_bert_dir, pair_data)))
    return path


def test_a_full_disk_in_the_job_process_names_the_file(tmp_path, small_job, capsys, monkeypatch):
    """ENOSPC while the job process writes (zarr's chunk writes of the learn stage, which name no file,
    then a file that names itself), wrapped in another error on the way: one line, exit 2."""
    import zarr.storage._local as local

    real_put = local._put

    def put(path, value, exclusive=False):
        if "/reduced/" in str(path) or "/cluster/" in str(path):
            try:
                raise OSError(errno.ENOSPC, "No space left on device")
            except OSError as e:
                raise RuntimeError("zarr could not write a chunk") from e
        return real_put(path, value, exclusive)

    monkeypatch.setattr(local, "_put", put)
    assert main([str(small_job)]) == 2
    err = capsys.readouterr().err
    assert failure_lines(err) == [f"error: {FULL}{tmp_path / 'run'}; {RESUME}"]
    store = tmp_path / "run" / "store.zarr"
    assert all(shards_done(store))  # the extraction is kept: the rerun needs no shard
    monkeypatch.undo()

    from rapids_attn.explain import outputs

    real_write_json = outputs.write_json

    def write_json(path, obj):
        if Path(path).name == "summary.json":
            raise OSError(errno.EDQUOT, "Disk quota exceeded", str(path))
        real_write_json(path, obj)

    monkeypatch.setattr(outputs, "write_json", write_json)
    assert main([str(small_job)]) == 2
    assert failure_lines(capsys.readouterr().err) == [f"error: {FULL}{tmp_path / 'run' / 'summary.json'}; {RESUME}"]
    monkeypatch.undo()
    assert main([str(small_job)]) == 0
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["extract"]["this_run"]["shards_run"] == 0


def test_an_output_that_cannot_be_written_is_one_line_and_leaves_no_temporary_file(tmp_path, small_job, capsys):
    """A directory where head_classes.json goes (or no permission to write it): one line naming the file, exit 2,
    no head_classes.json.tmp left behind, and the rerun after the path is cleared completes."""
    run = tmp_path / "run"
    assert main([str(small_job)]) == 0
    capsys.readouterr()
    (run / "head_classes.json").unlink()
    (run / "head_classes.json").mkdir()
    assert main([str(small_job), "--stages", "explain"]) == 2
    lines = failure_lines(capsys.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot write {run / 'head_classes.json'}: "), lines
    assert "rerun the same command" in lines[0]
    assert not (run / "head_classes.json.tmp").exists()
    (run / "head_classes.json").rmdir()
    assert main([str(small_job), "--stages", "explain"]) == 0
    assert json.loads((run / "head_classes.json").read_text())["heads"]
