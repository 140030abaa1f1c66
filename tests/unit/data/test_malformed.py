"""Each format's reader against malformed and hostile files of its kind: what it cannot read faithfully is
refused in preflight (:func:`build_index`) with one line that names the file and the line, row or column;
what it can read is read as the text it holds (a binary column decoded, never its ``b'...'`` repr). Records
are bounded before they are expensive: text over MAX_TEXT_CHARS characters, a line-file record over
MAX_RECORD_BYTES, JSON nested past Python's parser."""

from __future__ import annotations

import io
import json
import random
import tracemalloc
from decimal import Decimal
from pathlib import Path

import pytest

from rapids_attn.data import Example, build_index, linefiles, read_examples
from rapids_attn.data.fields import MAX_TEXT_CHARS
from rapids_attn.data.linefiles import MAX_RECORD_BYTES, LineReader
from rapids_attn.errors import DataError, UserError


def refused(path: Path, pattern: str, **kwargs) -> str:
    """The one-line DataError that indexing ``path`` raises; it matches ``pattern`` and names the file."""
    with pytest.raises(DataError, match=pattern) as info:
        build_index(path, **kwargs)
    message = str(info.value)
    assert isinstance(info.value, UserError)
    assert "\n" not in message and len(message) < 600, message
    assert str(path.name) in message, message
    return message


def write(path: Path, content: str | bytes) -> Path:
    path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    return path


ROWS = "".join(f"row {i},a\n" for i in range(4))  # lines 2-5 after a header "text,label"
TAIL = "".join(f"more {i},b\n" for i in range(15))

# -- csv -----------------------------------------------------------------------------------------------

BAD_CSV = [
    # the file: a quote opened on line 6 is never closed, and swallowed the 15 lines after it
    (
        "unclosed-quote",
        "text,label\n" + ROWS + '"unterminated,a\n' + TAIL,
        {},
        r"line 6 of .* opens a quoted field that is never closed \(it runs to the end of the file, line 21\)",
    ),
    # one column: every swallowed line fitted the header, so it used to read as "ok: 5 examples"
    (
        "unclosed-quote-one-column",
        "text\n" + "".join(f"row {i}\n" for i in range(4)) + '"open\n' + "x\n" * 15,
        {},
        r"line 6 of .* opens a quoted field that is never closed",
    ),
    # after a record whose quoted field spans two lines: named by the line the open quote is on, not the record's
    (
        "unclosed-after-quoted-newline",
        'text,b\nx,"ok\nmulti"\ny,"two\nlines\nmore\n',
        {},
        r"line 4 of .* opens a quoted field that is never closed \(.* line 6\)",
    ),
    (
        "unclosed-crlf-no-final-newline",
        'text\r\na\r\n"open\r\nb\r\nc',
        {},
        r"line 3 of .* opens a quoted field that is never closed \(.* line 5\)",
    ),
    ("unclosed-lone-quote-at-eof", 'text\na\n"', {}, r"line 3 of .* opens a quoted field that is never closed"),
    ("unclosed-in-header", '"text\na\nb\n', {}, r"line 1 of .* opens a quoted field that is never closed"),
    (
        "text-after-closing-quote",
        'text,label\nok,a\n"x"y,c\n',
        {},
        r"line 3 of .* is not valid CSV \(',' expected after '\"'\)",
    ),
    # a quote opened on line 2 closes inside a later line's text: named where it breaks, and where it began
    (
        "quote-closed-later",
        'text,label\n"open,b\nmore\nhe said "hi",c\n',
        {},
        r"line 4 of .* \(in the record that starts on line 2\) is not valid CSV",
    ),
    (
        "too-many-fields",
        "text,label\na,b\nc,d,e\n",
        {},
        r"line 3 of .* has a different number of columns \(3\) than the header \(2\)",
    ),
    (
        "too-few-fields",
        "text,label\na,b\nc\n",
        {},
        r"line 3 of .* has a different number of columns \(1\) than the header \(2\)",
    ),
    ("nul-byte", "text,label\na,b\nc\0d,e\n", {}, r"line 3 of .* holds a NUL byte \(offset 16\)"),
    ("utf16", "text\nhello\n".encode("utf-16-le"), {}, r"line 1 of .* holds a NUL byte"),
    (
        "field-over-the-bound",
        'text\n"' + "x" * (MAX_TEXT_CHARS + 1) + '"\n',
        {},
        r"the record that starts on line 2 of .* has a field longer than 1,000,000 characters",
    ),
    # an unclosed quote in a large file stops at the bound, not at the end of the file
    (
        "runaway-quote",
        'text\nok\n"' + ("y" * 999 + "\n") * 1500,
        {},
        r"the record that starts on line 3 of .* has a field longer than 1,000,000 characters",
    ),
    (
        "text-and-pair-over-the-bound",
        f"a,b\n{'x' * 600_000},{'y' * 400_001}\n",
        {"text_fields": ["a", "b"]},
        r"line 2 of .* holds 1,000,001 characters of text, more than the 1,000,000 one record may hold",
    ),
]


