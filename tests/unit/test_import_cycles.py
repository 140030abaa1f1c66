"""No import cycle among rapids_attn's modules, lazy imports (inside functions) counted: a cycle closed by a lazy
import works until someone moves that import to the top, and it ties the modules on it into one piece that cannot
be read, tested or changed alone. Imports under ``if TYPE_CHECKING:`` are left out (never run), and so are the edges
from a module to its parent packages (Python imports a package before its modules, never the other way round).

The modules are layered instead: the stage contract (``rapids_attn.stage``) and the stage kit import no stage; the
stages import the contract and what they use; the registry (``rapids_attn.registry``) imports the stages; only the
modules above it (the pipeline, the CLI) read it, and they hand a stage what it needs from the registry through the
run's context."""

from __future__ import annotations

import ast
from pathlib import Path

import rapids_attn

PACKAGE = Path(rapids_attn.__file__).parent


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    return skip


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The rapids_attn modules ``name`` imports anywhere in its code (``from pkg import mod`` is ``pkg.mod`` when
    that is a module, else ``pkg``; ``importlib.import_module("rapids_attn.x")`` counts too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_nodes(tree)
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif (  # importlib.import_module("rapids_attn.x"): an import by another name
            isinstance(node, ast.Call)
            and ast.unparse(node.func).endswith("import_module")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            targets = [node.args[0].value]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_package else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join([*pkg, base] if base else pkg)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # rapids_attn.x.y.attr -> the module that holds it
                t = t.rpartition(".")[0]
            if t and t != name and t.startswith("rapids_attn"):
                found.add(t)
    return found


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected pieces of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            piece = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                piece.append(w)
                if w == v:
                    break
            if len(piece) > 1:
                found.append(sorted(piece))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _a_path(graph: dict[str, set[str]], piece: list[str]) -> list[str]:
    """One cycle through the piece's first module, to name in the failure."""
    inside, start = set(piece), piece[0]
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & inside):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                todo.append(w)
    return piece


def test_no_module_imports_itself_through_others():
    graph = import_graph()
    assert len(graph) > 50  # the walk found the package's modules
    found = cycles(graph)
    assert not found, "import cycles (lazy imports counted): " + "; ".join(
        f"{len(piece)} modules ({', '.join(piece)}), e.g. " + " -> ".join(_a_path(graph, piece)) for piece in found
    )


def test_the_check_finds_a_cycle_through_a_lazy_import(tmp_path):
    """The check can fail: a lazy import that closes a loop is a cycle, one under TYPE_CHECKING is not."""
    known = {"rapids_attn.a": tmp_path / "a.py", "rapids_attn.b": tmp_path / "b.py"}
    assert cycles({"rapids_attn.a": {"rapids_attn.b"}, "rapids_attn.b": {"rapids_attn.a"}}) == [
        ["rapids_attn.a", "rapids_attn.b"]
    ]
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rapids_attn import a\n"
    known["rapids_attn.b"].write_text(typed + "def f():\n    import rapids_attn.a.thing\n")
    assert imports_of("rapids_attn.b", known["rapids_attn.b"], known) == {"rapids_attn.a"}  # the lazy one
    known["rapids_attn.b"].write_text(typed)
    assert imports_of("rapids_attn.b", known["rapids_attn.b"], known) == set()  # not the TYPE_CHECKING one
    known["rapids_attn.b"].write_text("import importlib\nimportlib.import_module('rapids_attn.a')\n")
    assert imports_of("rapids_attn.b", known["rapids_attn.b"], known) == {"rapids_attn.a"}
