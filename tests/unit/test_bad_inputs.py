"""Bad inputs from the hostile-user catalogue (issue 12): each is refused by ``--check`` (and so by a run)
with exit 2 and one line on stderr that names the field, before anything is written."""

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from helpers import make_job

from rapids_attn import devices
from rapids_attn.run import main

# (case id, job changes as --set words, extra CLI arguments, text appended to the job file, what the
# one line must name). The tiny job has 20 examples x 2 layers x 2 heads = 80 maps, pooled features of
# dim 16, pca_components 4, n_clusters 3.
CASES = [
    ("name-dot", ["name=."], [], "", "name:"),
    ("name-dotdot", ["name=.."], [], "", "name:"),
    ("name-slash", ["name=a/b"], [], "", "name:"),
    ("output-dir-unknown-field", ["output.dir=runs/{nam}"], [], "", "output.dir:"),
    # only the plain {name}: str.format would follow an attribute or an index into the string's own objects
    ("output-dir-attribute", ["output.dir=runs/{name.__class__}"], [], "", "output.dir: {name.__class__} is not a"),
    ("output-dir-index", ["output.dir=runs/{name[0]}"], [], "", "output.dir: {name[0]} is not a placeholder"),
    ("output-dir-conversion", ["output.dir=runs/{name!r}"], [], "", "output.dir: {name!r} is not a placeholder"),
    ("output-dir-format-spec", ["output.dir=runs/{name:>9}"], [], "", "output.dir: {name:>9} is not a placeholder"),
    ("output-dir-positional", ["output.dir=runs/{}"], [], "", "output.dir: {} is not a placeholder"),
    ("output-dir-lone-brace", ["output.dir=runs/{name"], [], "", "output.dir: expected '}' before end of string"),
    # extends is read from the job file only: a --set of it would be silently ignored
    ("set-extends", ["extends=[clusters/kmeans]"], [], "", "--set extends: extends is read from the job file only"),
    ("set-extends-entry", ["extends.0=clusters/kmeans"], [], "", "--set extends: extends is read from the job file"),
    # the embedders listed from the registry: none is left out
    (
        "embed-name-unknown",
        ["embed.name=nosuch"],
        [],
        "",
        "embed.name: unknown embedder 'nosuch'; use pattern-cnn, pooled, or",
    ),
    ("stages-comma", [], ["--stages", ","], "", "--stages: no stage named"),
    ("stages-blanks", [], ["--stages", " , ,"], "", "--stages: no stage named"),
    ("stages-empty", [], ["--stages", ""], "", "--stages: no stage named"),
    ("limit-true", ["data.limit=true"], [], "", "data.limit:"),
    ("sample-false", ["data.sample=false"], [], "", "data.sample:"),
    ("shard-size-true", ["extract.shard_size=true"], [], "", "extract.shard_size:"),
    # one message, naming the field as the user wrote it and saying that auto is allowed
    ("shard-size-word", ["extract.shard_size=big"], [], "", "extract.shard_size: must be a positive whole number"),
    ("shard-size-half", ["extract.shard_size=1.5"], [], "", "extract.shard_size: must be a positive whole number"),
    ("shard-size-zero", ["extract.shard_size=0"], [], "", "of examples or auto (got 0)"),
    ("shard-size-list", ["extract.shard_size=[64]"], [], "", "extract.shard_size: must be a positive whole number"),
    ("n-clusters-true", ["cluster.n_clusters=true"], [], "", "cluster.n_clusters:"),
    ("fit-sample-true", ["reduce.fit_sample=true"], [], "", "reduce.fit_sample:"),
    ("pca-components-true", ["reduce.pca_components=true"], [], "", "reduce.pca_components:"),
    ("layers-entry-true", ["extract.layers=[0, true]"], [], "", "extract.layers:"),
    ("k-sweep-entry-true", ["cluster.k_sweep=[2, true]"], [], "", "cluster.k_sweep:"),
    ("probe-count-true", ["data.probe.count=true"], [], "", "data.probe.count:"),
    ("min-dist-true", ["reduce.umap.min_dist=true"], [], "", "reduce.umap.min_dist:"),
    ("duplicate-key", [], [], "name: again\n", "duplicate key 'name'"),
    ("n-clusters-above-maps", ["cluster.n_clusters=100000"], [], "", "cluster.n_clusters:"),
    ("n-clusters-equal-maps", ["cluster.n_clusters=80"], [], "", "cluster.n_clusters:"),
    ("n-clusters-above-fit-sample", ["cluster.n_clusters=30", "reduce.fit_sample=20"], [], "", "cluster.n_clusters:"),
    ("k-sweep-span", ["cluster.k_sweep=[2, 100000]"], [], "", "cluster.k_sweep:"),
    ("k-sweep-first-above-maps", ["cluster.k_sweep=[90, 100]"], [], "", "cluster.k_sweep:"),
    ("fit-sample-1", ["reduce.fit_sample=1"], [], "", "reduce.fit_sample:"),
    ("fit-sample-below-components", ["reduce.fit_sample=3"], [], "", "reduce.fit_sample:"),
    (
        "pca-components-above-maps",
        ["data.limit=1", "extract.layers=[0]", "extract.heads=[0]", "cluster.k_sweep=null", "cluster.n_clusters=2"],
        [],
        "",
        "reduce.pca_components:",
    ),
    ("umap-metric", ["reduce.umap.enabled=true", "reduce.umap.metric=nosuch"], [], "", "reduce.umap.metric:"),
    ("umap-metric-one-backend", ["reduce.umap.enabled=true", "reduce.umap.metric=sqeuclidean"], [], "", "metric"),
    # true/false fields take true or false, not 1, 0 or a string
    ("processes-1", ["runtime.processes=1"], [], "", "runtime.processes: must be true or false"),
    ("umap-enabled-0", ["reduce.umap.enabled=0"], [], "", "reduce.umap.enabled: must be true or false"),
    ("report-string", ['explain.report="yes"'], [], "", "explain.report: must be true or false"),
    ("trust-remote-code-1", ["model.trust_remote_code=1"], [], "", "model.trust_remote_code: must be true or false"),
    # a device this machine lacks (the test hides any GPU)
    ("device-cuda-no-gpu", ["extract.device=cuda"], [], "", "extract.device: cuda, but no CUDA device is visible"),
    # neighbourhoods larger than the 80 maps the density fits and UMAP see
    (
        "umap-neighbours-equal-maps",
        ["reduce.umap.enabled=true", "reduce.umap.n_neighbors=80"],
        [],
        "",
        "reduce.umap.n_neighbors:",
    ),
    (
        "umap-neighbours-above-fit-sample",
        ["reduce.umap.enabled=true", "reduce.fit_sample=10"],
        [],
        "",
        "reduce.umap.n_neighbors:",
    ),
    (
        "umap-components-above-maps",
        ["reduce.umap.enabled=true", "reduce.umap.n_components=79"],
        [],
        "",
        "reduce.umap.n_components:",
    ),
    ("dbscan-min-samples", ["cluster.method=dbscan", "cluster.min_samples=81"], [], "", "cluster.min_samples:"),
    ("hdbscan-min-samples", ["cluster.method=hdbscan", "cluster.min_samples=81"], [], "", "cluster.min_samples:"),
    (
        "hdbscan-min-cluster-size",
        ["cluster.method=hdbscan", "cluster.min_cluster_size=41"],
        [],
        "",
        "cluster.min_cluster_size:",
    ),
    (
        "hdbscan-min-cluster-size-fit-sample",
        ["cluster.method=hdbscan", "cluster.min_cluster_size=20", "reduce.fit_sample=30"],
        [],
        "",
        "cluster.min_cluster_size:",
    ),
    # the heads stage (issue 14): the tiny job's model is a bare BertModel on JSONL pairs, 2 x 2 heads
    ("heads-squad-on-encoder", ["heads.enabled=true", "heads.metric=squad"], [], "", "heads.metric: squad needs"),
    ("heads-lm-on-encoder", [], ["--stages", "extract,learn,heads"], "heads: {metric: lm}\n", "heads.metric: lm needs"),
    ("heads-auto-finds-none", ["heads.enabled=true"], [], "", "heads.metric: auto"),
    ("heads-metric-unknown", ["heads.metric=nosuch"], [], "", "heads.metric:"),
    ("heads-examples-0", ["heads.examples=0"], [], "", "heads.examples:"),
    ("heads-enabled-1", ["heads.enabled=1"], [], "", "heads.enabled: must be true or false"),
    (
        "heads-top-k-above-heads",
        ["heads.enabled=true", "heads.metric=retrieval", "heads.probing.top_k=5"],
        [],
        "",
        "heads.probing.top_k:",
    ),
    # the relevance stage (issue 15): the same tiny 2 x 2 model
    (
        "relevance-pagerank-layer",
        ["relevance.enabled=true", "relevance.pagerank_layer=2"],
        [],
        "",
        "relevance.pagerank_layer:",
    ),
    (
        "relevance-pagerank-heads",
        ["relevance.enabled=true", "relevance.pagerank_heads=[0, 5]"],
        [],
        "",
        "relevance.pagerank_heads:",
    ),
    (
        "relevance-atlas-clusters",
        ["relevance.enabled=true", "relevance.atlas_clusters=5"],
        [],
        "",
        "relevance.atlas_clusters:",
    ),
    ("relevance-no-methods", ["relevance.enabled=true", "relevance.methods=[]"], [], "", "relevance.methods:"),
    ("relevance-method-unknown", ["relevance.methods=[saliency]"], [], "", "relevance.methods"),
    ("relevance-residual-2", ["relevance.residual=2"], [], "", "relevance.residual:"),
    ("attention-base-unknown", ["extract.attention_base=nosuch"], [], "", "extract.attention_base: unknown"),
    (
        "windows-without-room-for-text",
        ["model.long_inputs=windows", "model.max_length=2", "model.window_overlap=0"],
        [],
        "",
        "model.max_length: 2 leaves no room for text",
    ),
    ("attention-base-flex", ["extract.attention_base=flex_attention"], [], "", "extract.attention_base: flex"),
    (
        "attention-base-flash-on-cpu",
        ["extract.attention_base=flash_attention_2", "extract.device=cpu"],
        [],
        "",
        "extract.attention_base: flash_attention_2 runs on CUDA GPUs only",
    ),
]


