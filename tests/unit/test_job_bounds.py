"""Hostile or oversized job files (issue 33): each is refused in one short line that names the file (and the
line) or the field, before it costs anything: nesting depth, YAML alias expansion, the file's size, the
length of a value an error quotes, and settings past what the machine or the stage can use."""

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rapids_attn import job as J
from rapids_attn import jobfile
from rapids_attn.errors import JobConfigError, UserError
from rapids_attn.job import MAX_LINE, one_line, show
from rapids_attn.jobfile import MAX_DEPTH, MAX_JOB_BYTES, MAX_NODES, load_job
from rapids_attn.run import main

#: what a refusal of a job file may print: one line, a quoted value cut to 120 characters, the rest the message
#: and its hint (the list of known presets is the longest: 436 characters)
SHORT = 600


def job_text(tmp_path: Path, extra: str = "") -> str:
    data = tmp_path / "d.txt"
    data.write_text("hello\nworld\n")
    return f"data:\n  path: {data}\nmodel:\n  name: minilm-l6\n{extra}"


def write_job(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "job.yaml"
    p.write_text(text)
    return p


def laughs(levels: int = 9) -> str:
    """The "billion laughs": each alias repeats the one before nine times (9**9 values from ~500 bytes)."""
    text = '  a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
    for i in range(1, levels):
        text += f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n"
    return text


def refused(path: Path, overrides=(), says: str = "", capsys=None) -> str:
    """The one line ``load_job`` raises (a UserError: exit 2), checked to be short and to name the file."""
    t0 = time.perf_counter()
    with pytest.raises(JobConfigError) as e:
        load_job(path, list(overrides))
    took = time.perf_counter() - t0
    line = str(e.value)
    assert isinstance(e.value, UserError) and e.value.exit_code == 2
    assert "\n" not in line and len(line) < SHORT, line[:2000]
    assert says in line, line
    assert took < 20, f"{took:.1f}s to refuse"
    return line


# -- 1. nesting depth ------------------------------------------------------------------------------------

DEEP = 100_000


@pytest.mark.parametrize(
    ("body", "line"),
    [
        ("extract:\n  layers: " + "[" * DEEP + "]" * DEEP + "\n", 6),
        ("extract:\n  layers: " + "{a: " * DEEP + "1" + "}" * DEEP + "\n", 6),
        ("extract:\n  layers:\n    " + "- " * DEEP + "1\n", 7),
        ("extract:\n" + "".join(" " * (i + 1) + "a:\n" for i in range(2 * MAX_DEPTH)) + " " * 400 + "1\n", None),
        ("extract:\n  layers: " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "\n", 6),
    ],
    ids=["flow-sequences", "flow-mappings", "block-sequences", "indented-mappings", "just-past-the-bound"],
)
def test_deep_nesting_is_refused_in_one_line_naming_the_file_and_line(tmp_path, capsys, body, line):
    path = write_job(tmp_path, job_text(tmp_path, body))
    msg = refused(path, says=f"nested deeper than a job may be ({MAX_DEPTH} levels")
    assert msg.startswith(str(path))
    assert re.search(r"\.yaml line \d+: ", msg)
    if line is not None:
        assert f"job.yaml line {line}:" in msg
    assert main([str(path), "--check"]) == 2  # RecursionError before: 2,989 lines of traceback, exit 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nested deeper" in err


def test_nesting_within_the_bound_is_read(tmp_path):
    """A value nested 50 deep is read (and refused as a value, not as YAML)."""
    path = write_job(tmp_path, job_text(tmp_path, "extract:\n  layers: " + "[" * 50 + "]" * 50 + "\n"))
    msg = refused(path, says="extract.layers.0")
    assert "nested" not in msg


def test_deep_set_value_is_refused_not_read_as_a_string(tmp_path):
    """A --set value that is not YAML is taken as a string; one past the bounds is refused."""
    msg = refused(
        write_job(tmp_path, job_text(tmp_path)), ["extract.layers=" + "[" * DEEP], says="nested deeper than a job"
    )
    assert msg.startswith("--set extract.layers=[[[") and "(100,015 characters)" in msg


# -- 2. YAML alias expansion -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (
            "unused:\n" + laughs(9),
            f"aliases expand this value to 597,871 values, more than a job may hold ({MAX_NODES:,})",
        ),
        ("extract:\n  layers: &x [*x]\n", "a YAML alias refers to a value that contains it (a loop)"),
        (
            "unused:\n" + "".join(f"  a{i}: &a{i} [*a{i - 1}]\n" if i else "  a0: &a0 [1]\n" for i in range(150)),
            f"nest this value 101 levels deep, deeper than a job may ({MAX_DEPTH})",
        ),
    ],
    ids=["billion-laughs", "alias-loop", "alias-chain-depth"],
)
def test_alias_expansion_is_bounded_in_one_line(tmp_path, capsys, body, says):
    """A 500-byte job whose aliases expand to 9**9 values expanded inside the error (a 39 MB or 351 MB line, or
    6.2 GB and MemoryError); refused while it is read, with its line, before anything expands."""
    path = write_job(tmp_path, job_text(tmp_path, body))
    msg = refused(path, says=says)
    assert re.match(rf"{re.escape(str(path))} line \d+: ", msg), msg
    assert main([str(path), "--check"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_laughs_in_a_set_value_are_refused(tmp_path):
    value = (
        "{" + ", ".join(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}" if i else "1"] * 9) + "]" for i in range(9)) + "}"
    )
    refused(write_job(tmp_path, job_text(tmp_path)), [f"extract.layers={value}"], says="aliases expand")


