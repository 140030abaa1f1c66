"""Issue 50: a campaign's runs on one shared Dask cluster (``run --dask``): each run one Dask task calling the same
``run_task`` on a worker, one run per worker at a time (the ``campaign-slot`` resource), a failing run reported with
its error while the others finish, records naming the worker, each run sized to its worker's allotment (CPUs, or
its GPU group through CUDA_VISIBLE_DEVICES), the join refused in one line where the project's TLS rules say so.

The runs' processes are stubbed (``tasks.subprocess``) except one real tiny run; the GPU groups are checked on the
CPU (CUDA_VISIBLE_DEVICES is only a string to the workers that start the runs): a run on a GPU is not made here."""

import itertools
import json
import subprocess
import threading
import time
from types import SimpleNamespace

import pytest
import yaml
from helpers import make_job, repeated_rows, write_jsonl

from rapids_attn.campaign import cluster as dask_mode
from rapids_attn.campaign import tasks
from rapids_attn.campaign.__main__ import main
from rapids_attn.campaign.plan import load_campaign
from rapids_attn.errors import UserError


def _campaign(tmp, models, job=None):
    if job is None:
        job = {"name": "x", "data": {"path": "x.jsonl"}, "model": {"name": "x"}}
    (tmp / "job.yaml").write_text(yaml.safe_dump(job))
    doc = {"name": "shared", "job": "job.yaml", "models": models, "output": {"dir": "out"}}
    path = tmp / "campaign.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


class FakeRuns:
    """``tasks.subprocess`` for run_task: a run takes 0.3 s, writes its summary.json (done) or, for model ``bad``,
    its one-line error (exit 2); each is noted with its worker and times."""

    STDOUT = subprocess.STDOUT

    def __init__(self):
        self.lock = threading.Lock()
        self.seen = []  # (index, worker address, start, end, command, env)

    def run(self, cmd, stdout=None, stderr=None, env=None, check=False):
        from distributed import get_worker

        sets = dict(cmd[i + 1].split("=", 1) for i, a in enumerate(cmd) if a == "--set")
        t0 = time.perf_counter()
        time.sleep(0.3)
        rc = 0
        if sets["model.name"] == "bad":
            stdout.write("loading\nerror: model.name: no such model folder: bad\n")
            rc = 2
        else:
            from pathlib import Path

            Path(sets["output.dir"]).mkdir(parents=True, exist_ok=True)
            (Path(sets["output.dir"]) / "summary.json").write_text("{}")
        with self.lock:
            self.seen.append((sets["output.dir"], get_worker().address, t0, time.perf_counter(), cmd, env))
        return SimpleNamespace(returncode=rc)


def _status(capsys, path):
    capsys.readouterr()
    assert main([str(path), "status", "--json"]) == 0
    return {s["run"]: s for s in json.loads(capsys.readouterr().out)}


def test_runs_share_a_joined_cluster_one_per_worker(tmp_path, monkeypatch, capsys):
    """An existing cluster (2 workers of 2 threads each, started without the slot resource) joined by address:
    5 runs, one failing; each worker runs one at a time, the failure is reported and the others finish."""
    from distributed import Client, LocalCluster

    path = _campaign(tmp_path, [{"name": n, "label": f"m{i}"} for i, n in enumerate(["a", "a", "bad", "a", "a"])])
    fake = FakeRuns()
    monkeypatch.setattr(tasks, "subprocess", fake)
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=False, dashboard_address=":0") as cl:
        addr = cl.scheduler_address  # inproc://: plain, so joined only when told
        capsys.readouterr()
        assert main([str(path), "run", "--dask", addr]) == 2
        assert "plain TCP scheduler" in capsys.readouterr().err
        assert main([str(path), "run", "--dask", addr, "--plain-tcp"]) == 1
        out = capsys.readouterr().out
        with Client(cl) as client:
            workers = set(client.scheduler_info()["workers"])
            slots = client.run(lambda dask_worker: dict(dask_worker.state.total_resources))
    assert all(v == {dask_mode.SLOT: 1} for v in slots.values())  # given by the plugin
    assert "4 of 5 runs done, 1 failed" in out
    assert "m2/data: failed: error: model.name: no such model folder: bad" in out
    assert len([ln for ln in out.splitlines() if ln.startswith("[")]) == 5
    st = _status(capsys, path)
    assert {k: v["state"] for k, v in st.items()} == {
        "m0/data": "done",
        "m1/data": "done",
        "m2/data": "failed",
        "m3/data": "done",
        "m4/data": "done",
    }
    assert st["m2/data"]["detail"] == "error: model.name: no such model folder: bad"
    # one run per worker at a time (each worker has 2 threads), both workers used
    assert len(fake.seen) == 5
    by_worker = {}
    for _, w, t0, t1, _, _ in fake.seen:
        by_worker.setdefault(w, []).append((t0, t1))
    assert set(by_worker) <= workers and len(by_worker) == 2
    for spans in by_worker.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans
    # the records: the worker that ran it, the allotment added after the run's own overrides
    c = load_campaign(path, validate_jobs=False)
    for r in c.runs:
        rec = tasks.read_record(c, r)
        assert rec["mode"] == "dask" and rec["worker"] in workers and rec["host"]
        assert rec["spec"] == r.spec_hash  # the allotment is not part of what the run is
        assert rec["overrides_added"][0] == "runtime.cluster=local"
        cmd = next(s[4] for s in fake.seen if s[0] == str(r.run_dir))
        assert cmd[-6:] == [x for o in rec["overrides_added"] for x in ("--set", o)]
        assert rec["env"][dask_mode.MARK]
        assert tasks.log_path(c, r).read_text().startswith(f"$ {dask_mode.MARK}=")
    # done runs are skipped, as in every mode: nothing is started again but the failed one
    fake.seen.clear()
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as cl:
        assert main([str(path), "run", "--dask", cl.scheduler_address, "--plain-tcp", "--index", "0", "2"]) == 1
    assert [s[0] for s in fake.seen] == [str(c.runs[2].run_dir)]