@pytest.mark.parametrize(("name", "content", "kwargs", "pattern"), BAD_CSV, ids=[c[0] for c in BAD_CSV])
def test_malformed_csv_is_refused_naming_the_line(tmp_path, name, content, kwargs, pattern):
    refused(write(tmp_path / f"{name}.csv", content), pattern, **kwargs)


def test_an_unclosed_quote_in_tsv_is_refused_too(tmp_path):
    path = write(tmp_path / "d.tsv", 'text\tlabel\na\tb\n"open\tc\nd\te\n')
    refused(path, r"line 3 of .*d\.tsv opens a quoted field that is never closed")


GOOD_CSV = [
    ("bom-header", b"\xef\xbb\xbftext,label\nhello,c\n", [("hello", "c")]),
    ("quotes-inside-an-unquoted-field", 'text,label\nsay "hi" now,c\n', [('say "hi" now', "c")]),
    ("doubled-quotes", 'text,label\n"say ""hi"", now",c\n', [('say "hi", now', "c")]),
    (
        "quoted-newlines-and-blank-lines",
        'text,label\r\n"one\r\ntwo",a\r\n\r\n"three\nfour",b\r\n',
        [("one\r\ntwo", "a"), ("three\nfour", "b")],
    ),
    ("text-at-the-bound", "text,label\n" + "x" * MAX_TEXT_CHARS + ",c\n", [("x" * MAX_TEXT_CHARS, "c")]),
]


@pytest.mark.parametrize(("name", "content", "want"), GOOD_CSV, ids=[c[0] for c in GOOD_CSV])
def test_awkward_but_valid_csv_reads_as_written(tmp_path, name, content, want):
    path = write(tmp_path / f"{name}.csv", content)
    assert [(ex.text, ex.label) for ex in read_examples(path, label_field="label")] == want


def test_a_csv_record_over_the_byte_bound_is_refused_where_it_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(linefiles, "MAX_RECORD_BYTES", 4096)
    path = write(tmp_path / "d.csv", "text,label\nok,a\n" + '"many short lines,b\n' + "z\n" * 5000)
    refused(path, r"the record that starts on line 3 of .*d\.csv runs past 4,096 bytes, .* by line \d+; if a quote")


# -- line files: the record's bytes bounded before it is parsed -------------------------------------------


def test_a_jsonl_line_over_the_byte_bound_is_refused_unparsed(tmp_path, monkeypatch):
    """A line far over the bound is refused by its line number, and reading it never holds much more than the
    bound (the issue's 100 MB line, scaled down with the bound)."""
    monkeypatch.setattr(linefiles, "MAX_RECORD_BYTES", 1 << 20)
    path = tmp_path / "d.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        f.write('{"text": "a"}\n\n{"text": "' + "x" * (20 << 20) + '"}\n{"text": "b"}\n')
    tracemalloc.start()
    try:
        refused(path, r"line 3 of .*d\.jsonl is longer than 1,048,576 bytes, the bound on one record")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


def test_the_default_byte_bound_refuses_a_line_past_it(tmp_path):
    path = tmp_path / "d.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        f.write('{"text": "' + "x" * MAX_RECORD_BYTES + '"}\n')
    refused(path, rf"line 1 of .*d\.jsonl is longer than {MAX_RECORD_BYTES:,} bytes")


