"""The job's cluster accepts only the job's own processes (issue 33): a local cluster with worker processes talks
TLS with credentials made for it alone, and every other process of the machine is refused by the scheduler, the
nannies and the workers, whatever it tries (plain TCP, TLS without a certificate, TLS with a certificate of its
own); the dashboard stays plain HTTP on loopback. An external scheduler takes the Dask config's TLS settings."""

from __future__ import annotations

import inspect

import dask
import pytest
from distributed import Client, LocalCluster
from distributed.security import Security
from tls_probe import REFUSED, _client_runs, _identity, _no_certificate

from rapids_attn.errors import BackendUnavailableError
from rapids_attn.job import RuntimeConfig
from rapids_attn.runtime import (
    Runtime,
    check_runtime,
    cluster_security,
    local_cluster_args,
    local_cuda_cluster_args,
)


def test_a_local_cluster_refuses_every_process_without_its_credentials():
    from multiprocessing import forkserver

    import rapids_attn.processes as rt_mod

    # whatever an earlier test left running: the workers are forks of a server this test's runtime started
    forkserver._forkserver._stop()
    rt_mod._server_env = rt_mod._server_pid = None
    rt = Runtime(RuntimeConfig(n_workers=1, processes=True, dashboard_address="127.0.0.1:0"))
    with rt as client:
        assert rt.description["protocol"] == "tls"
        assert rt.description["worker_start"] == "forkserver"  # the fork server's workers got the credentials too
        assert rt.description["dashboard"].startswith("http://127.0.0.1:")  # the dashboard: plain HTTP, loopback
        info = client.scheduler_info()
        # the scheduler, the worker and its nanny: each listens, each must refuse
        addresses = [info["address"], *info["workers"], *(w["nanny"] for w in info["workers"].values())]
        assert len(set(addresses)) == 3 and all(a.startswith("tls://127.0.0.1:") for a in addresses), addresses

        ours = rt.security.get_connection_args("client")
        stranger = Security.temporary().get_connection_args("client")  # a key and certificate of its own
        for address in addresses:
            plain = "tcp://" + address.split("://", 1)[1]
            assert _identity(address, **ours)["type"]  # the job's own credentials: answered (the test can fail)
            with pytest.raises(REFUSED):
                _identity(plain)
            with pytest.raises(REFUSED):
                _identity(address, **_no_certificate())
            with pytest.raises(REFUSED):
                _identity(address, **stranger)

        # as a user would try it: a Client without the credentials, at the scheduler's address or at tcp:// on its port
        scheduler = info["address"]
        for address, security in [
            (scheduler, None),
            ("tcp://" + scheduler.split("://", 1)[1], None),
            (scheduler, Security.temporary()),
        ]:
            with pytest.raises((*REFUSED, TypeError)):  # TypeError: distributed's word for tls:// without TLS settings
                _client_runs(address, security)
        assert _client_runs(scheduler, rt.security) == ["ran"]
        assert list(client.run(lambda: "ran").values()) == ["ran"]  # the job's client: unaffected
    assert rt.security is None


def _listening() -> set:
    import os

    import psutil

    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process(os.getpid()).net_connections() if c.status == "LISTEN"}


def test_a_cluster_of_threads_listens_on_loopback_only_and_its_link_opens():
    """processes: false talks in-process (inproc://): nothing to connect to, so no credentials to make. The
    dashboard and each worker's HTTP server (/health, /metrics) listen on 127.0.0.1 only (issue 47: the workers'
    bound every interface), and the printed link is the one that opens (distributed's named the external host)."""
    import urllib.request

    before = _listening()
    rt = Runtime(RuntimeConfig(n_workers=2, processes=False, dashboard_address="127.0.0.1:0"))
    with rt as client:
        assert rt.security is None and rt.description["protocol"] == "inproc"
        assert client.scheduler_info()["address"].startswith("inproc://")
        opened = _listening() - before
        assert len(opened) == 3, opened  # the dashboard and two workers' HTTP servers
        assert {ip for ip, _ in opened} == {"127.0.0.1"}, opened
        link = rt.description["dashboard"]
        assert link.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(link.replace("/status", "/health"), timeout=10) as r:
            assert r.status == 200


def test_the_cluster_arguments_carry_the_credentials():
    cfg = RuntimeConfig(processes=True)
    sec = cluster_security(cfg)
    assert isinstance(sec, Security) and sec.require_encryption
    assert cluster_security(cfg) is not sec and cluster_security(cfg).tls_ca_file != sec.tls_ca_file  # per cluster
    kw = local_cluster_args(cfg, 2, sec)
    inspect.signature(LocalCluster).bind(**kw)
    assert kw["security"] is sec and kw["protocol"] == "tls" and kw["dashboard_address"] == "127.0.0.1:8787"
    cuda = local_cuda_cluster_args(RuntimeConfig(cluster="local-cuda"), 2, sec)
    assert cuda["security"] is sec and cuda["protocol"] == "tls"  # dask-cuda takes both (tests/contract binds)
    assert "security" not in local_cluster_args(cfg, 2) and "protocol" not in local_cluster_args(cfg, 2)
    assert cluster_security(RuntimeConfig(processes=False)) is None
    assert cluster_security(RuntimeConfig(cluster="scheduler", address="tls://127.0.0.1:8786")) is None
    assert isinstance(cluster_security(RuntimeConfig(cluster="local-cuda")), Security)


