"""The dataset's content is part of the extraction key: an edited file at the same path is a different
store (refused without --overwrite, never mixed into a resume), and the same bytes are the same store."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import make_job

from rapids_attn.data import build_index
from rapids_attn.data.fingerprint import content_fingerprint
from rapids_attn.errors import DataError, StoreError
from rapids_attn.jobfile import load_job
from rapids_attn.pipeline import preflight, run_job


def _edit_one_character(path):
    """Same size, same line count: only the content differs (an mtime-only check would miss none of these,
    but a size check would)."""
    text = path.read_text()
    i = text.index("question number 3")
    path.write_text(text[:i] + "Question" + text[i + len("question") :])


def test_the_fingerprint_follows_content_not_path_or_time(tmp_path, pair_data):
    a = content_fingerprint(pair_data)
    copy = shutil.copy(pair_data, tmp_path / "copy.jsonl")
    assert content_fingerprint(copy) == a  # same bytes elsewhere, later: same fingerprint
    _edit_one_character(pair_data)
    assert content_fingerprint(pair_data) != a


def test_a_folder_fingerprint_counts_names_and_boundaries(tmp_path):
    d = tmp_path / "ds"
    d.mkdir()
    (d / "a.arrow").write_bytes(b"abc")
    (d / "b.arrow").write_bytes(b"def")
    first = content_fingerprint(d)
    (d / "a.arrow").write_bytes(b"abcd")
    (d / "b.arrow").write_bytes(b"ef")  # same concatenated bytes, another split
    second = content_fingerprint(d)
    (d / "b.arrow").rename(d / "c.arrow")
    assert len({first, second, content_fingerprint(d)}) == 3


@pytest.mark.parametrize("fmt", ["jsonl", "squad", "csv"])
def test_every_format_indexes_its_content(tmp_path, fmt):
    if fmt == "squad":
        doc = {
            "version": "v2.0",
            "data": [
                {
                    "title": "T",
                    "paragraphs": [
                        {
                            "context": "Mainz is a city.",
                            "qas": [{"id": "q1", "question": "What is Mainz?", "answers": [], "is_impossible": True}],
                        }
                    ],
                }
            ],
        }
        path = tmp_path / "d.json"
        path.write_text(json.dumps(doc))
        kw = {"format": "squad"}
    elif fmt == "jsonl":
        path = tmp_path / "d.jsonl"
        path.write_text('{"text": "Mainz is a city."}\n')
        kw = {"format": "jsonl"}
    else:
        path = tmp_path / "d.csv"
        path.write_text("text\nMainz is a city.\n")
        kw = {"format": "csv"}
    before = build_index(path, **kw).fingerprint
    assert len(before) == 16
    path.write_text(path.read_text().replace("Mainz", "Mains"))
    assert build_index(path, **kw).fingerprint != before


def test_an_unreadable_file_is_one_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "x"}\n')
    path.chmod(0)
    try:
        if path.open("rb").readable():  # root reads anything: nothing to check here
            pytest.skip("running as root: permissions are not enforced")
    except PermissionError:
        with pytest.raises(DataError, match="data.path: cannot read"):
            content_fingerprint(path)
    finally:
        path.chmod(0o644)


def test_an_edited_dataset_is_a_different_store(tmp_path, tiny_bert_dir, pair_data):
    """Same path, same settings, one character changed: preflight's key changes, the finished store is
    refused (not silently reused), and --overwrite rebuilds it from the new text."""
    cfg = load_job(None, raw=make_job(tmp_path, tiny_bert_dir, pair_data))
    first = run_job(cfg, ("extract",))
    key = preflight(cfg, ("extract",)).ctx.key
    assert first["extract"]["shards_run"] == 4

    _edit_one_character(pair_data)
    edited = load_job(None, raw=make_job(tmp_path, tiny_bert_dir, pair_data))
    assert preflight(edited, ("extract",), overwrite=True).ctx.key != key
    with pytest.raises(StoreError, match="different job"):  # a later stage alone is refused too
        preflight(edited, ("learn",))
    with pytest.raises(StoreError, match="dataset's content"):
        run_job(load_job(None, raw=make_job(tmp_path, tiny_bert_dir, pair_data)), ("extract",))
    again = run_job(load_job(None, raw=make_job(tmp_path, tiny_bert_dir, pair_data)), ("extract",), overwrite=True)
    assert again["extract"]["shards_run"] == 4 and not again["extract"]["resumed"]
