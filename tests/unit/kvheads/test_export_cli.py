"""The exports a decoder's job writes to RUN/head_classes/, and ``python -m rapids_attn.export RUN``: one job on
a tiny grouped-query Llama (4 query heads on 2 key-value heads) over long repetitive texts, then the CLI on it.

The DuoAttention values are checked against head_classes.json (written by the same job from the same store):
each key-value head takes the max over its query heads of ``1 - streaming``, 1 for retrieval and
not-applicable heads.
"""

import io
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import zarr
from helpers import REPO, make_job, repeated_rows, save_tiny_llama, write_jsonl

from rapids_attn.jobfile import load_job
from rapids_attn.pipeline import run_job

HEADS, KV_HEADS, LAYERS = 4, 2, 2


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kvheads")
    model = save_tiny_llama(tmp / "llama", heads=HEADS, kv_heads=KV_HEADS, positions=256)
    rows = repeated_rows(8, 11)
    data = write_jsonl(tmp / "long.jsonl", rows)
    cfg = load_job(
        None,
        raw=make_job(
            tmp,
            model,
            data,
            explain={"head_classes": {"min_length": 128, "bootstrap": 50}},
            cluster={"n_clusters": 2, "k_sweep": None},
        ),
    )
    summary = run_job(cfg)
    return cfg.run_dir, summary, tmp


def _cli(*args, cwd=REPO):
    return subprocess.run(
        [sys.executable, "-m", "rapids_attn.export", *map(str, args)],
        cwd=cwd,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _main(capsys, *args):
    """``rapids_attn.export.main`` in this process (a subprocess costs ~10 s of imports on a small CPU: two tests
    run the real ``python -m``); returns what a subprocess would."""
    from rapids_attn.export import main

    capsys.readouterr()
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["python", "-m", "rapids_attn.export", *args], rc, out, err)


