"""Fault cases (issue 12): kill -9 of the job, of one worker, Ctrl-C, two runs on one directory, an
edited dataset, a full disk. Each asserts what is kept and that the resumed store is identical,
array for array, to one uninterrupted run of the same job (shared by the module), and so is
``maps.parquet``.

Every run is a real ``python -m rapids_attn.run`` in its own session, so a signal reaches the whole
process group as a terminal's would. Shards are one example each, so a kill lands between shards.
A struck run lands mid-extraction by construction, not by timing: it runs with a worker preload
(:func:`held_after_first_shard`) under which each of its processes writes one shard and then holds its
next writes, as a slow worker would, until the test has struck and creates the release file. The tests
poll the store's ``shards_done`` to decide when to strike, never a sleep.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
import zarr
from helpers import Hold, held_after_first_shard, make_job, pair_rows, write_jsonl

from rapids_attn.store import schema as S

pytestmark = [
    pytest.mark.slow,
    pytest.mark.budget(
        60, reason="a real job started, struck mid-extraction and resumed, each run a process of its own"
    ),
]

N_EXAMPLES = 24
RUN_TIMEOUT = 300
#: root attributes that hold timings or where the run happened rather than what is stored: ``job``
#: (its output.dir and runtime), ``extract_runs`` (one record per run: seconds, worker names; a resumed
#: store has more by design); ``learn`` is compared without its ``seconds``
RUN_SPECIFIC_ATTRS = {S.Attr.JOB, S.Attr.EXTRACT_RUNS, S.Attr.LEARN}


# -- jobs and processes -----------------------------------------------------------------------------


@dataclass
class Ref:
    """The uninterrupted run every fault is compared with."""

    model: Path
    data: Path
    run: Path


def write_fault_job(tmp: Path, ref_or_model, data: Path | None = None, processes: int = 0, **sections) -> Path:
    """``tmp/job.yaml`` for the shared job, writing to ``tmp/run``: one example per shard, no report.
    One in-process worker, or ``processes`` worker processes (the cases about them): the store does not
    depend on it (extraction is batch- and worker-invariant), and a process costs seconds to start."""
    model = ref_or_model.model if isinstance(ref_or_model, Ref) else ref_or_model
    data = data or ref_or_model.data
    job = make_job(
        tmp,
        model,
        data,
        extract={"shard_size": 1},
        cluster={"k_sweep": None},
        explain={"report": False, "head_views": 0, "permutations": 0},
        runtime={"processes": bool(processes), "n_workers": processes or 1},
        **sections,
    )
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def start(job: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    """The job in a new session (its own process group); stdout and stderr go to files beside the job;
    ``env``: variables added to this process's environment."""
    n = len(list(job.parent.glob("out*.txt")))
    out, err = job.parent / f"out{n}.txt", job.parent / f"err{n}.txt"
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rapids_attn.run", str(job), *args],
            cwd=job.parent,
            stdout=o,
            stderr=e,
            text=True,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    proc.stderr_path = err  # type: ignore[attr-defined]
    return proc


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    rc = proc.wait(RUN_TIMEOUT)
    return rc, proc.stderr_path.read_text()  # type: ignore[attr-defined]


def run(job: Path, *args: str) -> tuple[int, str]:
    return finish(start(job, *args))


def shards_done(run_dir: Path) -> np.ndarray | None:
    try:
        return np.asarray(zarr.open_group(str(run_dir / "store.zarr"), mode="r")[S.SHARDS_DONE][:], dtype=bool)
    except Exception:  # noqa: BLE001 - not created yet, or being created
        return None


