"""Create, reuse and write the Zarr v3 store (layout in :mod:`rapids_attn.store`)."""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import ZstdCodec

from rapids_attn import __version__
from rapids_attn.errors import StoreError

FORMAT_VERSION = 1


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
    profile_offsets: list[int] = field(default_factory=lambda: list(range(-4, 5)))
    detector_names: list[str] = field(default_factory=lambda: ["dup", "induction"])
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


def _compressors(level: int):
    # Plain zstd rather than Blosc: zarr's GPU work (nvCOMP codecs under zarr.config.enable_gpu)
    # targets zstd, so the GPU learn stage can decode on the device where that codec is available.
    return None if level == 0 else ZstdCodec(level=level)


def _map_array(g, name, layout: StoreLayout, tail: tuple[int, ...], tail_dims: tuple[str, ...], dtype, fill=0):
    nl, nh = len(layout.layers), len(layout.heads)
    return g.create_array(
        name,
        shape=(layout.n_examples, nl, nh, *tail),
        chunks=(layout.shard_size, nl, nh, *tail),
        dtype=dtype,
        fill_value=fill,
        compressors=_compressors(layout.compression_level),
        dimension_names=("example", "layer", "head", *tail_dims),
        overwrite=True,
    )


def create_store(path: Path, layout: StoreLayout, job: dict, key: str, meta: dict,
                 ids: list[str], groups: list[str], labels: list[str]) -> zarr.Group:
    """Create a fresh store. The job attributes are written last: a store without them is known to
    be an interrupted creation and is recreated rather than reused."""
    if path.exists():
        shutil.rmtree(path)
    g = zarr.open_group(str(path), mode="w", zarr_format=3)
    ex = layout.n_examples
    _map_array(g, "features", layout, (layout.feature_dim,), ("feature",), layout.features_dtype)
    if layout.thumb_size:
        t = layout.thumb_size
        _map_array(g, "thumbnails", layout, (t, t), ("ty", "tx"), "uint8").attrs["encoding"] = "sqrt-uint8"
    _map_array(g, "stats", layout, (len(layout.stat_names),), ("stat",), "float32", fill=np.nan)
    _map_array(g, "detectors", layout, (len(layout.detector_names),), ("detector",), "float32", fill=np.nan)
    _map_array(g, "profile", layout, (len(layout.profile_offsets),), ("offset",), "float16", fill=np.nan)
    for name, dtype in layout.embed_outputs.items():
        _map_array(g, name, layout, (), (), dtype)
    for name, dtype in (("seq_len", "int32"), ("truncated", "bool")):
        g.create_array(name, shape=(ex,), chunks=(layout.shard_size,), dtype=dtype, fill_value=0,
                       dimension_names=("example",))
    for name, values in (("example_id", ids), ("example_group", groups), ("example_label", labels)):
        arr = g.create_array(name, shape=(ex,), chunks=(max(ex, 1),), dtype=str, dimension_names=("example",))
        arr[:] = np.asarray(values, dtype=str)
    g.create_array("shards_done", shape=(layout.n_shards,), chunks=(1,), dtype=bool, fill_value=False,
                   dimension_names=("shard",))
    g.create_array("layer", shape=(len(layout.layers),), dtype="int32", dimension_names=("layer",))[:] = layout.layers
    g.create_array("head", shape=(len(layout.heads),), dtype="int32", dimension_names=("head",))[:] = layout.heads
    g.create_array("stat", shape=(len(layout.stat_names),), dtype=str, dimension_names=("stat",))[:] = np.asarray(
        layout.stat_names, dtype=str)
    g.create_array("detector", shape=(len(layout.detector_names),), dtype=str,
                   dimension_names=("detector",))[:] = np.asarray(layout.detector_names, dtype=str)
    g.create_array("offset", shape=(len(layout.profile_offsets),), dtype="int32",
                   dimension_names=("offset",))[:] = layout.profile_offsets
    g.attrs.update({
        "format_version": FORMAT_VERSION,
        "rapids_attn_version": __version__,
        "layout": asdict(layout),
        "model": meta,
        "extract_complete": False,
        "learn_complete": False,
        **layout.embed_attrs,
    })
    g.attrs["job"] = job
    g.attrs["extraction_key"] = key  # last: its presence marks a complete creation
    return g


def inspect_store(path: Path, key: str, layout: StoreLayout) -> str:
    """What is at ``path``, without changing it: "absent", "partial" (an interrupted creation: no
    shard in it was ever marked done), "same" (this job's store) or "different" (another job's)."""
    if not path.exists():
        return "absent"
    try:
        g = zarr.open_group(str(path), mode="r")
        old_key = g.attrs.get("extraction_key")
    except Exception:
        return "partial"
    if old_key is None:
        return "partial"
    return "same" if old_key == key and g.attrs.get("layout") == asdict(layout) else "different"


def foreign_store_error(path: Path) -> StoreError:
    return StoreError(
        f"{path}: holds the store of a different job (data, model, extract, embed or store settings changed); "
        "rerun with --overwrite to replace it, or set output.dir to a new run directory"
    )


def open_for_job(path: Path, key: str, layout: StoreLayout, overwrite: bool) -> zarr.Group | None:
    """The existing store if it was made by the same job and layout; None if there is none (or it is
    an interrupted creation, or ``overwrite``; both are removed). A store from another job is refused."""
    state = inspect_store(path, key, layout)
    if state == "absent":
        return None
    if overwrite or state == "partial":
        shutil.rmtree(path)
        return None
    if state == "different":
        raise foreign_store_error(path)
    return zarr.open_group(str(path), mode="r+")


def read_strings(array) -> np.ndarray:
    """A zarr string array as a fixed-width NumPy ``str`` array (zarr returns NumPy's StringDType)."""
    return np.asarray(array[:]).astype(object).astype(str)


def done_shards(g: zarr.Group) -> np.ndarray:
    return np.asarray(g["shards_done"][:], dtype=bool)


def write_shard(path: str, layout: StoreLayout, shard: int, arrays: dict[str, np.ndarray]) -> None:
    """Write one shard's rows (exactly one chunk of every example-major array), then mark it done.

    Called on workers; rows of different shards live in different chunk files, so no lock is needed.
    """
    g = zarr.open_group(path, mode="r+")
    start, stop = layout.shard_rows(shard)
    for name, value in arrays.items():
        if value.shape[0] != stop - start:
            raise ValueError(f"shard {shard}: {name} has {value.shape[0]} rows, expected {stop - start}")
        g[name][start:stop] = value
    g["shards_done"][shard] = True


def mark_extract_complete(g: zarr.Group) -> None:
    g.attrs["extract_complete"] = bool(done_shards(g).all())


def mark_learn(g: zarr.Group, complete: bool, info: dict | None = None) -> None:
    g.attrs["learn_complete"] = complete
    if info is not None:
        g.attrs["learn"] = info


def consolidate(path: Path) -> None:
    """Consolidated metadata lets xarray open the store with one read."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata")
        zarr.consolidate_metadata(str(path))
