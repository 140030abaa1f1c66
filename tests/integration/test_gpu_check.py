"""The GPU check in ``../shared/gpu-check`` (checks.py, run_gpu_check.sh) kept in step with the project's names.

The check is copied into a checkout as ``gpu_check/`` and run on a lent GPU machine (its README), where a call to
a renamed function, a job field or a CLI flag that no longer exists would only show as a failed step after minutes
of device time. Here, on the CPU:

- the subcommands that run on a CPU (``blocked``, ``overhead``, ``models``, small sizes) run from a copy laid out
  like a checkout, and each must print its JSON lines with ``"ok": true``;
- the subcommands that need CUDA, CuPy or RMM (``env``, ``zarr_gpu``, ``rmm_torch``) are checked statically: every
  project name checks.py imports exists, and every call to one binds to its signature;
- run_gpu_check.sh's job files (rendered by the script's own shell code) load through the project's loader and
  pass preflight with CPU stand-ins (extract on cpu, a local cluster), its ``rapids_attn.run`` and benchmark
  invocations take only flags their parsers accept, its pytest ``-k`` names tests that exist, and the
  summary.json fields it reads are fields the job writes.

Skipped where ``../shared/gpu-check`` is absent (CI clones the repository with ``../shared`` beside it);
``RAPIDS_ATTN_GPU_CHECK=path`` checks another copy instead.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, SHARED_SQUAD

#: the shared check (RAPIDS_ATTN_GPU_CHECK names another copy: a checkout's gpu_check/ while its calls are adapted)
GPU_CHECK = Path(os.environ.get("RAPIDS_ATTN_GPU_CHECK") or REPO.parent / "shared" / "gpu-check")
CHECKS = GPU_CHECK / "checks.py"
SCRIPT = GPU_CHECK / "run_gpu_check.sh"

pytestmark = pytest.mark.skipif(
    not (CHECKS.is_file() and SCRIPT.is_file()), reason=f"no GPU check at {GPU_CHECK} (../shared is not beside it)"
)

#: the subcommands that run on a CPU, as small as they go (the whole run: about 20 s on two shared cores)
CPU_RUNS = {
    "blocked": ["--lengths", "256", "--repeat", "1"],
    "overhead": ["--batch", "4", "--layers", "2", "--repeat", "1", "--profile-examples", "2"],
    "models": [],  # --out is added: the jobs' model, which the job files below name
}
#: the JSON lines each prints on a CPU (float16 is skipped there): check name -> how many
CPU_LINES = {
    "blocked": {"blocked_vs_eager_padded": 2, "blocked_long": 1},
    "overhead": {"capture_overhead": 1},
    "models": {"models": 1},
}
#: project modules checks.py may import (the rest are third-party: torch, transformers, cupy, rmm, dask_cuda)
PROJECT = ("rapids_attn", "helpers", "benchmarks")

#: one process runs checks.main() once per subcommand (the imports paid once), as checks.py is run: from the
#: checkout's root, its own sys.path setup, each result one JSON line
DRIVER = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("checks", sys.argv[1])
checks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(checks)
for argv in json.loads(sys.argv[2]):
    sys.argv = ["checks.py", *argv]
    print("=== " + argv[0], flush=True)
    rc = checks.main()
    print("=== rc " + str(rc), flush=True)
"""


def checkout_like(root: Path) -> Path:
    """``root`` laid out as a checkout with the check copied in: gpu_check/ plus the repository's package and tests
    (checks.py takes its parent's parent as the repository and puts it, tests/ and gpu_check/stub on sys.path)."""
    shutil.copytree(GPU_CHECK, root / "gpu_check", ignore=shutil.ignore_patterns("wheels", "__pycache__"))
    for name in ("rapids_attn", "tests"):
        (root / name).symlink_to(REPO / name, target_is_directory=True)
    return root


