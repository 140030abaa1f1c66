"""Example metadata in the store: chunked by shard and written by the workers with their rows; a store made
before that (ids written whole, in one chunk, by the driver) is resumed without touching them. A store
that cannot be read is never removed, even with overwrite, and a reused store missing an array (a crash, two
runs at once) is a one-line StoreError naming the fix, never a KeyError."""

import shutil
from dataclasses import asdict

import numpy as np
import pytest
import zarr

from rapids_attn.errors import StoreError
from rapids_attn.store import schema as S
from rapids_attn.store.zarr_store import (
    StoreLayout,
    check_consistent,
    consolidate,
    create_store,
    done_shards,
    layout_arrays,
    mark_complete,
    open_for_job,
    read_strings,
    store_action,
    write_shard,
)

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


# -- what is there is what the layout says; nothing unreadable is removed ---------------------------------


def test_layout_arrays_are_exactly_what_create_store_makes(tmp_path):
    lay = StoreLayout(**{**asdict(layout()), "thumb_size": 2, "embed_outputs": {"pattern": "int8"}})
    g = create_store(tmp_path / "s.zarr", lay, {}, "k", {})
    declared = {str(spec): (shape, chunks) for spec, shape, chunks, _ in layout_arrays(lay)}
    made = {name: (a.shape, a.chunks) for name, a in g.arrays()}
    assert declared.keys() == made.keys()
    for name, (shape, chunks) in declared.items():
        assert made[name][0] == shape, name
        if name not in ("layer", "head", "stat", "detector", "offset"):  # coordinates: one chunk
            assert made[name][1] == chunks, name
    check_consistent(tmp_path / "s.zarr", lay)  # a fresh store is consistent


def _one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_a_missing_array_is_reported_with_the_fix_even_if_consolidated_metadata_lists_it(tmp_path):
    lay, path = layout(), tmp_path / "s.zarr"
    create_store(path, lay, {}, "k", {})
    consolidate(path)  # the root zarr.json still lists shards_done after its folder is gone
    shutil.rmtree(path / S.SHARDS_DONE)
    with pytest.raises(StoreError) as e:
        check_consistent(path, lay)
    msg = _one_line(e)
    assert str(path) in msg and "'shards_done' is missing" in msg and "--overwrite" in msg
    with pytest.raises(StoreError, match="inconsistent"):  # the extract stage's preflight and open
        store_action(path, "k", lay, overwrite=False)
    with pytest.raises(StoreError, match="inconsistent"):
        open_for_job(path, "k", lay, overwrite=False)
    assert path.is_dir()
    assert store_action(path, "k", lay, overwrite=True) == "replace"  # ours: --overwrite recreates it
    with pytest.raises(StoreError, match="shards_done"):  # never a KeyError
        done_shards(zarr.open_group(str(path), mode="r", use_consolidated=False))


def test_a_wrong_shape_or_unreadable_array_is_reported(tmp_path):
    lay, path = layout(), tmp_path / "s.zarr"
    g = create_store(path, lay, {}, "k", {})
    S.create_array(g, S.SEQ_LEN, (7,), chunks=(4,))
    with pytest.raises(StoreError, match=r"'seq_len' has shape \(7,\), not \(10,\)"):
        check_consistent(path, lay)
    S.create_array(g, S.SEQ_LEN, (10,), chunks=(4,))
    (path / S.FEATURES / "zarr.json").write_text("{ cut")
    with pytest.raises(StoreError, match="'features' cannot be read"):
        check_consistent(path, lay)


def test_a_complete_stages_missing_arrays_name_that_stage(tmp_path):
    lay, path = layout(), tmp_path / "s.zarr"
    g = create_store(path, lay, {}, "k", {})
    mark_complete(g, "learn", True)
    check_consistent(path, lay)  # nobody asked for the learn arrays
    with pytest.raises(StoreError) as e:
        check_consistent(path, lay, ("extract", "learn"))
    assert "'reduced' is missing" in _one_line(e) and "--stages learn" in str(e.value)
    for spec, shape in ((S.REDUCED, (10, 1, 2, 3)), (S.COORDS, (10, 1, 2, 2)), (S.CLUSTER, (10, 1, 2))):
        S.create_array(g, spec, shape)
    check_consistent(path, lay, ("extract", "learn"))
    S.create_array(g, S.CLUSTER, (10, 2, 2))
    with pytest.raises(StoreError, match=r"'cluster' has shape \(10, 2, 2\), not \(10, 1, 2\)"):
        check_consistent(path, lay, ("learn",))


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_store_that_fails_to_open_is_never_removed(tmp_path, overwrite):
    """It used to be taken for an interrupted creation ("partial") and deleted."""
    lay, path = layout(), tmp_path / "s.zarr"
    create_store(path, lay, {}, "k", {})
    (path / "zarr.json").write_text('{"zarr_format": 3, "node_type": "gr')
    before = sorted(p.relative_to(path) for p in path.rglob("*"))
    for call in (store_action, open_for_job):
        with pytest.raises(StoreError, match="cannot read the store"):
            call(path, "k", lay, overwrite)
    assert sorted(p.relative_to(path) for p in path.rglob("*")) == before


def test_the_stores_default_detector_names_are_the_extractors():
    from rapids_attn.extract.signature import DETECTOR_NAMES

    assert StoreLayout(1, [0], [0], 1, 1, 0, 1, ["entropy"]).detector_names == list(DETECTOR_NAMES)
