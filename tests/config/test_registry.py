"""The registry of options and what reading a config imports (docs/architecture.md, "Options own their config";
docs/extending.md): the registry imports the modules of the options on its first lookup, vit-train's own from its
table `BUILT_IN` and then those installed packages name in the entry-point group vit_train.options; none of them
imports torch at its top, so a config is read, checked and refused without torch.

What went wrong elsewhere, as inputs here: a plugin that cannot be imported broke every command of a tool (a
stale entry point of an editable install, a missing dependency, a `sys.exit` at import); a plugin registered a
built-in's name and took its place; plugins were discovered again at every lookup; a lookup from a second thread
saw a registry half filled.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vit_train.schema.typed import BUILT_IN, chooser, registered

ROOT = Path(__file__).resolve().parents[2]
# What an option's module may import only inside the methods that build things: torch and what imports it, and the
# other packages the options read or draw with (none of them is needed to read a config).
HEAVY = ("torch", "torchvision", "numpy", "PIL", "datasets", "pyarrow", "webdataset", "matplotlib", "timm")
# The keys an option's own check needs besides its defaults (a data set of files its folder, a teacher its file).
NEEDS = {("data", "imagefolder"): {"root": "images"}, ("data", "webdataset"): {"root": "shards"},
         ("data", "hf"): {"root": "dataset"}, ("objective", "distill"): {"teacher": "teacher.pt"}}


def run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`code` in a fresh Python with this checkout first on the path."""
    env = {**(env or os.environ), "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *[p for p in (env or os.environ).get("PYTHONPATH", "").split(os.pathsep) if p]])}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


READ_EVERY_OPTION = """
import json, sys
from {module} import Config
from vit_train.errors import ConfigError
from vit_train.schema.typed import chooser, registered

needs = {{tuple(k.split("=")): v for k, v in json.loads(sys.argv[1]).items()}}
built = {{}}
for group, found in registered().items():
    for name in found:
        keys = needs.get((group, name), {{}})
        if found[name].listed:  # logger=[...], callbacks=[...]: each chosen option under its name
            cfg = Config.from_dict({{group: {{name: keys}}}})
            built.setdefault(group, []).append(type(getattr(cfg, group)[name]).__name__)
            continue
        cfg = Config.from_dict({{group: {{chooser(group): name, **keys}}}})
        built.setdefault(group, []).append(type(getattr(cfg, group)).__name__)
refused = []
for plain in ({{"data": {{"name": "nope"}}}}, {{"model": {{"embed_dim": 100, "num_heads": 3}}}}):
    try:
        Config.from_dict(plain)
    except ConfigError as e:
        refused.append(str(e))
print(json.dumps({{"built": built, "refused": refused,
                   "heavy": [m for m in {heavy} if m in sys.modules]}}))
"""


@pytest.mark.parametrize("module", ["vit_train.config", "vit_train.schema.config"])
def test_every_option_is_read_and_a_config_refused_without_torch(module):
    """Config.from_dict of every registered option of every group, validated, and two configs refused with their
    one line, in a process that imports `module` only: neither torch nor any other package of HEAVY is imported."""
    code = READ_EVERY_OPTION.format(module=module, heavy=HEAVY).replace("sys.argv[1]", repr(json.dumps(
        {f"{g}={n}": keys for (g, n), keys in NEEDS.items()})))
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["built"] == {group: [cls.__name__ for cls in options.values()] for group, options in
                              registered().items()}
    assert found["refused"] == [
        "data.name must be one of cifar10, cifar100, hf, imagefolder, shapes, webdataset; got 'nope'",
        "model.embed_dim (100) must be divisible by model.num_heads (3)"]
    assert found["heavy"] == []


def top_imports(source: str) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of each import that runs when a module's source is imported: the statements of its
    body, in blocks other than `if TYPE_CHECKING:` (type hints only) included, in functions and classes not.
    `names`: what `from module import ...` takes ([] for `import module`)."""
    found = []

    def walk(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import):
                found.extend((node.lineno, alias.name, []) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                found.append((node.lineno, "." * node.level + (node.module or ""), [a.name for a in node.names]))
            elif isinstance(node, ast.If) and not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                walk(node.body)
                walk(node.orelse)
            elif isinstance(node, (ast.Try, ast.With)):
                walk(node.body)
                for handler in getattr(node, "handlers", []):
                    walk(handler.body)
                walk(getattr(node, "orelse", []))
                walk(getattr(node, "finalbody", []))

    walk(ast.parse(source).body)
    return found


def module_file(module: str) -> Path | None:
    """The file of vit_train module `module`; None for anything else."""
    path = ROOT / module.replace(".", "/")
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if module.split(".")[0] == "vit_train" and candidate.is_file():
            return candidate
    return None


def imported(module: str, line_module: str, names: list[str]) -> list[str]:
    """The modules an import statement of `module` imports: the module named (resolved when relative), each of
    its packages, and each name of `from x import y` that is a submodule of x."""
    if line_module.startswith("."):
        level = len(line_module) - len(line_module.lstrip("."))
        package = module if module_file(module) and module_file(module).name == "__init__.py" else \
            module.rpartition(".")[0]
        line_module = ".".join(package.split(".")[: len(package.split(".")) - level + 1] +
                               ([line_module.lstrip(".")] if line_module.lstrip(".") else []))
    parts = line_module.split(".")
    found = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return found + [f"{line_module}.{name}" for name in names if module_file(f"{line_module}.{name}")]


def heavy_imports(module: str, seen: set[str] | None = None) -> list[str]:
    """Each chain by which importing `module` imports a package of HEAVY, e.g. 'vit_train.data.sources.cifar
    line 18 -> vit_train.data.datasets line 8 -> torch'; [] when none does."""
    seen = set() if seen is None else seen
    seen.add(module)
    chains = []
    for line, line_module, names in top_imports(module_file(module).read_text()):
        for target in imported(module, line_module, names):
            if target.split(".")[0] in HEAVY:
                chains.append(f"{module} line {line} -> {target}")
            elif module_file(target) and target not in seen:
                chains += [f"{module} line {line} -> {chain}" for chain in heavy_imports(target, seen)]
    return sorted(set(chains))


def test_the_walk_finds_an_import_at_the_top_and_leaves_those_inside_functions_and_type_hints():
    source = textwrap.dedent("""\
        from __future__ import annotations
        from typing import TYPE_CHECKING
        import torch.nn as nn
        if TYPE_CHECKING:
            from torchvision.transforms import v2
        try:
            import numpy
        except ImportError:
            pass
        def build():
            import PIL
        class Thing:
            import matplotlib
        """)
    assert [(line, name) for line, name, _ in top_imports(source)] == [
        (1, "__future__"), (2, "typing"), (3, "torch.nn"), (7, "numpy")]
    assert imported("vit_train.data.sources.cifar", "..datasets", ["TensorImages"]) == [
        "vit_train", "vit_train.data", "vit_train.data.datasets"]
    assert imported("vit_train.data.aug.randaug", "vit_train.data.device", ["ops"]) == [
        "vit_train", "vit_train.data", "vit_train.data.device", "vit_train.data.device.ops"]
    assert "vit_train.data.transforms line 7 -> torch" in heavy_imports("vit_train.data.transforms")


@pytest.mark.parametrize("module", sorted(m for modules in BUILT_IN.values() for m in modules))
def test_no_option_module_imports_torch_at_its_top(module):
    """Nor a module (of vit_train, at any depth) that does: torch and the rest of HEAVY are imported inside the
    methods that build things (docs/extending.md)."""
    assert heavy_imports(module) == []


WHOLE = """
import importlib, json, pkgutil, sys
import vit_train
from vit_train.schema.typed import REGISTRY, registered

lazily = {group: sorted(found) for group, found in registered().items()}
config_imported = "vit_train.config" in sys.modules
for info in pkgutil.walk_packages(vit_train.__path__, "vit_train."):
    importlib.import_module(info.name)
print(json.dumps({"lazily": lazily, "config_imported": config_imported,
                  "everything": {group: sorted(found) for group, found in sorted(REGISTRY.items())},
                  "modules": {group: sorted({cls.__module__ for cls in found.values()})
                              for group, found in sorted(REGISTRY.items())}}))
"""


def test_the_registry_is_whole_without_the_config_package_and_its_table_names_each_option_module():
    """The options the registry's first lookup finds (vit_train.config not imported) are those that importing every
    module of the package registers: no module of options is left out of BUILT_IN. And BUILT_IN names, group by
    group, exactly the modules that define its options."""
    done = run_python(WHOLE)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["config_imported"] is False
    assert found["lazily"] == found["everything"]
    assert found["modules"] == {group: sorted(modules) for group, modules in sorted(BUILT_IN.items())}
    assert {group: sorted(options) for group, options in registered().items()} == found["everything"]


def plugin_env(tmp_path: Path, module: str | None, entry: str = "theirs = their_options\n") -> dict[str, str]:
    """The environment of a process in which an installed package their-options 0.1 names `entry` in the entry-point
    group vit_train.options; `module`: the source of their_options.py (None: the file is gone, as after an
    editable install's folder was removed)."""
    folder = tmp_path / "site"
    folder.mkdir()
    if module is not None:
        (folder / "their_options.py").write_text(textwrap.dedent(module))
    info = folder / "their_options-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: their-options\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[vit_train.options]\n{entry}")
    return {**os.environ, "PYTHONPATH": str(folder)}