@pytest.fixture(scope="module")
def cpu_runs(tmp_path_factory):
    """The CPU subcommands' output: {subcommand: (exit code, [JSON lines], text)}, and the models' directory."""
    root = checkout_like(tmp_path_factory.mktemp("checkout"))
    out = tmp_path_factory.mktemp("gc")
    runs = [
        [cmd, "--device", "cpu", *args] + (["--out", str(out)] if cmd == "models" else [])
        for cmd, args in CPU_RUNS.items()
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.update(MPLBACKEND="Agg", OMP_WAIT_POLICY="PASSIVE")
    p = subprocess.run(
        [sys.executable, "-c", DRIVER, str(root / "gpu_check" / "checks.py"), json.dumps(runs)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    results, name, lines, text = {}, None, [], []
    for line in p.stdout.splitlines():
        if line.startswith("=== rc "):
            results[name] = (int(line[len("=== rc ") :]), lines, "\n".join(text))
            name = None
        elif line.startswith("=== "):
            name, lines, text = line[4:], [], []
        elif name is not None:
            text.append(line)
            if line.startswith('{"check"'):
                lines.append(json.loads(line))
    return results, out / "bert4x12", p


def _failed(rows: list[dict]) -> str:
    """What a failed check says (checks.py reports a raised exception as {"ok": false, "error": ...}: the error
    names the call, e.g. "ImportError: cannot import name 'register' from 'rapids_attn.extract.blocked'")."""
    return "; ".join(f"{r['check']}: {r.get('error') or json.dumps(r)[:600]}" for r in rows if r.get("ok") is not True)


@pytest.mark.parametrize("cmd", list(CPU_RUNS))
def test_cpu_subcommand_reports_ok(cpu_runs, cmd):
    results, _, p = cpu_runs
    assert cmd in results, f"checks.py {cmd} did not finish: {p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    rc, rows, text = results[cmd]
    assert not _failed(rows), f"checks.py {cmd} --device cpu: {_failed(rows)}"
    assert rc == 0, f"checks.py {cmd} exited {rc}: {text[-2000:]}"
    counts = {}
    for r in rows:
        counts[r["check"]] = counts.get(r["check"], 0) + 1
    assert counts == CPU_LINES[cmd], f"checks.py {cmd} printed {counts}, expected {CPU_LINES[cmd]}: {text[-2000:]}"
    if cmd == "overhead":  # a measurement: its numbers must at least be numbers of the batch asked for
        (row,) = rows
        assert row["examples"] == 4 and row["layers"] == 2 and row["device"] == "cpu"
        assert row["seconds"]["bare_sdpa"] > 0 and row["seconds"]["blocked_capture"] > 0
        assert row["capture_over_bare"] > 0 and row["max_tokens"] >= row["mean_tokens"] > 0
        assert row["profiled_one_batch"]["examples"] == 2
    if cmd == "blocked":
        long = [r for r in rows if r["check"] == "blocked_long"]
        assert [r["tokens"] for r in long] == [256] and all(r["finite"] for r in long)
        assert all("blocked_vs_eager" in r and "capture_vs_eager" in r for r in long)  # eager ran: compared
    if cmd == "models":
        assert (Path(rows[0]["path"]) / "config.json").is_file()


# -- checks.py's project names, statically (for the subcommands that need CUDA, CuPy or RMM) -----------------------


def _is_project(module: str | None) -> bool:
    return bool(module) and module.split(".")[0] in PROJECT


def _resolve(module: str, name: str):
    mod = importlib.import_module(module)
    if hasattr(mod, name):
        return getattr(mod, name)
    if not hasattr(mod, "__path__"):
        raise AttributeError(f"{module} has no {name!r}")
    return importlib.import_module(f"{module}.{name}")  # a submodule: from rapids_attn import runtime


def _imports(tree: ast.AST) -> list[tuple[int, str, str | None, str]]:
    """(line, module, name or None for ``import module``, local alias) of every project import in ``tree``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and _is_project(node.module):
            out += [(node.lineno, node.module, a.name, a.asname or a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name, None, a.asname or a.name) for a in node.names if _is_project(a.name)]
    return out


def test_every_project_name_checks_py_imports_exists():
    tree = ast.parse(CHECKS.read_text(), str(CHECKS))
    found = _imports(tree)
    assert {m.split(".")[0] for _, m, _, _ in found} >= {"rapids_attn"}, "checks.py imports nothing of the project?"
    missing = []
    for line, module, name, _ in found:
        try:
            importlib.import_module(module) if name is None else _resolve(module, name)
        except (ImportError, AttributeError) as e:
            what = f"import {module}" if name is None else f"from {module} import {name}"
            missing.append(f"checks.py line {line}: {what}: {type(e).__name__}: {e}")
    assert not missing, "the GPU check imports names the project no longer has:\n" + "\n".join(missing)


def _calls(func: ast.FunctionDef, names: dict[str, object]):
    """(call node, callable, placeholders to bind before the call's own arguments) for each call in ``func`` to a
    project name: the name itself, an attribute of it (``TokenMasks.from_ids``), or a method of an instance of a
    project class made in the same function (``gpu = LearnBackend(...); gpu.read(...)``,
    ``AttentionCapture(m, 2).run(...)``)."""
    instances = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            made = names.get(getattr(node.value.func, "id", None))
            if inspect.isclass(made):
                instances.update({t.id: made for t in node.targets if isinstance(t, ast.Name)})

    def method(cls, attr):
        static = inspect.getattr_static(cls, attr, None)
        if static is None:
            raise AttributeError(f"{cls.__qualname__} has no attribute {attr!r}")
        if isinstance(static, property):
            return None, 0
        bound = isinstance(static, (classmethod, staticmethod))
        return getattr(cls, attr), 0 if bound else 1

    for node in ast.walk(func):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        try:
            if isinstance(f, ast.Name) and f.id in names:
                yield node, names[f.id], 0
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in names:
                owner = names[f.value.id]
                yield node, *(method(owner, f.attr) if inspect.isclass(owner) else (getattr(owner, f.attr), 0))
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in instances:
                yield node, *method(instances[f.value.id], f.attr)
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Call):
                made = names.get(getattr(f.value.func, "id", None))
                if inspect.isclass(made):
                    yield node, *method(made, f.attr)
        except AttributeError as e:
            yield node, e, 0


def test_every_call_checks_py_makes_to_the_project_binds():
    """A renamed keyword (``block_bytes=``), a dropped or added positional parameter, or a renamed method fails
    here, naming the line, even in the subcommands that only run on a GPU."""
    tree = ast.parse(CHECKS.read_text(), str(CHECKS))
    top = {alias: (m, n) for _, m, n, alias in _imports(tree) if n is not None}
    bad, bound = [], 0
    for func in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        local = dict(top) | {alias: (m, n) for _, m, n, alias in _imports(func) if n is not None}
        names = {}
        for alias, (module, name) in local.items():
            try:
                names[alias] = _resolve(module, name)
            except (ImportError, AttributeError):
                pass  # test_every_project_name_checks_py_imports_exists names it
        for node, target, selves in _calls(func, names):
            where = f"checks.py line {node.lineno} ({func.name}): {ast.unparse(node)[:160]}"
            if isinstance(target, Exception):
                bad.append(f"{where}: {target}")
                continue
            if target is None or inspect.ismodule(target) or not callable(target):
                continue
            if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
                continue
            try:
                sig = inspect.signature(target)
            except (TypeError, ValueError):
                continue
            try:
                sig.bind(*[None] * (selves + len(node.args)), **{k.arg: None for k in node.keywords})
                bound += 1
            except TypeError as e:
                bad.append(f"{where}: {e} (signature {sig})")
    assert not bad, "the GPU check calls the project with arguments it no longer takes:\n" + "\n".join(bad)
    assert bound >= 10, f"only {bound} calls bound: the walk over checks.py found too little"


def test_zarr_gpu_reads_what_it_reads_on_the_cpu(tmp_path):
    """zarr_gpu's arrays and calls, with the CPU backend (its GPU half needs CuPy): the planted store has the array
    it reads, and LearnBackend.read gives float32 rows of it."""
    import numpy as np
    from helpers import planted_store

    from rapids_attn.backends.learn import LearnBackend

    src = CHECKS.read_text()
    array = re.search(r'gpu\.read\(g\["(\w+)"\], slice\(0, (\d+)\)\)', src)
    assert array, "checks.py's zarr_gpu no longer reads g[NAME][0:N] through LearnBackend.read: update this test"
    g, _ = planted_store(tmp_path)
    assert array[1] in g, f"checks.py zarr_gpu reads g[{array[1]!r}]; the planted store has {sorted(g.keys())}"
    got = LearnBackend("sklearn", "gpu check").read(g[array[1]], slice(0, int(array[2])))
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and len(got) == int(array[2])


# -- run_gpu_check.sh: job files, invocations, pytest selection, summary fields --------------------------------


def _script() -> str:
    return SCRIPT.read_text()


def render_jobs(repo: Path, gc: Path) -> dict[str, Path]:
    """The job files run_gpu_check.sh writes, by its own shell code (from ``DATA=""`` up to the first job's run)
    with REPO and GC set: {job name: path}."""
    text = _script()
    start = text.index('\nDATA=""')
    end = text.index("\nif wanted job_local_cuda")
    gc.mkdir(parents=True, exist_ok=True)
    code = f"set -u\nREPO={shlex.quote(str(repo))}\nGC={shlex.quote(str(gc))}\n{text[start:end]}\n"
    p = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 0, f"run_gpu_check.sh's job files: {p.stderr[-2000:]}"
    jobs = {f.stem: f for f in sorted(gc.glob("*.yaml"))}
    assert jobs, f"run_gpu_check.sh wrote no job file into {gc}"
    return jobs


def run_invocations() -> list[tuple[int, list[str]]]:
    """(line, words after ``-m rapids_attn.run``) of every run of the job CLI in the script."""
    out = []
    for i, line in enumerate(_script().splitlines(), 1):
        if "rapids_attn.run" in line and not line.lstrip().startswith("#"):
            words = shlex.split(line.split("rapids_attn.run", 1)[1], comments=True)
            out.append((i, words))
    return out


def test_script_runs_the_job_cli_with_flags_it_accepts():
    from rapids_attn.run import build_parser, overrides_in_order

    runs = run_invocations()
    assert runs, "run_gpu_check.sh no longer runs python -m rapids_attn.run: update this test"
    for line, words in runs:
        args, extra = build_parser().parse_known_args(words)  # exits 2 on a bad value
        unknown = [x for x in extra if "=" not in x or x.startswith("-")]  # as rapids_attn.run.main reads them
        assert not unknown, f"run_gpu_check.sh line {line}: rapids_attn.run does not take {unknown}"
        assert re.fullmatch(r"\$GC/\w+\.yaml", args.job), f"line {line}: a job other than the script's own: {args.job}"
        assert overrides_in_order(words) == args.overrides + [x for x in extra if x not in unknown]


@pytest.mark.parametrize("data", ["quickstart", "squad"])
def test_script_job_files_load_and_pass_preflight(cpu_runs, tmp_path, data):
    """Each job the script runs, with its --set overrides, through the project's loader; then preflight (what
    ``--check`` runs) with extract on the CPU and a local cluster standing in for CUDA and dask-cuda. The script
    takes the SQuAD file where it finds one (sample: 192) and the packaged quickstart data where not (limit: 46)."""
    from rapids_attn.jobfile import load_job
    from rapids_attn.pipeline import preflight
    from rapids_attn.registry import parse_stages
    from rapids_attn.run import build_parser

    _, model_dir, _ = cpu_runs
    assert model_dir.is_dir(), "checks.py models wrote no model: see test_cpu_subcommand_reports_ok"
    repo = checkout_like(tmp_path / "checkout")
    if data == "squad":
        if not SHARED_SQUAD.is_file():
            pytest.skip(f"no {SHARED_SQUAD}")
        (repo / "gpu_check" / "squad-v2-dev-half.json").symlink_to(SHARED_SQUAD)
    gc = tmp_path / "gc"
    gc.mkdir()
    (gc / "bert4x12").symlink_to(model_dir, target_is_directory=True)
    jobs = render_jobs(repo, gc)
    seen = set()
    for line, words in run_invocations():
        args, extra = build_parser().parse_known_args(words)
        name = Path(args.job).stem
        assert name in jobs, f"run_gpu_check.sh line {line} runs {args.job}; the script writes {sorted(jobs)}"
        seen.add(name)
        overrides = args.overrides + [x for x in extra if "=" in x and not x.startswith("-")]
        cfg = load_job(jobs[name], overrides)  # JobConfigError names a renamed or dropped field
        assert cfg.extract.device == "cuda" and cfg.data.format == "squad"
        if data == "squad":
            assert Path(cfg.data.path).resolve() == SHARED_SQUAD.resolve()
        stand_in = load_job(jobs[name], [*overrides, "extract.device=cpu", "runtime.cluster=local"])
        plan = preflight(stand_in, parse_stages(args.stages, stand_in), args.overwrite)
        assert len(plan.ctx.data) > 0 and plan.ctx.layout.n_shards > 0
    assert seen == set(jobs), f"run_gpu_check.sh writes {sorted(jobs)} but runs {sorted(seen)}"


def test_script_runs_benchmarks_with_flags_they_accept(monkeypatch):
    """``python -m benchmarks.X ...`` in the script: X's own parser reads the words (stopped right after, before
    it looks for a GPU)."""

    class Parsed(Exception):
        pass

    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise Parsed(parse(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    found = re.findall(r"-m (benchmarks\.\w+)([^\n]*)", _script())
    assert found, "run_gpu_check.sh runs no benchmark: update this test"
    for module, rest in found:
        words = shlex.split(rest, comments=True)
        try:
            importlib.import_module(module).main(words)
        except Parsed:
            continue
        except SystemExit as e:
            pytest.fail(f"run_gpu_check.sh: python -m {module} {rest.strip()}: its parser refused it (exit {e.code})")
        pytest.fail(f"python -m {module} finished without parsing its arguments with argparse: update this test")


def test_script_pytest_selection_names_tests_that_exist():
    """The GPU tests the script deselects (-k "not X"): a renamed test would run there and fail for want of the
    weights the stub leaves out."""
    line = next((x for x in _script().splitlines() if "-m pytest" in x and not x.lstrip().startswith("#")), None)
    assert line is not None, "run_gpu_check.sh runs no pytest: update this test"
    script = _script()
    words = shlex.split(script[script.index(line) :].split("\nstep ", 1)[0].replace("\\\n", " "))
    paths = [w for w in words if w.startswith("tests/")]
    assert paths and all((REPO / p).exists() for p in paths), f"run_gpu_check.sh runs pytest on {paths}"
    names = set()
    for p in paths:
        for f in [REPO / p] if (REPO / p).is_file() else sorted((REPO / p).rglob("test_*.py")):
            names |= {n.name for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.FunctionDef)}
    expr = words[words.index("-k") + 1] if "-k" in words else ""
    for term in re.findall(r"not (\w+)", expr):
        assert any(term.lower() in n.lower() for n in names), (
            f"run_gpu_check.sh: -k 'not {term}' matches no test in {paths}"
        )


def _dict_keys(node: ast.Dict) -> set[str]:
    return {k.value for k in node.keys if isinstance(k, ast.Constant)}


def test_script_reads_summary_fields_the_job_writes():
    """The script's SUMMARY reads summary.json's top-level s.get(...) and backend b.get(...) fields."""
    from rapids_attn.explain import outputs

    tree = ast.parse(inspect.getsource(outputs))
    build = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "build_summary")
    body = next(n.value for n in ast.walk(build) if isinstance(n, ast.Return) and isinstance(n.value, ast.Dict))
    top = _dict_keys(body)
    backend = next(v for k, v in zip(body.keys, body.values, strict=True) if getattr(k, "value", None) == "backend")
    text = _script()
    assert re.search(r'\bb = s\.get\("backend"', text), "the script no longer reads summary.json's backend as b"
    read_top = set(re.findall(r"\bs\.get\(['\"](\w+)['\"]", text))
    read_backend = set(re.findall(r"\bb\.get\(['\"](\w+)['\"]", text))
    assert read_top and read_backend
    assert read_top <= top, f"run_gpu_check.sh reads summary.json's {sorted(read_top - top)}; it has {sorted(top)}"
    assert read_backend <= _dict_keys(backend), (
        f"run_gpu_check.sh reads summary.json's backend.{sorted(read_backend - _dict_keys(backend))}; "
        f"it has {sorted(_dict_keys(backend))}"
    )


def test_script_runs_only_subcommands_checks_py_has():
    have = {
        n.name[4:]
        for n in ast.parse(CHECKS.read_text()).body
        if isinstance(n, ast.FunctionDef) and n.name.startswith("cmd_")
    }
    used = set(re.findall(r"gpu_check/checks\.py (\w+)", _script()))
    assert used and used <= have, f"run_gpu_check.sh runs checks.py {sorted(used - have)}; it has {sorted(have)}"
