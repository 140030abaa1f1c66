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
import shutil
from collections.abc import Sequence
from pathlib import Path

from rapids_attn import __version__
from rapids_attn.errors import UserError
from rapids_attn.runlock import LOCK_NAME

MARKER = ".rapids_attn"
TOOL = "rapids_attn"
JOB_YAML = "job.yaml"
#: every name rapids_attn writes at the top of a run directory (the stages write under these)
#: ``models``: the fine-tuned model's folder and the compared models' stores (issue 37)
OUTPUTS = (
    "store.zarr",
    JOB_YAML,
    "summary.json",
    "maps.parquet",
    "head_classes.json",
    "head_classes",
    "report",
    "models",
)
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


def _link_target(p: Path) -> str:
    try:
        return os.readlink(p)
    except OSError:
        return "?"


def _inside(p: Path, folder: Path) -> bool:
    return p == folder or folder in p.parents


def _zarr_store_above(p: Path) -> Path | None:
    """The Zarr store (a folder with zarr.json, .zgroup or .zarray) that holds ``p`` or is ``p``, if any."""
    for q in (p, *p.parents):
        if any((q / m).is_file() for m in ("zarr.json", ".zgroup", ".zarray")):
            return q
    return None


def _cannot_write(where: Path, folder: bool = False) -> str | None:
    """Why a file (with ``folder``: a folder) cannot be made in ``where``: tried for real and removed at once,
    since a permission bit says nothing of root, of /proc or /sys, of a read-only mount; None when it can."""
    import tempfile

    try:
        if folder:
            os.rmdir(tempfile.mkdtemp(prefix=".rapids_attn-probe-", dir=where))
        else:
            fd, name = tempfile.mkstemp(prefix=".rapids_attn-probe-", dir=where)
            os.close(fd)
            os.unlink(name)
    except OSError as e:
        return e.strerror or type(e).__name__
    return None


def check_run_dir_place(run_dir: Path, inputs: dict[str, Path | None] | None = None) -> None:
    """Where the run directory is, checked before anything is written (preflight, so ``--check`` refuses it
    too), changing nothing. Refused, in one line naming output.dir:

    - a symbolic link on its path that points nowhere (the run would fail creating it);
    - a directory this user cannot write (the run directory, or the nearest folder above it that exists), by
      its permissions and then by a real try: a file made and removed at once in the run directory and in each
      folder of ours already there (``store.zarr``, ``report/``, ...), or a folder in the nearest one above
      it (root ignores permission bits; /proc, /sys and read-only mounts do not);
    - a symbolic link in the place of a folder the explain stage writes into (``report/`` and its folders), or
      of the lock or the marker: it would send the run's writes, and removals, into a file or folder it did
      not make;
    - a run directory inside a Zarr store (another run's ``store.zarr``), or equal to or inside an input the
      job reads (``inputs``: field -> path, e.g. data.path and a local model folder), or one whose outputs
      would land on such an input.
    """
    run_dir = Path(run_dir)
    for q in (run_dir, *run_dir.parents):
        if q.is_symlink() and not q.exists():
            raise RunDirError(
                f"output.dir: {q} is a symbolic link to {_link_target(q)}, which does not exist; create its target "
                "or set output.dir (or name) to another directory"
            )
    here = next((q for q in (run_dir, *run_dir.parents) if q.exists()), None)
    if here is not None and here != run_dir and not here.is_dir():
        raise RunDirError(
            f"output.dir: {here} is a file, so {run_dir} cannot be made under it; set output.dir to another directory"
        )
    if here is not None and here.is_dir() and not os.access(here, os.W_OK | os.X_OK):
        raise RunDirError(
            f"output.dir: {here} is not writable by this user{' (read-only)' if here == run_dir else ''}; fix its "
            "permissions or set output.dir to a directory you can write"
        )
    for rel in (*OWN_FOLDERS, LOCK_NAME, MARKER):
        q = run_dir / rel
        if q.is_symlink():
            raise RunDirError(
                f"output.dir: {q} is a symbolic link (to {_link_target(q)}); rapids_attn writes only into files and "
                "folders it made, never through a link: remove the link (its target is kept) or set output.dir to a "
                "new directory"
            )
    for q in [here] if here is not None and here != run_dir else []:
        why = _cannot_write(q, folder=True)
        if why is not None:
            raise RunDirError(
                f"output.dir: {run_dir} cannot be made under {q} ({why}); set output.dir to another directory"
            )
    for rel in ("", *OUTPUTS[:1], *OWN_FOLDERS):  # the run directory and each folder of ours already there
        q = run_dir / rel if rel else run_dir
        if q.is_dir() and not q.is_symlink():
            why = _cannot_write(q)
            if why is not None:
                raise RunDirError(
                    f"output.dir: {q} cannot be written ({why}); fix its permissions or set output.dir to a new directory"
                )
    resolved = run_dir.resolve()
    store = _zarr_store_above(resolved)
    if store is not None:
        raise RunDirError(
            f"output.dir: {run_dir} is inside the Zarr store {store}; set output.dir (or name) to a directory outside it"
        )
    for field, path in (inputs or {}).items():
        if path is None or not Path(path).exists():
            continue
        src = Path(path).resolve()
        if _inside(resolved, src) if src.is_dir() else resolved == src:
            raise RunDirError(
                f"output.dir: {run_dir} is {'' if resolved == src else 'inside '}{field} ({path}), which the job "
                "reads; set output.dir (or name) to a directory outside it"
            )
        hit = next((n for n in OUTPUTS if _inside(src, resolved / n)), None)
        if hit is not None:
            raise RunDirError(
                f"output.dir: {run_dir}/{hit} is where the run writes, and {field} ({path}) is there; move the "
                "input out of the run directory or set output.dir to another directory"
            )


