"""The format registry: one registration per data format, read by the job schema, ``auto`` and the reader."""

import subprocess
import sys
import typing

import pytest

from rapids_attn.data import formats
from rapids_attn.data.fields import FieldSpec
from rapids_attn.data.fingerprint import content_fingerprint, file_fingerprint, folder_fingerprint
from rapids_attn.data.formats import FORMATS, REGISTRY, SUFFIX_FORMATS, Format, Source
from rapids_attn.errors import JobConfigError


def test_the_formats_and_their_order_are_the_ones_jobs_always_took():
    """The job schema's values, auto's suffixes and the fingerprint rules are what they were before the registry:
    a job, an auto-detected file or a store key that worked before works the same."""
    assert FORMATS == ("auto", "squad", "jsonl", "csv", "text", "parquet", "hf")
    assert SUFFIX_FORMATS == {
        ".json": "squad",
        ".jsonl": "jsonl",
        ".ndjson": "jsonl",
        ".csv": "csv",
        ".tsv": "csv",
        ".txt": "text",
        ".parquet": "parquet",
    }
    assert [n for n, f in REGISTRY.items() if f.fingerprint is folder_fingerprint] == ["hf"]
    assert all(f.fingerprint in (file_fingerprint, folder_fingerprint) for f in REGISTRY.values())
    assert REGISTRY["hf"].markers == ("dataset_info.json", "state.json", "dataset_dict.json")


def test_the_job_schema_takes_its_format_values_from_the_registry():
    from rapids_attn.job import DataConfig

    assert typing.get_args(DataConfig.model_fields["format"].annotation) == FORMATS
    assert DataConfig.model_json_schema()["properties"]["format"]["enum"] == list(FORMATS)


def test_a_bad_format_in_a_job_names_the_field_and_every_value(tmp_path):
    from rapids_attn.jobfile import load_job

    job = tmp_path / "job.yaml"
    job.write_text(f"data:\n  path: {tmp_path}/a.jsonl\nmodel:\n  name: minilm-l6\n")
    with pytest.raises(JobConfigError) as e:
        load_job(job, ["data.format=feather"])
    assert str(e.value) == (
        f"{job}: data.format: Input should be 'auto', 'squad', 'jsonl', 'csv', 'text', 'parquet' or 'hf' "
        "(got 'feather')"
    )


def test_every_registered_source_follows_the_protocol(tmp_path):
    """Each format's source class has the protocol's members, and an opened one is a Source."""
    for f in REGISTRY.values():
        if f.source is not None:
            for member in ("open", "scan", "read", "numbered", "pairs"):
                assert hasattr(f.source, member), (f.name, member)
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "x"}\n')
    spec = FieldSpec.make(None, None, None, None)
    assert isinstance(REGISTRY["jsonl"].source.open(path, spec, None), Source)
    text = REGISTRY["text"].source.open(tmp_path / "a.jsonl", None, None)
    assert isinstance(text, Source) and text.numbered and not text.pairs


def test_a_file_formats_fingerprint_is_the_content_fingerprint(tmp_path):
    """The rule a format names gives the digest content_fingerprint always gave (stores keep their keys)."""
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "x"}\n')
    assert file_fingerprint(path) == content_fingerprint(path)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "state.json").write_text("{}")
    assert folder_fingerprint(tmp_path / "d") == content_fingerprint(tmp_path / "d")


@pytest.mark.parametrize(
    "bad",
    [
        Format("auto", None),
        Format("jsonl", None),
        Format("new", None, (".JSON",)),
        Format("new", None, (".jsonl",)),
        Format("new", None, folder="a folder"),
    ],
)
def test_a_registration_that_would_clash_is_refused(bad):
    with pytest.raises(ValueError):
        formats._registry(*REGISTRY.values(), bad)


def test_the_job_schema_imports_the_registry_without_numpy():
    """The schema validates data.format from the registry; loading a job does not import NumPy or the index."""
    code = (
        "import sys, rapids_attn.job; print(sorted(m for m in ('numpy', 'rapids_attn.data.index') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"
