"""Connections a stranger tries against a Dask cluster, shared by the cluster-security tests (the job's own local
cluster: tests/unit/test_cluster_security.py; the documented multi-node commands: tests/integration/
test_multi_node.py)."""

from __future__ import annotations

import asyncio
import ssl

from distributed import Client
from distributed.comm import connect

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
