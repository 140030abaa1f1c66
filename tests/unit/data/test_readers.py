"""Tests for rapids_attn.data.readers: every format, auto detection, selection and error messages."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from helpers import REPO, SHARED_SQUAD

from rapids_attn.data import Example, read_examples
from rapids_attn.errors import DataError

QUICKSTART = REPO / "rapids_attn" / "data" / "quickstart.json"


def squad_doc(with_impossible: bool = True) -> dict:
    def qa(qid, question, impossible):
        out = {"id": qid, "question": question, "answers": [] if impossible else [{"text": "Ann", "answer_start": 0}]}
        if with_impossible:
            out["is_impossible"] = impossible
        return out

    return {
        "version": "v2.0" if with_impossible else "1.1",
        "data": [
            {
                "title": "Alpha",
                "paragraphs": [
                    {
                        "context": "Ann met Bob.",
                        "qas": [qa("a1", "Who met Bob?", False), qa("a2", "Who met Cy?", True)],
                    },
                    {"context": "Cy ran.", "qas": [qa("a3", "Who ran?", False)]},
                ],
            },
            {"title": "Beta", "paragraphs": [{"context": "Dee sang.", "qas": [qa("b1", "Who sang?", True)]}]},
        ],
    }


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def write_jsonl(path: Path, records, blank_lines: bool = False) -> Path:
    sep = "\n\n" if blank_lines else "\n"
    path.write_text(sep.join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    return path


def numbered(n: int) -> list[dict]:
    return [{"text": f"sentence {i}"} for i in range(n)]


# --------------------------------------------------------------------------------------------- squad


def test_squad_fields_group_and_label(tmp_path):
    path = write_json(tmp_path / "dev.json", squad_doc())
    examples = read_examples(path, format="squad")
    assert examples == [
        Example(
            id="a1",
            text="Who met Bob?",
            text_pair="Ann met Bob.",
            group="Alpha",
            label="answerable",
            answers=("Ann",),
            answer_starts=(0,),
        ),
        Example(id="a2", text="Who met Cy?", text_pair="Ann met Bob.", group="Alpha", label="impossible"),
        Example(
            id="a3",
            text="Who ran?",
            text_pair="Cy ran.",
            group="Alpha",
            label="answerable",
            answers=("Ann",),
            answer_starts=(0,),
        ),
        Example(id="b1", text="Who sang?", text_pair="Dee sang.", group="Beta", label="impossible"),
    ]


def test_squad_articles_are_one_document_each(tmp_path):
    """data.squad_unit: article: an article's paragraphs joined by blank lines, no question, in file order."""
    from rapids_attn.data import build_index

    path = write_json(tmp_path / "dev.json", squad_doc())
    docs = build_index(path, squad_unit="article").inline
    assert list(docs) == [
        Example(id="article-0", text="Ann met Bob.\n\nCy ran.", group="Alpha", label="2"),
        Example(id="article-1", text="Dee sang.", group="Beta", label="1"),
    ]
    assert not build_index(path, squad_unit="article").pairs and build_index(path).pairs
    with pytest.raises(DataError, match="data.squad_unit: 'article' applies to SQuAD JSON only"):
        build_index(write_json(tmp_path / "t.jsonl", {"text": "x"}), format="jsonl", squad_unit="article")


def test_without_is_impossible_an_empty_answer_list_is_impossible(tmp_path):
    """SQuAD 2.0 marks an unanswerable question by an empty ``answers`` list; ``is_impossible`` is an extra
    some files leave out. Without it the labels must be the same as with it."""
    with_flag = read_examples(write_json(tmp_path / "v2.json", squad_doc()))
    without = read_examples(write_json(tmp_path / "v2-no-flag.json", squad_doc(with_impossible=False)))
    assert (
        [e.label for e in without]
        == [e.label for e in with_flag]
        == [
            "answerable",
            "impossible",
            "answerable",
            "impossible",
        ]
    )