def test_a_task_that_fails_before_its_run_is_recorded_failed(tmp_path, monkeypatch, capsys):
    """A run whose Dask task fails on its worker before run_task starts (here its allotment raises) is reported
    and recorded failed, with why, so status does not call it pending; the other run finishes."""
    from distributed import LocalCluster

    path = _campaign(tmp_path, [{"name": "a", "label": "ok"}, {"name": "a", "label": "lost"}])
    monkeypatch.setattr(tasks, "subprocess", FakeRuns())
    real = dask_mode.allotment

    def allotment(job, r, *args):
        if r.label.startswith("lost/"):
            raise RuntimeError("no GPU group for this worker")
        return real(job, r, *args)

    monkeypatch.setattr(dask_mode, "allotment", allotment)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as cl:
        assert main([str(path), "run", "--dask", cl.scheduler_address, "--plain-tcp"]) == 1
    assert "lost/data: failed: RuntimeError: no GPU group for this worker" in capsys.readouterr().out
    st = _status(capsys, path)
    assert st["ok/data"]["state"] == "done" and st["lost/data"]["state"] == "failed"
    assert st["lost/data"]["detail"] == "its Dask task failed: RuntimeError: no GPU group for this worker"


@pytest.mark.budget(35, reason="a Dask cluster running a real run of a tiny model through the CLI")
def test_a_local_cluster_runs_a_real_tiny_run(tmp_path, tiny_gpt2_dir):
    """``local:2`` (threads here; worker processes from the CLI): a real run of a tiny model, its record naming the
    worker and the allotment (the worker's share of the CPUs); the failures are the stubbed test's."""
    data = write_jsonl(tmp_path / "docs.jsonl", repeated_rows(4, 1))
    job = make_job(tmp_path, "placeholder", data, cluster={"n_clusters": 2, "k_sweep": None})
    job.pop("output")
    job["model"].pop("name")
    path = _campaign(tmp_path, [{"name": str(tiny_gpt2_dir), "label": "gpt2"}], job)
    c = load_campaign(path)
    lines = []
    target = dask_mode.parse_target("local:2", processes=False)
    states = dask_mode.run_on_cluster(c, None, target, say=lines.append)
    assert [s.state for s in states] == ["done"], lines
    assert lines[0].startswith("dask: a local cluster of 2 worker(s)")
    rec = tasks.read_record(c, c.runs[0])
    assert rec["rc"] == 0 and rec["worker"].startswith("inproc://") and rec["mode"] == "dask"
    assert any(o.startswith("runtime.n_workers=") for o in rec["overrides_added"])
    summary = json.loads((c.runs[0].run_dir / "summary.json").read_text())
    assert summary["counts"]["examples"] == 4
    assert main([str(path), "status", "--json"]) == 0