def wait_for_shards(proc: subprocess.Popen, run_dir: Path, at_least: int = 1) -> None:
    """Until ``at_least`` shards are marked done (the job is then past store creation and the model load)."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the job ended (exit {proc.returncode}) before the fault: {_tail(proc)}"
        done = shards_done(run_dir)
        if done is not None and done.sum() >= at_least:
            return
        time.sleep(0.02)
    pytest.fail(f"no shard was done within {RUN_TIMEOUT}s")


def strike_mid_extraction(proc: subprocess.Popen, run_dir: Path, sig: int, hold: Hold) -> tuple[int, np.ndarray]:
    """Send ``sig`` to the job's process group once a shard is done; the exit code and the shards kept,
    checked to be some but not all (else the fault did not land mid-extraction). ``proc`` runs under ``hold``
    (:func:`held_after_first_shard`), released only once the job has ended: nothing is written after the
    strike but what a closing worker had held."""
    wait_for_shards(proc, run_dir)
    os.killpg(proc.pid, sig)
    try:
        rc, _ = finish(proc)
    finally:
        hold.release()
    done = shards_done(run_dir)
    assert done is not None and 0 < done.sum() < done.size, f"not mid-extraction: {done}"
    return rc, done


def live_members(pgid: int) -> list:
    import psutil

    out = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


def _tail(proc) -> str:
    return proc.stderr_path.read_text()[-2000:]


def one_line(stderr: str) -> str:
    # the progress bar redraws with carriage returns; the worker count and dashboard line is a notice
    lines = [
        ln for ln in re.split(r"[\r\n]", stderr) if ln.strip() and not ln.startswith(("extract:", "rapids_attn: "))
    ]
    assert len(lines) == 1 and lines[0].startswith("error: "), f"expected one error line, got:\n{stderr[-3000:]}"
    return lines[0]


# -- comparing stores -------------------------------------------------------------------------------


def assert_identical(run_dir: Path, ref_dir: Path) -> None:
    """Every array of the store equal (dtype, shape, values, NaN where NaN), the attributes equal but for
    timings and where it ran, and maps.parquet equal."""
    a = zarr.open_group(str(run_dir / "store.zarr"), mode="r")
    b = zarr.open_group(str(ref_dir / "store.zarr"), mode="r")
    names = sorted(b.array_keys())
    assert sorted(a.array_keys()) == names
    for name in names:
        x, y = a[name], b[name]
        assert (x.dtype, x.shape, x.chunks) == (y.dtype, y.shape, y.chunks), name
        np.testing.assert_array_equal(np.asarray(x[:]), np.asarray(y[:]), err_msg=name)
    aa, ba = dict(a.attrs), dict(b.attrs)
    assert set(aa) == set(ba)
    for key in set(ba) - RUN_SPECIFIC_ATTRS:
        assert aa[key] == ba[key], key
    # the learn stage's record less its clocks and how many workers fitted KMeans's extra fits (a run of two
    # workers against the reference's one): its figures are the same wherever the fits ran (fit._kmeans_fit)
    untimed = lambda d: {k: v for k, v in d.items() if k != "seconds"}
    assert untimed(aa[S.Attr.LEARN]) == untimed(ba[S.Attr.LEARN])
    assert aa[S.Attr.EXTRACT_RUNS][0].keys() == ba[S.Attr.EXTRACT_RUNS][0].keys()
    pd.testing.assert_frame_equal(pd.read_parquet(run_dir / "maps.parquet"), pd.read_parquet(ref_dir / "maps.parquet"))
    summary = [json.loads((d / "summary.json").read_text()) for d in (run_dir, ref_dir)]
    assert summary[0]["counts"] == summary[1]["counts"]


def extract_rows(run_dir: Path) -> dict[str, np.ndarray]:
    """The extract stage's per-example arrays (an example's rows depend on its own text only; the learn
    stage's depend on every example)."""
    g = zarr.open_group(str(run_dir / "store.zarr"), mode="r")
    return {
        str(spec): np.asarray(g[spec][:]) for spec in S.arrays_of("extract") if spec.dims[0] == "example" and spec in g
    }


# -- the reference ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ref(tiny_bert_dir, tmp_path_factory) -> Ref:
    tmp = tmp_path_factory.mktemp("reference")
    data = write_jsonl(tmp / "data.jsonl", pair_rows(N_EXAMPLES))
    job = write_fault_job(tmp, tiny_bert_dir, data)
    rc, err = run(job)
    assert rc == 0, err[-3000:]
    return Ref(tiny_bert_dir, data, tmp / "run")


# -- the cases --------------------------------------------------------------------------------------


def test_kill_9_of_the_whole_job_resumes_identically(ref, tmp_path):
    """SIGKILL to the process group (the job and its worker processes) between shards: nothing of the
    group survives, the lock dies with it, and the same command finishes what was left."""
    job = write_fault_job(tmp_path, ref, processes=1)
    hold = held_after_first_shard(tmp_path)
    proc = start(job, env=hold.env)
    rc, kept = strike_mid_extraction(proc, tmp_path / "run", signal.SIGKILL, hold)
    assert rc == -signal.SIGKILL
    deadline = time.monotonic() + 30
    while live_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not live_members(proc.pid), "worker processes outlived kill -9 of the job's group"
    rc, err = run(job)
    assert rc == 0, err[-3000:]
    assert_identical(tmp_path / "run", ref.run)
    runs = zarr.open_group(str(tmp_path / "run" / "store.zarr"), mode="r").attrs[S.Attr.EXTRACT_RUNS]
    assert runs[-1]["shards"] == kept.size - kept.sum()  # the rerun did only the shards not kept