def test_without_cryptography_the_check_says_so_in_one_line(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "cryptography" else find_spec(name, *a)
    )
    with pytest.raises(BackendUnavailableError, match="needs the cryptography package") as e:
        check_runtime(RuntimeConfig(processes=True))
    assert "\n" not in str(e.value)
    check_runtime(RuntimeConfig(processes=False))  # threads: no TLS, nothing needed


def test_a_refused_client_is_collected_at_once(tls_scheduler):
    """A Client whose start failed is left in a reference cycle; collected later, at the garbage collector's
    moment, its __del__ could run while another client starts and wait for ever on the lock distributed's loop
    runners share. The join collects it before its one-line error, so none is left for later."""
    import gc

    def clients() -> list:
        return [o for o in gc.get_objects() if isinstance(o, Client)]

    cluster, _ = tls_scheduler
    gc.collect()
    before = {id(c) for c in clients()}  # an earlier test's, still referenced somewhere: not this one's
    gc.disable()  # only the collection the join makes itself
    try:
        with pytest.raises(BackendUnavailableError, match="speaks TLS"):
            Runtime(RuntimeConfig(cluster="scheduler", address=cluster.scheduler_address)).__enter__()
        left = [c for c in clients() if id(c) not in before]
    finally:
        gc.enable()
    assert left == []


@pytest.fixture
def tls_scheduler():
    """An external scheduler (and a worker) secured with its own credentials, as `dask scheduler` with TLS."""
    sec = Security.temporary()
    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, security=sec, protocol="tls://", dashboard_address=":0"
    ) as cluster:
        yield cluster, sec


def _tls_config(tmp_path, sec: Security) -> dict:
    """The Dask config's TLS settings naming files that hold ``sec``'s certificate and key."""
    (tmp_path / "ca.pem").write_text(sec.tls_ca_file)
    (tmp_path / "client.pem").write_text(sec.tls_client_cert)
    (tmp_path / "client.key").write_text(sec.tls_client_key)
    return {
        "distributed.comm.tls.ca-file": str(tmp_path / "ca.pem"),
        "distributed.comm.tls.client.cert": str(tmp_path / "client.pem"),
        "distributed.comm.tls.client.key": str(tmp_path / "client.key"),
    }


def test_an_external_scheduler_takes_the_dask_configs_tls(tmp_path, tls_scheduler):
    cluster, sec = tls_scheduler
    cfg = RuntimeConfig(cluster="scheduler", address=cluster.scheduler_address)
    with dask.config.set(_tls_config(tmp_path, sec)):
        rt = Runtime(cfg)
        with rt as client:
            assert rt.security is None and rt.description["protocol"] == "tls"
            assert list(client.run(lambda: "ran").values()) == ["ran"]
    # without TLS settings, or with another certificate: one line each, naming the field and what to set
    with pytest.raises(
        BackendUnavailableError, match=r"^runtime.address: .* speaks TLS .*distributed.comm.tls.ca-file"
    ):
        Runtime(cfg).__enter__()
    (tmp_path / "other").mkdir()
    other = _tls_config(tmp_path / "other", Security.temporary())
    with dask.config.set(other), pytest.raises(BackendUnavailableError, match=r"^runtime.address: .* each other's TLS"):
        Runtime(cfg).__enter__()
    # and a later client of this process starts: the refused ones were collected at once, not in the middle of
    # its start, where their __del__ waited for ever on the lock distributed's loop runners share
    with dask.config.set(_tls_config(tmp_path, sec)), Runtime(cfg) as client:
        assert list(client.run(lambda: "ran").values()) == ["ran"]


def test_runtime_tls_joins_with_the_helpers_folder_and_refuses_another(tmp_path, tls_scheduler):
    """runtime.tls: the folder python -m rapids_attn.tls writes (here holding the scheduler's own key) is the
    client's credentials; another folder's key is refused in one line naming runtime.tls."""
    from rapids_attn import tls

    cluster, sec = tls_scheduler
    ours = tmp_path / "ours"
    ours.mkdir(mode=0o700)
    (ours / "dask.pem").write_text(sec.tls_ca_file)
    (ours / "dask.key").write_text(sec.tls_client_key)
    (ours / "dask.key").chmod(0o600)
    rt = Runtime(RuntimeConfig(cluster="scheduler", address=cluster.scheduler_address, tls=ours))
    with rt as client:
        assert rt.description["protocol"] == "tls"
        assert list(client.run(lambda: "ran").values()) == ["ran"]
    other = tls.make(tmp_path / "other")
    with pytest.raises(BackendUnavailableError, match=r"^runtime.address: .* each other's TLS .*runtime.tls \("):
        Runtime(RuntimeConfig(cluster="scheduler", address=cluster.scheduler_address, tls=other)).__enter__()


