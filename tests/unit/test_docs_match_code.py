"""The docs match the code: the layout and the module map list exactly the modules that exist, every
``python -m`` command and repository path the docs name exists, every signature they quote equals the code's,
and every relative link (and its anchor) resolves.

The manual is README.md and docs/**/*.md. docs/decisions/ is history (file names and signatures there are as
they were then): only its links are checked."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "rapids_attn"
ALL_DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
MANUAL = [d for d in ALL_DOCS if "decisions" not in d.relative_to(REPO).parts]
# a path or module the docs name only as an example or a placeholder
PLACEHOLDER = re.compile(r"[<>{}*]|\.\.\.")


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def _prose(text: str) -> str:
    """The text without fenced code blocks (their brackets are code, not links)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def _code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", _prose(text))


# -- the layout ----------------------------------------------------------------------------------------------


def package_dirs(root: Path = PACKAGE) -> set[str]:
    """Every folder of the package that holds Python modules, or the presets (`extract/`, `presets/`)."""
    dirs = {p.parent for p in root.rglob("*.py") if "__pycache__" not in p.parts} - {root}
    return {f"{d.relative_to(root)}/" for d in dirs} | ({"presets/"} if (root / "presets").is_dir() else set())


def top_modules(root: Path = PACKAGE) -> set[str]:
    return {p.name for p in root.glob("*.py") if p.name != "__init__.py"}


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end >= 0 else None]


