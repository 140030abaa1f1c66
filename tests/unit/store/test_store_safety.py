"""Nothing a user did not ask to delete is deleted: a store that cannot be read, or a folder that is not
a rapids_attn store, is an error (exit 2, one line naming it) and every file stays as it was."""

import os
from pathlib import Path

import pytest
import yaml
import zarr
from helpers import make_job, snapshot

from rapids_attn.run import main


@pytest.fixture
def job_path(tmp_path, tiny_bert_dir, pair_data) -> Path:
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(make_job(tmp_path, tiny_bert_dir, pair_data)))
    return p


@pytest.fixture
def extracted(job_path, tmp_path) -> Path:
    assert main([str(job_path), "--stages", "extract"]) == 0
    return tmp_path / "run" / "store.zarr"


def _refused(capsys, job_path, store: Path, *args) -> str:
    before = snapshot(store)
    capsys.readouterr()  # drop what the fixture's own run printed
    assert main([str(job_path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: ") and str(store) in err
    assert snapshot(store) == before  # every file still there, byte for byte
    return err


@pytest.mark.parametrize("args", [(), ("--stages", "learn"), ("--overwrite",)])
def test_corrupt_zarr_json_is_named_and_kept(capsys, job_path, extracted, args):
    (extracted / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group", "attributes": {')  # cut short
    err = _refused(capsys, job_path, extracted, *args)
    assert "cannot read the store" in err and "nothing was changed" in err


def test_a_permission_error_is_named_and_kept(capsys, job_path, extracted, monkeypatch):
    import rapids_attn.store.zarr_store as zs

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied", str(extracted / "zarr.json"))

    monkeypatch.setattr(zs.zarr, "open_group", denied)
    err = _refused(capsys, job_path, extracted)
    assert "PermissionError" in err and "Fix its permissions" in err


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads files whatever their mode")
def test_an_unreadable_store_on_disk_is_named_and_kept(capsys, job_path, extracted):
    meta = extracted / "zarr.json"
    meta.chmod(0)
    try:
        assert main([str(job_path)]) == 2
        assert str(extracted) in capsys.readouterr().err
        assert meta.exists()
    finally:
        meta.chmod(0o644)


@pytest.mark.parametrize("attrs", [{}, {"format_version": 2}, {"format_version": 1, "owner": "someone"}])
def test_a_zarr_store_made_by_something_else_is_refused(capsys, job_path, tmp_path, attrs):
    store = tmp_path / "run" / "store.zarr"
    g = zarr.open_group(str(store), mode="w", zarr_format=3, attributes=attrs)
    g.create_array("mine", shape=(3,), dtype="int32")[:] = [1, 2, 3]
    for args in ((), ("--overwrite",)):
        err = _refused(capsys, job_path, store, *args)
        assert "not one made by rapids_attn" in err


def test_a_folder_of_other_files_is_refused(capsys, job_path, tmp_path):
    store = tmp_path / "run" / "store.zarr"
    store.mkdir(parents=True)
    (store / "notes.txt").write_text("my own notes")
    err = _refused(capsys, job_path, store)
    assert "not a Zarr store made by rapids_attn" in err


def test_an_interrupted_creation_of_ours_is_recreated(job_path, tmp_path):
    from rapids_attn.store.schema import Attr
    from rapids_attn.store.zarr_store import CREATOR

    store = tmp_path / "run" / "store.zarr"
    # the first thing create_store writes: the group, born with its marker
    zarr.open_group(str(store), mode="w", zarr_format=3, attributes={Attr.CREATED_BY: CREATOR})
    assert main([str(job_path), "--stages", "extract"]) == 0
    assert zarr.open_group(str(store), mode="r").attrs["extract_complete"] is True


def test_a_linked_store_is_not_deleted_through_the_link(capsys, job_path, extracted, tmp_path):
    real = tmp_path / "elsewhere.zarr"
    extracted.rename(real)
    extracted.symlink_to(real, target_is_directory=True)
    assert main([str(job_path), "--stages", "extract"]) == 0  # reusing it through the link is fine
    before = snapshot(real)
    capsys.readouterr()
    assert main([str(job_path), "--overwrite"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "symbolic link" in err
    assert extracted.is_symlink() and snapshot(real) == before
