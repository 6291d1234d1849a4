"""Every `vit-train` command shown in README.md and docs/*.md composes and validates.

The commands are collected from fenced code blocks (a `$ ` prompt, `python -m vit_train`,
`torchrun ... -m vit_train` and `srun vit-train` count too; `\\` continues a line; `${VAR}` is a
shell variable). Each is checked as `vit-train --cfg job` would compose it, in this process (a
subprocess per command would take minutes), plus what a run checks before any work: unknown keys
and missing plugins (`check_override_keys`), Hydra's composition of the config groups, launcher and
sweeper, and the typed schema (`Config.from_dict`). A sweep is checked with each swept value in
turn. A page added under docs/ is covered without being listed here.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import tempfile
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf, open_dict

from vit_train.cli.train import check_override_keys
from vit_train.config import Config, config_dir
from vit_train.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
ENTRY = re.compile(r"(?:^|\s)(?:vit-train|-m vit_train)(?=\s|$)")


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def commands_in(text: str) -> list[tuple[int, list[str]]]:
    """(line number, the arguments after vit-train, the error line shown under it or None) for each
    vit-train command in the code blocks."""
    found = []
    for block in FENCE.finditer(text):
        first_line = text.count("\n", 0, block.start(1)) + 1
        lines = block.group(1).split("\n")
        i = 0
        while i < len(lines):
            start, line = i, lines[i]
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i]
            i += 1
            line = re.sub(r"^\s*\$ ", "", line)
            line = re.sub(r"\$\{?(\w+)\}?", "1234", line)  # shell variables ($SLURM_JOB_ID, ...)
            match = ENTRY.search(line)
            if match is None or line.lstrip().startswith("#") or re.match(r"\s*[\w-]+: error: ", line):  # a message
                continue
            args = [a for a in shlex.split(line[match.end():], comments=True) if a != "..."]
            shown = lines[i].strip() if i < len(lines) else ""  # the refusal shown under a command
            refused = shown.startswith(("vit-train: error: ", "In 'train': "))  # ours, or Hydra's for a group option
            found.append((first_line + start, args, shown if refused else None))
    return found


def doc_commands() -> list:
    params = []
    for page in doc_pages():
        for line, args, error in commands_in(page.read_text()):
            params.append(pytest.param(args, error, id=f"{page.relative_to(ROOT)}:{line}"))
    return params


@contextlib.contextmanager
def your_options(tmp: Path):
    """docs/extending.md's options of your own, registered for the block (tests/helpers/toy_options.py, as
    tests/config/test_new_options.py uses them), and their YAML files in `tmp`: the `hydra.searchpath`
    argument to give instead of the one shown."""
    import importlib
    import sys

    from vit_train.cli.train import register_options
    from vit_train.schema.typed import REGISTRY

    registered = {group: dict(found) for group, found in REGISTRY.items()}
    try:
        importlib.import_module("helpers.toy_options")
        register_options()
        for group, name in (("data", "stripes"), ("objective", "hinge")):
            (tmp / group).mkdir(parents=True, exist_ok=True)
            (tmp / group / f"{name}.yaml").write_text(f"defaults:\n  - /schema/{group}/{name}\n  - _self_\n")
        yield f"hydra.searchpath=[file://{tmp}]"
    finally:
        sys.modules.pop("helpers.toy_options", None)
        REGISTRY.clear()
        REGISTRY.update(registered)


def check_command(args: list[str]) -> Config:
    """What `vit-train ARGS --cfg job` composes, validated as a run validates it; raises otherwise.
    A sweep is checked value by value (each swept value with the first of the others). A command with
    `hydra.searchpath` (docs/extending.md) is checked with the example options of your own."""
    if any(a.startswith("hydra.searchpath=") for a in args):
        with tempfile.TemporaryDirectory() as tmp, your_options(Path(tmp)) as searchpath:
            return composes([searchpath if a.startswith("hydra.searchpath=") else a for a in args])
    return composes(args)


def composes(args: list[str]) -> Config:
    """`check_command`'s check of `args` as they are."""
    args = [a for a in args if a not in ("-m", "--multirun")]
    if "--cfg" in args:
        k = args.index("--cfg")
        del args[k:k + 2]
    check_override_keys(args)
    fixed, swept = [], []
    for override in OverridesParser.create().parse_overrides(args):
        if not override.is_sweep_override():
            fixed.append(override.input_line)
        elif not override.key_or_group.startswith("hydra."):  # discrete sweeps; Optuna's ranges are Hydra's
            key = override.get_key_element()
            swept.append([f"{key}={value}" for value in override.sweep_string_iterator()])
    first = [values[0] for values in swept]
    variants = [fixed + first] + [fixed + first[:i] + [v] + first[i + 1:] for i, values in enumerate(swept)
                                  for v in values[1:]]
    for overrides in variants:
        cfg = compose("train", overrides, return_hydra_config=True)
        assert cfg.hydra.launcher is not None and cfg.hydra.sweeper is not None
        with open_dict(cfg):
            del cfg["hydra"]
        config = Config.from_dict(OmegaConf.to_container(cfg, resolve=True))
        if overrides is variants[0]:
            result = config
    return result


COMMANDS = doc_commands()


@pytest.fixture(scope="module", autouse=True)
def hydra_configs():
    with initialize_config_dir(config_dir(), version_base="1.3"):
        yield


def test_the_docs_show_commands():
    pages = {p.id.split(":")[0] for p in COMMANDS}
    assert len(COMMANDS) >= 30 and "README.md" in pages and len(pages) >= 5, pages


@pytest.mark.parametrize("args, error", COMMANDS)
def test_doc_command_composes_and_validates(args, error):
    """A command composes and validates. One shown with a refusal under it is either refused with
    that very line ("..." elides), or refused only at run time (a run directory that already holds
    checkpoints), which composing cannot see."""
    if error is None:
        check_command(args)
        return
    if error.startswith("In 'train': "):
        with pytest.raises(MissingConfigException, match=re.escape(error)):
            check_command(args)
        return
    try:
        check_command(args)
    except ConfigError as refused:
        shown = error.removeprefix("vit-train: error: ")
        assert re.fullmatch(".*".join(map(re.escape, shown.split("..."))), str(refused)), str(refused)


def test_the_check_catches_a_wrong_command():
    """The collection and the check can fail: a wrong key, value, group option, or a sweep's bad value."""
    text = ("```bash\nvit-train optim.lr=1e-3 \\\n    trainer.epochs=3   # fine\n$ vit-train model.patch_size=5\n"
            "torchrun --nproc_per_node=2 -m vit_train aug=fancy\nvit-train -m optim.learning_rate=1e-3,1e-4\n"
            "srun vit-train hydra.run.dir=runs/${SLURM_JOB_ID} trainer.precision=bf17\n```\n"
            "vit-train outside=a_code_block\n")
    found = commands_in(text)
    assert [line for line, _, _ in found] == [2, 4, 5, 6, 7]
    assert found[0][1] == ["optim.lr=1e-3", "trainer.epochs=3"]
    assert found[4][1] == ["hydra.run.dir=runs/1234", "trainer.precision=bf17"]
    assert check_command(found[0][1]).trainer.epochs == 3
    for _, args, _ in found[1:]:
        with pytest.raises(Exception):
            check_command(args)
    with pytest.raises(Exception):
        check_command(["-m", "model.patch_size=4,5"])  # the first value is fine, the second is not
    assert check_command(["-m", "model.patch_size=8,4"]).model.patch_size == 8
