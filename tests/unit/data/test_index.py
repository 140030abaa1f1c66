"""The driver's index and the workers' reads: for every format, the rows a worker reads for each shard are
the rows the whole-file reader gives (with sample, limit, blank lines, quoted newlines, BOM, CRLF, a
lone CR), the task's description of them holds no text, and the driver's pass stays small."""

from __future__ import annotations

import csv
import json
import pickle
import random
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import rapids_attn.data.index as index_mod
from rapids_attn.data import Example, build_index, read_examples
from rapids_attn.data.fields import FieldSpec
from rapids_attn.errors import DataError

WORDS = ["alpha", "beta", "γάμμα", "naïve", "日本語", 'say "hi"', "a,b", "tab\there", "x;y"]
FIELDS = {"text_fields": ["text", "ctx"], "id_field": "id", "group_field": "g", "label_field": "y"}
SPEC = FieldSpec("text", "ctx", "id", "g", "y")
# (sample, limit) pairs: none, limit only, sample only, both, and a sample larger than the data
SELECTIONS = [(None, None), (None, 9), (13, None), (17, 5), (500, None)]


def records(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))
        if i % 7 == 3:
            text += "\nsecond line"  # a quoted newline in CSV (JSON escapes it)
        if i % 11 == 5:
            text += "\r\nthird line"
        out.append(
            {"id": f"r{i}", "text": text, "ctx": f"context {i} " * rng.randint(1, 3), "g": f"g{i % 3}", "y": i % 2}
        )
    return out


def old_select(examples: list, limit=None, sample=None, seed=0) -> list:
    """The list selection every job used before the index (kept here as the reference)."""
    if sample is not None and sample < len(examples):
        keep = np.sort(np.random.default_rng(seed).choice(len(examples), size=sample, replace=False))
        examples = [examples[i] for i in keep]
    return examples if limit is None else examples[:limit]


# -- the whole-file readers, as they were: text mode, one pass, everything in a list --------------------


def old_jsonl(path: Path) -> list[Example]:
    out = []
    with open(path, encoding="utf-8-sig") as f:
        for lineno, line in enumerate(f, start=1):
            if line.strip():
                out.append(SPEC.example(json.loads(line), len(out), f"line {lineno} of {path}"))
    return out


def old_csv(path: Path) -> list[Example]:
    delimiter = "\t" if path.suffix == ".tsv" else ","
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f, delimiter=delimiter)
        return [SPEC.example(row, i, "") for i, row in enumerate(reader)]


def old_text(path: Path) -> list[Example]:
    with open(path, encoding="utf-8-sig") as f:
        return [Example(id=str(n), text=line.strip()) for n, line in enumerate(f, start=1) if line.strip()]


# -- writers with the awkward parts ---------------------------------------------------------------------


def write_jsonl(path: Path, rows: list[dict], newline: str = "\n", bom: bool = False, blank_every: int = 5) -> Path:
    parts = []
    for i, r in enumerate(rows):
        if blank_every and i % blank_every == 0:
            parts.append(newline if i % 2 else "   " + newline)
        parts.append(json.dumps(r, ensure_ascii=False) + newline)
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + "".join(parts).encode("utf-8"))
    return path


def write_csv(path: Path, rows: list[dict], newline: str = "\r\n", bom: bool = False) -> Path:
    import io

    buf = io.StringIO(newline="")
    delimiter = "\t" if path.suffix == ".tsv" else ","
    w = csv.DictWriter(
        buf, fieldnames=list(rows[0]), delimiter=delimiter, lineterminator=newline, quoting=csv.QUOTE_ALL
    )
    w.writeheader()
    for i, r in enumerate(rows):
        w.writerow(r)
        if i % 6 == 2:
            buf.write(newline)  # a blank line between records
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + buf.getvalue().encode("utf-8"))
    return path