def test_squad_1_1_is_answerable_and_a_test_file_unlabelled(tmp_path):
    doc = squad_doc(with_impossible=False)
    for article in doc["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                qa["answers"] = [{"text": "Ann", "answer_start": 0}]
    assert {e.label for e in read_examples(write_json(tmp_path / "v11.json", doc))} == {"answerable"}
    for article in doc["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                del qa["answers"]
    assert {e.label for e in read_examples(write_json(tmp_path / "test.json", doc))} == {""}


@pytest.mark.parametrize(
    ("key", "value", "says"), [("is_impossible", "yes", "not true or false"), ("answers", {}, "not a list")]
)
def test_squad_bad_label_fields_name_the_location(tmp_path, key, value, says):
    doc = squad_doc(with_impossible=key == "is_impossible")  # answers decide only without is_impossible
    doc["data"][0]["paragraphs"][1]["qas"][0][key] = value
    path = write_json(tmp_path / "bad.json", doc)
    with pytest.raises(DataError, match=rf"data\[0\]\.paragraphs\[1\]\.qas\[0\]\.{key} in .*bad\.json .*{says}"):
        read_examples(path)


def test_squad_missing_question_names_location(tmp_path):
    doc = squad_doc()
    del doc["data"][1]["paragraphs"][0]["qas"][0]["question"]
    path = write_json(tmp_path / "bad.json", doc)
    with pytest.raises(DataError, match=r"data\[1\]\.paragraphs\[0\]\.qas\[0\] in .*bad\.json has no 'question'"):
        read_examples(path)


def test_squad_wrong_type_names_location(tmp_path):
    doc = squad_doc()
    doc["data"][0]["paragraphs"][1]["context"] = ["not", "text"]
    path = write_json(tmp_path / "bad.json", doc)
    with pytest.raises(DataError, match=r"data\[0\]\.paragraphs\[1\]\.context in .*bad\.json is a list"):
        read_examples(path)


def test_squad_without_data_list_suggests_jsonl(tmp_path):
    path = write_json(tmp_path / "records.json", [{"text": "a"}])
    with pytest.raises(DataError, match=r"no top-level 'data' list.*data\.format: jsonl"):
        read_examples(path)


def test_squad_invalid_json_names_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"data": [\n{"title": "x",\n oops}]}', encoding="utf-8")
    with pytest.raises(DataError, match=r"line 3 of .*broken\.json is not valid JSON"):
        read_examples(path)


# --------------------------------------------------------------------------------------------- jsonl


def test_jsonl_text_pair_and_named_fields(tmp_path):
    records = [
        {"qid": "q1", "q": "Why?", "ctx": "Because.", "topic": "t1", "y": 1},
        {"qid": "q2", "q": "How?", "ctx": "Thus.", "topic": "t2", "y": 0},
    ]
    path = write_jsonl(tmp_path / "data.jsonl", records)
    examples = read_examples(path, text_fields=["q", "ctx"], id_field="qid", group_field="topic", label_field="y")
    assert examples == [
        Example(id="q1", text="Why?", text_pair="Because.", group="t1", label="1"),
        Example(id="q2", text="How?", text_pair="Thus.", group="t2", label="0"),
    ]


def test_jsonl_defaults_text_field_and_index_ids_skipping_blank_lines(tmp_path):
    path = write_jsonl(tmp_path / "data.ndjson", numbered(3), blank_lines=True)
    examples = read_examples(path)
    assert [(ex.id, ex.text, ex.text_pair, ex.group, ex.label) for ex in examples] == [
        ("0", "sentence 0", None, "", ""),
        ("1", "sentence 1", None, "", ""),
        ("2", "sentence 2", None, "", ""),
    ]


def test_jsonl_bad_line_reports_line_number(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"text": "ok"}\n\n{"text": oops}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"line 3 of .*data\.jsonl is not valid JSON"):
        read_examples(path)


def test_jsonl_non_object_line(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"text": "ok"}\n["a", "b"]\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"line 2 of .*data\.jsonl is a JSON list, not an object"):
        read_examples(path)


