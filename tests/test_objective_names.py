"""The objective is the complete unit of variation (vit_train/objectives/__init__.py): no module outside
vit_train/objectives/ (and the schema's own dataclasses, config/schema.py) tells objectives apart by
name. The walk reads every module's syntax tree: a string constant that is an objective's name, or an
`objective.name` attribute, anywhere in it (docstrings aside) is a decision that belongs to an objective."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "vit_train"
NAMES = {"classify", "distill", "mae"}
ALLOWED = {PACKAGE / "config" / "schema.py"}


def docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants (module, class, function): prose, not decisions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def name_uses(source: str) -> list[str]:
    """Each objective-name string constant and each `<x>.objective.name` in `source`, as 'line N: what'."""
    tree = ast.parse(source)
    prose = docstrings(tree)
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in NAMES and id(node) not in prose:
            uses.append(f"line {node.lineno}: {node.value!r}")
        elif (isinstance(node, ast.Attribute) and node.attr == "name" and isinstance(node.value, ast.Attribute)
              and node.value.attr == "objective"):
            uses.append(f"line {node.lineno}: .objective.name")
    return uses


def test_the_walk_finds_a_name_comparison_and_an_objective_name_attribute():
    source = 'def f(cfg):\n    """mae, distill: prose."""\n    return cfg.objective.name == "mae"\n'
    assert name_uses(source) == ["line 3: .objective.name", "line 3: 'mae'"] or \
        sorted(name_uses(source)) == sorted(["line 3: .objective.name", "line 3: 'mae'"])
    assert name_uses('x = {"distill": 1}\n') == ["line 1: 'distill'"]
    assert name_uses('x = "objective=mae"\ny = "mae.mask_ratio"\n') == []  # text that only mentions one


def test_no_module_outside_objectives_tells_objectives_apart_by_name():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in ALLOWED or (PACKAGE / "objectives") in path.parents:
            continue
        uses = name_uses(path.read_text())
        if uses:
            found[str(path.relative_to(PACKAGE.parent))] = uses
    assert found == {}, f"move these decisions into the objectives (vit_train/objectives/): {found}"
