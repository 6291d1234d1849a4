"""The package's layers (docs/architecture.md): a module imports only from its own layer or a lower
one, deferred and TYPE_CHECKING imports included; no import circle; only cli/ imports Hydra. Above the
package, the tests and scripts (tests/README.md): no test imports another test module (what tests share
is in tests/helpers/), and scripts/ imports nothing of tests/.

The walk reads every `import` and `from ... import` statement anywhere in a module's syntax tree
(inside functions and `if TYPE_CHECKING:` blocks too), so an import hidden from start-up still counts.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "vit_train"
TESTS = PACKAGE.parent / "tests"
SCRIPTS = PACKAGE.parent / "scripts"

# Low to high. Layers on one row are siblings: neither imports the other.
LAYERS = [("errors",), ("extras",), ("trackers",), ("schema",), ("optim", "schedules", "callbacks"), ("runtime",), ("data",), ("outputs",), ("models",), ("viz",),
          ("checkpoint",), ("objectives",), ("config",), ("train", "tools"), ("sweeps",), ("cli",)]
RANK = {layer: rank for rank, row in enumerate(LAYERS) for layer in row}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(dotted: str) -> bool:
    path = PACKAGE.parent / dotted.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imported_modules(path: Path) -> set[str]:
    """Every vit_train module `path` imports, anywhere in the file, as dotted names."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # `from vit_train.x import y` may name a submodule y: then the import is of y
            submodules = {f"{source}.{a.name}" for a in node.names if is_module(f"{source}.{a.name}")}
            found |= submodules
            if len(submodules) < len(node.names):
                found.add(source)
    return {m for m in found if m == "vit_train" or m.startswith("vit_train.")} | {
        m for m in found if m.split(".")[0] in ("hydra", "omegaconf")}


def layer_of(module: str) -> str | None:
    """The layer a vit_train module belongs to; None for the package root and __main__ (outside the layers)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in RANK else None


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_sits_in_a_layer():
    outside = [module_name(p) for p in MODULES if layer_of(module_name(p)) is None
               and module_name(p) not in ("vit_train", "vit_train.__main__")]
    assert outside == [], f"modules outside the layers (docs/architecture.md): {outside}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_a_module_imports_only_its_layer_and_lower_ones(path):
    here = layer_of(module_name(path))
    if here is None:
        return  # the package root (a version string) and __main__ (the torchrun entry, above every layer)
    upward = [m for m in imported_modules(path) if m.startswith("vit_train.") and layer_of(m) is not None
              and layer_of(m) != here and RANK[layer_of(m)] >= RANK[here]]
    assert upward == [], f"{module_name(path)} ({here}) imports from a layer not below it: {upward}"


def test_only_the_cli_imports_hydra():
    hydra = {module_name(p): sorted(m for m in imported_modules(p) if not m.startswith("vit_train"))
             for p in MODULES if layer_of(module_name(p)) != "cli"}
    assert {m: h for m, h in hydra.items() if h} == {}


def test_no_import_circle():
    modules = {module_name(p) for p in MODULES}
    graph = {module_name(p): {m for m in imported_modules(p) if m in modules and m != module_name(p)}
             for p in MODULES}
    # a package's own __init__ importing its submodules is how packages re-export; a submodule importing
    # its package back is the circle, and it is counted
    circles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert circles == []


def torch_file_calls(path: Path) -> set[str]:
    """Which of torch.load and torch.save `path` calls (as `torch.load(...)`, `torch.save(...)`)."""
    return {f"torch.{node.func.attr}" for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("load", "save")
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"}


def test_checkpoints_have_one_owner_behind_one_door():
    """vit_train/checkpoint/ owns what crosses a restart and every file weights are read from: the other layers
    import its door (`vit_train.checkpoint`), never a room behind it, and only it calls torch.load/torch.save."""
    rooms = {module_name(p): sorted(m for m in imported_modules(p) if m.startswith("vit_train.checkpoint."))
             for p in MODULES if layer_of(module_name(p)) != "checkpoint"}
    assert {m: r for m, r in rooms.items() if r} == {}
    calls = {module_name(p): sorted(torch_file_calls(p)) for p in MODULES}
    assert {m: c for m, c in calls.items() if c} == {"vit_train.checkpoint.files": ["torch.load"],
                                                     "vit_train.checkpoint.saving": ["torch.save"]}


def test_the_walk_sees_deferred_and_type_checking_imports(tmp_path, monkeypatch):
    """The oracle itself: an import inside a function or a TYPE_CHECKING block is found."""
    fake = PACKAGE / "data" / "_layer_probe.py"
    fake_source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from vit_train.train.run import Run\n"
                   "def f():\n    from ..cli import train\n")
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: fake_source if self == fake else
                        Path.read_bytes(self).decode())
    found = imported_modules(fake)
    assert {"vit_train.train.run", "vit_train.cli.train"} <= found


# --- above the package: the tests and scripts ------------------------------------------------------

def top_level_imports(source: str) -> set[str]:
    """The top-level name of every module `source` imports anywhere (`import`, `from ... import`,
    `importlib.import_module("...")` and `__import__("...")` with a constant name); relative imports aside."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and (getattr(node.func, "attr", None) == "import_module" or getattr(node.func, "id", None) == "__import__")):
            found.add(node.args[0].value.split(".")[0])
    return found


def suite_modules() -> set[str]:
    """The names pytest imports the test files as (rootdir-relative folders without __init__.py: the basename)."""
    return {p.stem for p in TESTS.rglob("test_*.py")} | {"conftest"}


def test_no_test_imports_another_test_module():
    files = sorted(TESTS.rglob("test_*.py"))
    names = [p.stem for p in files]
    assert len(names) == len(set(names)), "test files' basenames must stay unique (pytest imports them by basename)"
    assert [p for p in TESTS.rglob("__init__.py") if p.parent != TESTS / "helpers"] == []  # pytest's default import
    tests = suite_modules()
    importing = {str(p.relative_to(TESTS)): sorted(top_level_imports(p.read_text()) & tests - {p.stem})
                 for p in sorted(TESTS.rglob("*.py"))}
    assert {path: names for path, names in importing.items() if names} == {}, \
        "share it through tests/helpers/ (`from helpers.x import y`) instead"


def test_scripts_import_nothing_of_the_tests():
    tests = {"tests", "helpers"} | suite_modules() | {p.stem for p in (TESTS / "faults").glob("*.py")}
    reaching = {}
    for path in sorted(SCRIPTS.rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        paths = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
                 and id(node) not in docstrings and (node.value == "tests" or node.value.startswith("tests/"))]
        names = sorted(top_level_imports(path.read_text()) & tests) + paths
        if names:
            reaching[str(path.relative_to(SCRIPTS.parent))] = names
    assert reaching == {}, "scripts/ must not import or run tests/ (the fault table lives in tests/faults/)"


def test_the_test_walk_sees_every_kind_of_import():
    """The oracle itself: a test module imported at the top, inside a function, or by importlib is found."""
    source = ("from test_webdataset import read_back\nimport helpers.files\n"
              "def f():\n    import test_distributed as d\n    importlib.import_module('test_fsdp')\n"
              "from . import test_aug\n")
    assert top_level_imports(source) & suite_modules() == {"test_webdataset", "test_distributed", "test_fsdp"}
    assert "helpers" in top_level_imports(source)
