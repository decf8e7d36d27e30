"""The layers of docs/architecture.md, as the imports of the code state them.

Every module of the project is read with `ast` (imports inside functions included, and
`importlib.import_module("...")` calls with a constant name), each import of another tgc module
is an arrow from the importer's layer to the imported one's, and an arrow the table below does
not allow fails the test. The table is the whole policy; docs/architecture.md draws it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# The layer of each top-level part. `tgc/` is the core except its public API (`tgc/__init__.py`),
# the tools and the torch.compile backend (`tgc/dynamo/`), which wire the parts together and may
# import anything.
TOP_LEVEL_LAYERS = ("dialects", "passes", "codegen", "runtime", "planner", "importers")
WIRING = "wiring"
WIRING_PACKAGES = ("tools", "dynamo")

# layer -> the layers it may import (besides itself).
ALLOWED = {
    "core": set(),
    "dialects": {"core"},
    "passes": {"core", "dialects"},
    "codegen": {"core", "dialects"},
    "runtime": {"core", "dialects", "codegen"},
    "planner": {"core", "dialects", "passes", "codegen", "runtime"},
    "importers": {"core", "dialects"},
    WIRING: {"core", "dialects", "passes", "codegen", "runtime", "planner", "importers"},
}


def layer_of_module(module: str) -> str | None:
    """The layer of a dotted tgc module name (None: not a tgc module)."""
    parts = module.split(".")
    if parts[0] != "tgc":
        return None
    if len(parts) == 1:
        return WIRING
    if parts[1] in TOP_LEVEL_LAYERS:
        return parts[1]
    if parts[1] in WIRING_PACKAGES:
        return WIRING
    return "core"


def module_name(rel: Path) -> str:
    """The dotted name a source file imports as (`passes/cse.py` -> `tgc.passes.cse`)."""
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts if parts[0] == "tgc" else ["tgc", *parts])


def is_module(dotted: str) -> bool:
    """Whether a dotted tgc name is a module or package of this checkout."""
    parts = dotted.split(".")
    if parts[0] != "tgc":
        return False
    path = ROOT.joinpath("tgc", *parts[1:])
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def source_files() -> list[Path]:
    files = [p for p in (ROOT / "tgc").rglob("*.py") if not p.is_symlink()]
    for part in TOP_LEVEL_LAYERS:
        folder = ROOT / part
        if folder.is_dir():
            files += folder.rglob("*.py")
    return sorted(p for p in files if "Output" not in p.parts)


def imported_modules(rel: Path, source: str) -> list[tuple[str, int]]:
    """Every module the file imports, as (dotted name, line), at any depth of the file."""
    module = module_name(rel)
    tree = ast.parse(source, str(rel))
    package = module if rel.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.append((base, node.lineno))
            # `from tgc import passes` imports the module tgc.passes
            found += [
                (f"{base}.{alias.name}", node.lineno)
                for alias in node.names
                if is_module(f"{base}.{alias.name}")
            ]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.args[0].value, node.lineno))
    return found


def forbidden_arrows(rel: Path, source: str) -> list[str]:
    """The imports of the file at `rel` (relative to the root) that the layering forbids."""
    here = layer_of_module(module_name(rel))
    bad = []
    for target, line in imported_modules(rel, source):
        there = layer_of_module(target)
        if there is None or there == here:
            continue
        if there not in ALLOWED[here]:
            bad.append(f"{rel}:{line}: {here} imports {there} ({target})")
    return bad


def test_every_import_follows_the_layers():
    bad = []
    for path in source_files():
        bad += forbidden_arrows(path.relative_to(ROOT), path.read_text())
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "layer, source, expect_bad",
    [
        ("core", "def f():\n    import tgc.dialects\n", True),
        ("core", "from tgc.passes.cse import CSE\n", True),
        ("core", "import importlib\nimportlib.import_module('tgc.runtime.interpreter')\n", True),
        ("core", "from tgc.ir import Operation\n", False),
        ("dialects", "from tgc.runtime.interpreter import run_block\n", True),
        ("passes", "from tgc.dialects.atomic import AddOp\n", False),
        ("runtime", "from tgc.passes.fuse import Group\n", True),
        ("codegen", "from tgc.runtime import cublas\n", True),
        ("tools", "from tgc.planner import select\nimport tgc.passes\n", False),
        ("dynamo", "from tgc.importers.torch import import_module\nimport tgc.planner\n", False),
        ("importers", "from tgc.dynamo import tgc_backend\n", True),
    ],
)
def test_the_checker_finds_a_wrong_import(layer, source, expect_bad):
    """The check itself can fail: a module with a forbidden import is reported, with its line."""
    folder = {"core": "tgc", "tools": "tgc/tools", "dynamo": "tgc/dynamo"}.get(layer, layer)
    bad = forbidden_arrows(Path(folder) / "_layering_probe.py", source)
    assert bool(bad) == expect_bad, bad
    if expect_bad:
        assert "_layering_probe.py:" in bad[0]