def test_merge_keys_and_small_aliases_still_work(tmp_path):
    """``<<: *base`` (its keys overridden) and an alias reused a few times are ordinary YAML a job may use."""
    path = write_job(
        tmp_path,
        job_text(
            tmp_path,
            "cluster: &c\n  n_clusters: 3\n  k_sweep: &sweep [2, 9]\n"
            "explain:\n  <<: {report: false, head_views: 1}\n  head_views: 0\n"
            "heads:\n  <<: &h {examples: 40, batch_size: 4}\n  batch_size: 2\n"
            "relevance:\n  <<: *h\n",
        ),
    )
    cfg = load_job(path)
    assert (cfg.explain.report, cfg.explain.head_views) == (False, 0)
    assert (cfg.heads.examples, cfg.heads.batch_size) == (40, 2)
    assert (cfg.relevance.examples, cfg.relevance.batch_size) == (40, 4)
    assert cfg.cluster.k_sweep == [2, 9]


def test_a_job_of_too_many_values_is_refused_as_it_is_read(tmp_path):
    values = ", ".join(["1"] * (MAX_NODES + 10))
    refused(
        write_job(tmp_path, job_text(tmp_path, f"unused: [{values}]\n")),
        says=f"job.yaml line 5: more than {MAX_NODES:,} values, more than a job may hold",
    )