def test_gpu_groups_each_worker_its_own(tmp_path, monkeypatch):
    """``local --gpus 2`` with four GPUs visible: two worker processes, each started with its group in
    CUDA_VISIBLE_DEVICES, and a run there gets that group and a local-cuda cluster of 2 workers. Checked on the
    CPU: the workers only start runs; no run is made on a GPU here."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    target = dask_mode.parse_target("local", gpus=2)
    path = _campaign(tmp_path, [{"name": "a"}])
    c = load_campaign(path, validate_jobs=False)
    r = c.runs[0]
    with dask_mode.campaign_client(target) as (client, where):
        assert where == "a local cluster of 2 GPU group(s) of 2: 0,1; 2,3"
        shares = dask_mode.check_workers(client, 2)
        assert len(shares) == 2
        got = client.run(dask_mode.allotment, c.job, r, 2, 1, "m")
        slots = client.run(lambda dask_worker: dict(dask_worker.state.total_resources))
    assert sorted(env["CUDA_VISIBLE_DEVICES"] for env, _ in got.values()) == ["0,1", "2,3"]
    for env, sets in got.values():
        assert sets == ["runtime.cluster=local-cuda", "runtime.n_workers=2"]
        assert env.get("OMP_NUM_THREADS", "x") is None  # the nanny's value is not the run's
    assert all(v == {dask_mode.SLOT: 1} for v in slots.values())
    with pytest.raises(UserError, match="at most local:2"):
        dask_mode.gpu_groups(["0", "1", "2", "3"], 2, 3)


def test_a_job_that_joins_a_scheduler_runs_inside_its_worker_instead(tmp_path):
    """A job with ``runtime.cluster: scheduler`` (its own address): on a campaign's worker the run starts a local
    cluster in the worker's share, and the settings that only go with joining are cleared, so the job validates."""
    from rapids_attn.jobfile import load_job

    data = write_jsonl(tmp_path / "docs.jsonl", repeated_rows(2, 2))
    job = make_job(tmp_path, "placeholder", data)
    job["runtime"] = {"cluster": "scheduler", "address": "tcp://10.0.0.9:8786", "plain_tcp": True}
    path = _campaign(tmp_path, [{"name": "a"}], job=job)
    c = load_campaign(path, validate_jobs=False)
    _, sets = dask_mode.allotment(c.job, c.runs[0], 0, 2, "m")
    assert sets[:3] == ["runtime.cluster=local", "runtime.n_workers=2", "runtime.threads_per_worker=1"]
    assert "runtime.address=null" in sets and "runtime.plain_tcp=false" in sets
    rt = load_job(c.job, [*c.runs[0].overrides, *sets]).runtime
    assert (rt.cluster, rt.address, rt.plain_tcp, rt.n_workers) == ("local", None, False, 2)
    # a job with a local cluster of its own gets the worker's share only
    assert dask_mode._unjoin(tmp_path / "job.yaml", c.runs[0]) != []
    job["runtime"] = {"cluster": "local"}
    path = _campaign(tmp_path, [{"name": "a"}], job=job)
    c = load_campaign(path, validate_jobs=False)
    assert dask_mode.allotment(c.job, c.runs[0], 0, 2, "m")[1] == [
        "runtime.cluster=local",
        "runtime.n_workers=2",
        "runtime.threads_per_worker=1",
    ]


def test_workers_that_would_share_a_gpu_are_refused():
    """dask-cuda's workers list every GPU, their own first: --gpus 2 would give two of them the same GPU."""
    info = {
        "tls://h:1": {"host": "h", "cpus": 8, "group": "0,1", "set": True},
        "tls://h:2": {"host": "h", "cpus": 8, "group": "1,0", "set": True},
    }
    fake = SimpleNamespace(run=lambda fn, *a: info)
    with pytest.raises(UserError, match="would share GPU"):
        dask_mode.check_workers(fake, 2)
    info["tls://h:2"]["group"] = "2,3"
    assert dask_mode.check_workers(fake, 2) == {"tls://h:1": 4, "tls://h:2": 4}
    info["tls://h:2"] = {"host": "h", "cpus": 8, "group": "0,1", "set": False}
    with pytest.raises(UserError, match="no CUDA_VISIBLE_DEVICES"):
        dask_mode.check_workers(fake, 2)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--dask", "tcp://127.0.0.1:8786"], ["--dask", "plain TCP scheduler", "--plain-tcp", "--tls FOLDER"]),
        (["--dask", "local:0"], ["local:N"]),
        (["--dask", "local:2", "--tls", "/nope"], ["--tls"]),
        (["--dask", "tls://127.0.0.1:1", "--tls", "/no/such/folder"], ["runtime.tls", "no such folder"]),
        (["--dask", "local:2", "--parallel", "2"], ["--parallel"]),
        (["--gpus", "1"], ["--dask"]),
    ],
)
def test_bad_dask_options_are_one_line(tmp_path, capsys, args, words):
    path = _campaign(tmp_path, [{"name": "a"}])
    capsys.readouterr()
    assert main([str(path), "run", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    for w in words:
        assert w in err[0], err
    assert not (tmp_path / "out").exists()
