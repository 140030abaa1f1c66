"""The store: resumable extraction, no half-written shard taken for done, xarray, outputs."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import zarr
from helpers import FULL_REPORT, make_job

import rapids_attn.extract.shard as shard_mod
from rapids_attn.jobfile import load_job
from rapids_attn.pipeline import run_job
from rapids_attn.store.zarr_store import write_shard

ARRAYS = ("features", "stats", "thumbnails", "seq_len", "truncated")


def _job(tmp_path, model, data, name, **sections):
    return load_job(None, raw=make_job(tmp_path / name, model, data, **sections))


def test_interrupted_extraction_resumes_to_the_same_store(tmp_path, tiny_bert_dir, pair_data, monkeypatch):
    ref_cfg = _job(tmp_path, tiny_bert_dir, pair_data, "ref")
    run_job(ref_cfg, ("extract",))
    ref = zarr.open_group(str(ref_cfg.run_dir / "store.zarr"), mode="r")
    n_shards = ref["shards_done"].shape[0]
    assert n_shards == 4  # 20 examples, shard_size 6

    cfg = _job(tmp_path, tiny_bert_dir, pair_data, "resumed")

    def write_then_die(path, layout, shard, arrays):
        if shard == 2:  # rows of shard 2 hit the disk, then the worker dies before the marker
            g = zarr.open_group(path, mode="r+")
            start, stop = layout.shard_rows(shard)
            g["features"][start:stop] = np.full_like(arrays["features"], 7)
            raise RuntimeError("simulated crash")
        write_shard(path, layout, shard, arrays)

    monkeypatch.setattr(shard_mod, "write_shard", write_then_die)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_job(cfg, ("extract",))
    g = zarr.open_group(str(cfg.run_dir / "store.zarr"), mode="r")
    done = g["shards_done"][:]
    assert not done[2] and not g.attrs["extract_complete"]
    # a later stage must not take the interrupted store for complete
    with pytest.raises(Exception, match="extraction is not complete"):
        run_job(cfg, ("learn",))

    monkeypatch.setattr(shard_mod, "write_shard", write_shard)
    out = run_job(cfg, ("extract",))
    assert out["extract"]["resumed"] is True
    assert out["extract"]["shards_run"] == int((~done).sum()) >= 1
    g = zarr.open_group(str(cfg.run_dir / "store.zarr"), mode="r")
    assert g["shards_done"][:].all() and g.attrs["extract_complete"]
    for name in ARRAYS:
        np.testing.assert_array_equal(g[name][:], ref[name][:], err_msg=name)


def test_outputs_maps_table_summary_and_xarray(tmp_path, tiny_bert_dir, pair_data):
    import xarray as xr

    cfg = _job(tmp_path, tiny_bert_dir, pair_data, "full", explain=FULL_REPORT)
    summary = run_job(cfg)
    run = cfg.run_dir
    t = pq.read_table(run / "maps.parquet").to_pandas()
    assert len(t) == 20 * 2 * 2
    assert {
        "example_index",
        "example_id",
        "group",
        "label",
        "layer",
        "head",
        "cluster",
        "x",
        "y",
        "entropy",
        "self",
        "prev",
        "first",
        "sep",
    } <= set(t.columns)
    assert set(t["layer"]) == {0, 1} and set(t["head"]) == {0, 1}
    assert t["cluster"].between(0, 2).all() and t["cluster"].nunique() == 3
    assert np.isfinite(t[["x", "y"]].to_numpy()).all()
    first = t[t.example_index == 0]
    assert set(first["example_id"]) == {"q0"} and set(first["group"]) == {"t0"} and set(first["label"]) == {"True"}
    # every map counted once per cluster
    sizes = summary["clusters"]["sizes"]
    assert sum(sizes.values()) == len(t)
    assert t["cluster"].value_counts().to_dict() == {int(k): v for k, v in sizes.items()}

    s = json.loads((run / "summary.json").read_text())
    assert s["counts"]["maps"] == 80 and s["counts"]["examples"] == 20
    assert s["backend"]["learn"] == "sklearn" and s["backend"]["extract_devices"] == ["cpu"]
    assert set(s["seconds"]) >= {"preflight", "extract", "learn", "explain"}
    assert s["clusters"]["silhouette"] is not None and -1 <= s["clusters"]["silhouette"] <= 1
    assert (run / "job.yaml").is_file()
    # the head views read their few exemplar examples from the data by position (the driver holds none)
    assert not [w for w in s["warnings"] if "head views" in w]
    pages = sorted((run / "report" / "headviews").glob("cluster*_ex*.html"))
    assert pages and all("example q" in p.read_text() for p in pages)

    ds = xr.open_zarr(run / "store.zarr")
    assert ds["features"].dims == ("example", "layer", "head", "feature")
    assert ds["cluster"].dims == ("example", "layer", "head")
    assert ds["cluster"].shape == (20, 2, 2)
    np.testing.assert_array_equal(ds["cluster"].values.reshape(-1), t["cluster"].to_numpy())
    assert list(ds["stat"].values[:2]) == ["entropy", "entropy_norm"]


def test_truncation_is_counted(tmp_path, tiny_bert_dir, pair_data):
    raw = make_job(tmp_path / "trunc", tiny_bert_dir, pair_data)
    raw["model"]["max_length"] = 24
    cfg = load_job(None, raw=raw)
    s = run_job(cfg)
    g = zarr.open_group(str(cfg.run_dir / "store.zarr"), mode="r")
    seq = g["seq_len"][:]
    assert seq.max() == 24
    assert s["counts"]["truncated_examples"] == int(g["truncated"][:].sum()) > 0
    assert (seq[g["truncated"][:]] == 24).all()


def test_failed_learn_leaves_no_complete_flag(tmp_path, tiny_bert_dir, pair_data, monkeypatch):
    from rapids_attn.learn.estimator import MapClusterer

    cfg = _job(tmp_path, tiny_bert_dir, pair_data, "learnfail")
    run_job(cfg)

    def boom(*a, **k):
        raise RuntimeError("fit failed")

    monkeypatch.setattr(MapClusterer, "fit", boom)
    with pytest.raises(RuntimeError):
        run_job(cfg, ("learn",))
    g = zarr.open_group(str(cfg.run_dir / "store.zarr"), mode="r")
    assert g.attrs["learn_complete"] is False
    with pytest.raises(Exception, match="no complete clustering"):
        run_job(cfg, ("explain",))


def test_thumbnail_code_round_trips_small_values():
    from rapids_attn.store.zarr_store import decode_thumbnails, encode_thumbnails

    v = np.array([0.0, 1 / 150, 0.05, 0.5, 1.0], dtype=np.float32)
    q = encode_thumbnails(v)
    assert q.dtype == np.uint8 and q[1] == 21  # a uniform row over 150 tokens stays visible
    back = decode_thumbnails(q)
    assert np.all(np.abs(np.sqrt(back) - np.sqrt(v)) <= 0.5 / 255 + 1e-7)
    assert back[0] == 0 and back[-1] == 1


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_the_store_holds_the_inputs_ids_groups_and_labels(tmp_path, tiny_bert_dir, pair_data, fmt):
    """The workers read their own rows and write their metadata: the store's example_id, group and label are
    the input's, row for row, whole or sampled."""
    import pyarrow as pa

    from rapids_attn.data import read_examples
    from rapids_attn.store.schema import read_strings

    rows = [json.loads(line) for line in pair_data.read_text().splitlines()]
    path = pair_data
    if fmt == "parquet":
        path = tmp_path / "pairs.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=7)
    for sample in (None, 11):
        raw = make_job(tmp_path / f"{fmt}-{sample}", tiny_bert_dir, path)
        raw["data"].update(format="auto", sample=sample, seed=4)
        cfg = load_job(None, raw=raw)
        run_job(cfg, ("extract",))
        g = zarr.open_group(str(cfg.run_dir / "store.zarr"), mode="r")
        stored = [list(read_strings(g[n])) for n in ("example_id", "example_group", "example_label")]
        if sample is None:
            assert stored == [[r["id"] for r in rows], [r["topic"] for r in rows], [str(r["answerable"]) for r in rows]]
        else:
            d = cfg.data
            chosen = read_examples(
                path, "auto", d.text_fields, d.id_field, d.group_field, d.label_field, sample=sample, seed=4
            )
            assert stored == [[e.id for e in chosen], [e.group for e in chosen], [e.label for e in chosen]]
            assert len(chosen) == 11 and [e.id for e in chosen] != [r["id"] for r in rows][:11]


