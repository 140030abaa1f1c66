"""Hub dataset ids in ``data.path`` (rapids_attn/data/hub.py), offline: each test lays a dataset out in a temporary
``datasets`` cache exactly as ``datasets.load_dataset("owner/name")`` leaves a hub download there
(``owner___name/<config>/<version>/<revision>/name-<split>.arrow``), with the hub unreachable (HF_HUB_OFFLINE),
so ``load_dataset`` finds it the way it finds a dataset downloaded once before. Nothing is downloaded."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import yaml
from helpers import make_job

from rapids_attn.data.hub import hub_id
from rapids_attn.data.readers import build_index, read_examples
from rapids_attn.errors import DataError

datasets = pytest.importorskip("datasets")

SQUAD_ROWS = [
    {
        "id": f"q{i}",
        "title": "Alpha" if i < 3 else "Beta",
        "context": "Ann met Bob in Paris.",
        "question": f"Who met Bob ({i})?",
        "answers": {"text": ["Ann"], "answer_start": [0]} if i % 2 == 0 else {"text": [], "answer_start": []},
    }
    for i in range(5)
]


def cache_hub_dataset(cache: Path, repo: str, splits: dict[str, list[dict]], config: str = "default", rev: str = "a"):
    """Lay ``splits`` out in the ``datasets`` cache ``cache`` as a download of the hub dataset ``repo`` (its
    ``config`` at revision hash ``rev``): the layout ``load_dataset`` reads offline. The source files are deleted."""
    from datasets.packaged_modules.json.json import Json

    owner, name = repo.split("/")
    src = cache.parent / f"src-{owner}-{name}-{config}"
    src.mkdir(parents=True)
    files = {}
    for split, rows in splits.items():
        (src / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        files[split] = [str(src / f"{split}.jsonl")]
    # what a hub download writes: the folder owner___name, the Arrow files name-<split>.arrow
    builder = Json(
        cache_dir=str(cache), dataset_name=f"{owner}___{name}", config_name=config, config_id=config,
        hash=rev * 16, data_files=files,
    )  # fmt: skip
    builder.download_and_prepare()
    for f in cache.glob(f"{owner}___{name}/**/*.arrow"):
        f.rename(f.with_name(f.name.replace(f"{owner}___{name}-", f"{name}-")))
    for f in src.iterdir():
        f.unlink()
    src.rmdir()


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """An empty ``datasets`` cache, the hub offline."""
    cache = tmp_path / "hf" / "datasets"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)  # a relative owner/name is no file here
    return cache


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("rajpurkar/squad_v2", ("rajpurkar/squad_v2", None)),
        ("nyu-mll/glue:sst2", ("nyu-mll/glue", "sst2")),
        ("owner/name.v1", ("owner/name.v1", None)),
        ("data/train.jsonl", None),  # a file that is missing, not a dataset
        ("runs/SQuAD.JSON", None),
        ("/abs/path", None),
        ("./owner/name", None),
        ("a/b/c", None),
        ("squad_v2", None),
    ],
)
def test_what_reads_as_a_hub_id(text, parsed):
    assert hub_id(text) == parsed


def test_a_squad_shaped_hub_dataset_reads_as_squad(hub_cache):
    cache_hub_dataset(hub_cache, "testorg/squad_tiny", {"train": SQUAD_ROWS[:2], "validation": SQUAD_ROWS})
    index = build_index("testorg/squad_tiny")  # two splits: validation
    assert (index.format, index.pairs, len(index)) == ("squad", True, 5)
    examples = index.read(range(5))
    first = examples[0]
    assert (first.id, first.text, first.text_pair, first.group, first.label) == (
        "q0",
        "Who met Bob (0)?",
        "Ann met Bob in Paris.",
        "Alpha",
        "answerable",
    )
    assert (first.answers, first.answer_starts, first.answer_span()) == (("Ann",), (0,), (0, 3))
    assert [e.label for e in examples] == ["answerable", "impossible"] * 2 + ["answerable"]
    assert examples[4].group == "Beta"
    # a worker reads its rows from the cached files the shard task names, with no call to the hub
    rows = pickle.loads(pickle.dumps(index.rows(3, 5)))
    assert [e.id for e in rows.read()] == ["q3", "q4"]
    assert [e.id for e in read_examples("testorg/squad_tiny", split="train")] == ["q0", "q1"]


def test_the_fingerprint_is_the_datasets_own_and_stable(hub_cache, tmp_path, monkeypatch):
    cache_hub_dataset(hub_cache, "testorg/squad_tiny", {"train": SQUAD_ROWS[:2], "validation": SQUAD_ROWS})
    a = build_index("testorg/squad_tiny").fingerprint
    assert len(a) == 16 and build_index("testorg/squad_tiny", split="validation").fingerprint == a
    assert build_index("testorg/squad_tiny", split="train").fingerprint != a
    # another revision of the same dataset (a new download) is a different store
    other = tmp_path / "other" / "datasets"
    cache_hub_dataset(other, "testorg/squad_tiny", {"validation": SQUAD_ROWS}, rev="b")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(other))
    assert build_index("testorg/squad_tiny").fingerprint != a


def test_a_generic_hub_dataset_reads_by_fields(hub_cache):
    rows = [{"sentence": f"text {i}", "label": i % 2, "idx": 10 + i} for i in range(6)]
    cache_hub_dataset(hub_cache, "testorg/texts", {"train": rows, "test": rows[:3]}, config="sst2")
    with pytest.raises(DataError, match=r"^data\.split: the hub dataset testorg/texts has splits 'train', 'test'"):
        build_index("testorg/texts", text_fields=["sentence"])
    index = build_index(
        "testorg/texts:sst2", text_fields=["sentence"], id_field="idx", label_field="label", split="train", sample=4
    )
    assert (index.format, index.pairs, index.n_records, len(index)) == ("hf", False, 6, 4)
    got = index.read(range(4))
    assert all(e.text == f"text {int(e.id) - 10}" and e.label == str((int(e.id) - 10) % 2) for e in got)
    with pytest.raises(DataError, match=r"^data\.path: .*has no field 'text'; set data\.text_fields"):
        build_index("testorg/texts", split="test")
    with pytest.raises(DataError, match=r"^data\.format: the hub dataset testorg/texts has columns .*not SQuAD's"):
        build_index("testorg/texts", format="squad", split="test")
    with pytest.raises(DataError, match=r"^data\.config: 'other' and data\.path testorg/texts:sst2 name two"):
        build_index("testorg/texts:sst2", config="other", split="test")


def test_a_missing_dataset_offline_is_one_line_naming_the_fix(hub_cache):
    with pytest.raises(DataError) as e:
        build_index("testorg/not_cached")
    text = str(e.value)
    assert "\n" not in text and text.startswith("data.path: testorg/not_cached is no local file or folder")
    assert "HF_HUB_OFFLINE" in text and "run once with network access" in text


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"split": "train"}, r"^data\.split: applies to a hub dataset id in data\.path, and .* is a local file"),
        ({"revision": "main"}, r"^data\.revision: applies to a hub dataset id"),
    ],
)
def test_hub_settings_on_a_local_file_are_refused(tmp_path, kwargs, says):
    path = tmp_path / "x.jsonl"
    path.write_text('{"text": "a"}\n')
    with pytest.raises(DataError, match=says):
        build_index(path, **kwargs)


def test_a_missing_file_still_says_no_such_file(hub_cache):
    with pytest.raises(DataError, match=r"^data\.path: no such file or directory: data/train\.jsonl; set data\.path"):
        build_index("data/train.jsonl")


def test_hub_settings_leave_the_job_as_written_unchanged_when_unset():
    """Stores made before data.config/split/revision existed keep their extraction key."""
    from rapids_attn.job import DataConfig

    assert not {"config", "split", "revision"} & set(DataConfig(path="x.jsonl").model_dump(mode="json"))
    assert DataConfig(path="o/n", split="train").model_dump(mode="json")["split"] == "train"


def test_a_job_reads_a_hub_dataset_and_refuses_a_missing_one_in_one_line(
    hub_cache, tmp_path, capsys, monkeypatch, tiny_bert_dir
):
    from rapids_attn import devices
    from rapids_attn.run import main

    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)  # the same answers on a GPU machine
    cache_hub_dataset(hub_cache, "testorg/squad_tiny", {"validation": SQUAD_ROWS})
    job = make_job(tmp_path, tiny_bert_dir, Path("unused.jsonl"))
    job["data"] = {"path": "testorg/squad_tiny", "limit": 4}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    assert main([str(tmp_path / "job.yaml"), "--check"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    job["data"] = {"path": "testorg/not_cached"}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    assert main([str(tmp_path / "job.yaml"), "--check"]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]  # after preflight's status line
    assert len(errors) == 1 and "Traceback" not in err, err
    assert errors[0].startswith("error: data.path: testorg/not_cached is no local file") and "HF_HUB_OFFLINE" in err


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"format": "jsonl"}, r"^data\.format: 'jsonl' reads a local file, and testorg/squad_tiny is a hub dataset id"),
        ({"squad_unit": "article"}, r"^data\.squad_unit: 'article' applies to SQuAD JSON files only"),
    ],
)
def test_settings_a_hub_dataset_cannot_take_are_refused_before_loading(hub_cache, kwargs, says):
    with pytest.raises(DataError, match=says):  # nothing cached: refused before any load
        build_index("testorg/squad_tiny", **kwargs)