SHADOW = """
from dataclasses import dataclass
from vit_train.data.sources.base import DataSource

@dataclass
class Waves(DataSource):
    name: str = "waves"

    def splits(self, img_size, labels=True):
        raise NotImplementedError("waves are read by the tests of reading only")

@dataclass
class Cifar(DataSource):
    name: str = "cifar10"
"""
LINE = "the options of their_options (entry point theirs of vit_train.options, package their-options 0.1) are not " \
       "available: "
READ = """
import json, sys
from vit_train.schema.config import Config
from vit_train.schema.typed import options
cfg = Config.from_dict({"data": {"name": "cifar10"}, "aug": {"name": "deit"}})
print(json.dumps({"data": type(cfg.data).__module__, "names": sorted(options("data")),
                  "torch": "torch" in sys.modules}))
"""


@pytest.mark.parametrize("module, said, names", [
    (None, "ModuleNotFoundError: No module named 'their_options'", []),
    ("raise ImportError('their_options needs a package that is not installed')\n",
     "ImportError: their_options needs a package that is not installed", []),
    ("import sys\nsys.exit('their_options needs a GPU')\n", "SystemExit: their_options needs a GPU", []),
    (SHADOW, "ConfigError: data=cifar10 is vit_train.data.sources.cifar.Cifar10 already; give their_options.Cifar "
             "another name", ["waves"]),
], ids=["module-gone", "import-error", "sys-exit", "a-built-in-name"])
def test_a_package_whose_module_cannot_be_imported_is_one_line_and_the_rest_works(tmp_path, module, said, names):
    """One warning line names the module, the entry point and the package; the built-in options are vit-train's (a
    name of theirs never takes a built-in's place); what the module registered before its error stays."""
    done = run_python(READ, plugin_env(tmp_path, module))
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [LINE + said]
    found = json.loads(done.stdout)
    assert found == {"data": "vit_train.data.sources.cifar", "torch": False,
                     "names": sorted(["cifar10", "cifar100", "hf", "imagefolder", "shapes", "webdataset", *names])}