@pytest.mark.parametrize("limit", [5, 6, 7, 64])
def test_the_bounded_reader_splits_lines_as_text_mode_does(limit):
    """Random files of \\n, \\r\\n and lone \\r endings (a "\\r\\n" may straddle a read's cut): the lines are
    exactly bytes.splitlines', and the first line over the bound is refused by its number."""
    rng = random.Random(limit)
    for _ in range(2000):
        parts = [
            rng.choice(["a", "bb", "cccc", ""]) + rng.choice(["\n", "\r", "\r\n"]) for _ in range(rng.randint(0, 8))
        ]
        data = ("".join(parts) + rng.choice(["", "z"])).encode()
        want = data.splitlines(keepends=True)
        reader, got, error = LineReader(io.BytesIO(data), "f", 0, 0, limit=limit), [], None
        try:
            while True:
                reader.begin()
                got.append(next(reader).encode())
        except StopIteration:
            pass
        except DataError as e:
            error = str(e)
        too_long = [i for i, w in enumerate(want) if len(w) > limit]
        if not too_long:
            assert got == want and error is None, data
        else:
            assert got == want[: too_long[0]], data
            assert error and error.startswith(f"data.path: line {too_long[0] + 1} of f is longer than"), (data, error)


# -- jsonl, text and SQuAD JSON --------------------------------------------------------------------------

DEEP = "[" * 200_000

BAD_JSON = [
    ("deep.jsonl", '{"text": "a"}\n' + DEEP + "\n", {}, r"line 2 of .*deep\.jsonl nests JSON too deeply to parse"),
    (
        "deep-field.jsonl",
        '{"text": "a"}\n\n{"text": "b", "meta": ' + DEEP + "}\n",
        {},
        r"line 3 of .* nests JSON too deeply",
    ),
    (
        "deep.json",
        '{"version": "v2.0",\n "data": [\n' + DEEP + "\n",
        {},
        r"line 3 of .*deep\.json nests JSON too deeply",
    ),
    (
        "long.jsonl",
        '{"text": "a"}\n' + json.dumps({"text": "x" * (MAX_TEXT_CHARS + 1)}) + "\n",
        {},
        r"line 2 of .* holds 1,000,001 characters of text",
    ),
    (
        "long-pair.jsonl",
        json.dumps({"q": "x" * 600_000, "c": "é" * 400_001}) + "\n",
        {"text_fields": ["q", "c"]},
        r"line 1 of .* holds 1,000,001 characters",
    ),
    (
        "long.txt",
        "short\n\n" + "x" * (MAX_TEXT_CHARS + 1) + "\n",
        {},
        r"line 3 of .*long\.txt holds 1,000,001 characters",
    ),
    ("nul.jsonl", '{"text": "a"}\n{"text": "b\0"}\n', {}, r"line 2 of .* holds a NUL byte"),
    ("nul.txt", "a\nb\0c\n", {}, r"line 2 of .*nul\.txt holds a NUL byte"),
    ("true.jsonl", '{"text": "a"}\n{"text": true}\n', {}, r"line 2 of .* field 'text' is true, not text"),
    ("list.jsonl", '{"text": ["a"]}\n', {}, r"line 1 of .* field 'text' is a list, not text"),
]


@pytest.mark.parametrize(("name", "content", "kwargs", "pattern"), BAD_JSON, ids=[c[0] for c in BAD_JSON])
def test_malformed_json_and_text_files_are_refused_naming_the_line(tmp_path, name, content, kwargs, pattern):
    refused(write(tmp_path / name, content), pattern, **kwargs)


def _squad(question: str, context: str, paragraphs: int = 1) -> dict:
    qas = [{"id": "q1", "question": question, "answers": []}]
    return {"data": [{"title": "T", "paragraphs": [{"context": context, "qas": qas}] * paragraphs}]}