def _snapshot(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_store_left_inconsistent_is_one_line_with_the_fix_never_a_key_error(
    tmp_path, capsys, tiny_bert_dir, pair_data
):
    """Two runs at once or a crash could leave a store whose zarr.json is there and an array is not; every
    later run failed with KeyError: 'shards_done'. Now the run and --check say so in the same line, change
    nothing, and --overwrite recreates the store."""
    import shutil

    import yaml

    from rapids_attn.run import main

    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(make_job(tmp_path, tiny_bert_dir, pair_data)))
    store = tmp_path / "run" / "store.zarr"
    assert main([str(p)]) == 0
    shutil.rmtree(store / "cluster")  # learn's array, with learn_complete still set
    capsys.readouterr()
    assert main([str(p), "--stages", "explain"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'cluster' is missing" in err and "--stages learn" in err
    assert main([str(p), "--stages", "learn,explain"]) == 0  # the fix it names works

    shutil.rmtree(store / "shards_done")
    before = _snapshot(store)
    capsys.readouterr()
    lines = set()
    for args in ((), ("--check",), ("--stages", "learn"), ("--stages", "extract")):
        assert main([str(p), *args]) == 2, args
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "KeyError" not in err, err
        assert str(store) in err and "'shards_done' is missing" in err and "--overwrite" in err
        lines.add(err)
    assert len(lines) == 1  # --check says exactly what the run says
    assert _snapshot(store) == before
    assert main([str(p), "--overwrite"]) == 0
    assert zarr.open_group(str(store), mode="r")["shards_done"][:].all()


def test_shard_size_auto_resumes_a_store_made_with_a_number(tmp_path, tiny_bert_dir, pair_data):
    """A store made with an explicit shard size (or with 128, the default before ``auto``) is this job's store
    under ``auto`` too: the run reuses it with its own shard size instead of refusing it as another job's. A
    store of another job (another model setting) is still refused, whatever its shard size."""
    from rapids_attn.errors import StoreError
    from rapids_attn.pipeline import preflight

    made = load_job(None, raw=make_job(tmp_path, tiny_bert_dir, pair_data, extract={"shard_size": 8}))
    run_job(made, ("extract",))  # 20 examples in shards of 8, where auto would give 16
    auto = load_job(None, raw=make_job(tmp_path, tiny_bert_dir, pair_data, extract={"shard_size": "auto"}))
    ctx = preflight(auto, ("extract",)).ctx
    assert ctx.layout.shard_size == 8 and ctx.key == preflight(made, ("extract",)).ctx.key
    out = run_job(auto, ("extract",))
    assert out["extract"]["resumed"] is True and out["extract"]["shards_run"] == 0
    # a fresh directory: auto gives its own size, and the key is that of the same number given explicitly
    fresh = tmp_path / "fresh"
    a = load_job(None, raw=make_job(fresh, tiny_bert_dir, pair_data, extract={"shard_size": "auto"}))
    n = load_job(None, raw=make_job(fresh, tiny_bert_dir, pair_data, extract={"shard_size": 16}))
    ca, cn = preflight(a, ("extract",)).ctx, preflight(n, ("extract",)).ctx
    assert ca.layout.shard_size == cn.layout.shard_size == 16 and ca.key == cn.key
    # another job's store is not adopted: another image size changes the key at any shard size
    other = load_job(
        None, raw=make_job(tmp_path, tiny_bert_dir, pair_data, extract={"shard_size": "auto", "image_size": 16})
    )
    with pytest.raises(StoreError, match="different job"):
        run_job(other, ("extract",))