def test_a_job_of_many_values_within_the_bound_is_read(tmp_path):
    layers = ", ".join(map(str, range(MAX_NODES // 4)))
    cfg = load_job(write_job(tmp_path, job_text(tmp_path, f"extract:\n  layers: [{layers}]\n")))
    assert len(cfg.extract.layers) == MAX_NODES // 4


# -- 3. the file's size, and values quoted in errors -----------------------------------------------------


def test_job_file_over_the_size_bound_is_not_read(tmp_path, capsys):
    path = write_job(tmp_path, job_text(tmp_path, "extract:\n  layers: [" + "1, " * 600_000 + "1]\n"))
    assert path.stat().st_size > MAX_JOB_BYTES
    msg = refused(path, says=f"job: {path} is 1.8 MB; a job file may be at most 1 MB")
    assert main([str(path), "--check"]) == 2
    assert msg in capsys.readouterr().err


def test_a_preset_over_the_size_bound_is_not_read(tmp_path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "big.yaml").write_text("cluster:\n  n_clusters: 3\n" + "#" * (MAX_JOB_BYTES + 1))
    refused(write_job(tmp_path, job_text(tmp_path, "extends: [big]\n")), says="extends: preset 'big': ")


K = "k" * 500_000


@pytest.mark.parametrize(
    ("body", "overrides", "says"),
    [
        (f'  limit: "{K}"\n', [], "data.limit: Input should be a valid integer"),
        ("", [f'data.limit="{K}"'], "(500,000 characters)"),
        ("", [f"data.{K}=1"], "unknown key; valid keys here: path, format"),
        ("", [f"data.limit {K}"], "expected KEY=VALUE"),
        (f"  ? {K}\n  : 1\n", [], "unknown key"),
        (f"  ? {K[:300_000]}\n  : 1\n  ? {K[:300_000]}\n  : 2\n", [], "duplicate key 'kkkk"),
        ("  limit: -0x" + "f" * 5000 + "\n", [], "greater than 0 (got a number of 6,021 digits)"),
        ("  limit: " + "1" * 5000 + "\n", [], "(5,000 characters) (Exceeds the limit (4300 digits)"),
        ("  seed: 2020-13-01\n", [], "cannot read '2020-13-01' (month must be in 1..12)"),
        ("extends: ['" + "m" * 5000 + "']\n", [], "extends: no preset 'mmmm"),
    ],
    ids=["value", "set-value", "set-key", "set-no-equals", "key", "duplicate-key", "hex-int", "int", "date", "preset"],
)
def test_errors_quote_a_long_value_cut_with_its_length(tmp_path, capsys, body, overrides, says):
    """A 50 MB job with a huge list gave a 47.8 MB error line; each quoted value is cut after 120 characters."""
    text = (
        job_text(tmp_path).replace("model:", body + "model:", 1) if body.startswith("  ") else job_text(tmp_path, body)
    )
    path = write_job(tmp_path, text)
    refused(path, overrides, says=says)
    sets = [a for o in overrides for a in ("--set", o)]
    assert main([str(path), "--check", *sets]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < SHORT


def test_a_long_list_is_shown_by_its_first_entries_and_length(tmp_path):
    layers = ", ".join(["1"] * 60_000)
    msg = refused(write_job(tmp_path, job_text(tmp_path, f"extract:\n  layers: [{layers}]\n")), says="(60,000 entries)")
    assert "extract: layers must be distinct non-negative indices, got [1, 1, 1" in msg


def test_show_and_one_line():
    assert show("short") == "'short'" and show([0, 1]) == "[0, 1]" and show(3) == "3"
    assert show("x" * 1000) == repr("x" * 120) + "... (1,000 characters)"
    assert show(list(range(100))).endswith("...] (100 entries)")
    assert show(int("f" * 5000, 16)) == "a number of 6,021 digits"
    line = one_line("start " + "y" * 10_000 + " the fix")
    assert len(line) < MAX_LINE + 50 and line.startswith("start yyy") and line.endswith("y the fix")
    assert "characters cut" in line and one_line("a\nb") == "a b"


def test_every_load_job_error_is_cut_to_one_short_line(tmp_path, monkeypatch):
    """Whatever message a check builds, load_job raises at most MAX_LINE characters of it, start and end."""

    def long_error(*a, **k):
        raise JobConfigError("data.path: " + "z" * 50_000 + "; fix it")

    monkeypatch.setattr(jobfile, "_expand_extends", long_error)
    with pytest.raises(JobConfigError) as e:
        load_job(write_job(tmp_path, job_text(tmp_path)))
    assert len(str(e.value)) <= MAX_LINE + 50 and str(e.value).endswith("; fix it")


# -- 4. runtime.n_workers --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sets", "field", "says"),
    [
        (["runtime.n_workers=100000"], "runtime.n_workers", "2 CPUs here, at most 8 workers (4 per CPU)"),
        (["runtime.n_workers=9"], "runtime.n_workers", "lower runtime.n_workers, or leave it out"),
        (["runtime.n_workers=4", "runtime.threads_per_worker=3"], "runtime.threads_per_worker", "4 workers x 3"),
        (["runtime.threads_per_worker=9"], "runtime.threads_per_worker", "9 threads in a worker for 2 CPUs"),
        (
            ["runtime.cluster=local-cuda", "runtime.threads_per_worker=100"],
            "runtime.threads_per_worker",
            "at most 8 threads in all",
        ),
    ],
    ids=["n_workers-100000", "n_workers-9", "workers-x-threads", "threads", "local-cuda-threads"],
)
def test_local_workers_past_the_machine_are_refused(tmp_path, monkeypatch, sets, field, says):
    monkeypatch.setattr(J, "available_cpus", lambda: 2)
    msg = refused(write_job(tmp_path, job_text(tmp_path)), sets, says=says)
    assert f"job.yaml: {field}: " in msg


@pytest.mark.parametrize(
    "sets",
    [
        ["runtime.n_workers=8"],
        ["runtime.n_workers=4", "runtime.threads_per_worker=2"],
        ["runtime.threads_per_worker=8"],
        ["runtime.cluster=local-cuda", "runtime.n_workers=64"],  # one per GPU: checked with the devices
        ["runtime.cluster=scheduler", "runtime.address=tls://h:8786", "runtime.n_workers=100000"],  # not used
        ["runtime.cluster=scheduler", "runtime.address=tls://h:8786", "runtime.threads_per_worker=64"],
    ],
    ids=["n_workers-8", "4x2", "threads-8", "local-cuda", "scheduler-n_workers", "scheduler-threads"],
)
def test_workers_the_machine_can_run_are_accepted(tmp_path, monkeypatch, sets):
    monkeypatch.setattr(J, "available_cpus", lambda: 2)
    load_job(write_job(tmp_path, job_text(tmp_path)), sets)


def test_n_workers_100000_fails_check_with_exit_2(tmp_path, capsys):
    assert main([str(write_job(tmp_path, job_text(tmp_path))), "--check", "--set", "runtime.n_workers=100000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "runtime.n_workers: more local workers than this machine runs" in err


def test_available_cpus_is_this_process_share():
    import os

    assert 1 <= J.available_cpus() <= (os.cpu_count() or 1)


# -- 5. relevance.pagerank_heads -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("[]", "relevance.pagerank_heads: is empty, which ranks every token the same"),
        (
            "[-1]",
            "relevance.pagerank_heads: must be distinct non-negative head indices; list each head once (got [-1])",
        ),
        ("[0, 2, 0]", "must be distinct non-negative head indices; list each head once (got [0, 2, 0])"),
        ("[true]", "relevance.pagerank_heads: must be a whole number in each entry, not true/false"),
    ],
    ids=["empty", "negative", "repeated", "bool"],
)
def test_pagerank_heads_must_name_some_distinct_heads(tmp_path, value, says):
    refused(write_job(tmp_path, job_text(tmp_path)), [f"relevance.pagerank_heads={value}"], says=says)


def test_pagerank_heads_valid_or_null_are_accepted(tmp_path):
    path = write_job(tmp_path, job_text(tmp_path))
    assert load_job(path, ["relevance.pagerank_heads=[3, 0]"]).relevance.pagerank_heads == [3, 0]
    assert load_job(path, ["relevance.pagerank_heads=null"]).relevance.pagerank_heads is None


# -- 6. the extraction key -------------------------------------------------------------------------------


def test_label_and_group_fields_are_part_of_the_extraction_key(tmp_path):
    """The extract stage writes each example's label and group into the store (``example_label``,
    ``example_group``, extract/shard.py), which maps.parquet and the report's metadata tests read: a store made
    without data.label_field holds empty labels, so it must not be reused for a job that names one (it would
    report no labels, silently). Dropping label_field from the key needs the store's labels rewritten when it
    changes; until then it stays, and a job that does not name it keeps its key. The text fields are read by
    the model, so they change the key too; batching and learn settings do not."""
    path = write_job(tmp_path, job_text(tmp_path))
    base = load_job(path).extraction_key()
    assert load_job(path, ["data.label_field=null", "data.group_field=null"]).extraction_key() == base
    assert load_job(path, ["data.label_field=answerable"]).extraction_key() != base
    assert load_job(path, ["data.group_field=topic"]).extraction_key() != base
    assert load_job(path, ["data.text_fields=[question]"]).extraction_key() != base
    assert load_job(path, ["heads.probing.folds=3", "relevance.pagerank_heads=[0]"]).extraction_key() == base


# -- 7. --help names every stage -------------------------------------------------------------------------


def test_help_names_every_stage_in_order_without_importing_torch():
    from rapids_attn.registry import registered_stages

    STAGES = registered_stages()
    code = (
        "import sys; from rapids_attn.run import build_parser; print(build_parser().format_help()); "
        "print('torch imported' if 'torch' in sys.modules else 'no torch')"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.rstrip().endswith("no torch")
    listed = re.search(r"comma-separated subset of\s+([a-z,]+)", r.stdout)
    assert listed is not None, r.stdout
    assert listed.group(1).strip(",").split(",") == list(STAGES)
    for name, stage in STAGES.items():
        if stage.runs_by_default.__func__ is not STAGES["extract"].runs_by_default.__func__:
            assert f"{name}.enabled" in " ".join(r.stdout.split())  # how a stage that runs only when enabled runs


@pytest.mark.parametrize("field", ["data.path", "model.name", "output.dir", "runtime.scheduler_file"])
@pytest.mark.parametrize("length", ["name", "path"])
def test_a_path_no_file_system_holds_is_refused_naming_its_field(tmp_path, field, length):
    """A 5,000-character data.path ended in ``OSError: File name too long`` and a traceback, the whole path in it."""
    value = "/tmp/" + ("x" * 5000 if length == "name" else "/".join(["y" * 200] * 30))
    sets = [f"{field}={value}"]
    if field == "runtime.scheduler_file":
        sets.append("runtime.cluster=scheduler")
    say = refused(write_job(tmp_path, job_text(tmp_path)), sets, f"{field}: /tmp/")
    assert "too long for a file system" in say and "shorten it" in say and len(say) < SHORT


@pytest.mark.parametrize("value", ["null", "''", "5", "'  '"])
def test_an_output_dir_that_names_no_directory_says_how_to_fix_it(tmp_path, value):
    """It said "Input is not a valid path for <class 'pathlib.Path'>", with no fix."""
    say = refused(write_job(tmp_path, job_text(tmp_path)), [f"output.dir={value}"], "output.dir: must name a directory")
    assert "leave it out for runs/<job name>" in say and "pathlib" not in say