def test_a_module_of_options_imported_first_cannot_take_a_built_in_name(tmp_path):
    """Imported by the user before any lookup (vit-train's own not yet imported), a class named as a built-in option
    is refused there, naming both, as it is when vit-train's came first."""
    (tmp_path / "their_options.py").write_text(textwrap.dedent(SHADOW))
    done = run_python("""
        import sys
        from vit_train.errors import ConfigError
        try:
            import their_options
        except ConfigError as e:
            print(e)
        from vit_train.schema.typed import options
        print(options("data")["cifar10"].__module__, "waves" in options("data"))
        """, {**os.environ, "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "data=cifar10 is vit_train.data.sources.cifar.Cifar10 already; give their_options.Cifar another name",
        "vit_train.data.sources.cifar True"]


def test_installed_packages_are_asked_for_their_options_once_in_a_process(tmp_path):
    """The entry points are read on the first lookup and never again, however many lookups and configs follow."""
    done = run_python("""
        import vit_train.schema.typed as typed
        calls = []
        found = typed.entry_points
        typed.entry_points = lambda **kw: calls.append(kw) or found(**kw)
        from vit_train.schema.config import Config
        for _ in range(3):
            typed.registered()
            Config.from_dict({"data": {"name": "waves"}, "objective": {"name": "mae"}})
        print(calls, "waves" in typed.options("data"))
        """, plugin_env(tmp_path, SHADOW.rpartition("@dataclass")[0]))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[{'group': 'vit_train.options'}] True"]


def test_a_lookup_while_another_thread_imports_the_options_waits_for_all_of_them(tmp_path):
    """A second thread's lookup during the first's loading (a slow module of options) sees the whole registry, not
    the part imported so far."""
    slow = """
        import time
        from dataclasses import dataclass
        from vit_train.data.aug.basic import Basic
        time.sleep(1.0)

        @dataclass
        class Slow(Basic):
            name: str = "slow"
        """
    done = run_python("""
        import threading, time
        from vit_train.schema.typed import options
        first = threading.Thread(target=options, args=("data",))
        first.start()
        time.sleep(0.3)
        print("slow" in options("aug"))
        first.join()
        """, plugin_env(tmp_path, slow))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["True"]
