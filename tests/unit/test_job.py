"""The job schema (rapids_attn.job) and its loader (rapids_attn.jobfile): presets, overrides, one-line errors with
the nearest valid name."""

import hashlib
import json
from pathlib import Path

import pytest
from helpers import REPO

from rapids_attn.errors import JobConfigError
from rapids_attn.jobfile import builtin_presets, load_job, parse_override, preset_dirs
from rapids_attn.registry import job_model


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def minimal(tmp_path: Path, extra: str = "") -> Path:
    data = write(tmp_path / "d.txt", "hello\nworld\n")
    return write(tmp_path / "job.yaml", f"data:\n  path: {data}\nmodel:\n  name: minilm-l6\n{extra}")


def test_defaults_fill_every_section(tmp_path):
    cfg = load_job(minimal(tmp_path))
    assert cfg.extract.image_size == 32
    assert cfg.embed.name == "pattern-cnn"
    assert cfg.cluster.method == "kmeans"
    assert cfg.runtime.dashboard_address == "127.0.0.1:8787"
    assert cfg.model.trust_remote_code is False


def test_unknown_key_suggests_nearest_name(tmp_path):
    with pytest.raises(JobConfigError, match=r"embed\.nmae: unknown key; did you mean 'name'\?"):
        load_job(minimal(tmp_path, "embed:\n  nmae: pooled\n"))


def test_unknown_section_suggests_nearest_section(tmp_path):
    with pytest.raises(JobConfigError, match=r"clustr: unknown key; did you mean 'cluster'\?"):
        load_job(minimal(tmp_path, "clustr:\n  n_clusters: 3\n"))


def test_bad_value_names_field_and_value(tmp_path):
    with pytest.raises(JobConfigError, match=r"extract\.image_size: .*greater than or equal to 4.*got 2"):
        load_job(minimal(tmp_path, "extract:\n  image_size: 2\n"))


def test_bad_literal_lists_choices(tmp_path):
    with pytest.raises(JobConfigError, match=r"cluster\.method: .*'kmeans', 'dbscan' or 'hdbscan'"):
        load_job(minimal(tmp_path, "cluster:\n  method: spectral\n"))


def test_missing_required_section(tmp_path):
    data = write(tmp_path / "d.txt", "x\n")
    with pytest.raises(JobConfigError, match=r"model: required but missing"):
        load_job(write(tmp_path / "job.yaml", f"data:\n  path: {data}\n"))


def test_invalid_yaml_names_line(tmp_path):
    with pytest.raises(JobConfigError, match=r"job.yaml line 3: not valid YAML"):
        load_job(write(tmp_path / "job.yaml", "data:\n  path: [unclosed\nmodel: {}\n"))


def test_errors_are_one_line(tmp_path):
    with pytest.raises(JobConfigError) as e:
        load_job(minimal(tmp_path, "extract:\n  layers: [1, 1]\n"))
    assert "\n" not in str(e.value)
    assert "extract" in str(e.value) and "distinct" in str(e.value)


def test_overrides_are_yaml_typed(tmp_path):
    cfg = load_job(minimal(tmp_path), ["data.limit=7", "extract.layers=[0, 2]", "runtime.processes=false"])
    assert cfg.data.limit == 7
    assert cfg.extract.layers == [0, 2]
    assert cfg.runtime.processes is False


def test_override_unknown_key_is_reported(tmp_path):
    with pytest.raises(JobConfigError, match=r"data\.limt: unknown key; did you mean 'limit'\?"):
        load_job(minimal(tmp_path), ["data.limt=3"])


def test_override_syntax_error():
    with pytest.raises(JobConfigError, match="expected KEY=VALUE"):
        parse_override("data.limit")


def test_presets_merge_in_order_and_job_wins(tmp_path):
    cfgs = tmp_path / "configs" / "x"
    cfgs.mkdir(parents=True)
    write(cfgs / "a.yaml", "cluster:\n  n_clusters: 3\n  method: dbscan\n")
    write(cfgs / "b.yaml", "cluster:\n  n_clusters: 5\n")
    cfg = load_job(minimal(tmp_path, "extends: [x/a, x/b]\ncluster:\n  eps: 0.25\n"))
    assert cfg.cluster.n_clusters == 5  # b after a
    assert cfg.cluster.method == "dbscan"  # from a, untouched by b
    assert cfg.cluster.eps == 0.25  # the job itself
    assert cfg.extends == ["x/a", "x/b"]


