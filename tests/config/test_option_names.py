"""An option is sealed in its own module: no module of vit_train but a data set's or an objective's own
names it (docs/architecture.md, "Options own their config"). The walk reads every module's syntax tree:
a string constant that is a registered data set's or objective's name anywhere in it (docstrings aside),
or a comparison with an `<x>.objective.name` / `<x>.data.name` attribute, is a decision that belongs to
that option (naming the chosen one in a message or a record is not).
A name that is also another thing's name (the webdataset package, AutoAugment's "cifar10" policy) is
allowed where it means that other thing, each with its reason."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from vit_train.schema.typed import chooser, options

PACKAGE = Path(__file__).resolve().parents[2] / "vit_train"
GROUPS = ("model", "data", "optim", "schedule", "objective")  # aug's names are plain words (none, basic)
# (module, name): why that module may hold that string
OTHER_MEANING = {("extras.py", "webdataset"): "the webdataset package, which `require` names",
                 ("data/shards/index.py", "webdataset"): "the webdataset package, which `require` names",
                 ("data/aug/autoaug.py", "cifar10"): "AutoAugment's CIFAR-10 policy (torchvision's name)",
                 ("schema/legacy.py", "vit"): "the one family before model.arch existed: a checkpoint of then is a ViT's",
                 ("cli/commands.py", "hf"): "vit-export's format=hf (the Hub's folder layout), not data=hf",
                 ("tools/hub_export.py", "hf"): "vit-export's format=hf (the Hub's folder layout), not data=hf",
                 # timm's Hub layout describes timm's VisionTransformer, which maps onto the ViT family alone (a
                 # ResNet is refused by name); left here beside the layout, not moved into models/families/vit.py
                 ("checkpoint/hub.py", "vit"): "timm's Hub config.json describes a ViT: the one family it maps to"}


def own_module(group: str) -> dict[str, Path]:
    """{option name: the file of the module that defines it}."""
    return {name: Path(sys.modules[cls.__module__].__file__).resolve() for name, cls in options(group).items()}


def docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants (module, class, function): prose, not decisions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def is_option_name(node: ast.AST, group: str) -> bool:
    """`<x>.<group>.name`, or the attribute that chooses the group's option (`<x>.model.arch`)."""
    return (isinstance(node, ast.Attribute) and node.attr in {"name", chooser(group)}
            and isinstance(node.value, ast.Attribute) and node.value.attr == group)


def name_uses(source: str, names: set[str], group: str) -> list[str]:
    """Each string constant in `names` and each comparison with `<x>.<group>.name` (or its chooser) in `source`, as
    'line N: what'."""
    tree = ast.parse(source)
    prose = docstrings(tree)
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in names and id(node) not in prose:
            uses.append(f"line {node.lineno}: {node.value!r}")
        elif isinstance(node, ast.Compare) and any(is_option_name(n, group) for n in [node.left, *node.comparators]):
            uses.append(f"line {node.lineno}: .{group}.{chooser(group)} compared")
    return sorted(uses)


def test_the_walk_finds_a_name_comparison_and_a_name_attribute():
    source = 'def f(cfg):\n    """mae, distill: prose."""\n    return cfg.objective.name == "mae"\n'
    assert name_uses(source, {"mae", "distill"}, "objective") == ["line 3: 'mae'", "line 3: .objective.name compared"]
    assert name_uses('x = {"distill": 1}\n', {"distill"}, "objective") == ["line 1: 'distill'"]
    assert name_uses('x = "objective=mae"\ny = "objective.mask_ratio"\n', {"mae"}, "objective") == []
    assert name_uses('if cfg.data.name in KNOWN: pass\n', {"hf"}, "data") == ["line 1: .data.name compared"]
    assert name_uses('if cfg.model.arch != "vit": pass\n', {"vit"}, "model") == [
        "line 1: 'vit'", "line 1: .model.arch compared"]
    assert name_uses('print(f"data={cfg.data.name}")\n', {"hf"}, "data") == []  # naming the chosen one


@pytest.mark.parametrize("group", GROUPS)
def test_no_module_names_an_option_outside_its_own(group):
    own = own_module(group)
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(PACKAGE))
        names = {n for n, module in own.items() if module != path.resolve() and (where, n) not in OTHER_MEANING}
        uses = name_uses(path.read_text(), names, group)
        if uses:
            found[where] = uses
    assert found == {}, f"move these decisions into the {group} options' own modules: {found}"


def test_every_allowed_other_meaning_is_still_there():
    """The allow-list holds no stale entry (each still occurs where it says)."""
    for where, name in OTHER_MEANING:
        assert f'"{name}"' in (PACKAGE / where).read_text(), where