def module_map(text: str) -> dict[str, str]:
    """docs/architecture.md's module map: each row's first cell (`run.py`, `data/`) -> the rest of the row."""
    rows = {}
    for line in _section(text, "## Module map").splitlines():
        m = re.match(r"\|\s*`([^`]+)`\s*\|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def layout_block(text: str) -> str:
    """The README's project layout: its code block."""
    section = _section(text, "## Project layout")
    return re.search(r"```\n(.*?)```", section, re.DOTALL).group(1)


def layout_problems(readme: str, architecture: str, root: Path = PACKAGE) -> list[str]:
    problems = []
    packages, modules = package_dirs(root), top_modules(root)
    rows = module_map(architecture)
    named = {k for k in rows if not k.startswith(("tools/", "benchmarks/"))}
    for missing in sorted((packages | modules) - named):
        problems.append(f"docs/architecture.md's module map does not list rapids_attn/{missing}")
    for extra in sorted(named - packages - modules):
        problems.append(f"docs/architecture.md's module map lists rapids_attn/{extra}, which does not exist")
    for key in sorted(k for k in rows if k.startswith(("tools/", "benchmarks/"))):
        if not (REPO / key).exists():
            problems.append(f"docs/architecture.md's module map lists {key}, which does not exist")
    # each package's row names each of its modules (`stage.py`), and no module it does not have
    for pkg in sorted(packages & named):
        files = {p.name for p in (root / pkg).glob("*.py") if p.name != "__init__.py"}
        said = set(re.findall(r"`([A-Za-z_][\w]*\.py)`", rows[pkg])) | set(
            re.findall(r"(?<![\w/.])([A-Za-z_]\w*\.py)\b", rows[pkg])
        )
        for missing in sorted(files - said):
            problems.append(f"docs/architecture.md's module map row {pkg} does not name {missing}")
        for extra in sorted(said - files):
            if not (REPO / extra).exists():
                problems.append(f"docs/architecture.md's module map row {pkg} names {extra}, which it does not hold")
    block = layout_block(readme)
    words = set(re.findall(r"(?<![\w/.])([A-Za-z_][\w]*(?:\.py|/))", block))
    for missing in sorted(p for p in packages | modules if "/" not in p[:-1] and p not in words):
        problems.append(f"README.md's project layout does not list rapids_attn/{missing}")
    rapids_part = block.split("benchmarks/")[0]
    for extra in sorted(w for w in set(re.findall(r"(?<![\w/.])([A-Za-z_][\w]*(?:\.py|/))", rapids_part))):
        if extra != "rapids_attn/" and extra not in packages | modules:
            problems.append(f"README.md's project layout lists rapids_attn/{extra}, which does not exist")
    return problems


def test_the_layout_and_the_module_map_list_exactly_the_modules_that_exist():
    readme = (REPO / "README.md").read_text()
    architecture = (REPO / "docs" / "architecture.md").read_text()
    problems = layout_problems(readme, architecture)
    assert not problems, "\n".join(problems)


def test_a_package_added_without_docs_fails(tmp_path):
    """The check above fails when a package or a module appears that the docs do not list."""
    readme = (REPO / "README.md").read_text()
    architecture = (REPO / "docs" / "architecture.md").read_text()
    root = tmp_path / "rapids_attn"
    for path in PACKAGE.rglob("*.py"):
        if "__pycache__" not in path.parts:
            (root / path.relative_to(PACKAGE)).parent.mkdir(parents=True, exist_ok=True)
            (root / path.relative_to(PACKAGE)).touch()
    (root / "presets").mkdir(exist_ok=True)
    assert layout_problems(readme, architecture, root) == []
    (root / "importance").mkdir()
    (root / "importance" / "stage.py").touch()
    (root / "widgets.py").touch()
    problems = layout_problems(readme, architecture, root)
    assert "docs/architecture.md's module map does not list rapids_attn/importance/" in problems
    assert "README.md's project layout does not list rapids_attn/importance/" in problems
    assert "README.md's project layout does not list rapids_attn/widgets.py" in problems


# -- the job reference ---------------------------------------------------------------------------------------


def reference_fields(text: str) -> set[tuple[str, str]]:
    """docs/jobs.md's job reference: each row's first cell, `section.field` then bare `field`s of that section."""
    found = set()
    for line in _section(text, "## Job reference").splitlines():
        m = re.match(r"\| (`[^|]*`) \|", line)
        section = None
        for name in re.findall(r"`([\w.]+)`", m.group(1)) if m else []:
            if "." in name:
                section, name = name.split(".", 1)
            if section:
                found.add((section, name))
    return found


def test_the_job_reference_lists_every_field_of_every_section():
    """Every field of every job section (the core ones and each registered stage's) has its row, and no row names a
    field that is gone."""
    import rapids_attn.registry  # noqa: F401  (the stages' sections join the job's schema)
    from rapids_attn.job import job_model

    schema = {
        section: set(field.annotation.model_fields)
        for section, field in job_model().model_fields.items()
        if hasattr(field.annotation, "model_fields")
    }
    documented = reference_fields((REPO / "docs" / "jobs.md").read_text())
    missing = sorted(f"{s}.{f}" for s, fields in schema.items() for f in fields if (s, f) not in documented)
    gone = sorted(f"{s}.{f}" for s, f in documented if f not in schema.get(s, ()))
    assert not missing, "docs/jobs.md's job reference has no row for: " + ", ".join(missing)
    assert not gone, "docs/jobs.md's job reference names fields the job has not: " + ", ".join(gone)


# -- commands and paths --------------------------------------------------------------------------------------


def _module_exists(module: str) -> bool:
    base = REPO / Path(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__main__.py").is_file() or (base / "__init__.py").is_file()


def test_every_python_m_command_of_the_docs_exists():
    missing = []
    for doc in MANUAL:
        for module in re.findall(r"python3? -m ((?:rapids_attn|benchmarks|tools)(?:\.\w+)*)", doc.read_text()):
            if not _module_exists(module):
                missing.append(f"{_rel(doc)}: python -m {module}")
    assert not missing, "\n".join(missing)


REPO_PATH = re.compile(r"^((?:rapids_attn|tests|benchmarks|tools|jobs|docker|docs|\.ci)/[\w./-]*)")


def test_every_repository_path_the_docs_name_exists():
    missing = []
    for doc in MANUAL:
        for span in _code_spans(doc.read_text()):
            for word in span.split():
                m = REPO_PATH.match(word.strip("(),;:'\""))
                if not m or PLACEHOLDER.search(word):
                    continue
                path = m.group(1).split("::")[0].rstrip(".,")
                if not (REPO / path).exists():
                    missing.append(f"{_rel(doc)}: `{span}` names {path}, which does not exist")
    assert not missing, "\n".join(missing)


# -- signatures ----------------------------------------------------------------------------------------------


def _definitions() -> dict[str, list[tuple[str, str]]]:
    """Every top-level function, class and method of the package, by its last name: [(module, qualname)]."""
    found: dict[str, list[tuple[str, str]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                found.setdefault(node.name, []).append((module, node.name))
            if isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, ast.FunctionDef) and not sub.name.startswith("_"):
                        found.setdefault(sub.name, []).append((module, f"{node.name}.{sub.name}"))
    return found


SIGNATURE = re.compile(r"^([A-Za-z_][\w.]*)\(([\w\s,*=]*)\)$")


def quoted_signatures(text: str) -> list[tuple[str, list[str]]]:
    """`name(a, b, c)` spans whose arguments are all plain names: a quoted signature, not a call with values."""
    quoted = []
    for span in _code_spans(text):
        m = SIGNATURE.match(span.strip())
        if not m:
            continue
        params = [p.strip() for p in m.group(2).split(",") if p.strip()]
        if any(not re.fullmatch(r"\*{0,2}[A-Za-z_]\w*(=\w+)?", p) for p in params):
            continue
        quoted.append((m.group(1), [p.split("=")[0].lstrip("*") for p in params]))
    return quoted


def _parameters(obj) -> list[str]:
    params = list(inspect.signature(obj).parameters)
    return params[1:] if params[:1] in (["self"], ["cls"]) else params


def _matches(quoted: list[str], obj) -> bool:
    """The quoted names are the signature's, in order; parameters left out at the end must have defaults."""
    sig = inspect.signature(obj)
    params = _parameters(obj)
    if params[: len(quoted)] != quoted:
        return False
    rest = [sig.parameters[p] for p in params[len(quoted) :]]
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in rest)


def test_the_signatures_the_docs_quote_are_the_codes():
    defs = _definitions()
    checked, wrong = 0, []
    for doc in MANUAL:
        for name, quoted in quoted_signatures(doc.read_text()):
            parts = name.split(".")
            candidates = [
                (module, qual)
                for module, qual in defs.get(parts[-1], [])
                # a dotted quote must agree with where it lives: `learn.fit_store`, `MapClusterer.fit`
                if len(parts) == 1
                or qual.split(".")[0] == parts[-2]
                or module.split(".")[-1] == parts[-2]
                or ".".join(parts[:-1]) in module
            ]
            if not candidates:
                continue  # not this package's (torch.load, a shell command)
            objects = []
            for module, qual in candidates:
                obj = importlib.import_module(module)
                for attr in qual.split("."):
                    obj = getattr(obj, attr)
                objects.append((f"{module}.{qual}", obj))
            checked += 1
            if not any(_matches(quoted, obj) for _, obj in objects):
                code = "; ".join(f"{where}{inspect.signature(obj)}" for where, obj in objects)
                wrong.append(f"{_rel(doc)}: `{name}({', '.join(quoted)})` but the code has {code}")
    assert not wrong, "\n".join(wrong)
    assert checked >= 3, "the docs quote signatures (MapClusterer, fit_store, ...): the scan found too few"


def test_a_drifted_signature_is_caught():
    from rapids_attn.stage import Stage

    assert _matches(["ctx", "client"], Stage.run) and _matches(["ctx"], Stage.run)  # client has a default
    assert not _matches(["ctx", "cluster"], Stage.run) and not _matches([], Stage.run)  # renamed; ctx left out
    assert quoted_signatures("`run(ctx, client)` and `f(1, 'x')`") == [("run", ["ctx", "client"])]


# -- links ---------------------------------------------------------------------------------------------------


def github_slug(heading: str) -> str:
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip()).lower()
    return re.sub(r"\s", "-", re.sub(r"[^\w\- ]", "", text))


def anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(doc.read_text()).splitlines():
        m = re.match(r"#{1,6} (.*)", line)
        if m:
            slug = github_slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("doc", ALL_DOCS, ids=_rel)
def test_every_relative_link_resolves(doc):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(doc.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {_rel(dest)}")
    assert not broken, f"{_rel(doc)}:\n" + "\n".join(broken)


def test_the_decisions_index_lists_every_decision():
    folder = REPO / "docs" / "decisions"
    index = (folder / "README.md").read_text()
    files = sorted(p.name for p in folder.glob("*.md") if p.name != "README.md")
    assert files, "docs/decisions/ holds no decision"
    unlisted = [name for name in files if f"]({name})" not in index]
    assert not unlisted, "docs/decisions/README.md does not list: " + ", ".join(unlisted)
    undated = [name for name in files if not re.match(r"\d{4}-\d{2}-\d{2}-[\w-]+\.md$", name)]
    assert not undated, "a decision's file name starts with its date (YYYY-MM-DD-): " + ", ".join(undated)


def test_the_readmes_job_example_is_a_valid_job(tmp_path):
    """The job the README shows loads as written (its presets, its fields), its data file standing beside it."""
    from rapids_attn.jobfile import load_job

    block = re.search(r"```yaml\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL)
    assert block, "README.md shows no job (a yaml block)"
    (tmp_path / "job.yaml").write_text(block.group(1))
    data = re.search(r"path: ([\w.-]+)", block.group(1)).group(1)
    (tmp_path / data).write_bytes((PACKAGE / "data" / "quickstart.json").read_bytes())
    cfg = load_job(tmp_path / "job.yaml")
    assert cfg.name and cfg.model.name