def test_unknown_preset_suggests_nearest(tmp_path):
    with pytest.raises(JobConfigError, match=r"no preset 'clusters/kmean'.*did you mean 'clusters/kmeans'\?"):
        load_job(minimal(tmp_path, "extends: [clusters/kmean]\n"))


def test_builtin_presets_all_validate(tmp_path):
    root = REPO / "rapids_attn" / "presets"
    assert Path(str(builtin_presets())) == root  # the checkout reads the same files a wheel ships
    presets = sorted(root.rglob("*.yaml"))
    assert len(presets) >= 12
    for p in presets:
        name = str(p.relative_to(root))[:-5]
        cfg = load_job(minimal(tmp_path, f"extends: [{name}]\n"))  # no configs/ beside this job
        assert name in cfg.extends


def test_local_preset_wins_over_builtin_and_is_found_in_a_parent_folder(tmp_path):
    write(tmp_path / "d.txt", "x\n")
    (tmp_path / "configs" / "clusters").mkdir(parents=True)
    write(tmp_path / "configs" / "clusters" / "kmeans.yaml", "cluster:\n  n_clusters: 3\n")
    (tmp_path / "jobs").mkdir()
    job = write(
        tmp_path / "jobs" / "job.yaml", "extends: [clusters/kmeans, models/minilm-l6]\ndata:\n  path: ../d.txt\n"
    )
    cfg = load_job(job)
    assert cfg.cluster.n_clusters == 3  # configs/ of the parent folder, before the built-in clusters/kmeans
    assert cfg.model.name == "minilm-l6"  # not in the local folder: the built-in preset
    assert preset_dirs(job)[0] == tmp_path / "configs"


def test_a_presets_hub_dataset_id_stays_an_id_and_its_relative_file_is_anchored(tmp_path):
    """A preset's relative data.path is the preset's own file (anchored to its folder), unless it reads as a hub
    dataset id with nothing of that name beside the preset: then it stays the id."""
    (tmp_path / "configs" / "data").mkdir(parents=True)
    write(tmp_path / "configs" / "data" / "hub.yaml", "data:\n  path: rajpurkar/squad_v2\n  split: validation\n")
    write(tmp_path / "configs" / "data" / "local.yaml", "data:\n  path: qs.txt\n")
    write(tmp_path / "configs" / "data" / "qs.txt", "x\n")
    job = write(tmp_path / "job.yaml", "extends: [data/hub, models/minilm-l6]\n")
    assert str(load_job(job).data.path) == "rajpurkar/squad_v2"
    job = write(tmp_path / "job.yaml", "extends: [data/local, models/minilm-l6]\n")
    assert load_job(job).data.path == (tmp_path / "configs" / "data" / "qs.txt").resolve()


def test_preset_name_must_not_climb_out_of_the_presets(tmp_path):
    with pytest.raises(JobConfigError, match=r"extends: '\.\./models/gpt2' is not a preset name"):
        load_job(minimal(tmp_path, "extends: [../models/gpt2]\n"))