@pytest.mark.parametrize(
    ("doc", "unit", "pattern"),
    [
        (
            _squad("Why?", "x" * MAX_TEXT_CHARS),
            "question",
            r"data\[0\]\.paragraphs\[0\]\.qas\[0\] \(with its context\) in .* holds 1,000,004 characters",
        ),
        (
            _squad("Why?", "x" * 500_000, paragraphs=2),
            "article",
            r"data\[0\] \(its paragraphs joined\) in .* holds 1,000,002 characters",
        ),
    ],
)
def test_squad_records_over_the_bound_are_refused(tmp_path, doc, unit, pattern):
    refused(write(tmp_path / "long.json", json.dumps(doc)), pattern, squad_unit=unit)


def test_numbers_in_a_text_field_are_read_as_their_text(tmp_path):
    path = write(tmp_path / "d.jsonl", '{"text": 5}\n{"text": 2.5}\n')
    assert [ex.text for ex in read_examples(path)] == ["5", "2.5"]


# -- parquet -------------------------------------------------------------------------------------------


def _parquet(path: Path, columns: dict, row_group_size: int = 4) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return path


def _binary_kinds():
    import pyarrow as pa

    return {"binary": pa.binary(), "large_binary": pa.large_binary(), "binary_view": pa.binary_view()}


@pytest.mark.parametrize("kind", ["binary", "large_binary", "binary_view", "dictionary"])
def test_a_binary_parquet_text_column_is_decoded_as_utf8(tmp_path, kind):
    import pyarrow as pa

    texts = [f"hello wörld {i}" for i in range(10)]
    texts[6] = ""
    values = [t.encode("utf-8") for t in texts]
    if kind == "dictionary":
        column = pa.array(values, pa.binary()).dictionary_encode()
    else:
        column = pa.array(values, _binary_kinds()[kind])
    ids = pa.array([f"k{i}".encode() for i in range(10)], pa.binary())
    path = _parquet(tmp_path / "d.parquet", {"text": column, "k": ids})
    examples = read_examples(path, id_field="k")
    assert [ex.text for ex in examples] == texts  # not "b'hello w\\xc3\\xb6rld 0'"
    assert [ex.id for ex in examples] == [f"k{i}" for i in range(10)]
    index = build_index(path, id_field="k")
    assert index.empty_records == (6,)
    assert [ex.text for ex in index.read([9, 0])] == [texts[9], texts[0]]  # a worker's read decodes the same


@pytest.mark.parametrize("kind", ["binary", "large_binary", "binary_view"])
def test_a_binary_parquet_text_column_that_is_not_utf8_is_refused_naming_row_and_column(tmp_path, kind):
    import pyarrow as pa

    values = [f"t{i}".encode() for i in range(20)]
    values[13] = b"caf\xe9"
    path = _parquet(tmp_path / "d.parquet", {"q": pa.array(["q"] * 20), "ctx": pa.array(values, _binary_kinds()[kind])})
    refused(
        path,
        r"row 13 of .*d\.parquet field 'ctx' holds bytes that are not UTF-8 text \(bad byte at offset 3 of the value\)",
        text_fields=["q", "ctx"],
    )


def test_parquet_number_columns_are_read_as_their_text(tmp_path):
    import pyarrow as pa

    path = _parquet(
        tmp_path / "d.parquet",
        {
            "i": pa.array([1, 2]),
            "f": pa.array([1.5, 2.0]),
            "d": pa.array([Decimal("1.50"), Decimal(2)], pa.decimal128(5, 2)),
        },
    )
    assert [(ex.text, ex.text_pair) for ex in read_examples(path, text_fields=["i", "f"])] == [
        ("1", "1.5"),
        ("2", "2.0"),
    ]
    assert [ex.text for ex in read_examples(path, text_fields=["d"])] == ["1.50", "2.00"]


def _not_text_columns():
    import pyarrow as pa

    return {
        "bool": (pa.array([True, False]), "bool"),
        "timestamp": (pa.array([0, 1], pa.timestamp("s")), r"timestamp\[m?s\]"),
        "date": (pa.array([0, 1], pa.date32()), r"date32\[day\]"),
        "struct": (pa.array([{"a": "x"}, {"a": "y"}]), r"struct<a: string>"),
        "list": (pa.array([["a"], ["b"]]), r"list<.*>"),
        "null": (pa.array([None, None], pa.null()), "null"),
        "fixed_size_binary": (pa.array([b"ab", b"cd"], pa.binary(2)), r"fixed_size_binary\[2\]"),
    }