def _is_worker(p) -> bool:
    cmd = " ".join(p.cmdline())
    if "spawn_main" in cmd:
        return True
    parent = p.parent()
    return parent is not None and "forkserver" in " ".join(parent.cmdline()) and "forkserver" in cmd


def test_kill_9_of_one_worker(ref, tmp_path):
    """SIGKILL to one worker process mid-extraction: the job finishes identically, or fails in one line
    and the rerun is identical."""
    import psutil

    job = write_fault_job(tmp_path, ref, processes=2)
    hold = held_after_first_shard(tmp_path)  # each worker writes one shard, then waits for the kill
    proc = start(job, env=hold.env)
    wait_for_shards(proc, tmp_path / "run")
    # the workers: forks of the fork server (processes.start_worker_server) or, where there is none, spawned
    workers = [p for p in psutil.Process(proc.pid).children(recursive=True) if _is_worker(p)]
    assert len(workers) == 2, [p.cmdline() for p in workers]
    before = shards_done(tmp_path / "run")
    try:
        workers[0].kill()
        workers[0].wait(30)
    finally:
        hold.release()  # the other worker (and a restarted one) go on
    rc, err = finish(proc)
    assert before.sum() < before.size, "the job was done before the worker was killed"
    if rc != 0:
        one_line(err)
        rc, err = run(job)
    assert rc == 0, err[-3000:]
    assert_identical(tmp_path / "run", ref.run)


def test_two_runs_on_one_directory(ref, tmp_path):
    """A second run while the first holds the directory exits 2 in one line naming the directory and the
    holder's pid, and the holder's store is identical to the reference. The holder is held after its first
    shard (:func:`held_after_first_shard`) and paused (SIGSTOP to its group) once it is extracting, so that the
    two runs overlap whatever the machine's speed: started merely together, a fast first run could finish
    before the second reached the directory."""
    job = write_fault_job(tmp_path, ref)
    hold = held_after_first_shard(tmp_path)
    holder = start(job, env=hold.env)
    wait_for_shards(holder, tmp_path / "run")
    os.killpg(holder.pid, signal.SIGSTOP)
    try:
        rc, err = run(job)
    finally:
        os.killpg(holder.pid, signal.SIGCONT)
        hold.release()
    assert rc == 2, err[-2000:]
    line = one_line(err)
    assert str(tmp_path / "run") in line and f"pid {holder.pid}" in line, line
    rc, err = finish(holder)
    assert rc == 0, err[-2000:]
    assert_identical(tmp_path / "run", ref.run)


def test_ctrl_c_resumes_identically(ref, tmp_path):
    """SIGINT to the process group, as a terminal's Ctrl-C: the rerun finishes what was left."""
    job = write_fault_job(tmp_path, ref)
    hold = held_after_first_shard(tmp_path)
    proc = start(job, env=hold.env)
    rc, _ = strike_mid_extraction(proc, tmp_path / "run", signal.SIGINT, hold)
    assert rc != 0
    rc, err = run(job)
    assert rc == 0, err[-3000:]
    assert_identical(tmp_path / "run", ref.run)


EDITED = 3  # the example whose text is edited
EDITED_CONTEXT = "Edited after the run: a short new context."


class edited_data:
    """Edit one example's context in the reference data file in place (same path) and restore the exact
    bytes afterwards: the content fingerprint then matches the reference again for the other cases."""

    def __init__(self, path: Path):
        self.path, self.original = path, path.read_bytes()

    def __enter__(self):
        rows = [json.loads(line) for line in self.original.decode().splitlines()]
        rows[EDITED]["context"] = EDITED_CONTEXT
        write_jsonl(self.path, rows)

    def __exit__(self, *exc):
        self.path.write_bytes(self.original)