def _empty_dir(p: Path) -> bool:
    try:
        return p.is_dir() and not p.is_symlink() and not any(os.scandir(p))
    except OSError:
        return False


#: what the explain stage writes from the store: it describes the store as it was when explain last ran
EXPLAIN_OUTPUTS = ("summary.json", "maps.parquet", "head_classes.json", "head_classes", "report")
#: the head-class exports' manifest (rapids_attn.kvheads.export): a head_classes/ folder holding it was written
#: whole by rapids_attn, and is removed whole
EXPORTS_MANIFEST = "exports.json"


REPORT = "report"
#: the files the explain stage writes under ``report/``, by folder (relative to it) and name pattern; nothing
#: else there is rapids_attn's (kept in step with explain.report, explain.headview and explain.explorer, and
#: checked by tests/unit/test_rundir.py against a full run's report)
REPORT_FILES: dict[str, re.Pattern] = {
    ".": re.compile(
        r"^(index\.html|explorer\.html|explorer\.html\.part|index\.html\.tmp"
        r"|(scatter_(cluster|layer)|dominant_grid|k_sweep|detectors|head_importance|pruning|relevance_shares"
        r"|head_atlas|(occupancy|montage)_\d+)\.png)$"
    ),
    "headviews": re.compile(r"^cluster-?\d+_ex\d+\.html(\.tmp)?$"),
    "headviews/vendor": re.compile(r"^(require\.js|d3\.min\.js|jquery\.min\.js|LICENSES\.txt)(\.tmp)?$"),
}
#: the folders rapids_attn makes under a run directory, where a symbolic link would send its writes (and its
#: removals of stale pages) into a folder it did not make. ``store.zarr`` is not among them: a store linked to
#: another disk is used through the link when it is this job's store, and never deleted through it
#: (:mod:`rapids_attn.store.zarr_store`); a link to anything else is refused as another job's store.
OWN_FOLDERS = (REPORT, f"{REPORT}/headviews", f"{REPORT}/headviews/vendor", "models")


#: ``report/<this>``: the files the explain stage last wrote there (a JSON list of paths relative to ``report/``)
REPORT_MANIFEST = ".rapids_attn-files.json"