def _refused(proc):
    """Exit 2 with exactly one stderr line, starting "error:"; returns it."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    return lines[0]


def test_the_job_writes_every_format(llama_run):
    run, summary, _ = llama_run
    out = run / "head_classes"
    for rel in (
        "duo_attention/full_attention_heads.tsv",
        "duo_attention/config.json",
        "sparse_attention_config.json",
        "kv_budget.json",
        "exports.json",
    ):
        assert (out / rel).is_file(), rel
    assert len(list((out / "head_score").glob("*.json"))) == 1
    manifest = json.loads((out / "exports.json").read_text())
    assert manifest["shape"] == {"layers": LAYERS, "heads": HEADS, "kv_heads": KV_HEADS}
    # made to be shared (issue 47): the local model folder is named by its name, no absolute path anywhere
    assert manifest["model"] == "llama"
    for f in out.rglob("*.json"):
        assert str(run.parent) not in f.read_text(), f
    assert set(manifest["formats"]) == {"duo_attention", "sparse_attention", "head_score", "kv_budget"}
    assert manifest["examples"]["all"] == 8 and manifest["examples"]["min_length"] == 128
    assert summary["head_classes"]["exports"]["written"] is True
    # no staging folder left beside it
    assert not [p.name for p in run.iterdir() if p.name.startswith(".head_classes")]


def test_every_example_is_long_enough_for_the_classes(llama_run):
    run, _, _ = llama_run
    g = zarr.open_group(str(run / "store.zarr"), mode="r")
    assert (np.asarray(g["seq_len"][:]) >= 160).all()
    doc = json.loads((run / "head_classes.json").read_text())
    assert doc["applicability"]["long_examples"] == 8
    assert all(h["scores"]["streaming"] is not None for h in doc["heads"])


def test_duo_attention_values_are_the_groups_max_of_one_minus_streaming(llama_run):
    run, _, _ = llama_run
    doc = json.loads((run / "head_classes.json").read_text())
    q = np.full((LAYERS, HEADS), np.nan)
    for h in doc["heads"]:
        s = h["scores"]["streaming"]
        full = h["class"] in ("retrieval", "not_applicable") or s is None
        q[h["layer"], h["head"]] = 1.0 if full else 1.0 - s
    assert np.isfinite(q).all()
    expected = np.array(
        [[max(q[i, k * 2 : k * 2 + 2]) for k in range(KV_HEADS)] for i in range(LAYERS)]
    )  # query heads 2k and 2k+1 read key-value head k (repeat_kv)
    tsv = (run / "head_classes" / "duo_attention" / "full_attention_heads.tsv").read_text()
    got = np.clip(np.loadtxt(io.StringIO(tsv), dtype=float, delimiter="\t"), 0, 1)
    assert got.shape == (LAYERS, KV_HEADS)
    np.testing.assert_allclose(got, expected, atol=2e-4)  # head_classes.json rounds to 4 digits
    cfg = json.loads((run / "head_classes" / "duo_attention" / "config.json").read_text())
    assert cfg["sink_size"] == 4 and cfg["recent_size"] == 64


def test_head_score_file_is_one_line_with_every_head(llama_run):
    run, _, _ = llama_run
    (path,) = (run / "head_classes" / "head_score").glob("*.json")
    with path.open() as f:
        doc = json.loads(f.readline())
        assert f.readline() == ""
    assert list(doc) == [f"{i}-{h}" for i in range(LAYERS) for h in range(HEADS)]
    g = zarr.open_group(str(run / "store.zarr"), mode="r")
    names = [str(x) for x in g["detector"][:]]
    ret = np.asarray(g["detectors"][:], np.float64)[..., names.index("retrieval")]
    for i in range(LAYERS):
        for h in range(HEADS):
            assert np.mean(doc[f"{i}-{h}"]) == pytest.approx(np.nanmean(ret[:, i, h]), abs=1e-4)


def test_cli_writes_only_the_asked_format(llama_run):
    run, _, tmp = llama_run
    out = tmp / "cli-duo"
    proc = _cli(run, "--format", "duo_attention", "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote {out}")
    assert sorted(p.name for p in out.iterdir()) == ["duo_attention", "exports.json"]
    assert list(json.loads((out / "exports.json").read_text())["formats"]) == ["duo_attention"]
    # the same values as the job's own export (same store, same settings)
    job_tsv = (run / "head_classes" / "duo_attention" / "full_attention_heads.tsv").read_text()
    assert (out / "duo_attention" / "full_attention_heads.tsv").read_text() == job_tsv


@pytest.mark.parametrize(
    ("kw", "names"),
    [({"layers": 3}, ("layers", "0-1 (2)", "has 3")), ({"heads": 2, "kv_heads": 1}, ("heads", "0-3 (4)", "has 2"))],
    ids=["three-layers", "two-heads"],
)
def test_cli_refuses_a_model_that_does_not_match_the_run(llama_run, kw, names, capsys):
    run, _, tmp = llama_run
    model = tmp / f"other-{'-'.join(map(str, kw.values()))}"
    from transformers import LlamaConfig

    # only the config is read: a 2-layer model's with another layer or head count
    layers, heads, kv = kw.get("layers", LAYERS), kw.get("heads", HEADS), kw.get("kv_heads", KV_HEADS)
    LlamaConfig(
        hidden_size=32, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv
    ).save_pretrained(model)
    parent = tmp / f"refused-{model.name}"
    parent.mkdir()
    out = parent / "out"
    # the real command once; the other case in this process
    cli = _cli if "layers" in kw else lambda *a: _main(capsys, *a)
    line = _refused(cli(run, "--model", model, "--out", out))
    for n in names:
        assert n in line, line
    assert list(parent.iterdir()) == []  # neither the folder nor a staging folder


def test_cli_refuses_an_unknown_format(llama_run, capsys):
    run, _, tmp = llama_run
    parent = tmp / "refused-format"
    parent.mkdir()
    line = _refused(_main(capsys, run, "--format", "nope", "--out", parent / "out"))
    assert "nope" in line
    assert list(parent.iterdir()) == []
    line = _refused(_main(capsys, run, "--format", ",", "--out", parent / "out"))  # no format named at all
    assert "name at least one" in line
    assert list(parent.iterdir()) == []


def test_cli_refuses_a_folder_without_a_store(tmp_path, capsys):
    line = _refused(_main(capsys, tmp_path))
    assert "store.zarr" in line


def test_cli_refuses_an_encoders_run(llama_run, capsys):
    """The decoder's store marked as an encoder's (its extract runs' causality probe false): no KV cache."""
    run, _, tmp = llama_run
    enc = tmp / "encoder-run"
    shutil.copytree(run / "store.zarr", enc / "store.zarr")
    g = zarr.open_group(str(enc / "store.zarr"), mode="r+")
    g.attrs["extract_runs"] = [{**r, "causal": False} for r in g.attrs["extract_runs"]]
    line = _refused(_main(capsys, enc))
    assert "decoders" in line
    assert not (enc / "head_classes").exists()
