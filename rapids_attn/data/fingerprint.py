"""The dataset's content fingerprint: part of the extraction key, so an edited file is a different store.

The store's reuse check compares the job's settings; settings alone cannot tell that the file at
``data.path`` was edited since the store was made. :func:`content_fingerprint` hashes the bytes the
job reads (a file, or every file of a saved Hugging Face dataset folder with its relative path), so
a changed dataset changes the key: it is refused without ``--overwrite`` and never mixed into a
resume. It is a second sequential read of the input (SHA-256, hundreds of MB/s on one core, and the
page cache usually still holds the file from the indexing pass).

Each data format names its rule in :data:`rapids_attn.data.formats.REGISTRY`: :func:`file_fingerprint` (a file's
bytes) or :func:`folder_fingerprint` (a folder's files). A rule never changes once stores were made with it:
old stores would stop matching their unchanged data.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from rapids_attn.errors import DataError


def _update(h, path: Path) -> None:
    with open(path, "rb") as f:  # one file's digest, read in 256 KiB blocks into one reused buffer
        h.update(hashlib.file_digest(f, "sha256").digest())


def stamp(path: Path) -> tuple:
    """What changes when a file or folder is edited: (relative path, size, mtime ns) of every file."""
    if not path.is_dir():
        st = os.stat(path)
        return ((".", st.st_size, st.st_mtime_ns),)
    out = []
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        st = f.stat()
        out.append((f.relative_to(path).as_posix(), st.st_size, st.st_mtime_ns))
    return tuple(out)


def content_fingerprint(path: str | os.PathLike[str]) -> str:
    """SHA-256 (hex, 16 characters) of the content at ``path``: a folder's by :func:`folder_fingerprint`, a
    file's by :func:`file_fingerprint` (each format names its rule: :mod:`rapids_attn.data.formats`)."""
    path = Path(path)
    return folder_fingerprint(path) if path.is_dir() else file_fingerprint(path)


def file_fingerprint(path: str | os.PathLike[str]) -> str:
    """SHA-256 (hex, 16 characters) of a file: of the SHA-256 digest of its bytes."""
    return _fingerprint(Path(path), lambda h, path, before: _update(h, path))


def folder_fingerprint(path: str | os.PathLike[str]) -> str:
    """SHA-256 (hex, 16 characters) of a folder's files: each one's relative path and length, then the SHA-256
    digest of its bytes, in sorted order (so a rename or a split boundary also counts)."""

    def files(h, path: Path, before: tuple) -> None:
        for rel, size, _ in before:
            h.update(f"{rel}\0{size}\0".encode())
            _update(h, path / rel)

    return _fingerprint(Path(path), files)


def _fingerprint(path: Path, rule) -> str:
    """``rule(h, path, stamp)`` fed into one SHA-256, refused when the content changed while it was read."""
    h = hashlib.sha256()
    before = stamp(path)
    try:
        rule(h, path, before)
    except PermissionError as e:
        raise DataError(f"data.path: cannot read {path} ({e.strerror}); fix its permissions") from None
    if stamp(path) != before:
        raise changed_while_reading(path)
    return h.hexdigest()[:16]


def changed_while_reading(path) -> DataError:
    return DataError(
        f"data.path: {path} changed while the job was reading it; leave the data unchanged while a job runs, "
        "then rerun it"
    )