def read_report_manifest(report: Path) -> set[str] | None:
    """The files the last explain stage wrote under ``report`` by its manifest; None when there is none (a report
    of a version before it) or it is not ours. Only paths of rapids_attn's own names count, whatever it says."""
    try:
        names = json.loads((Path(report) / REPORT_MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(names, list):
        return None
    return {n for n in names if isinstance(n, str) and _own_report_name(n)}


def _own_report_name(rel: str) -> bool:
    """A path relative to ``report/`` that the explain stage may write: one of its names, in one of its folders."""
    folder, _, name = rel.rpartition("/")
    pattern = REPORT_FILES.get(folder or ".")
    return pattern is not None and ".." not in rel.split("/") and pattern.match(name) is not None


def write_report_manifest(report: Path, written: set[str]) -> None:
    """Record what this explain stage wrote under ``report`` (atomically): what a later run may replace or remove."""
    tmp = Path(report) / (REPORT_MANIFEST + ".tmp")
    tmp.write_text(json.dumps(sorted(written), indent=1) + "\n")
    tmp.replace(Path(report) / REPORT_MANIFEST)


def own_report_files(report: Path) -> set[str]:
    """What of ``report``'s files rapids_attn may replace or remove (paths relative to it): those its manifest
    lists (what the last explain stage wrote: a user's ``montage_99.png`` beside them is not among them) or,
    for a report of a version before the manifest, every file of its own names."""
    listed = read_report_manifest(report)
    if listed is not None:
        return {rel for rel in listed if (Path(report) / rel).is_file() or (Path(report) / rel).is_symlink()}
    return {str(p.relative_to(report)) for p in _own_report_files(report)}


def _own_report_files(report: Path) -> list[Path]:
    """The files under ``report`` of the explain stage's names (by pattern), deepest folder first."""
    out = []
    for sub in sorted(REPORT_FILES, key=len, reverse=True):
        folder = report if sub == "." else report / sub
        if folder.is_symlink() or not folder.is_dir():
            continue
        out += sorted(p for p in folder.iterdir() if REPORT_FILES[sub].match(p.name) and not p.is_dir())
    return out


def remove_stale_outputs(run_dir: Path, stages: Sequence) -> list[str]:
    """Before a run that changes the store (a stage that provides arrays: extract, learn, heads, relevance, ...)
    without explaining it again (``stages``: the run's stages, objects or classes with a ``name`` and the
    ``provides`` of :class:`rapids_attn.stage.Stage`; explain writes to the store too, and these outputs anew),
    remove the explain stage's earlier outputs from a marked run directory: they describe the store as it
    was, and a reader would take them for this run's. Only the files rapids_attn wrote, by name, in a
    directory it marked: never a folder as a whole, never through a symbolic link (a link in the place of an
    output is removed itself, its target kept): under ``report/`` what its manifest says the last explain stage
    wrote (:func:`own_report_files`), so a user's file there stays, with the folders that hold it, and the
    manifest, then empty, stays with them (a file of theirs named as ours is never taken for ours later).
    Called only once every check of the run has passed (preflight, then the lock). Returns the names removed."""
    run_dir = Path(run_dir)
    names = {st.name for st in stages}
    if "explain" in names or not any(st.provides for st in stages) or read_marker(run_dir) is None:
        return []
    removed = []
    for name in EXPLAIN_OUTPUTS:
        p = run_dir / name
        if p.is_symlink() or p.is_file():
            p.unlink()
        elif p.is_dir() and name == "head_classes":
            if (p / EXPORTS_MANIFEST).is_file():
                shutil.rmtree(p)
            else:
                continue
        elif p.is_dir():
            files = sorted(own_report_files(p)) if name == REPORT else []
            if not files:
                continue
            for rel in files:
                (p / rel).unlink()
            for sub in sorted(REPORT_FILES, key=len, reverse=True):  # the folders left empty, deepest first
                folder = p if sub == "." else p / sub
                left = {e.name for e in os.scandir(folder)} if folder.is_dir() and not folder.is_symlink() else None
                if sub == "." and left == {REPORT_MANIFEST}:
                    (p / REPORT_MANIFEST).unlink()
                    left = set()
                if left == set():
                    folder.rmdir()
            if p.is_dir():  # a user's files stay: the manifest now lists nothing of ours (none of theirs is)
                write_report_manifest(p, set())
        else:
            continue
        removed.append(name)
    return removed


# -- how the outputs a user shares name paths (issue 47) ----------------------------------------------------------
#
# summary.json, head_classes.json, the report folder and correctness.json are made to be passed around; an absolute
# path there names the user's home folder and the machine's layout. They name a path inside the run directory
# relative to it, and a file or folder elsewhere (the data file, a model folder) by its name alone: the absolute
# path would mean nothing on the reader's machine, and the data's fingerprint (summary.json's data.fingerprint) says
# which file it was. What later runs read back keeps the absolute path: the store's attributes (the compared
# stores, the fine-tuned folder), each fine-tuned folder's metrics.json (made_from), job.yaml.


def shared_path(path, run_dir: Path) -> str | None:
    """``path`` as an output a user shares names it: relative to ``run_dir`` where it lies inside it ("." for the run
    directory itself), else its name alone where it is absolute; a relative path (as the user wrote it), a hub id
    or a preset name as it is. None stays None."""
    if path is None:
        return None
    text = str(path)
    p = Path(text).expanduser()
    if not p.is_absolute():
        return text
    run_dir = Path(run_dir)
    for base, q in ((run_dir.absolute(), p), (run_dir.resolve(), p.resolve())):  # as written, then through links
        try:
            return q.relative_to(base).as_posix()
        except ValueError:
            continue
    return p.name or text


def shared_paths(obj, run_dir: Path):
    """A copy of ``obj`` (a summary: dicts, lists, strings, numbers) with every string that is an absolute path
    through :func:`shared_path`."""
    if isinstance(obj, dict):
        return {k: shared_paths(v, run_dir) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [shared_paths(v, run_dir) for v in obj]
    if isinstance(obj, str) and obj.startswith(("/", "~")) and "\n" not in obj:
        return shared_path(obj, run_dir)
    return obj


def shared_model(meta: dict, run_dir: Path) -> dict:
    """The store's model description (name, source, type, ...) as the shared outputs show it: the name through
    :func:`shared_path`; the source (the folder it was loaded from) too where the name is a local folder, else the
    name (a preset's source is a folder inside the installed package; a hub id's is the id)."""
    out = dict(meta)
    name = meta.get("name")
    out["name"] = shared_path(name, run_dir)
    local = name is None or Path(str(name)).expanduser().is_absolute()
    out["source"] = shared_path(meta.get("source"), run_dir) if local else out["name"]
    return out