def write_text(path: Path, rows: list[dict], bom: bool = False) -> Path:
    endings = ["\n", "\r\n", "\r"]  # mixed, a lone CR included: text mode ends a line at each
    body = "".join(
        r["ctx"] + r["text"].replace("\n", " ").replace("\r", " ") + endings[i % 3] for i, r in enumerate(rows)
    )
    body = body.replace("context 4 ", "\n  \n")  # some blank lines
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + body.encode("utf-8"))
    return path


def write_parquet(path: Path, rows: list[dict], row_group_size: int = 7) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


def parquet_reference(path: Path) -> list[Example]:
    import pyarrow.parquet as pq

    return [
        Example(
            id=str(r["id"]), text=str(r["text"]), text_pair=str(r["ctx"]), group=str(r["g"] or ""), label=str(r["y"])
        )
        for r in pq.read_table(path).to_pylist()
    ]


def save_hf(path: Path, rows: list[dict], split: str | None = None) -> Path:
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(rows)
    (datasets.DatasetDict({"train": ds.select(range(3)), split: ds}) if split else ds).save_to_disk(str(path))
    return path


def hf_reference(path: Path, split: str | None) -> list[Example]:
    import datasets

    ds = datasets.load_from_disk(str(path))
    ds = ds[split] if split else ds
    return [SPEC.example(row, i, "") for i, row in enumerate(ds)]


def _cases(tmp: Path, n: int = 40):
    """(name, path, build_index kwargs, the whole-file reader's examples) for every format and variant."""
    rows = records(n)
    yield "jsonl", (p := write_jsonl(tmp / "a.jsonl", rows)), FIELDS, old_jsonl(p)
    yield "jsonl-crlf-bom", (p := write_jsonl(tmp / "b.jsonl", rows, "\r\n", bom=True)), FIELDS, old_jsonl(p)
    yield "jsonl-cr", (p := write_jsonl(tmp / "c.jsonl", rows, "\r")), FIELDS, old_jsonl(p)
    yield "csv-crlf", (p := write_csv(tmp / "a.csv", rows)), FIELDS, old_csv(p)
    yield "csv-lf-bom", (p := write_csv(tmp / "b.csv", rows, "\n", bom=True)), FIELDS, old_csv(p)
    yield "tsv", (p := write_csv(tmp / "a.tsv", rows)), FIELDS, old_csv(p)
    yield "text-bom", (p := write_text(tmp / "a.txt", rows, bom=True)), {}, old_text(p)
    yield "parquet", (p := write_parquet(tmp / "a.parquet", rows)), FIELDS, parquet_reference(p)
    yield "hf", (p := save_hf(tmp / "hf", rows)), FIELDS, hf_reference(p, None)
    yield "hf-split", (p := save_hf(tmp / "hfd", rows, "validation")), FIELDS, hf_reference(p, "validation")


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return list(_cases(tmp_path_factory.mktemp("formats")))


def test_the_references_see_the_awkward_parts(cases):
    """The data really has what the readers must get right (so the comparisons below have teeth)."""
    by = {name: ref for name, _, _, ref in cases}
    assert all(len(by[k]) == 40 for k in by if not k.startswith("text"))
    assert any("\n" in ex.text for ex in by["csv-crlf"]) and any("\r\n" in ex.text for ex in by["csv-lf-bom"])
    assert by["jsonl-crlf-bom"][0].id == "r0" and by["csv-lf-bom"][0].id == "r0"  # the BOM is not in the first field
    lines = [int(ex.id) for ex in by["text-bom"]]
    assert lines != list(range(1, len(lines) + 1))  # blank lines skipped, numbers kept


@pytest.mark.parametrize("sample, limit", SELECTIONS)
def test_every_shard_reads_what_the_whole_file_reader_gives(cases, sample, limit):
    for name, path, kwargs, reference in cases:
        expected = old_select(reference, limit=limit, sample=sample, seed=5)
        index = build_index(path, sample=sample, limit=limit, seed=5, checkpoint_every=3, **kwargs)
        assert len(index) == len(expected), name
        assert read_examples(path, sample=sample, limit=limit, seed=5, **kwargs) == expected, name
        for shard_size in (1, 4, 7):
            for start in range(0, len(index), shard_size):
                rows = index.rows(start, start + shard_size)
                got = pickle.loads(pickle.dumps(rows)).read()  # as a worker gets it
                assert got == expected[start : start + shard_size], (name, shard_size, start)