def test_the_listed_attention_bases_are_the_usable_ones():
    """The unknown-base error lists what the field takes: not flex attention, nor the paged ones (the field's
    pattern refuses their '|')."""
    from rapids_attn.errors import ModelError
    from rapids_attn.extract.blocked import check_base

    with pytest.raises(ModelError) as e:
        check_base("nosuch")
    listed = str(e.value).split("use one of: ")[1].split(", ")
    assert {"sdpa", "eager", "capture"} <= set(listed)
    assert not [b for b in listed if "|" in b or b == "flex_attention" or b.startswith("rapids_blocked")]
    for b in listed:
        if not b.startswith("flash"):
            check_base(b, "cpu")


def _job_file(tmp_path: Path, job: dict, append: str = "") -> Path:
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(job, sort_keys=False) + append)
    return p


@pytest.mark.parametrize(("sets", "args", "append", "names"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2(
    tmp_path, capsys, monkeypatch, tiny_bert_dir, pair_data, sets, args, append, names
):
    _check_refused(tmp_path, capsys, monkeypatch, tiny_bert_dir, pair_data, sets, args, append, names)


def _check_refused(tmp_path, capsys, monkeypatch, model_dir, data, sets, args, append, names):
    """``--check`` of the tiny job with ``--set`` each of ``sets``: exit 2, one line naming ``names``, nothing
    written."""
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)  # the same answers on a GPU machine
    job = make_job(tmp_path, model_dir, data)
    argv = [str(_job_file(tmp_path, job, append)), "--check", *args]
    for word in sets:
        argv += ["--set", word]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert names in err, err
    assert not (tmp_path / "run").exists()


def _one_line_exit_2(argv: list[str], capsys, names: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert names in err, err
    return err


def _rewritten(text_of):
    """A maker of a bad job file: the valid job file rewritten as ``text_of(its text)`` (str or bytes)."""

    def make(p: Path) -> Path:
        out = text_of(p.read_text())
        p.write_bytes(out if isinstance(out, bytes) else out.encode())
        return p

    return make


# (case id, how the job path is made from a valid job file, what the line must say)
JOB_PATHS = [
    ("directory", lambda p: p.parent, "is a directory; give the job's YAML file"),
    ("executable", lambda p: Path(sys.executable).resolve(), "is not a UTF-8 text file"),
    (
        "latin-1",
        _rewritten(lambda t: ("# caf\u00e9\n" + t).encode("latin-1")),
        "is not a UTF-8 text file (byte 5 is 0xe9)",
    ),
    ("nul-byte", _rewritten(lambda t: t + "\0\n"), "not a YAML text file (character #x0000"),
    ("list", _rewritten(lambda t: "- a\n- b\n"), "must be a YAML mapping of sections, got list"),
    ("scalar", _rewritten(lambda t: "just words\n"), "must be a YAML mapping of sections, got str"),
    ("broken-yaml", _rewritten(lambda t: "data: [1\n"), "line 2: not valid YAML (expected ',' or ']'"),
]


@pytest.mark.parametrize(("make", "names"), [c[1:] for c in JOB_PATHS], ids=[c[0] for c in JOB_PATHS])
def test_bad_job_file_is_one_line_exit_2(tmp_path, capsys, tiny_bert_dir, pair_data, make, names):
    path = make(_job_file(tmp_path, make_job(tmp_path, tiny_bert_dir, pair_data)))
    _one_line_exit_2([str(path), "--check"], capsys, names)
    assert not (tmp_path / "run").exists()


def _cut(path: Path, drop: int = 1) -> None:
    path.write_bytes(path.read_bytes()[:-drop])


# (case id, files left out of a copy of the tiny BERT, what is then done to the copy, what the line must say)
MODEL_FOLDERS = [
    ("no-tokenizer", ("tokenizer*", "vocab.txt", "special_tokens_map.json"), None, "has no tokenizer files"),
    (
        "vocabulary-of-specials",
        ("tokenizer*", "vocab.txt", "special_tokens_map.json"),
        lambda m: (m / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n"),
        "reads every word of",
    ),
    ("no-weights", ("*.safetensors",), None, "has no weights (one of model.safetensors"),
    ("truncated-safetensors", (), lambda m: _cut(m / "model.safetensors"), "model.safetensors cannot be loaded"),
    ("no-config", ("config.json",), None, "has no config.json"),
    # custom code that model.trust_remote_code: false would not run: transformers would read the folder as BERT
    (
        "auto-map",
        (),
        lambda m: _with_auto_map(m),
        (
            "asks for custom code (auto_map in its config.json: AutoConfig, AutoModel), which model.trust_remote_code: "
            "false does not run; review that code and set model.trust_remote_code: true to run it (only if you trust it)"
        ),
    ),
]


def _with_auto_map(model: Path) -> Path:
    """The model folder with an ``auto_map`` in its config.json (as a hub model with its own code has), naming
    modules that are not there: read with trust_remote_code false, transformers would build its own BERT."""
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_mine.MineConfig", "AutoModel": "modeling_mine.MineModel"}
    (model / "config.json").write_text(json.dumps(config))
    return model


@pytest.mark.parametrize(
    ("without", "damage", "names"), [c[1:] for c in MODEL_FOLDERS], ids=[c[0] for c in MODEL_FOLDERS]
)
def test_bad_model_folder_is_one_line_exit_2(tmp_path, capsys, tiny_bert_dir, pair_data, without, damage, names):
    model = tmp_path / "model"
    shutil.copytree(tiny_bert_dir, model, ignore=shutil.ignore_patterns(*without))
    if damage is not None:
        damage(model)
    job = make_job(tmp_path, model, pair_data)
    err = _one_line_exit_2([str(_job_file(tmp_path, job)), "--check"], capsys, names)
    assert "model.name: " in err and str(model) in err
    assert not (tmp_path / "run").exists()


def test_duplicate_key_names_its_line(tmp_path, capsys, tiny_bert_dir, pair_data):
    job = make_job(tmp_path, tiny_bert_dir, pair_data)
    p = _job_file(tmp_path, job)
    text = p.read_text()
    p.write_text(text.replace("  format: jsonl\n", "  format: jsonl\n  format: csv\n", 1))
    line = p.read_text().splitlines().index("  format: csv") + 1
    assert main([str(p), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"line {line}: duplicate key 'format' (first on line {line - 1})" in err


def test_duplicate_key_in_a_preset_names_the_preset(tmp_path, capsys, tiny_bert_dir, pair_data):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "dup.yaml").write_text("cluster:\n  n_clusters: 3\n  n_clusters: 4\n")
    job = make_job(tmp_path, tiny_bert_dir, pair_data)
    job["extends"] = ["dup"]
    assert main([str(_job_file(tmp_path, job)), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dup.yaml line 3: duplicate key 'n_clusters'" in err


def test_merge_keys_may_be_overridden(tmp_path, capsys, tiny_bert_dir, pair_data):
    """Overriding a key a YAML merge (<<) brings in is not a duplicate."""
    job = make_job(tmp_path, tiny_bert_dir, pair_data)
    del job["explain"]  # given below, by a merge
    p = _job_file(tmp_path, job)
    text = p.read_text().replace("cluster:\n", "cluster: &c\n", 1)
    p.write_text(text + "explain:\n  <<: {report: false, head_views: 1}\n  head_views: 0\n")
    assert main([str(p), "--check"]) == 0, capsys.readouterr().err


def test_legitimate_tiny_job_passes_check(tmp_path, capsys, tiny_bert_dir, pair_data):
    job = make_job(tmp_path, tiny_bert_dir, pair_data, reduce={"umap": {"enabled": True, "metric": "cosine"}})
    assert main([str(_job_file(tmp_path, job)), "--check", "--set", "name=my.job-1"]) == 0
    out = capsys.readouterr().out
    assert "ok: 20 examples, 2 layers x 2 heads, 4 shards" in out  # shard_size 6 below the data: unchanged
    assert not (tmp_path / "run").exists()


def test_shard_size_is_capped_at_the_data(tmp_path, capsys, tiny_bert_dir, pair_data):
    job = make_job(tmp_path, tiny_bert_dir, pair_data, extract={"shard_size": 50000})
    assert main([str(_job_file(tmp_path, job)), "--check"]) == 0
    assert "ok: 20 examples, 2 layers x 2 heads, 1 shards" in capsys.readouterr().out


def test_learn_settings_at_the_bounds_run(tmp_path, capsys, tiny_bert_dir, pair_data):
    """The most clusters preflight allows, a sweep clipped at the maps, a fit sample of exactly the PCA
    components and a data-capped shard size run to the end."""
    job = make_job(
        tmp_path,
        tiny_bert_dir,
        pair_data,
        extract={"shard_size": 50000},
        reduce={"fit_sample": 4, "pca_components": 4},
        cluster={"n_clusters": 3, "k_sweep": [2, 150]},
        explain={"report": False, "head_views": 0},
    )
    assert main([str(_job_file(tmp_path, job))]) == 0, capsys.readouterr().err


@pytest.mark.slow  # UMAP: numba compiles it on first use, 40 s or more in a fresh process (test_fit's UMAP test too)
@pytest.mark.budget(60, reason="numba compiles UMAP on its first use in a process")
def test_density_settings_at_the_bounds_run(tmp_path, capsys, tiny_bert_dir, pair_data):
    """The largest neighbourhoods preflight allows on 80 maps (UMAP 79 neighbours, HDBSCAN min_samples 80 and
    clusters of 40) fit without an error."""
    job = make_job(
        tmp_path,
        tiny_bert_dir,
        pair_data,
        reduce={"umap": {"enabled": True, "n_neighbors": 79}},
        cluster={"method": "hdbscan", "min_samples": 80, "min_cluster_size": 40, "k_sweep": None},
        explain={"report": False, "head_views": 0},
    )
    assert main([str(_job_file(tmp_path, job)), "--stages", "extract,learn"]) == 0, capsys.readouterr().err


def test_data_the_tokenizer_cannot_read_is_one_line_exit_2(tmp_path, capsys, tiny_bert_dir):
    """The tiny BERT has MiniLM's (bert-base-uncased) vocabulary, which has no Cherokee or Tifinagh: a dataset
    in those scripts tokenizes to nothing but [UNK], and every map would describe [UNK] tokens. Refused in
    preflight, naming the first example."""
    from helpers import write_jsonl

    rows = [
        {"id": f"q{i}", "question": "ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ", "context": "ⴰⵎⴰⵣⵉⵖ ⵜⴰⵎⴰⵣⵉⵖⵜ", "topic": "t", "answerable": True}
        for i in range(4)
    ]
    data = write_jsonl(tmp_path / "zh.jsonl", rows)
    err = _one_line_exit_2(
        [str(_job_file(tmp_path, make_job(tmp_path, tiny_bert_dir, data))), "--check"], capsys, "model.name:"
    )
    assert "the dataset's first example" in err and "nothing but unknown tokens" in err
    assert not (tmp_path / "run").exists()


def _texts_with_an_empty_one(tmp_path: Path, fmt: str = "jsonl") -> Path:
    rows = [{"id": f"r{i}", "text": "" if i == 3 else f"the cat sat on mat number {i}"} for i in range(6)]
    rows.append({"id": "r6", "text": ""})
    p = tmp_path / f"texts.{fmt}"
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), p, row_group_size=2)
    else:
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_an_example_without_text_is_refused_at_preflight_where_it_has_no_tokens(
    tmp_path, capsys, monkeypatch, tiny_gpt2_dir, tiny_bert_dir, fmt
):
    """GPT-2's tokenizer adds no special tokens: an empty text is no tokens. Preflight names the first such
    example the run reads (and counts the rest) before any worker starts; a tokenizer that adds [CLS] and
    [SEP] gives the same example a map, and a selection that leaves it out runs. Parquet's index pass reads
    ids only; its empty texts are found from the text column, before any worker starts too."""
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)
    data = _texts_with_an_empty_one(tmp_path, fmt)

    def job(model, **data_fields):
        j = make_job(tmp_path, model, data)
        j["data"] = {"path": str(data), "format": fmt, "id_field": "id", **data_fields}
        return str(_job_file(tmp_path, j))

    err = _one_line_exit_2([job(tiny_gpt2_dir), "--check"], capsys, "example 'r3' (and 1 more) has no text")
    assert "model.name" in err
    assert not (tmp_path / "run").exists()
    assert main([job(tiny_gpt2_dir, limit=3), "--check"]) == 0  # r0..r2: all have text
    assert main([job(tiny_bert_dir), "--check"]) == 0  # [CLS] [SEP]: two tokens
    from rapids_attn.data.index import select_positions

    picked = [int(r) for r in select_positions(7, sample=4, seed=1)]  # a sampled selection: an array of records
    empty = [r for r in picked if r in (3, 6)]
    assert len(empty) == 1, picked  # the seed is chosen so that one of the two is drawn
    _one_line_exit_2([job(tiny_gpt2_dir, sample=4, seed=1), "--check"], capsys, f"example 'r{empty[0]}' has no text")


def test_a_task_metric_on_an_encoder_decoder_models_head_is_refused_at_preflight(tmp_path, capsys, monkeypatch):
    """BART's classification head reads its decoder, and the heads stage masks the encoder's heads (the only ones
    extract reads): ``heads.metric: auto`` (accuracy, from the head) is refused before any worker starts."""
    from helpers import bpe_tokenizer, make_job, write_jsonl
    from transformers import BartConfig, BartForSequenceClassification

    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)
    tok = bpe_tokenizer()
    cfg = BartConfig(
        vocab_size=len(tok), d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=128, num_labels=2,
    )  # fmt: skip
    BartForSequenceClassification(cfg).save_pretrained(tmp_path / "bart")
    tok.save_pretrained(tmp_path / "bart")
    capsys.readouterr()  # save_pretrained's progress bar
    rows = [
        {"id": f"q{i}", "question": f"q {i}?", "context": "a b c", "topic": "t", "answerable": True} for i in range(4)
    ]
    job = make_job(tmp_path, tmp_path / "bart", write_jsonl(tmp_path / "d.jsonl", rows), heads={"enabled": True})
    err = _one_line_exit_2(
        [str(_job_file(tmp_path, job)), "--check"], capsys, "heads.metric: accuracy scores the task head"
    )
    assert "encoder-decoder" in err and "retrieval" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("n", "want"), [(500, 64), (46, 16), (8, 8), (100, 16), (200, 32), (1000, 128), (1024, 128), (6078, 128)]
)
def test_auto_shard_size_makes_about_eight_shards_of_small_data(n, want):
    """``auto`` (the default): 128 examples, or about eight shards below 1,024 (multiples of 16, at least 16,
    at most the data): a size that depends on the data alone, so a resumed run finds its store's layout."""
    from rapids_attn.extract.stage import resolve_shard_size
    from rapids_attn.job import ExtractConfig

    assert ExtractConfig().shard_size == "auto"
    assert resolve_shard_size("auto", n) == want
    assert resolve_shard_size(48, n) == min(48, n)  # a number is taken as given, capped at the data


def test_auto_shard_size_is_the_default_and_a_bad_one_is_one_line(tmp_path, capsys, tiny_bert_dir, pair_data):
    job = make_job(tmp_path, tiny_bert_dir, pair_data)
    job["extract"].pop("shard_size", None)
    assert main([str(_job_file(tmp_path, job)), "--check"]) == 0
    assert "ok: 20 examples, 2 layers x 2 heads, 2 shards" in capsys.readouterr().out  # 20 examples: 16 and 4
    for bad in ("0", "many"):
        assert main([str(_job_file(tmp_path, job)), "--check", "--set", f"extract.shard_size={bad}"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "extract.shard_size" in err, err


@pytest.mark.parametrize("stages", [None, "heads"])
def test_more_local_cuda_workers_than_gpus_is_refused_in_preflight(
    tmp_path, capsys, monkeypatch, tiny_bert_dir, pair_data, stages
):
    """dask-cuda cannot start more workers than visible GPUs ("Can not scale beyond visible devices": exit 1 and
    a traceback, issue 35): preflight refuses it in one line naming both numbers, for any stage that starts the
    workers (a heads-only run too), before anything is written."""
    import types

    from rapids_attn import runtime

    monkeypatch.setattr(devices, "cuda_device_count", lambda: 1)
    monkeypatch.setattr(runtime, "cuda_device_count", lambda: 1)
    monkeypatch.setitem(sys.modules, "dask_cuda", types.ModuleType("dask_cuda"))  # importable, never started
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    job = make_job(
        tmp_path, tiny_bert_dir, pair_data, heads={"enabled": True, "metric": "retrieval", "probing": {"top_k": 2}}
    )
    job["runtime"] = {"cluster": "local-cuda", "n_workers": 2, "learn_backend": "cpu", "dashboard_address": ":0"}
    argv = [str(_job_file(tmp_path, job)), "--check", *(["--stages", stages] if stages else [])]
    err = _one_line_exit_2(argv, capsys, "runtime.n_workers: 2 workers")
    assert "1 GPU(s) are visible (CUDA_VISIBLE_DEVICES=0)" in err and "at most 1" in err
    assert not (tmp_path / "run").exists()
    job["runtime"]["n_workers"] = 1
    assert main([str(_job_file(tmp_path, job)), "--check"]) == 0
    # two MIG instances of one GPU: CUDA lists one device to this process, dask-cuda starts a worker per entry
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-a,MIG-b")
    job["runtime"]["n_workers"] = 2
    assert main([str(_job_file(tmp_path, job)), "--check"]) == 0


@pytest.mark.parametrize(
    ("sets", "names"),
    [
        (["extract.kernel=triton", "extract.device=cpu"], "extract.kernel: triton runs on a CUDA GPU; on the CPU set"),
        (["extract.kernel=triton", "extract.attention=eager"], "extract.kernel: triton runs under the blocked capture"),
    ],
    ids=["triton-on-cpu", "triton-with-eager"],
)
def test_a_kernel_that_cannot_run_is_one_line_exit_2(
    tmp_path, capsys, monkeypatch, tiny_bert_dir, pair_data, sets, names
):
    """The fused kernel on a CPU outside Triton's interpreter, or under the eager capture (which has no kernel):
    refused in preflight, naming the field and the fix, before anything is written."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    _check_refused(tmp_path, capsys, monkeypatch, tiny_bert_dir, pair_data, sets, [], "", names)


def test_another_jobs_store_is_refused_naming_what_changed(tmp_path, capsys, monkeypatch, tiny_bert_dir, pair_data):
    """Adding data.label_field to a job whose store exists makes the store another job's: the one line names the
    field (and each other changed setting, with both values), and the data file when its content changed."""
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)
    job = make_job(tmp_path, tiny_bert_dir, pair_data)
    del job["data"]["label_field"]
    assert main([str(_job_file(tmp_path, job)), "--stages", "extract"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    job["data"]["label_field"] = "answerable"
    err = _one_line_exit_2([str(_job_file(tmp_path, job)), "--check"], capsys, "holds the store of a different job")
    assert 'changed since it was made: data.label_field null -> "answerable")' in err, err
    assert "--overwrite" in err
    # a later stage alone over it (no extraction to replace it): the same line
    learn = [str(_job_file(tmp_path, job)), "--check", "--stages", "learn"]
    assert _one_line_exit_2(learn, capsys, "different job") == err
    err = _one_line_exit_2(
        [str(_job_file(tmp_path, job)), "--check", "--set", "extract.image_size=16"], capsys, "different job"
    )
    assert 'data.label_field null -> "answerable", extract.image_size 8 -> 16)' in err, err
    # the same settings over an edited data file: the file is named
    del job["data"]["label_field"]
    pair_data.write_text(pair_data.read_text().replace("question number 3", "question number three"))
    err = _one_line_exit_2([str(_job_file(tmp_path, job)), "--check"], capsys, "different job")
    assert "changed since it was made: the dataset's content (the file data.path names))" in err, err
    assert main([str(_job_file(tmp_path, job)), "--check", "--overwrite"]) == 0


def _repeated_field_file(tmp_path: Path, fmt: str) -> tuple[Path, str]:
    """The tiny job's pairs in ``fmt``, with the column (or JSONL key) ``question`` given twice: (the file, what
    the line must say)."""
    from helpers import pair_rows

    rows = pair_rows()
    cols = ["id", "question", "context", "question", "topic"]
    if fmt == "jsonl":
        p = tmp_path / "twice.jsonl"
        lines = [json.dumps({k: r[k] for k in cols if k != "question"}) for r in rows]
        lines = [
            line[:-1] + f', "question": "first", "question": {json.dumps(r["question"])}}}'
            for line, r in zip(lines, rows)
        ]
        p.write_text("\n".join(lines) + "\n")
        return p, f"line 1 of {p} names the key 'question' twice, and data.text_fields reads it"
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        p = tmp_path / "twice.parquet"
        arrays = [
            pa.array([str(r[c]) if c != "question" or i == 3 else "first" for r in rows]) for i, c in enumerate(cols)
        ]
        pq.write_table(pa.Table.from_arrays(arrays, names=cols), p)
        return p, f"the schema of {p} names the column 'question' twice (columns 2 and 4)"
    import csv

    p = tmp_path / f"twice.{fmt}"
    with open(p, "w", newline="") as f:
        w = csv.writer(f, delimiter="\t" if fmt == "tsv" else ",")
        w.writerow(cols)
        w.writerows([[r["id"], "first", r["context"], r["question"], r["topic"]] for r in rows])
    return p, f"the header (line 1) of {p} names the column 'question' twice (columns 2 and 4)"


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl", "parquet"])
def test_a_field_the_job_reads_named_twice_is_one_line_exit_2(tmp_path, capsys, monkeypatch, tiny_bert_dir, fmt):
    """A CSV header ``question,...,question`` (csv keeps the last), a JSONL record with the key twice (json keeps the
    last) and a Parquet schema with the column twice (no column to pick) are refused naming the file and where, and
    the setting that reads it; a repeated column the job does not read is left alone."""
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)
    data, names = _repeated_field_file(tmp_path, fmt)
    job = make_job(tmp_path, tiny_bert_dir, data)
    job["data"].update(format="csv" if fmt == "tsv" else fmt)
    job["data"].pop("label_field")
    _one_line_exit_2([str(_job_file(tmp_path, job)), "--check"], capsys, names)
    assert not (tmp_path / "run").exists()
    job["data"]["text_fields"] = ["context"]  # the repeated column is not read: nothing is ambiguous
    assert main([str(_job_file(tmp_path, job)), "--check"]) == 0, capsys.readouterr().err


def _compare_job(tmp_path: Path, model: Path, entries: list, finetune: bool = False) -> Path:
    """The tiny job on a tiny SQuAD file with the compare stage on, comparing ``entries`` (compare.models)."""
    from helpers import write_squad

    job = make_job(tmp_path, model, write_squad(tmp_path / "squad.json"))
    job["data"] = {"path": str(tmp_path / "squad.json")}
    job["compare"] = {"enabled": True, "models": [str(e) for e in entries], "examples": 6, "resamples": 100}
    if finetune:
        job["finetune"] = {"enabled": True, "max_steps": 2, "max_length": 64, "doc_stride": 16}
        job["model"]["max_length"] = 64  # the fine-tune's windows: no warning
    return _job_file(tmp_path, job)


def _copy_of(model: Path, where: Path) -> Path:
    shutil.copytree(model, where)
    return where


# (case id, compare.models as made from (the job's model, the test's folder), finetune enabled, what the line says)
COMPARED = [
    ("itself", lambda m, t: [m], False, "compare.models[0]: '{m}' is the job's own model (model.name '{m}')"),
    ("itself-as-a-link", lambda m, t: [_link(m, t / "link")], False, "compare.models[0]: '{t}/link' is the job's own"),
    ("itself-slash", lambda m, t: [f"{m}/"], False, "compare.models[0]: '{m}/' is the job's own model"),
    (
        "itself-second",
        lambda m, t: [_copy_of(m, t / "other"), m],
        False,
        "compare.models[1]: '{m}' is the job's own model",
    ),
    ("twice", lambda m, t: [t / "o", t / "o"], False, "compare.models[1]: '{t}/o' is compare.models[0] again"),
    (
        "twice-spelled-two-ways",
        lambda m, t: [_copy_of(m, t / "other"), f"{t}/other/"],
        False,
        "compare.models[1]: '{t}/other/' is the model compare.models[0] ('{t}/other') names already",
    ),
    (
        "twice-with-finetune",
        lambda m, t: [m, f"{m}/"],
        True,
        "compare.models[1]: '{m}/' is the model compare.models[0] ('{m}') names already",
    ),
    ("blank", lambda m, t: [t / "o", " "], False, "compare.models[1]: is empty; name a model"),
    # a bad entry is named as the user wrote it, never as model.name
    ("missing-folder", lambda m, t: [t / "nosuch"], False, "compare.models[0]: no such model folder: {t}/nosuch"),
    ("not-a-model", lambda m, t: [t], False, "compare.models[0]: folder {t} has no config.json"),
    (
        "no-weights",
        lambda m, t: [_without(m, t / "other", "*.safetensors")],
        False,
        "compare.models[0]: {t}/other has no weights",
    ),
    (
        "auto-map",
        lambda m, t: [_with_auto_map(_copy_of(m, t / "other"))],
        False,
        (
            "compare.models[0]: '{t}/other' asks for custom code (auto_map in its config.json: AutoConfig, AutoModel), "
            "which model.trust_remote_code: false does not run; review that code and set model.trust_remote_code: true"
        ),
    ),
]


def _link(model: Path, link: Path) -> Path:
    link.symlink_to(model, target_is_directory=True)
    return link


def _without(model: Path, where: Path, pattern: str) -> Path:
    shutil.copytree(model, where, ignore=shutil.ignore_patterns(pattern))
    return where


@pytest.mark.parametrize(
    ("entries", "finetune", "names"), [c[1:] for c in COMPARED], ids=[f"compare-{c[0]}" for c in COMPARED]
)
def test_a_bad_compared_model_is_named_as_written(
    tmp_path, capsys, monkeypatch, tiny_bert_dir, entries, finetune, names
):
    """compare.models: the job's own model (without a fine-tune, nothing would change), one model listed twice (as
    written, or two ways), and an entry that is no usable model are refused in preflight in one line naming
    compare.models[i] (not model.name), before anything is written."""
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)
    folder = tmp_path / "models"
    folder.mkdir()
    job = _compare_job(tmp_path, tiny_bert_dir, entries(tiny_bert_dir, folder), finetune)
    err = _one_line_exit_2([str(job), "--check"], capsys, names.format(m=tiny_bert_dir, t=folder))
    assert "model.name:" not in err, err
    assert not (tmp_path / "run").exists()


def test_the_base_of_a_fine_tune_may_be_listed_with_other_models(tmp_path, capsys, monkeypatch, tiny_bert_dir):
    """With finetune enabled the job's model is the fine-tune: compare.models naming model.name (however written)
    compares it with its base, as an empty compare.models does, so it is accepted and labelled ``base``; another
    model, named twice, is not."""
    from rapids_attn.compare.stage import compared_models
    from rapids_attn.jobfile import load_job

    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)
    other = _copy_of(tiny_bert_dir, tmp_path / "other")
    job = _compare_job(tmp_path, tiny_bert_dir, [f"{tiny_bert_dir}/", other], finetune=True)
    assert main([str(job), "--check"]) == 0, capsys.readouterr().err
    label, others = compared_models(load_job(job))
    assert label == "finetuned" and [o.label for o in others] == ["base", "other"]
    job = _compare_job(tmp_path, tiny_bert_dir, [tiny_bert_dir, other, f"{other}/"], finetune=True)
    _one_line_exit_2([str(job), "--check"], capsys, f"compare.models[2]: '{other}/' is the model compare.models[1]")
    assert not (tmp_path / "run").exists()


def test_a_compared_model_failing_a_job_setting_is_named(tmp_path, capsys, monkeypatch, tiny_bert_dir):
    """A job setting the compared model cannot take (model.max_length past its positions) names the setting and
    the compared model as written."""
    from helpers import tiny_bert_config
    from transformers import AutoTokenizer, BertModel

    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)
    short = tmp_path / "short"  # 64 positions, the job's model 128
    BertModel(tiny_bert_config(AutoTokenizer.from_pretrained(tiny_bert_dir).vocab_size)).save_pretrained(short)
    cfg = json.loads((short / "config.json").read_text())
    cfg["max_position_embeddings"] = 64
    (short / "config.json").write_text(json.dumps(cfg))
    BertModel.from_pretrained(short, ignore_mismatched_sizes=True).save_pretrained(short)
    AutoTokenizer.from_pretrained(tiny_bert_dir).save_pretrained(short)
    job = _compare_job(tmp_path, tiny_bert_dir, [short])
    raw = yaml.safe_load(job.read_text())
    raw["model"]["max_length"] = 100
    job.write_text(yaml.safe_dump(raw))
    capsys.readouterr()
    _one_line_exit_2(
        [str(job), "--check"], capsys, f"compare.models[0] ('{short}'): model.max_length: 100 exceeds the model's 64"
    )