def test_jsonl_missing_field_lists_existing_fields(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", [{"id": "1", "q": "a", "ctx": "b"}])
    with pytest.raises(
        DataError,
        match=r"line 1 of .*data\.jsonl has no field 'question'; set "
        r"data\.text_fields .*\(found: id, q, ctx\)",
    ):
        read_examples(path, text_fields=["question"])


def test_jsonl_missing_id_field_names_id_setting(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", [{"text": "a", "key": "k"}])
    with pytest.raises(DataError, match=r"has no field 'uid'; set data\.id_field .*\(found: text, key\)"):
        read_examples(path, id_field="uid")


def test_jsonl_null_text_is_rejected(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", [{"text": "a"}, {"text": None}])
    with pytest.raises(DataError, match=r"line 2 of .*field 'text' is empty"):
        read_examples(path)


@pytest.mark.parametrize("fields", [[], ["a", "b", "c"]])
def test_text_fields_must_have_one_or_two_names(tmp_path, fields):
    path = write_jsonl(tmp_path / "data.jsonl", numbered(2))
    with pytest.raises(DataError, match=r"data\.text_fields: must list 1 or 2 field names"):
        read_examples(path, text_fields=fields)


# ----------------------------------------------------------------------------------------------- csv


def test_csv_with_pair_and_fields(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text('id,a,b,g\nx1,"hello, world",second,G\n\nx2,bye,again,H\n', encoding="utf-8")
    examples = read_examples(path, text_fields=["a", "b"], id_field="id", group_field="g")
    assert examples == [
        Example(id="x1", text="hello, world", text_pair="second", group="G"),
        Example(id="x2", text="bye", text_pair="again", group="H"),
    ]


def test_tsv_uses_tab_delimiter(tmp_path):
    path = tmp_path / "data.tsv"
    path.write_text("text\tlabel\na, b\tpos\nc\tneg\n", encoding="utf-8")
    examples = read_examples(path, label_field="label")
    assert [(ex.id, ex.text, ex.label) for ex in examples] == [("0", "a, b", "pos"), ("1", "c", "neg")]


def test_csv_missing_column_lists_header(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("sentence,label\nhi,1\n", encoding="utf-8")
    with pytest.raises(
        DataError,
        match=r"header \(line 1\) of .*data\.csv has no field 'text'; "
        r".*\(found: sentence, label\)",
    ):
        read_examples(path)


def test_csv_short_row_names_line(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("text,label\nhi,1\nshort\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"line 3 of .*data\.csv has a different number of columns"):
        read_examples(path, label_field="label")


# ---------------------------------------------------------------------------------------------- text


def test_text_one_example_per_non_empty_line(tmp_path):
    path = tmp_path / "lines.txt"
    path.write_text("first line\n\n   \nsecond line\n", encoding="utf-8")
    examples = read_examples(path)
    assert examples == [Example(id="1", text="first line"), Example(id="4", text="second line")]


# ------------------------------------------------------------------------------------------------ hf


def test_hf_dataset_saved_to_disk(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"sentence": ["a b", "c d"], "key": ["k1", "k2"], "y": [3, 4]})
    ds.save_to_disk(str(tmp_path / "ds"))
    examples = read_examples(tmp_path / "ds", text_fields=["sentence"], id_field="key", label_field="y")
    assert examples == [Example(id="k1", text="a b", label="3"), Example(id="k2", text="c d", label="4")]


def test_hf_dataset_missing_field_lists_columns(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"sentence": ["a"], "y": [1]}).save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(DataError, match=r"has no field 'text'; .*\(found: sentence, y\)"):
        read_examples(tmp_path / "ds", format="hf")


def test_hf_dataset_dict_prefers_validation_split(tmp_path, caplog):
    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": ["train 0", "train 1"]}),
            "validation": datasets.Dataset.from_dict({"text": ["val 0"]}),
        }
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    with caplog.at_level(logging.INFO, logger="rapids_attn.data.readers"):
        examples = read_examples(tmp_path / "dd")
    assert examples == [Example(id="0", text="val 0")]
    assert "using split 'validation'" in caplog.text


def test_hf_dataset_dict_with_several_splits_and_no_validation_is_refused(tmp_path):
    """No split named validation and more than one: which to read is the user's choice (it used to be the
    first split, said only in a log line), made by pointing data.path at the split's own folder."""
    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict(
        {
            "test": datasets.Dataset.from_dict({"text": ["test 0"]}),
            "train": datasets.Dataset.from_dict({"text": ["train 0"]}),
        }
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DataError) as info:
        read_examples(tmp_path / "dd", format="hf")
    message = str(info.value)
    assert "\n" not in message
    assert f"{tmp_path / 'dd'} is a DatasetDict with splits 'test', 'train' and none named 'validation'" in message
    assert f"set data.path to the split's own folder, e.g. {tmp_path / 'dd' / 'test'}" in message
    # the folder the message names is read as that split alone
    assert [ex.text for ex in read_examples(tmp_path / "dd" / "train")] == ["train 0"]


def test_hf_dataset_dict_with_one_split_uses_it(tmp_path, caplog):
    datasets = pytest.importorskip("datasets")
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["train 0"]})}).save_to_disk(
        str(tmp_path / "dd")
    )
    with caplog.at_level(logging.INFO, logger="rapids_attn.data.readers"):
        examples = read_examples(tmp_path / "dd", format="hf")
    assert [ex.text for ex in examples] == ["train 0"]
    assert "using split 'train'" in caplog.text


