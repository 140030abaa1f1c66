"""The job's cluster accepts only the job's own processes (issue 33): a local cluster with worker processes talks
TLS with credentials made for it alone, and every other process of the machine is refused by the scheduler, the
nannies and the workers, whatever it tries (plain TCP, TLS without a certificate, TLS with a certificate of its
own); the dashboard stays plain HTTP on loopback. An external scheduler takes the Dask config's TLS settings."""

from __future__ import annotations

import asyncio
import inspect
import ssl

import dask
import pytest
from distributed import Client, LocalCluster
from distributed.comm import connect
from distributed.security import Security

from rapids_attn.errors import BackendUnavailableError
from rapids_attn.job import RuntimeConfig
from rapids_attn.runtime import (
    Runtime,
    check_runtime,
    cluster_security,
    local_cluster_args,
    local_cuda_cluster_args,
)

# every exception a refused connection may end in: distributed's CommClosedError is an OSError, an SSL error too
REFUSED = (OSError, TimeoutError, ssl.SSLError)


def _identity(address: str, **connection_args) -> dict:
    """Connect to a scheduler, nanny or worker and ask for its identity: the smallest request every distributed
    server answers, sent the way any other request (``run`` included) would be."""

    async def ask():
        comm = await connect(address, timeout=5, **connection_args)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            await comm.close()

    return asyncio.run(ask())


def _client_runs(address: str, security) -> list:
    """``Client(address, security=security).run(...)``: what ran, on each worker. The client runs on an event loop
    of this thread (``asynchronous``) and is closed there, so a refused client leaves no loop thread behind and
    nothing for its ``__del__`` to do later."""

    async def run():
        client = Client(address, security=security, asynchronous=True, timeout="5s")  # connects when awaited
        try:
            await client
            return list((await client.run(lambda: "ran")).values())
        finally:
            await client.close()  # a refused one too, on its own loop

    return asyncio.run(run())


def _no_certificate() -> dict:
    """TLS as a stranger can do it: verifying nothing, presenting no certificate."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return {"ssl_context": ctx, "require_encryption": True}


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


def test_a_cluster_of_threads_listens_on_no_port():
    """processes: false talks in-process (inproc://): nothing to connect to, so no credentials to make."""
    rt = Runtime(RuntimeConfig(n_workers=1, processes=False, dashboard_address="127.0.0.1:0"))
    with rt as client:
        assert rt.security is None and rt.description["protocol"] == "inproc"
        assert client.scheduler_info()["address"].startswith("inproc://")


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