def test_quickstart_preset_data_ships_in_the_package(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_job(write(tmp_path / "job.yaml", "extends: [data/quickstart, models/minilm-l6]\n"))
    assert cfg.data.path == (REPO / "rapids_attn" / "data" / "quickstart.json").resolve()
    assert cfg.data.path.is_file() and cfg.data.format == "squad"


def test_preset_data_path_is_relative_to_the_preset_not_the_job_or_cwd(tmp_path, monkeypatch):
    (tmp_path / "files").mkdir()
    write(tmp_path / "files" / "d.txt", "a\n")
    write(tmp_path / "d.txt", "decoy beside the job and in the working directory\n")
    (tmp_path / "configs" / "data").mkdir(parents=True)
    write(tmp_path / "configs" / "data" / "mine.yaml", "data:\n  path: ../../files/d.txt\n")
    monkeypatch.chdir(tmp_path)
    cfg = load_job(write(tmp_path / "job.yaml", "extends: [data/mine, models/minilm-l6]\n"))
    assert cfg.data.path == (tmp_path / "files" / "d.txt").resolve()
    # the job's own relative data.path still wins, relative to the job file
    (tmp_path / "sub").mkdir()
    cfg = load_job(
        write(tmp_path / "sub" / "job.yaml", "extends: [data/mine, models/minilm-l6]\ndata:\n  path: ../d.txt\n")
    )
    assert cfg.data.path == (tmp_path / "d.txt").resolve()


def test_quickstart_job_is_the_same_job_wherever_its_file_is(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    here = load_job(REPO / "jobs" / "quickstart.yaml")
    copy = load_job(write(tmp_path / "quickstart.yaml", (REPO / "jobs" / "quickstart.yaml").read_text()))
    assert here.data.path == (REPO / "rapids_attn" / "data" / "quickstart.json").resolve()
    assert here.to_dict() == copy.to_dict()
    assert here.extraction_key() == copy.extraction_key()


def test_data_path_relative_to_job_file(tmp_path):
    sub = tmp_path / "jobs"
    sub.mkdir()
    write(tmp_path / "d.txt", "a\n")
    cfg = load_job(write(sub / "job.yaml", "data:\n  path: ../d.txt\nmodel:\n  name: minilm-l6\n"))
    assert Path(cfg.data.path) == (tmp_path / "d.txt").resolve()


def test_scheduler_cluster_needs_an_address(tmp_path):
    with pytest.raises(JobConfigError, match=r"runtime: cluster 'scheduler' needs address"):
        load_job(minimal(tmp_path, "runtime:\n  cluster: scheduler\n"))


def test_extraction_key_ignores_learn_settings(tmp_path):
    a = load_job(minimal(tmp_path))
    b = load_job(minimal(tmp_path), ["cluster.n_clusters=3", "reduce.pca_components=4", "runtime.n_workers=4"])
    c = load_job(minimal(tmp_path), ["extract.image_size=16"])
    assert a.extraction_key() == b.extraction_key()
    assert a.extraction_key() != c.extraction_key()


@pytest.mark.parametrize("name", ["'has space'", "'.'", "'..'", "a/b"])
def test_name_is_a_plain_file_name(tmp_path, name):
    with pytest.raises(JobConfigError, match=r"name: must be a plain file name"):
        load_job(minimal(tmp_path, f"name: {name}\n"))


def test_run_dir_uses_name(tmp_path):
    cfg = load_job(minimal(tmp_path, "name: demo\n"))
    assert cfg.run_dir == Path.cwd() / "runs" / "demo"  # absolute: workers elsewhere find it
    assert isinstance(cfg, job_model())


def test_batching_settings_do_not_change_the_store_key(tmp_path):
    a = load_job(minimal(tmp_path))
    b = load_job(
        minimal(tmp_path),
        [
            "extract.token_budget=4096",
            "extract.attention_budget=100000",
            "extract.max_batch_size=8",
            "extract.device=cpu",
            "embed.batch_size=64",
            "extract.attention_base=eager",
            "extract.attention_block_mb=1024",
        ],
    )
    assert a.extraction_key() == b.extraction_key()


def test_the_capture_base_default_keeps_the_keys_of_stores_made_before_it_changed(tmp_path):
    """Issue 34 made ``capture`` the default base; a store made by the same job under the old default (``sdpa``,
    64 MiB blocks) still matches: the key holds those values, whatever the job says."""
    cfg = load_job(minimal(tmp_path))
    assert cfg.extract.attention_base == "capture"
    d = cfg.to_dict()
    keep = {k: d[k] for k in ("data", "model", "extract", "embed", "store")}
    keep["data_content"] = ""
    keep["extract"] = {
        k: v
        for k, v in keep["extract"].items()
        # and extract.kernel and kernel_precision, which came after (issue 45): the old key function never saw them
        if k not in ("device", "token_budget", "attention_budget", "max_batch_size", "kernel", "kernel_precision")
    }
    keep["extract"].update(attention_base="sdpa")  # the old default, as the old key function saw it
    keep["embed"] = {k: v for k, v in keep["embed"].items() if k != "batch_size"}
    old = hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]
    assert cfg.extraction_key() == old


def test_the_capture_kernel_and_its_precision_leave_the_store_key_alone(tmp_path):
    """The kernels agree within tolerance (tests/unit/extract/test_fused.py): a store extracted with one is
    resumed, and reused, by a job that names another."""
    base = load_job(minimal(tmp_path))
    assert (base.extract.kernel, base.extract.kernel_precision) == ("auto", "auto")
    for change in (["extract.kernel=triton"], ["extract.kernel=torch", "extract.kernel_precision=bf16"]):
        assert load_job(minimal(tmp_path), change).extraction_key() == base.extraction_key()
    with pytest.raises(JobConfigError, match=r"extract\.kernel"):
        load_job(minimal(tmp_path), ["extract.kernel=cuda"])


def test_data_format_parquet_is_a_choice_and_leaves_other_keys_alone(tmp_path):
    """Adding parquet to the formats changes no existing job's settings, so no existing store's key."""
    auto = load_job(minimal(tmp_path))
    pq = load_job(minimal(tmp_path), ["data.format=parquet"])
    assert pq.data.format == "parquet" and auto.data.format == "auto"
    assert set(pq.to_dict()["data"]) == set(auto.to_dict()["data"])  # no new data setting
    assert pq.extraction_key() != auto.extraction_key()  # the format is part of what the store holds
    with pytest.raises(JobConfigError, match=r"data\.format: .*'parquet'"):
        load_job(minimal(tmp_path), ["data.format=feather"])


def test_true_false_fields_take_only_true_or_false(tmp_path):
    """pydantic would read 1, 0, "yes" or "off" as a bool; a job that writes them meant something else."""
    for word in (
        "runtime.processes=1",
        "reduce.umap.enabled=0",
        'explain.report="yes"',
        'model.trust_remote_code="off"',
    ):
        field = word.split("=")[0]
        with pytest.raises(JobConfigError, match=rf"{field}: must be true or false \(got "):
            load_job(minimal(tmp_path), [word])
    cfg = load_job(minimal(tmp_path), ["runtime.processes=false", "reduce.umap.enabled=yes", "explain.report=off"])
    assert (cfg.runtime.processes, cfg.reduce.umap.enabled, cfg.explain.report) == (False, True, False)  # YAML 1.1


def test_every_true_false_field_is_strict():
    """Each field of the schema that takes true/false refuses a number, so a new one cannot slip through."""
    from pydantic import BaseModel, ValidationError

    from rapids_attn.settings import _is_bool_field

    def fields(model):
        for name, f in model.model_fields.items():
            if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
                yield from fields(f.annotation)
            elif _is_bool_field(f.annotation):
                yield model, name

    found = list(fields(job_model()))
    assert len(found) >= 4
    for model, name in found:
        with pytest.raises(ValidationError, match="must be true or false"):
            model.__pydantic_validator__.validate_assignment(model.model_construct(), name, 1)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "is a directory"),
        (b"\x7fELF\x02\x01\x01\x00\xff\xfe", "is not a UTF-8 text file (byte 8 is 0xff)"),
        (b"name: x\n\x00", "not a YAML text file (character #x0000 at position 8)"),
        (b"- a\n- b\n", "must be a YAML mapping of sections, got list"),
    ],
    ids=["directory", "binary", "nul", "list"],
)
def test_job_path_that_is_no_yaml_file_is_one_line(tmp_path, content, says):
    path = tmp_path / "job.yaml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    with pytest.raises(JobConfigError) as e:
        load_job(path)
    assert says in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_unreadable_preset_is_one_line(tmp_path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "bad.yaml").write_bytes(b"cluster: {method: \xe9}\n")
    with pytest.raises(JobConfigError, match=r"extends: preset 'bad': .*bad.yaml is not a UTF-8 text file"):
        load_job(minimal(tmp_path, "extends: [bad]\n"))