def test_hf_format_on_a_file_is_rejected(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", numbered(1))
    with pytest.raises(DataError, match=r"is not a directory written by datasets' save_to_disk"):
        read_examples(path, format="hf")


# -------------------------------------------------------------------------------------- auto detection


@pytest.mark.parametrize(
    "name, content, expected_text",
    [
        ("a.json", json.dumps(squad_doc()), "Who met Bob?"),
        ("a.jsonl", '{"text": "from jsonl"}\n', "from jsonl"),
        ("a.NDJSON", '{"text": "from ndjson"}\n', "from ndjson"),
        ("a.csv", "text\nfrom csv\n", "from csv"),
        ("a.tsv", "text\tother\nfrom tsv\tx\n", "from tsv"),
        ("a.txt", "from txt\n", "from txt"),
    ],
)
def test_auto_detects_format_from_suffix(tmp_path, name, content, expected_text):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    assert read_examples(path)[0].text == expected_text


def test_auto_unknown_suffix_asks_for_format(tmp_path):
    path = tmp_path / "data.xml"
    path.write_bytes(b"<a/>")
    with pytest.raises(DataError, match=r"data\.format: cannot tell the format of .*data\.xml.*set data\.format"):
        read_examples(path)


def test_auto_plain_directory_is_rejected(tmp_path):
    (tmp_path / "folder").mkdir()
    with pytest.raises(DataError, match=r"is a directory but not a saved HuggingFace dataset"):
        read_examples(tmp_path / "folder")


def test_explicit_format_overrides_suffix(tmp_path):
    path = tmp_path / "notes.dat"
    path.write_text("one\ntwo\n", encoding="utf-8")
    assert [ex.text for ex in read_examples(path, format="text")] == ["one", "two"]


def test_unknown_format_is_rejected(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", numbered(1))
    with pytest.raises(DataError, match=r"data\.format: unknown format 'xml'"):
        read_examples(path, format="xml")


# --------------------------------------------------------------------------------- limit and sample


def test_limit_keeps_first_examples(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", numbered(10))
    assert [ex.id for ex in read_examples(path, limit=3)] == ["0", "1", "2"]
    assert len(read_examples(path, limit=50)) == 10


def test_sample_is_seeded_and_keeps_order(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", numbered(100))
    first = [int(ex.id) for ex in read_examples(path, sample=10, seed=7)]
    again = [int(ex.id) for ex in read_examples(path, sample=10, seed=7)]
    other = [int(ex.id) for ex in read_examples(path, sample=10, seed=8)]
    assert len(first) == len(set(first)) == 10
    assert first == again
    assert first != other
    assert first == sorted(first)
    assert first != list(range(10))


def test_sample_larger_than_dataset_keeps_all(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", numbered(5))
    assert [ex.id for ex in read_examples(path, sample=5)] == ["0", "1", "2", "3", "4"]
    assert len(read_examples(path, sample=99)) == 5


def test_limit_applies_after_sample(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", numbered(100))
    sampled = read_examples(path, sample=20, seed=3)
    assert read_examples(path, sample=20, seed=3, limit=5) == sampled[:5]


@pytest.mark.parametrize(
    "kwargs, name", [({"limit": 0}, "limit"), ({"sample": -2}, "sample"), ({"limit": 2.5}, "limit")]
)
def test_limit_and_sample_must_be_positive_integers(tmp_path, kwargs, name):
    path = write_jsonl(tmp_path / "data.jsonl", numbered(3))
    with pytest.raises(DataError, match=rf"data\.{name}: must be a positive integer"):
        read_examples(path, **kwargs)


# ------------------------------------------------------------------------------------ common checks


def test_duplicate_ids_are_rejected(tmp_path):
    path = write_jsonl(
        tmp_path / "data.jsonl", [{"text": "a", "k": "x"}, {"text": "b", "k": "y"}, {"text": "c", "k": "x"}]
    )
    with pytest.raises(DataError, match=r"duplicate id 'x' in .*data\.jsonl \(records 0 and 2"):
        read_examples(path, id_field="k")


def test_duplicate_squad_ids_are_rejected(tmp_path):
    doc = squad_doc()
    doc["data"][1]["paragraphs"][0]["qas"][0]["id"] = "a1"
    path = write_json(tmp_path / "dev.json", doc)
    with pytest.raises(DataError, match=r"duplicate id 'a1'"):
        read_examples(path)


def test_missing_path(tmp_path):
    with pytest.raises(DataError, match=r"data\.path: no such file or directory: .*nope\.jsonl"):
        read_examples(tmp_path / "nope.jsonl")


@pytest.mark.parametrize(
    "name, content",
    [
        ("empty.jsonl", "\n\n"),
        ("empty.csv", ""),
        ("header_only.csv", "text\n"),
        ("empty.txt", "\n  \n"),
        ("empty.json", '{"version": "v2.0", "data": []}'),
    ],
)
def test_empty_dataset_is_rejected(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=rf"{name} holds no examples"):
        read_examples(path)


def test_non_utf8_file_is_rejected(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"is not UTF-8 text"):
        read_examples(path)


def test_error_messages_are_one_line(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"text": "a"}\n{bad\n', encoding="utf-8")
    with pytest.raises(DataError) as info:
        read_examples(path)
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------------------- shipped and shared


def test_quickstart_dataset_loads_with_valid_spans():
    examples = read_examples(QUICKSTART)
    assert 40 <= len(examples) <= 50
    assert {ex.label for ex in examples} == {"answerable", "impossible"}
    assert len({ex.group for ex in examples}) == 6
    assert all(ex.text and ex.text_pair for ex in examples)

    doc = json.loads(QUICKSTART.read_text(encoding="utf-8"))
    assert doc["version"] == "v2.0"
    n_impossible = 0
    for article in doc["data"]:
        for paragraph in article["paragraphs"]:
            context = paragraph["context"]
            for qa in paragraph["qas"]:
                if qa["is_impossible"]:
                    n_impossible += 1
                    assert qa["answers"] == [] and qa["plausible_answers"]
                else:
                    assert qa["answers"]
                for answer in qa["answers"] + qa.get("plausible_answers", []):
                    start = answer["answer_start"]
                    assert context[start : start + len(answer["text"])] == answer["text"], qa["id"]
    assert 0.15 <= n_impossible / len(examples) <= 0.35


@pytest.mark.skipif(not SHARED_SQUAD.is_file(), reason=f"shared SQuAD 2.0 dev half not found at {SHARED_SQUAD}")
def test_shared_squad_dev_half():
    examples = read_examples(SHARED_SQUAD, limit=500)
    assert len(examples) == 500
    assert all(ex.text and ex.text_pair and ex.group for ex in examples)
    assert len(read_examples(SHARED_SQUAD)) == 6078
