"""Example metadata in the store: chunked by shard and written by the workers with their rows; a store made
before that (ids written whole, in one chunk, by the driver) is resumed without touching them."""

import numpy as np
import zarr

from rapids_attn.store import schema as S
from rapids_attn.store.zarr_store import StoreLayout, create_store, read_strings, write_shard

META = (S.EXAMPLE_ID, S.EXAMPLE_GROUP, S.EXAMPLE_LABEL)


def layout(n: int = 10) -> StoreLayout:
    return StoreLayout(
        n_examples=n,
        layers=[0],
        heads=[0, 1],
        feature_dim=3,
        image_size=4,
        thumb_size=0,
        shard_size=4,
        stat_names=["entropy"],
        features_dtype="float32",
    )


def shard_arrays(lay: StoreLayout, shard: int, tag: str) -> dict:
    a, b = lay.shard_rows(shard)
    n = b - a
    return {
        S.FEATURES: np.full((n, 1, 2, 3), shard, dtype=np.float32),
        S.SEQ_LEN: np.arange(a, b, dtype=np.int32),
        S.EXAMPLE_ID: np.asarray([f"{tag}{i}" for i in range(a, b)], dtype=str),
        S.EXAMPLE_GROUP: np.asarray([f"g{i % 2}" for i in range(a, b)], dtype=str),
        S.EXAMPLE_LABEL: np.asarray(["yes"] * n, dtype=str),
    }


def test_workers_write_their_rows_of_example_metadata(tmp_path):
    lay = layout()
    g = create_store(tmp_path / "s.zarr", lay, {}, "k", {})
    for name in META:
        assert g[name].chunks == (lay.shard_size,) == g[S.SEQ_LEN].chunks
        assert g[name].shape == (10,)
    for s in (2, 0, 1):  # any order, as workers finish
        write_shard(str(tmp_path / "s.zarr"), lay, s, shard_arrays(lay, s, "e"))
    g = zarr.open_group(str(tmp_path / "s.zarr"), mode="r")
    assert list(read_strings(g[S.EXAMPLE_ID])) == [f"e{i}" for i in range(10)]
    assert list(read_strings(g[S.EXAMPLE_GROUP])) == [f"g{i % 2}" for i in range(10)]
    assert set(read_strings(g[S.EXAMPLE_LABEL])) == {"yes"}
    assert g[S.SHARDS_DONE][:].all()


def test_ids_given_at_creation_are_written_chunked_by_shard(tmp_path):
    lay = layout()
    ids = [f"p{i}" for i in range(10)]
    g = create_store(tmp_path / "s.zarr", lay, {}, "k", {}, ids, ["a"] * 10, [""] * 10)
    assert g[S.EXAMPLE_ID].chunks == (4,)
    assert list(read_strings(g[S.EXAMPLE_ID])) == ids


def test_a_store_with_whole_chunk_ids_keeps_them_on_resume(tmp_path):
    """Stores made before workers wrote metadata hold it in one chunk; several workers writing that one chunk
    would race, and the rows are already there, so write_shard leaves them alone and writes the rest."""
    lay = layout()
    path = tmp_path / "old.zarr"
    g = create_store(path, lay, {}, "k", {})
    old = {S.EXAMPLE_ID: [f"old{i}" for i in range(10)], S.EXAMPLE_GROUP: ["G"] * 10, S.EXAMPLE_LABEL: ["L"] * 10}
    for name, values in old.items():  # the layout those stores have: one chunk, written at creation
        S.create_array(g, name, (10,), data=values)
        assert g[name].chunks == (10,)
    write_shard(str(path), lay, 1, shard_arrays(lay, 1, "new"))
    g = zarr.open_group(str(path), mode="r")
    for name, values in old.items():
        assert list(read_strings(g[name])) == values
    assert g[S.SEQ_LEN][4:8].tolist() == [4, 5, 6, 7] and g[S.SHARDS_DONE][1]
