"""TLS credentials for a Dask cluster that jobs join (``runtime.cluster: scheduler``; issue 47, item 2).

A scheduler that anyone on its network can reach runs their code on its workers, so the cluster examples the
project documents start the scheduler and the workers with TLS, and the job joins with ``runtime.tls`` naming the
folder this module writes::

    python -m rapids_attn.tls /shared/tls

writes, into a new folder readable by its owner only:

- ``dask.key``: a private key (RSA 2048), mode 0600;
- ``dask.pem``: a certificate signed with that key (valid for a year), which is also the one trusted CA: only a
  process that holds the key is accepted, by the scheduler, the workers and the job alike;
- ``dask.yaml``: the same as Dask config (``distributed.comm.tls.*``, encryption required), for any other Dask
  client: ``DASK_CONFIG=/shared/tls python ...``.

and prints the options that ``dask scheduler``, ``dask worker`` and ``dask cuda worker`` take to use them. The
key and certificate are made by distributed's own ``Security.temporary`` (the ones a local cluster of this project
holds in memory), written to files. Certificates from your own CA work too: ``runtime.tls`` reads
``dask.pem`` (CA and certificate, or give the three files in the Dask config instead).
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from pathlib import Path

CERT, KEY, CONFIG = "dask.pem", "dask.key", "dask.yaml"


def plain_address(address: str) -> bool:
    """Whether a Dask address is unencrypted: anything but ``tls://`` (``tcp://``, ``ucx://``, or no scheme, which
    distributed reads as tcp)."""
    return not address.strip().lower().startswith("tls://")


def plain_refusal(what: str = "") -> str:
    """The refusal of a plain scheduler; ``what`` names it where the field's value does not (a scheduler file's
    address)."""
    return (
        f"{what}a plain TCP scheduler: whoever reaches it runs code on its workers; start the cluster with TLS "
        "(python -m rapids_attn.tls FOLDER; docs/deployment.md, 'Several nodes') and give runtime.tls: FOLDER, or "
        "set runtime.plain_tcp: true to join it unencrypted"
    )


def flags(folder: Path) -> str:
    """The TLS options of ``dask scheduler`` / ``dask worker`` / ``dask cuda worker`` for ``folder``'s credentials."""
    folder = Path(folder)
    cert, key = folder / CERT, folder / KEY
    return f"--tls-ca-file {cert} --tls-cert {cert} --tls-key {key}"


def config_text(folder: Path) -> str:
    folder = Path(folder)
    cert, key = folder / CERT, folder / KEY
    roles = "".join(
        f"      {role}:\n        cert: {cert}\n        key: {key}\n" for role in ("scheduler", "worker", "client")
    )
    return (
        "# made by python -m rapids_attn.tls: every connection of the cluster is TLS with this key\n"
        "distributed:\n  comm:\n    require-encryption: true\n    tls:\n"
        f"      ca-file: {cert}\n{roles}"
    )


def _write_private(path: Path, text: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def make(folder: Path, force: bool = False) -> Path:
    """Write a key, its certificate and a Dask config into ``folder`` (made with mode 0700 if new). An existing key
    is kept unless ``force``: replacing it locks out every process that still holds the old one."""
    from distributed.security import Security

    folder = Path(folder).absolute()
    if (folder / KEY).exists() and not force:
        raise FileExistsError(
            f"{folder / KEY} exists: the cluster's processes may be using it; pass --force to replace it"
        )
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    sec = Security.temporary()  # a key and a self-signed certificate, in memory
    for name in (KEY, CERT, CONFIG):
        (folder / name).unlink(missing_ok=True)
    _write_private(folder / KEY, sec.tls_client_key, 0o600)
    _write_private(folder / CERT, sec.tls_ca_file, 0o644)
    _write_private(folder / CONFIG, config_text(folder), 0o600)
    return folder


def problem(folder: Path) -> str | None:
    """Why ``folder`` cannot serve as ``runtime.tls``, or None."""
    folder = Path(folder)
    if not folder.is_dir():
        return f"no such folder: {folder}; make one with python -m rapids_attn.tls {folder}"
    for name in (CERT, KEY):
        if not (folder / name).is_file():
            return f"{folder} has no {name}; make the credentials with python -m rapids_attn.tls {folder}"
    mode = (folder / KEY).stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        return f"{folder / KEY} is readable by others (mode {stat.S_IMODE(mode):o}); chmod 600 it"
    return None


def security(folder: Path):
    """A client's ``distributed.Security`` for ``folder``'s credentials, encryption required."""
    from distributed.security import Security

    folder = Path(folder)
    cert = str(folder / CERT)
    return Security(tls_ca_file=cert, tls_client_cert=cert, tls_client_key=str(folder / KEY), require_encryption=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rapids_attn.tls",
        description="Make the TLS key and certificate a Dask cluster and its jobs share (runtime.tls).",
    )
    parser.add_argument("folder", type=Path, help="where to write dask.key, dask.pem and dask.yaml")
    parser.add_argument("--force", action="store_true", help="replace an existing key")
    args = parser.parse_args(argv)
    try:
        folder = make(args.folder, args.force)
    except (FileExistsError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {folder / KEY} (mode 600), {folder / CERT} and {folder / CONFIG}")
    print(f"scheduler: dask scheduler --protocol tls {flags(folder)} --scheduler-file SCHEDULER_FILE")
    print(f"workers:   dask cuda worker --scheduler-file SCHEDULER_FILE {flags(folder)}   (or dask worker)")
    print(f"jobs:      runtime: {{cluster: scheduler, scheduler_file: SCHEDULER_FILE, tls: {folder}}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