def test_a_plain_scheduler_is_refused_unless_the_job_opts_out(tmp_path):
    """A plain tcp:// scheduler, given as the address or named by the scheduler file, is refused in one line
    naming the field; runtime.plain_tcp: true joins it."""
    from pydantic import ValidationError

    from rapids_attn.errors import JobConfigError
    from rapids_attn.runtime import scheduler_address

    for address in ("tcp://h:8786", "h:8786", "ucx://h:8786"):
        with pytest.raises(ValidationError, match="a plain TCP scheduler: whoever reaches it runs code"):
            RuntimeConfig(cluster="scheduler", address=address)
        assert RuntimeConfig(cluster="scheduler", address=address, plain_tcp=True).address == address
    with pytest.raises(ValidationError, match="tls\n.*only used with cluster: scheduler"):
        RuntimeConfig(tls=tmp_path)
    with pytest.raises(ValidationError, match="plain_tcp\n.*only used with cluster: scheduler"):
        RuntimeConfig(plain_tcp=True)
    file = tmp_path / "scheduler.json"
    file.write_text('{"address": "tcp://10.0.0.1:8786"}')
    with pytest.raises(JobConfigError, match=r"^runtime.scheduler_file: .* names tcp://10.0.0.1:8786, a plain TCP"):
        scheduler_address(RuntimeConfig(cluster="scheduler", scheduler_file=file))
    assert scheduler_address(RuntimeConfig(cluster="scheduler", scheduler_file=file, plain_tcp=True)).startswith("tcp")
    file.write_text("{")
    with pytest.raises(BackendUnavailableError, match=r"^runtime.scheduler_file: cannot read a scheduler's address"):
        scheduler_address(RuntimeConfig(cluster="scheduler", scheduler_file=file))


def test_the_tls_helper_writes_private_credentials_and_keeps_an_existing_key(tmp_path, capsys):
    from rapids_attn import tls
    from rapids_attn.errors import JobConfigError

    folder = tmp_path / "tls"
    assert tls.main([str(folder)]) == 0
    out = capsys.readouterr().out
    assert f"--tls-ca-file {folder}/dask.pem --tls-cert {folder}/dask.pem --tls-key {folder}/dask.key" in out
    assert (folder / "dask.key").stat().st_mode & 0o777 == 0o600 and folder.stat().st_mode & 0o777 == 0o700
    config = yaml_load((folder / "dask.yaml").read_text())["distributed"]["comm"]
    assert config["require-encryption"] is True and config["tls"]["client"]["key"] == str(folder / "dask.key")
    key = (folder / "dask.key").read_text()
    assert tls.main([str(folder)]) == 2 and "pass --force" in capsys.readouterr().err
    assert (folder / "dask.key").read_text() == key
    assert tls.main([str(folder), "--force"]) == 0 and (folder / "dask.key").read_text() != key
    check_runtime(RuntimeConfig(cluster="scheduler", address="tls://h:1", tls=folder))  # complete: no complaint
    (folder / "dask.key").chmod(0o644)
    with pytest.raises(JobConfigError, match=r"^runtime.tls: .*dask.key is readable by others \(mode 644\)"):
        check_runtime(RuntimeConfig(cluster="scheduler", address="tls://h:1", tls=folder))
    (folder / "dask.pem").unlink()
    with pytest.raises(JobConfigError, match=r"^runtime.tls: .* has no dask.pem; make the credentials with"):
        check_runtime(RuntimeConfig(cluster="scheduler", address="tls://h:1", tls=folder))
    with pytest.raises(JobConfigError, match=r"^runtime.tls: no such folder"):
        check_runtime(RuntimeConfig(cluster="scheduler", address="tls://h:1", tls=tmp_path / "none"))


def yaml_load(text: str):
    import yaml

    return yaml.safe_load(text)


def test_check_tries_an_external_schedulers_address(tmp_path, capsys, monkeypatch, tiny_bert_dir, pair_data):
    """--check joins an external scheduler and leaves (issue 47): an address nothing answers at is one line,
    exit 2, before any stage runs."""
    import socket

    import yaml
    from helpers import make_job

    from rapids_attn import runtime
    from rapids_attn.run import main

    monkeypatch.setattr(runtime, "JOIN_TIMEOUT", "2s")  # nothing listens: the join retries until its timeout

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    job = make_job(tmp_path, tiny_bert_dir, pair_data)
    from rapids_attn import tls

    folder = str(tls.make(tmp_path / "tls"))
    job["runtime"] = {
        "cluster": "scheduler",
        "address": f"tls://127.0.0.1:{port}",
        "tls": folder,
        "learn_backend": "cpu",
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    assert main([str(path), "--check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: runtime.address: cannot reach the Dask scheduler at tls://")