def test_edited_dataset_is_refused_then_overwritten(ref, tmp_path):
    """A finished store, then the same data file edited: the rerun refuses in one line (different data,
    --overwrite), changing nothing; with --overwrite it holds the new text's results."""
    run_dir = tmp_path / "run"
    shutil.copytree(ref.run, run_dir, symlinks=True)  # a finished run of this job, without running it again
    job = write_fault_job(tmp_path, ref)
    with edited_data(ref.data):
        rc, err = run(job)
        assert rc == 2, err[-3000:]
        line = one_line(err)
        assert "different" in line and "--overwrite" in line and str(run_dir) in line, line
        assert_identical(run_dir, ref.run)  # refused before touching anything
        rc, err = run(job, "--overwrite")
        assert rc == 0, err[-3000:]
    new, old = extract_rows(run_dir), extract_rows(ref.run)
    others = np.arange(N_EXAMPLES) != EDITED
    for name in old:
        np.testing.assert_array_equal(new[name][others], old[name][others], err_msg=name)
    assert new[S.SEQ_LEN][EDITED] < old[S.SEQ_LEN][EDITED]  # the new, shorter text
    assert not np.array_equal(new[S.FEATURES][EDITED], old[S.FEATURES][EDITED])


def test_kill_9_then_edit_never_mixes_old_and_new(ref, tmp_path):
    """kill -9 mid-extraction, edit the data, rerun: refused in one line, and the kept shards are left
    as they were (none of the new data written beside the old)."""
    run_dir = tmp_path / "run"
    job = write_fault_job(tmp_path, ref)
    hold = held_after_first_shard(tmp_path)
    proc = start(job, env=hold.env)
    _, kept = strike_mid_extraction(proc, run_dir, signal.SIGKILL, hold)
    before = extract_rows(run_dir)
    with edited_data(ref.data):
        rc, err = run(job)
    assert rc == 2, err[-3000:]
    line = one_line(err)
    assert "different" in line and "--overwrite" in line, line
    after = extract_rows(run_dir)
    np.testing.assert_array_equal(shards_done(run_dir), kept)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)


def _unprivileged_mounts() -> str | None:
    """None where ``unshare -rm`` can mount a tmpfs here, else why not."""
    if shutil.which("unshare") is None:
        return "no unshare(1) on this machine"
    try:
        r = subprocess.run(
            ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare -rm failed: {e}"
    return None if r.returncode == 0 else f"unprivileged mount namespaces are not permitted: {r.stderr.strip()}"


FULL_DISK_SCRIPT = """
mount -t tmpfs -o size=512k tmpfs "$MNT" || exit 97
"$PY" -m rapids_attn.run "$JOB" > "$OUT/first.out" 2> "$OUT/first.err"; echo $? > "$OUT/first.rc"
cp -a "$MNT/run" "$OUT/after_fail"
mount -o remount,size=256m "$MNT" || exit 98
"$PY" -m rapids_attn.run "$JOB" > "$OUT/second.out" 2> "$OUT/second.err"; echo $? > "$OUT/second.rc"
cp -a "$MNT/run" "$OUT/resumed"
"""


def test_full_disk_fails_in_one_line_and_resumes_identically(ref, tmp_path):
    """output.dir on a 512 kB tmpfs (in a private mount namespace) fills up mid-extraction: the job fails
    with one line, not a traceback; after the mount is made bigger the same command resumes, and the
    store is identical to the reference."""
    why = _unprivileged_mounts()
    if why:
        pytest.skip(why)
    mnt, out = tmp_path / "mnt", tmp_path / "out"
    mnt.mkdir()
    out.mkdir()
    job = write_fault_job(tmp_path, ref, output={"dir": str(mnt / "run")})
    env = {**os.environ, "MNT": str(mnt), "OUT": str(out), "JOB": str(job), "PY": sys.executable}
    r = subprocess.run(
        ["unshare", "-rm", "sh", "-c", FULL_DISK_SCRIPT], env=env, cwd=tmp_path, timeout=2 * RUN_TIMEOUT, check=False
    )
    assert r.returncode == 0, f"the namespace script failed ({r.returncode})"
    first_rc, first_err = int((out / "first.rc").read_text()), (out / "first.err").read_text()
    kept = shards_done(out / "after_fail")
    assert first_rc == 2 and kept is not None and 0 < kept.sum() < kept.size, (first_rc, kept, first_err[-2000:])
    assert "Traceback" not in first_err, first_err[-3000:]
    line = one_line(first_err)
    assert str(mnt) in line and "no space left on device" in line and "rerun the same command" in line, line
    second_rc = int((out / "second.rc").read_text())
    assert second_rc == 0, (out / "second.err").read_text()[-3000:]
    assert_identical(out / "resumed", ref.run)