def test_reading_chosen_positions_reads_only_those(cases):
    for name, path, kwargs, reference in cases:
        index = build_index(path, checkpoint_every=4, **kwargs)
        picks = [17, 3, 39, 3, 0]
        assert index.read(picks) == [reference[i] for i in picks], name
        view = index.examples()
        assert len(view) == len(reference) and view[-1] == reference[-1] and view[5] == reference[5]
        with pytest.raises(IndexError):
            index.read([len(reference)])


def test_probes_follow_the_file_rows_inline(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", records(10))
    probes = [Example(id=f"probe-{i}", text=f"w{i} w{i}", text_pair=f"w{i}") for i in range(3)]
    index = build_index(path, checkpoint_every=2, **FIELDS).with_inline(probes)
    everything = old_jsonl(path) + probes
    assert len(index) == 13
    assert index.rows(8, 12).read() == everything[8:12]
    assert index.rows(8, 12).inline == tuple(probes[:2])
    assert index.read([12, 0]) == [probes[2], everything[0]]


def test_squad_examples_travel_inline(tmp_path):
    from test_readers import squad_doc
    from test_readers import write_json as write_squad

    path = write_squad(tmp_path / "dev.json", squad_doc())
    index = build_index(path, limit=3)
    assert index.source is None and len(index) == 3 and index.pairs
    assert index.rows(1, 3).read() == read_examples(path)[1:3]


# -- what a task carries ------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet", "hf"])
def test_rows_pickle_small_and_without_text(tmp_path, fmt):
    """A shard's description is the same size whatever the texts' length, and holds none of them."""
    sizes = []
    for scale in (1, 50):
        rows = [{**r, "text": r["text"] * scale, "ctx": r["ctx"] * scale} for r in records(60)]
        d = tmp_path / f"x{scale}"
        d.mkdir()
        writer = {"jsonl": write_jsonl, "csv": write_csv, "parquet": write_parquet, "hf": save_hf}[fmt]
        path = writer(d / f"data.{fmt}" if fmt != "hf" else d / "data", rows)
        for sample in (None, 30):
            index = build_index(path, sample=sample, checkpoint_every=8, **FIELDS)
            for start in range(0, len(index), 16):
                rows_ = index.rows(start, start + 16)
                blob = pickle.dumps(rows_)
                for ex in rows_.read():
                    assert ex.text[:40].encode() not in blob and ex.text_pair[:40].encode() not in blob
                if sample is None and start == 16:
                    sizes.append(len(blob))
    # 50x the text: the same description (byte offsets may take a few more bytes to write)
    assert abs(sizes[1] - sizes[0]) <= 16 and sizes[1] < 1000, sizes


def test_the_driver_keeps_no_record(tmp_path, monkeypatch):
    """The pass over a 6 MB file allocates far less than the file: nothing per record is kept but ids' hashes
    and a seek point per block; and the index holds no Example."""
    rows = [
        {"id": f"id-{i:07d}", "text": "lorem ipsum dolor sit amet " * 8, "ctx": "c", "g": "", "y": 0}
        for i in range(20000)
    ]
    path = write_jsonl(tmp_path / "big.jsonl", rows, blank_every=0)
    size = path.stat().st_size
    built = []
    real = index_mod.Rows.read

    def spy(self):
        built.append(len(self))
        return real(self)

    monkeypatch.setattr(index_mod.Rows, "read", spy)
    tracemalloc.start()
    try:
        index = build_index(path, **FIELDS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(index) == 20000 and isinstance(index.records, range) and index.inline == ()
    assert built == []  # no second read: there was no duplicate hash
    assert peak < size / 10, (peak, size)


# -- duplicates and bad records, found by the driver ------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet", "hf"])
def test_duplicates_far_apart_are_named_by_record(tmp_path, fmt):
    rows = records(30)
    rows[23]["id"] = rows[4]["id"]
    rows[27]["id"] = rows[1]["id"]  # a later repeat: the first one in file order is reported
    writer = {"jsonl": write_jsonl, "csv": write_csv, "parquet": write_parquet, "hf": save_hf}[fmt]
    path = writer(tmp_path / (f"d.{fmt}" if fmt != "hf" else "d"), rows)
    with pytest.raises(DataError, match=r"duplicate id 'r4' in .*\(records 4 and 23, counting from 0\); ids must be"):
        build_index(path, checkpoint_every=4, **FIELDS)


def test_a_hash_collision_is_not_a_duplicate(tmp_path, monkeypatch):
    """Every id hashing alike sends all of them to the exact check: unique ids pass, a real repeat is named."""
    monkeypatch.setattr(index_mod, "hash", lambda s: 7, raising=False)
    rows = records(12)
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    assert len(build_index(path, checkpoint_every=5, **FIELDS)) == 12
    rows[9]["id"] = rows[2]["id"]
    rows[11]["id"] = rows[0]["id"]
    write_jsonl(path, rows)
    with pytest.raises(DataError, match=r"duplicate id 'r2' .*\(records 2 and 9"):
        build_index(path, checkpoint_every=5, **FIELDS)


def test_bad_record_deep_in_the_file_is_named_by_line(tmp_path):
    rows = records(30)
    path = write_jsonl(tmp_path / "d.jsonl", rows, blank_every=0)
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[25] = json.dumps({**rows[25], "text": None})
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"line 26 of .*d\.jsonl field 'text' is empty"):
        build_index(path, **FIELDS)


def test_csv_quoted_newlines_keep_line_numbers_in_messages(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text('text,k\n"one\ntwo",a\n"three\r\nfour",b\nshort\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"line 6 of .*d\.csv has a different number of columns"):
        build_index(path, label_field="k")


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_a_file_changed_after_indexing_is_an_error_not_wrong_rows(tmp_path, fmt):
    import os

    writer = {"jsonl": write_jsonl, "csv": write_csv, "parquet": write_parquet}[fmt]
    path = writer(tmp_path / f"d.{fmt}", records(20))
    index = build_index(path, checkpoint_every=4, **FIELDS)
    rows = pickle.loads(pickle.dumps(index.rows(8, 16)))  # what a worker gets
    assert len(rows.read()) == 8
    writer(path, records(20, seed=1))  # other texts, same ids
    with pytest.raises(DataError, match=rf"d\.{fmt} changed after the job read it \(its size or modification time"):
        rows.read()
    stamp = index.source.stamp
    writer(path, records(10))
    os.utime(path, ns=(stamp[1], stamp[1]))  # even with the old time, fewer records are noticed
    with pytest.raises(DataError, match=rf"d\.{fmt} changed after the job read it"):
        rows.read()


# -- parquet -------------------------------------------------------------------------------------------


def test_parquet_is_detected_by_suffix_and_reads_named_columns(tmp_path):
    rows = [
        {"q": f"question {i}", "c": f"ctx {i}", "key": i * 10, "topic": None if i == 2 else "t", "ok": i % 2 == 0}
        for i in range(5)
    ]
    path = write_parquet(tmp_path / "d.parquet", rows, row_group_size=2)
    got = read_examples(path, text_fields=["q", "c"], id_field="key", group_field="topic", label_field="ok")
    assert got[2] == Example(id="20", text="question 2", text_pair="ctx 2", group="", label="True")
    assert [e.id for e in got] == ["0", "10", "20", "30", "40"]
    assert [e.id for e in read_examples(path, text_fields=["q"], limit=2)] == ["0", "1"]  # numbered rows


def test_parquet_missing_column_names_file_and_field(tmp_path):
    path = write_parquet(tmp_path / "d.parquet", [{"sentence": "a", "y": 1}])
    with pytest.raises(
        DataError,
        match=r"the schema of .*d\.parquet has no field 'text'; set data\.text_fields .*\(found: sentence, y\)",
    ):
        build_index(path)
    with pytest.raises(DataError, match=r"d\.parquet has no field 'uid'; set data\.id_field"):
        build_index(path, text_fields=["sentence"], id_field="uid")


@pytest.mark.parametrize("bad", [None, ""])
def test_parquet_empty_id_names_file_row_and_field(tmp_path, bad):
    rows = [{"text": f"t{i}", "k": f"k{i}"} for i in range(20)]
    rows[13]["k"] = bad
    path = write_parquet(tmp_path / "d.parquet", rows, row_group_size=4)
    with pytest.raises(DataError, match=r"row 13 of .*d\.parquet has an empty id in field 'k'"):
        build_index(path, id_field="k")


@pytest.mark.parametrize("writer", ["stats", "no-stats", "dictionary", "large-string", "string-view"])
def test_parquet_index_records_its_empty_texts_as_a_line_file_does(tmp_path, writer, monkeypatch):
    """Parquet's pass reads ids only, so its examples with no text come from the text columns: the same
    records as the JSONL file of the same rows (an empty text with a non-empty pair is not empty), reading
    only the row groups whose statistics leave room for an empty string."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rapids_attn.data import tables

    rows = [{"id": f"r{i}", "text": f"t{i}", "ctx": f"c{i}"} for i in range(20)]
    for i in (2, 9, 10, 17):
        rows[i]["text"] = ""
    for i in (9, 17):
        rows[i]["ctx"] = ""  # 2 and 10: an empty question with a context is text
    table = pa.Table.from_pylist(rows)
    if writer in ("large-string", "string-view"):
        kind = pa.large_string() if writer == "large-string" else pa.string_view()
        table = table.cast(pa.schema([(f, kind) for f in table.column_names]))
    path = tmp_path / "d.parquet"
    pq.write_table(
        table, path, row_group_size=4, write_statistics=writer != "no-stats", use_dictionary=writer == "dictionary"
    )
    read_groups = []
    real = tables._parquet_file

    def recording(p):
        pf = real(p)
        iter_batches = pf.iter_batches

        def iterate(*args, row_groups=None, **kwargs):
            read_groups.extend(row_groups or [])
            return iter_batches(*args, row_groups=row_groups, **kwargs)

        pf.iter_batches = iterate
        return pf

    monkeypatch.setattr(tables, "_parquet_file", recording)
    # groups of 4 rows: empty texts in groups 0, 2 and 4, empty pairs in groups 2 and 4 only; with statistics,
    # only the groups where every column may hold an empty string are read
    for fields, want, groups in ((["text"], [2, 9, 10, 17], [0, 2, 4]), (["text", "ctx"], [9, 17], [2, 4])):
        jsonl = write_jsonl(tmp_path / "d.jsonl", rows)
        assert build_index(jsonl, text_fields=fields, id_field="id").empty_records == tuple(want)
        read_groups.clear()
        assert build_index(path, text_fields=fields, id_field="id").empty_records == tuple(want)
        assert sorted(set(read_groups)) == ([0, 1, 2, 3, 4] if writer == "no-stats" else groups)
    index = build_index(path, text_fields=["text", "ctx"], id_field="id")
    pos, ex, count = index.first_without_text()  # read back by a worker's reader: the same row
    assert (pos, ex.id, ex.text, ex.text_pair, count) == (9, "r9", "", "", 2)


def test_parquet_null_text_names_file_row_and_field(tmp_path):
    rows = [{"text": f"t{i}", "ctx": f"c{i}"} for i in range(20)]
    rows[17]["ctx"] = None
    path = write_parquet(tmp_path / "d.parquet", rows, row_group_size=4)
    with pytest.raises(DataError, match=r"row 17 of .*d\.parquet field 'ctx' is empty"):
        build_index(path, text_fields=["text", "ctx"])


def test_parquet_null_check_finds_its_column_behind_nested_ones(tmp_path):
    """Row-group statistics are per leaf column: a struct before the text column must not shift which
    column's null count is read (here the struct's leaves have no nulls and the text has one)."""
    rows = [{"meta": {"a": i, "b": "x"}, "text": f"t{i}", "other": f"o{i}"} for i in range(8)]
    rows[6]["text"] = None
    path = write_parquet(tmp_path / "d.parquet", rows, row_group_size=3)
    with pytest.raises(DataError, match=r"row 6 of .*d\.parquet field 'text' is empty"):
        build_index(path)
    rows[6]["text"] = "t6"
    write_parquet(path, rows, row_group_size=3)
    assert [e.text for e in read_examples(path)] == [f"t{i}" for i in range(8)]


def test_parquet_nested_text_column_is_refused(tmp_path):
    path = write_parquet(tmp_path / "d.parquet", [{"text": ["a", "b"]}])
    with pytest.raises(DataError, match=r"the schema of .*d\.parquet field 'text' is a list<.*> column, not text"):
        build_index(path)


def test_a_broken_parquet_file_is_one_line(tmp_path):
    path = tmp_path / "d.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(DataError, match=r"d\.parquet cannot be read as Parquet \(.*\); point data\.path") as info:
        build_index(path)
    assert "\n" not in str(info.value)


def test_empty_parquet_holds_no_examples(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "e.parquet")
    with pytest.raises(DataError, match=r"e\.parquet holds no examples"):
        build_index(tmp_path / "e.parquet")


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "hf"])
def test_read_examples_keeps_what_the_pass_built(tmp_path, fmt, monkeypatch):
    """The whole-list reader reads a line file or HF dataset once: the driver's pass hands over the Examples it
    validated, and nothing is read again."""
    writer, reference = {
        "jsonl": (write_jsonl, old_jsonl),
        "csv": (write_csv, old_csv),
        "hf": (save_hf, lambda p: hf_reference(p, None)),
    }[fmt]
    path = writer(tmp_path / (f"d.{fmt}" if fmt != "hf" else "d"), records(25))
    expected = reference(path)
    again = []
    monkeypatch.setattr(index_mod.Rows, "read", lambda self: again.append(len(self)))
    assert read_examples(path, sample=9, seed=2, **FIELDS) == old_select(expected, sample=9, seed=2)
    assert again == []


# -- data.limit on a file whose groups come in runs ---------------------------------------------------------


def test_a_limit_that_keeps_one_run_of_groups_is_warned():
    from rapids_attn.data.index import prefix_warning

    runs = [f"article{i // 100}" for i in range(2000)]  # 20 articles of 100 questions, one after another
    warn = prefix_warning(runs, 300)
    assert warn is not None and "from 3 of 20 groups" in warn and "random draw would cover about 20" in warn
    assert "data.sample: 300" in warn
    rng = np.random.default_rng(0)
    assert prefix_warning(list(rng.permutation(runs)), 300) is None  # a shuffled file's prefix is a fair draw
    assert prefix_warning(runs, 2000) is None  # nothing left out
    assert prefix_warning(["one"] * 50, 10) is None  # no groups to miss
    # exact expectation: 4 groups of 10, a draw of 10 misses a given group with probability C(30,10)/C(40,10)
    four = [g for g in "abcd" for _ in range(10)]
    assert "about 4;" in prefix_warning(four, 10)  # 1 group against 3.86: warned
    assert prefix_warning(four, 11) is None  # 2 groups: at least half of the expected 3.9


def test_squad_limit_carries_the_warning_and_sample_does_not(tmp_path):
    import json

    doc = {
        "data": [
            {
                "title": f"T{a}",
                "paragraphs": [
                    {"context": "c.", "qas": [{"id": f"{a}-{q}", "question": "q?", "answers": []} for q in range(20)]}
                ],
            }
            for a in range(10)
        ]
    }
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(doc))
    assert "from 2 of 10 groups" in build_index(path, format="squad", limit=30).warnings[0]
    assert build_index(path, format="squad", sample=30).warnings == ()