@pytest.mark.parametrize("kind", ["bool", "timestamp", "date", "struct", "list", "null", "fixed_size_binary"])
def test_a_parquet_text_column_of_another_type_is_refused_naming_it(tmp_path, kind):
    column, shown = _not_text_columns()[kind]
    path = _parquet(tmp_path / "d.parquet", {"q": ["a", "b"], "x": column})
    refused(path, rf"the schema of .*d\.parquet field 'x' is a {shown} column, not text", text_fields=["q", "x"])


def test_a_parquet_row_over_the_bound_is_refused_in_the_pass(tmp_path):
    """Found by the driver's pass (from the text columns, row groups whose size leaves room for it), the text
    and its pair counted together."""
    rows = 9
    text = ["a"] * rows
    ctx = ["c"] * rows
    text[7], ctx[7] = "b" * 600_000, "é" * 400_001
    text[2] = "x" * (MAX_TEXT_CHARS - 1)  # with its pair "c": at the bound, kept
    path = _parquet(tmp_path / "d.parquet", {"text": text, "ctx": ctx}, row_group_size=3)
    refused(
        path,
        r"row 7 of .*d\.parquet holds 1,000,001 characters of text, more than the 1,000,000",
        text_fields=["text", "ctx"],
    )
    assert len(build_index(path)) == rows  # the text column alone is within the bound


# -- saved HuggingFace datasets ----------------------------------------------------------------------------


@pytest.fixture
def hf():
    return pytest.importorskip("datasets")


def test_a_binary_hf_text_column_is_decoded(tmp_path, hf):
    hf.Dataset.from_dict({"text": ["é one".encode(), b"two"]}).save_to_disk(str(tmp_path / "ds"))
    assert read_examples(tmp_path / "ds") == [Example(id="0", text="é one"), Example(id="1", text="two")]


@pytest.mark.parametrize(
    ("values", "pattern"),
    [
        ([b"ok", b"ok", b"\xfe"], r"row 2 of dataset .*ds field 'text' holds bytes that are not UTF-8 text"),
        ([True, False], r"row 0 of dataset .*ds field 'text' is true, not text"),
        ([["a"], ["b"]], r"row 0 of dataset .*ds field 'text' is a list, not text"),
        (["a", "x" * (MAX_TEXT_CHARS + 1)], r"row 1 of dataset .*ds holds 1,000,001 characters of text"),
    ],
    ids=["not-utf8", "bool", "list", "over-the-bound"],
)
def test_bad_hf_text_columns_are_refused_naming_the_row(tmp_path, hf, values, pattern):
    hf.Dataset.from_dict({"text": values}).save_to_disk(str(tmp_path / "ds"))
    refused(tmp_path / "ds", pattern)


@pytest.mark.parametrize(
    ("ids", "labels", "pattern"),
    [
        ([b"k0", b"", b"k2"], [b"a"] * 3, r"row 1 of .*d\.parquet has an empty id in field 'k'"),
        ([b"k0", b"k\xff", b"k2"], [b"a"] * 3, r"row 1 of .*d\.parquet field 'k' holds bytes .* set data\.id_field to"),
        ([b"k0", b"k1", b"k2"], [b"a", b"b", b"\xc3"], r"row 2 of .*d\.parquet field 'y' .* set data\.label_field to"),
    ],
    ids=["empty-id", "id-not-utf8", "label-not-utf8"],
)
def test_binary_id_and_label_columns_are_text_or_refused(tmp_path, ids, labels, pattern):
    import pyarrow as pa

    path = _parquet(tmp_path / "d.parquet", {"text": ["a", "b", "c"], "k": pa.array(ids), "y": pa.array(labels)})
    with pytest.raises(DataError, match=pattern) as info:
        read_examples(path, id_field="k", label_field="y")
    assert "\n" not in str(info.value)
    good = _parquet(tmp_path / "g.parquet", {"text": ["a"], "k": pa.array([b"k0"]), "y": pa.array([b"pos"])})
    assert read_examples(good, id_field="k", label_field="y") == [Example(id="k0", text="a", label="pos")]
