"""The package's layout: a name with a leading underscore is its module's own, never used from another module.

A helper two modules share is public in the module that owns it (or moved to where it belongs), so that a
reader sees what a module offers the rest of the package and may change the rest freely.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "rapids_attn"

#: private names still used through a module attribute (``module._name``), to be made public; this list
#: only shrinks (issue 36)
KNOWN_ATTRIBUTE_USES: set = set()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE.parent).as_posix(), ast.parse(path.read_text(encoding="utf-8"))


def _is_module(dotted: str) -> bool:
    path = PACKAGE.parent / dotted.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imported_from(node: ast.ImportFrom, rel: str) -> str | None:
    """The absolute module an import reads from, or None outside the package."""
    if node.level == 0:
        return node.module if node.module and node.module.split(".")[0] == "rapids_attn" else None
    parts = rel.removesuffix(".py").split("/")[: -node.level]  # a relative import, resolved against this file
    return ".".join(parts + ([node.module] if node.module else []))


def test_no_private_name_is_imported_across_modules():
    found = []
    for rel, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (module := _imported_from(node, rel)):
                found += [f"{rel}: from {module} import {a.name}" for a in node.names if _private(a.name)]
    assert not found, "private names imported from other modules (make them public where they live):\n" + "\n".join(
        found
    )


def test_no_private_name_is_read_through_another_module():
    found = set()
    for rel, tree in _modules():
        modules = {}  # local name -> a package module it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (module := _imported_from(node, rel)):
                for a in node.names:
                    if _is_module(f"{module}.{a.name}"):
                        modules[a.asname or a.name] = f"{module}.{a.name}"
            elif isinstance(node, ast.Import):
                modules.update({a.asname: a.name for a in node.names if a.asname and a.name.startswith("rapids_attn.")})
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
                and _private(node.attr)
            ):
                found.add((rel, modules[node.value.id], node.attr))
    new = sorted(found - KNOWN_ATTRIBUTE_USES)
    assert not new, "private names read through another module (make them public where they live):\n" + "\n".join(
        f"{rel}: {module}.{name}" for rel, module, name in new
    )
