"""Create, reuse and write the Zarr v3 store (layout in :mod:`rapids_attn.store`)."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import zarr

from rapids_attn import __version__
from rapids_attn.errors import StoreError
from rapids_attn.extract.signature import DETECTOR_NAMES, PROFILE_OFFSETS
from rapids_attn.store import schema as S
from rapids_attn.store.schema import Attr, complete_attr, read_strings

#: the value of the created_by attribute: marks a store (even an interrupted one) as rapids_attn's own
CREATOR = "rapids_attn"

__all__ = [
    "StoreLayout",
    "check_consistent",
    "complete_attr",
    "consolidate",
    "create_store",
    "decode_thumbnails",
    "done_shards",
    "encode_thumbnails",
    "inspect_store",
    "layout_arrays",
    "mark_complete",
    "open_for_job",
    "read_strings",
    "write_shard",
]


@dataclass(frozen=True)
class StoreLayout:
    """Everything that fixes the arrays' shapes."""

    n_examples: int
    layers: list[int]
    heads: list[int]
    feature_dim: int
    image_size: int
    thumb_size: int
    shard_size: int
    stat_names: list[str]
    features_dtype: str = "float16"
    compression_level: int = 3
    profile_offsets: list[int] = field(default_factory=lambda: list(PROFILE_OFFSETS))
    detector_names: list[str] = field(default_factory=lambda: list(DETECTOR_NAMES))
    #: extra per-map outputs of the embedder (name -> dtype), e.g. pattern and pattern_prob.
    embed_outputs: dict[str, str] = field(default_factory=dict)
    #: attributes the embedder records (e.g. pattern_classes).
    embed_attrs: dict = field(default_factory=dict)

    @property
    def n_shards(self) -> int:
        return -(-self.n_examples // self.shard_size)

    def shard_rows(self, shard: int) -> tuple[int, int]:
        start = shard * self.shard_size
        return start, min(start + self.shard_size, self.n_examples)


def encode_thumbnails(x: np.ndarray) -> np.ndarray:
    """Attention values in [0, 1] -> uint8 on a square-root scale, q = round(255 sqrt(v)).

    Thumbnails are for figures. A square-root code keeps the small values that attention maps are
    full of (a uniform row over 150 tokens, v = 0.0067, is q = 21, not 2) at a quarter of float32's
    bytes; decoding is v = (q / 255)^2 (an error of at most about 0.008 sqrt(v))."""
    return np.rint(np.sqrt(np.clip(x, 0.0, 1.0)) * 255.0).astype(np.uint8)


def decode_thumbnails(q: np.ndarray) -> np.ndarray:
    q = np.asarray(q)
    if q.dtype != np.uint8:  # stores written before the code: float values as they are
        return q.astype(np.float32)
    return (q.astype(np.float32) / 255.0) ** 2


def layout_arrays(layout: StoreLayout) -> list[tuple[S.ArraySpec, tuple[int, ...], tuple[int, ...], str | None]]:
    """Every array a store of this layout holds from its creation: (spec, shape, chunks, dtype or None for
    the schema's). :func:`create_store` makes exactly these, and :func:`check_consistent` looks for them."""
    ex, nl, nh, rows = layout.n_examples, len(layout.layers), len(layout.heads), layout.shard_size

    def per_map(spec, tail, dtype=None):
        return (spec, (ex, nl, nh, *tail), (rows, nl, nh, *tail), dtype)

    out = [per_map(S.FEATURES, (layout.feature_dim,), layout.features_dtype)]
    if layout.thumb_size:
        out.append(per_map(S.THUMBNAILS, (layout.thumb_size, layout.thumb_size)))
    out += [
        per_map(S.STATS, (len(layout.stat_names),)),
        per_map(S.DETECTORS, (len(layout.detector_names),)),
        per_map(S.PROFILE, (len(layout.profile_offsets),)),
        *(per_map(S.ARRAYS[name], ()) for name in layout.embed_outputs),
    ]
    out += [(spec, (ex,), (rows,), None) for spec in _PER_EXAMPLE]
    out.append((S.SHARDS_DONE, (layout.n_shards,), (1,), None))
    out += [(spec, (len(v),), (len(v),), None) for spec, v in _coord_values(layout).items()]
    return out


def _coord_values(layout: StoreLayout) -> dict:
    values = (layout.layers, layout.heads, layout.stat_names, layout.detector_names, layout.profile_offsets)
    return dict(zip(_COORDS, values, strict=True))


_PER_EXAMPLE = (S.SEQ_LEN, S.TRUNCATED, S.EXAMPLE_ID, S.EXAMPLE_GROUP, S.EXAMPLE_LABEL)
_COORDS = (S.LAYER, S.HEAD, S.STAT, S.DETECTOR, S.OFFSET)


def create_store(
    path: Path,
    layout: StoreLayout,
    job: dict,
    key: str,
    meta: dict,
    ids: list[str] | None = None,
    groups: list[str] | None = None,
    labels: list[str] | None = None,
    data_content: str | None = None,
) -> zarr.Group:
    """Create a fresh store at ``path``, which must be absent or an empty folder (the caller decides,
    through :func:`open_for_job`, what may be replaced). The package's marker attributes are written
    first and the job attributes last: a store with the first and without the last is known to be an
    interrupted creation of ours, and is recreated rather than reused.

    ``example_id``, ``example_group`` and ``example_label`` are chunked by shard like ``seq_len``: the
    extract stage's workers write their own rows of them (:func:`write_shard`), so the driver never
    holds them. ``ids``, ``groups`` and ``labels``, when given, are written here instead (planted
    stores in tests and tools). ``data_content``: the dataset's content hash, kept so that a later job refused
    this store can be told whether the file changed (:func:`foreign_store_error`)."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise StoreError(f"{path}: exists and is not empty; refusing to write a store over it")
    marks = {Attr.CREATED_BY: CREATOR, Attr.FORMAT_VERSION: S.FORMAT_VERSION, Attr.VERSION: __version__}
    g = zarr.open_group(str(path), mode="w", zarr_format=3, attributes=marks)  # zarr.json is born with them
    given = {S.EXAMPLE_ID: ids, S.EXAMPLE_GROUP: groups, S.EXAMPLE_LABEL: labels, **_coord_values(layout)}
    for spec, shape, chunks, dtype in layout_arrays(layout):
        level = layout.compression_level if spec.dims[:3] == S.MAP_DIMS else 0
        if spec in _COORDS:
            chunks = None  # one chunk, as the schema makes it
        a = S.create_array(g, spec, shape, chunks=chunks, dtype=dtype, compression_level=level, data=given.get(spec))
        if spec == S.THUMBNAILS:
            a.attrs[Attr.ENCODING] = "sqrt-uint8"
    g.attrs.update(
        {
            Attr.LAYOUT: asdict(layout),
            Attr.MODEL: meta,
            complete_attr("extract"): False,
            complete_attr("learn"): False,
            **layout.embed_attrs,
        }
    )
    g.attrs[Attr.JOB] = job
    if data_content is not None:
        g.attrs[Attr.DATA_CONTENT] = data_content
    g.attrs[Attr.EXTRACTION_KEY] = key  # last: its presence marks a complete creation
    return g


def _unreadable(path: Path, e: BaseException) -> StoreError:
    what = type(e).__name__
    detail = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
    return StoreError(
        f"{path}: cannot read the store ({what}{': ' + detail if detail else ''}); nothing was changed. "
        "Fix its permissions or files, or set output.dir to a new run directory"
    )


def inspect_store(path: Path, key: str, layout: StoreLayout) -> str:
    """What is at ``path``, without changing it: "absent" (nothing, or an empty folder), "partial"
    (an interrupted creation of ours: no shard in it was ever marked done), "same" (this job's
    store) or "different" (another job's). Anything else is an error that names it and deletes
    nothing: a store that cannot be read (permissions, a corrupt ``zarr.json``, a newer format), or a
    folder that is not a rapids_attn store."""
    try:
        if not path.exists():
            return "absent"
        if path.is_dir() and not any(path.iterdir()):
            return "absent"
    except OSError as e:
        raise _unreadable(path, e) from None
    if not (path / "zarr.json").is_file():
        raise StoreError(
            f"{path}: exists but is not a Zarr store made by rapids_attn; move it away or set output.dir "
            "to a new run directory (nothing was changed)"
        )
    try:
        g = zarr.open_group(str(path), mode="r")
        attrs = dict(g.attrs)
    except Exception as e:  # noqa: BLE001 - permissions, corrupt JSON, an unknown zarr format: say so, never delete
        raise _unreadable(path, e) from None
    old_key = attrs.get(Attr.EXTRACTION_KEY)
    ours = attrs.get(Attr.CREATED_BY) == CREATOR if old_key is None else Attr.VERSION in attrs
    if not ours:
        raise StoreError(
            f"{path}: is a Zarr store, but not one made by rapids_attn; move it away or set output.dir "
            "to a new run directory (nothing was changed)"
        )
    if old_key is None:
        return "partial"
    return "same" if old_key == key and attrs.get(Attr.LAYOUT) == asdict(layout) else "different"


def stored_key_and_layout(path: Path) -> tuple[str, dict] | None:
    """An existing, complete store's extraction key and layout (as its attributes hold them), or None where
    there is none or it cannot be read (:func:`inspect_store` says why, later)."""
    try:
        if not (path / "zarr.json").is_file():
            return None
        attrs = dict(zarr.open_group(str(path), mode="r").attrs)
    except Exception:  # noqa: BLE001 - unreadable: inspect_store refuses it with the reason
        return None
    key, layout = attrs.get(Attr.EXTRACTION_KEY), attrs.get(Attr.LAYOUT)
    return (key, layout) if isinstance(key, str) and isinstance(layout, dict) else None


#: changed settings a foreign store's line names (then "and N more")
NAMED_CHANGES = 4

_ABSENT = object()


def _leaves(value, prefix: str = "") -> dict:
    """A nested settings dict as {"data.label_field": value, ...}."""
    if not isinstance(value, dict) or not value:
        return {prefix: value}
    out = {}
    for k, v in value.items():
        out.update(_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _as_json(value) -> str:
    return "absent" if value is _ABSENT else json.dumps(value, sort_keys=True)


def _changed(theirs: dict, ours: dict, prefix: str = "") -> list[str]:
    """``<prefix><field> <was> -> <now>`` for each field whose value differs (as JSON writes them: a stored tuple
    reads back as a list), in this job's order of fields, then the ones only the store has."""
    from rapids_attn.job import clip

    names = list(ours) + [k for k in theirs if k not in ours]
    return [
        f"{prefix}{k} {clip(_as_json(theirs.get(k, _ABSENT)), 60)} -> {clip(_as_json(ours.get(k, _ABSENT)), 60)}"
        for k in names
        if _as_json(theirs.get(k, _ABSENT)) != _as_json(ours.get(k, _ABSENT))
    ]


def store_changes(path: Path, job: dict, layout: StoreLayout, data_content: str | None) -> list[str]:
    """What differs between what the store at ``path`` was made with (its ``job``, ``layout`` and ``data_content``
    attributes) and this job's ``job``, ``layout`` and ``data_content``, as the store's key sees the settings
    (:func:`rapids_attn.job.extraction_settings`): one entry per changed field (``data.label_field null ->
    "answerable"``), the data file where its content hash differs, and the layout's fields where no setting does
    (another number of examples, another model's layers). Empty where the store's attributes cannot be read."""
    from rapids_attn.job import extraction_settings

    try:
        attrs = dict(zarr.open_group(str(path), mode="r").attrs)
        their_job, their_layout = attrs.get(Attr.JOB), attrs.get(Attr.LAYOUT)
        if not isinstance(their_job, dict) or not isinstance(their_layout, dict):
            return []
        theirs = extraction_settings(their_job, shard_size=their_layout.get("shard_size"))
        ours = extraction_settings(job, shard_size=layout.shard_size)
    except Exception:  # noqa: BLE001 - attributes that cannot be read: the line says what can change instead
        return []
    changes = _changed(_leaves(theirs), _leaves(ours))
    their_content = attrs.get(Attr.DATA_CONTENT)
    if data_content is not None and isinstance(their_content, str) and their_content != data_content:
        changes.append("the dataset's content (the file data.path names)")
    if not changes:
        changes = _changed(their_layout, asdict(layout), "the store's ")
    return changes


def foreign_store_error(
    path: Path, job: dict | None = None, layout: StoreLayout | None = None, data_content: str | None = None
) -> StoreError:
    """The store at ``path`` is another job's: one line that names what changed since it was made (with this job's
    ``job`` dict, ``layout`` and ``data_content``; without them, or where nothing is found, the kinds of change that
    make a store another job's)."""
    changes = store_changes(path, job, layout, data_content) if job is not None and layout is not None else []
    if changes:
        more = len(changes) - NAMED_CHANGES
        what = ", ".join(changes[:NAMED_CHANGES]) + (f" and {more} more" if more > 0 else "")
        why = f"changed since it was made: {what}"
    else:
        why = "the dataset's content, or the data, model, extract, embed or store settings changed"
    return StoreError(
        f"{path}: holds the store of a different job ({why}); "
        "rerun with --overwrite to replace it (its maps are extracted again), or set output.dir to a new run directory"
    )


def store_action(
    path: Path,
    key: str,
    layout: StoreLayout,
    overwrite: bool,
    job: dict | None = None,
    data_content: str | None = None,
) -> str:
    """What the extract stage will do with ``path``, decided without changing anything: "create"
    (nothing there), "reuse" (this job's store: resume it) or "replace" (an interrupted creation of
    ours, or any store of ours under ``overwrite``). A store from another job without ``overwrite``,
    a store that cannot be read, a folder that is not ours, and a replacement through a symbolic
    link are errors. Preflight calls it, so these fail before any worker starts. ``job`` (this job's dict) and
    ``data_content`` (its dataset's content hash) let the refusal of another job's store name what changed."""
    state = inspect_store(path, key, layout)
    if state == "absent":
        return "create"
    if state == "different" and not overwrite:
        raise foreign_store_error(path, job, layout, data_content)
    if state == "same" and not overwrite:
        check_consistent(path, layout)  # a crash or two runs at once can leave arrays missing
        return "reuse"
    if path.is_symlink():
        raise StoreError(
            f"{path}: is a symbolic link, and replacing the store would delete through it; remove the link or "
            "set output.dir to a new run directory (nothing was changed)"
        )
    return "replace"


def open_for_job(path: Path, key: str, layout: StoreLayout, overwrite: bool) -> zarr.Group | None:
    """The existing store if the same job and layout made it; None when a new one must be created
    (after removing what :func:`store_action` says may be replaced: only ever a store of ours)."""
    action = store_action(path, key, layout, overwrite)
    if action == "reuse":
        return zarr.open_group(str(path), mode="r+")
    if action == "replace":
        shutil.rmtree(path)
    return None


def check_consistent(path: Path, layout: StoreLayout, stages: tuple[str, ...] = ()) -> None:
    """Before a store of this job is reused: every array its layout declares is there with its shape, and
    so is every array of each stage in ``stages`` whose completion flag is set. A crash, or two runs on one
    store, can leave a ``zarr.json`` whose arrays are missing; that is reported here in one line with the
    fix, never as a KeyError in a stage. Reads the arrays' own metadata on disk, not the consolidated
    copy, which can still list an array that is gone."""
    try:
        g = zarr.open_group(str(path), mode="r", use_consolidated=False)
        attrs = dict(g.attrs)
    except Exception as e:  # noqa: BLE001 - whatever zarr raises, say it in one line and change nothing
        raise _unreadable(path, e) from None
    fix = "rerun with --overwrite (and the extract stage) to recreate it"
    expected = [(spec, shape, fix) for spec, shape, _, _ in layout_arrays(layout)]
    sizes = {"example": layout.n_examples, "layer": len(layout.layers), "head": len(layout.heads), "xy": 2}
    for stage in stages:
        if stage != "extract" and attrs.get(complete_attr(stage)):
            again = f"rerun with --stages {stage} to write them again"
            expected += [(spec, tuple(sizes.get(d) for d in spec.dims), again) for spec in S.arrays_of(stage)]
    for spec, shape, how in expected:
        try:
            found = tuple(g[spec].shape)
        except KeyError:
            problem = f"array '{spec}' is missing"
        except Exception as e:  # noqa: BLE001 - a damaged array's metadata
            problem = f"array '{spec}' cannot be read ({type(e).__name__})"
        else:
            if len(found) == len(shape) and all(w is None or w == f for w, f in zip(shape, found, strict=True)):
                continue
            want = tuple("*" if w is None else w for w in shape)
            problem = f"array '{spec}' has shape {found}, not {want}".replace("'*'", "*")
        raise StoreError(
            f"{path}: the store is inconsistent ({problem}), as a crash or two runs at once can leave it; "
            f"{how} (nothing was changed)"
        )


def done_shards(g: zarr.Group) -> np.ndarray:
    try:
        return np.asarray(g[S.SHARDS_DONE][:], dtype=bool)
    except KeyError:
        where = getattr(g.store, "root", g.store)
        raise StoreError(
            f"{where}: the store is inconsistent (array '{S.SHARDS_DONE}' is missing); rerun with --overwrite "
            "to recreate it"
        ) from None


def write_shard(path: str, layout: StoreLayout, shard: int, arrays: dict[str, np.ndarray]) -> None:
    """Write one shard's rows (exactly one chunk of every example-major array), then mark it done.

    Called on workers; rows of different shards live in different chunk files, so no lock is needed.
    A store created before the workers wrote the example metadata holds ``example_id`` (group, label)
    whole, written at creation, in one chunk: those rows are already there and are left alone (several
    workers writing one chunk would race).
    """
    g = zarr.open_group(path, mode="r+")
    start, stop = layout.shard_rows(shard)
    for name, value in arrays.items():
        if value.shape[0] != stop - start:
            raise ValueError(f"shard {shard}: {name} has {value.shape[0]} rows, expected {stop - start}")
        array = g[name]
        if name in _METADATA and array.chunks[0] != layout.shard_size:
            continue
        array[start:stop] = value
    g[S.SHARDS_DONE][shard] = True


#: example metadata the workers write; created whole by the driver in stores made before that
_METADATA = (S.EXAMPLE_ID, S.EXAMPLE_GROUP, S.EXAMPLE_LABEL)


def mark_complete(g: zarr.Group, stage: str, complete: bool, info: dict | None = None) -> None:
    """Set (or clear, before a stage rewrites its arrays) a stage's completion flag; ``info`` is the
    stage's result, kept as the attribute named after the stage (e.g. ``learn``)."""
    if info is not None:
        g.attrs[stage] = info
    g.attrs[complete_attr(stage)] = bool(complete)


def consolidate(path: Path) -> None:
    """Consolidated metadata lets xarray open the store with one read."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata")
        zarr.consolidate_metadata(str(path))
