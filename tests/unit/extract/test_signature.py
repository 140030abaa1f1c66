"""The signature's schema (rapids_attn.extract.signature): its names live in one module apart from the kernel,
which imports neither torch nor the kernel, and every user imports them from there."""

from __future__ import annotations

import ast
import subprocess
import sys

from helpers import REPO

from rapids_attn.extract import signature


def test_the_schema_imports_no_torch_and_no_kernel():
    code = "import sys, rapids_attn.extract.signature; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch' or m == 'rapids_attn.extract.maps'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_names_are_distinct_and_always_defined_is_a_subset():
    for names in (signature.STAT_NAMES, signature.DETECTOR_NAMES, signature.PROFILE_OFFSETS):
        assert len(set(names)) == len(names) > 0
    assert set(signature.ALWAYS_DEFINED) <= set(signature.STAT_NAMES)
    assert 0 in signature.PROFILE_OFFSETS and signature.SINK_TOKENS < signature.RECENT_WINDOW


def test_no_module_reads_the_schema_from_the_kernel():
    """The kernel (extract/maps.py) imports the names for its own use; nobody else takes them from it."""
    moved = {name for name in vars(signature) if not name.startswith("_") and name not in ("annotations", "np")}
    offenders = []
    for folder in ("rapids_attn", "tests", "benchmarks", "tools"):
        for path in (REPO / folder).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            if "rapids_attn.extract.maps" not in text:
                continue
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.ImportFrom) and node.module == "rapids_attn.extract.maps":
                    offenders += [f"{path.relative_to(REPO)}: {a.name}" for a in node.names if a.name in moved]
    # tools/capture_golden/dump.py falls back to maps when it runs against a tree from before the move
    assert [o for o in offenders if not o.startswith("tools/capture_golden/dump.py")] == []
