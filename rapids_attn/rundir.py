"""The run directory is rapids_attn's only where it says so: a marker, and a fixed list of own outputs.

rapids_attn writes a fixed set of names at the top of a run directory (:data:`OUTPUTS`, with their
temporaries and bookkeeping in :data:`OWN_NAMES`) and nothing else. A directory it has used carries
the marker ``<run dir>/.rapids_attn`` (a small JSON file: the tool, its version, the outputs); it is
distinct from the run lock ``.rapids_attn.lock`` (:mod:`rapids_attn.runlock`), which any run,
including one that dies before marking, may leave behind.

:func:`check_run_dir` (preflight, so ``--check`` refuses what the run would) decides, changing nothing:

- absent, empty (or holding only the lock file), or marked: the run may write its outputs;
- unmarked but holding a store made by rapids_attn (a run directory of a version before the marker):
  ours, and marked at the run's start, so existing run directories keep working;
- unmarked with other files: refused, unless ``--overwrite``; and even then refused when one of the
  names rapids_attn writes is already there (a user's own ``job.yaml``, ``report/``, ...), unless
  that file is byte-for-byte what this run would write. The user's own files are never replaced.

:func:`mark_run_dir` writes the marker once the run holds the lock, before any other output.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from rapids_attn import __version__
from rapids_attn.errors import UserError
from rapids_attn.runlock import LOCK_NAME

MARKER = ".rapids_attn"
TOOL = "rapids_attn"
JOB_YAML = "job.yaml"
#: every name rapids_attn writes at the top of a run directory (the stages write under these)
OUTPUTS = ("store.zarr", JOB_YAML, "summary.json", "maps.parquet", "head_classes.json", "report")
#: the outputs, their temporaries (written, then renamed into place), the marker and the lock
OWN_NAMES = frozenset({*OUTPUTS, *(n + ".tmp" for n in OUTPUTS), MARKER, MARKER + ".tmp", LOCK_NAME})


class RunDirError(UserError):
    """The run directory holds files rapids_attn did not make, where it would write."""


def read_marker(run_dir: Path) -> dict | None:
    """The marker's contents, or None when there is none or it is not ours (a user file of that name)."""
    try:
        data = json.loads((Path(run_dir) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("tool") == TOOL else None


def mark_run_dir(run_dir: Path) -> None:
    """Write the marker (atomically) unless it is already there."""
    run_dir = Path(run_dir)
    if read_marker(run_dir) is not None:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / (MARKER + ".tmp")
    body = {"tool": TOOL, "version": __version__, "outputs": list(OUTPUTS)}
    tmp.write_text(json.dumps(body, indent=2) + "\n")
    tmp.replace(run_dir / MARKER)


def _is_lock_file(p: Path) -> bool:
    """The run lock holds a pid or nothing; a user's file of that name holds something else."""
    try:
        return p.is_file() and not p.is_symlink() and re.fullmatch(r"\d*\s*", p.read_text()) is not None
    except (OSError, UnicodeDecodeError):
        return False


def _same_job(p: Path, job: dict) -> bool:
    """``job.yaml`` holding exactly the resolved job this run writes: replacing it changes nothing."""
    import yaml

    try:
        return p.is_file() and not p.is_symlink() and yaml.safe_load(p.read_text()) == job
    except (OSError, ValueError, yaml.YAMLError):
        return False


def check_run_dir(run_dir: Path, job: dict, overwrite: bool, store_is_ours) -> str:
    """What the run directory is, without changing it: "new" (absent or empty), "marked", "legacy" (an
    unmarked directory holding a rapids_attn store) or "adopted" (unmarked, other files, ``--overwrite``
    and none of them in the way). Anything else raises :class:`RunDirError`.

    ``store_is_ours()`` says whether ``store.zarr`` there is a rapids_attn store; it raises its own
    one-line error for a store that cannot be read or is not ours."""
    run_dir = Path(run_dir)
    try:
        if not run_dir.exists():
            return "new"
        if not run_dir.is_dir():
            raise RunDirError(
                f"output.dir: {run_dir} is a file, not a directory; set output.dir (or name) to a new directory"
            )
        if read_marker(run_dir) is not None:
            return "marked"
        entries = sorted(p for p in run_dir.iterdir() if not (p.name == LOCK_NAME and _is_lock_file(p)))
    except OSError as e:
        raise RunDirError(
            f"output.dir: {run_dir} cannot be read ({type(e).__name__}: {e.strerror or e}); fix its permissions "
            "or set output.dir to another directory"
        ) from None
    if not entries:
        return "new"
    if (run_dir / OUTPUTS[0]).exists() and store_is_ours():
        return "legacy"  # made by a version of rapids_attn before the marker
    if not overwrite:
        shown = ", ".join(p.name for p in entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise RunDirError(
            f"output.dir: {run_dir} is not empty and was not made by rapids_attn (it holds {shown}); set output.dir "
            "or name to a new directory, or rerun with --overwrite to write rapids_attn's outputs beside those "
            "files (they are kept)"
        )
    in_the_way = [
        p.name
        for p in entries
        if p.name in OWN_NAMES
        and not (p.name == OUTPUTS[0] and _empty_dir(p))
        and not (p.name == JOB_YAML and _same_job(p, job))
    ]
    if in_the_way:
        raise RunDirError(
            f"output.dir: {run_dir} holds {', '.join(in_the_way)}, not made by rapids_attn, where rapids_attn "
            "writes its outputs; nothing was changed, even with --overwrite: move them away, or set output.dir "
            "or name to a new directory"
        )
    return "adopted"


def _empty_dir(p: Path) -> bool:
    try:
        return p.is_dir() and not p.is_symlink() and not any(os.scandir(p))
    except OSError:
        return False


#: what the explain stage writes from the store: it describes the store as it was when explain last ran
EXPLAIN_OUTPUTS = ("summary.json", "maps.parquet", "head_classes.json", "report")


def remove_stale_outputs(run_dir: Path, stages: tuple[str, ...]) -> list[str]:
    """Before a run that changes the store (extract, learn or heads) without explaining it again, remove the explain
    stage's earlier outputs from a marked run directory: they describe the store as it was, and a reader
    would take them for this run's. Only rapids_attn's own names, only in a directory it marked. Returns
    the names removed."""
    import shutil

    run_dir = Path(run_dir)
    if "explain" in stages or not {"extract", "learn", "heads"} & set(stages) or read_marker(run_dir) is None:
        return []
    removed = []
    for name in EXPLAIN_OUTPUTS:
        p = run_dir / name
        if p.is_symlink() or p.is_file():
            p.unlink()
        elif p.is_dir():
            shutil.rmtree(p)
        else:
            continue
        removed.append(name)
    return removed
