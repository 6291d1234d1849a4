"""Every `vit-train` command shown in README.md and docs/*.md composes and validates.

The commands are collected from fenced code blocks (a `$ ` prompt, `python -m vit_train`,
`torchrun ... -m vit_train` and `srun vit-train` count too; `\\` continues a line; `${VAR}` is a
shell variable). Each is checked as `vit-train --cfg job` would compose it, in this process (a
subprocess per command would take minutes), plus what a run checks before any work: unknown keys
and missing plugins (cli/compose.py `read`), Hydra's composition of the config groups, launcher and
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

from helpers.cases import (ARCHITECTURE_FIELDS, FAST_KILL_MOMENTS, FLIPPED_PLACES, KILL_MOMENTS, VIT_LAYOUTS,
                           VIT_OPTIONS)
from vit_train.cli.compose import read
from vit_train.config import Config, config_dir
from vit_train.errors import ConfigError
from vit_train.schema.config import OPTION_GROUPS

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

    from helpers.registry import registry_kept
    from vit_train.cli.train import register_options

    with registry_kept():
        try:
            importlib.import_module("helpers.toy_options")
            register_options()
            for group, name in (("data", "stripes"), ("objective", "hinge"), ("callbacks", "best_so_far")):
                (tmp / group).mkdir(parents=True, exist_ok=True)
                (tmp / group / f"{name}.yaml").write_text(f"defaults:\n  - /schema/{group}/{name}\n  - _self_\n")
            yield f"hydra.searchpath=[file://{tmp}]"
        finally:
            sys.modules.pop("helpers.toy_options", None)


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
    resumes = any(a.startswith("resume=") and a.split("=", 1)[1] not in ("auto", "null") for a in args)
    read([*args, "--help"] if resumes else args)  # the command line's checks (a resumed run's checkpoint: not here)
    args = [a for a in args if a not in ("-m", "--multirun")]
    if "--cfg" in args:
        k = args.index("--cfg")
        del args[k:k + 2]
    fixed, swept = [], []
    for override in OverridesParser.create().parse_overrides(args):
        if not override.is_sweep_override():
            fixed.append(override.input_line)
        elif override.is_interval_sweep():  # an Optuna range (`interval(a, b)`): its two ends
            interval = override.value()
            swept.append([f"{override.get_key_element()}={v}" for v in (interval.start, interval.end)])
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
    with pytest.raises(Exception):
        check_command(["-m", "optim.lr=tag(log, interval(-1, 3e-3))"])  # an Optuna range: both ends are checked


# ---------------------------------------------------------------- counts the docs state, computed

WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve".split())}


def _number(text: str) -> int:
    return WORDS[text.lower()] if text.lower() in WORDS else int(text)


def stated(page: str, pattern: str) -> list[int]:
    """The numbers `pattern`'s groups capture in `page` (words or digits; whitespace in the page as one space),
    which must be found there once."""
    text = " ".join((ROOT / page).read_text().split())
    found = re.findall(pattern, text)
    assert len(found) == 1, (page, pattern, found)
    return [_number(n) for n in (found[0] if isinstance(found[0], tuple) else (found[0],))]


def test_the_shapes_classes_counted_in_the_docs():
    from vit_train.data.sources.shapes import CLASS_NAMES

    assert stated("README.md", r"on `shapes`, a procedural data set of (\w+) geometric shapes") == \
        [len(CLASS_NAMES)]
    assert stated("docs/data.md", r"\*\*shapes\*\* \(default\): (\w+) classes") == [len(CLASS_NAMES)]
    assert stated("docs/architecture.md", r"the built-in procedural shapes \((\d+) classes") == [len(CLASS_NAMES)]


def test_the_quick_starts_parameter_count():
    from vit_train.data.sources.shapes import CLASS_NAMES

    cfg = composes(["experiment=quickstart"])
    count = sum(p.numel() for p in cfg.model.build(len(CLASS_NAMES)).parameters())
    text = " ".join((ROOT / "README.md").read_text().split())
    assert f"trains a {count / 1e6:.2f}M-parameter ViT" in text, count


def test_the_composed_configs_length():
    (lines,) = stated("docs/outputs.md", r"The whole composed config \(about (\d+) lines\)")
    cfg = compose("train", ["experiment=quickstart"])
    with open_dict(cfg):
        cfg.pop("hydra", None)
    assert abs(len(OmegaConf.to_yaml(cfg).splitlines()) - lines) <= lines // 10, OmegaConf.to_yaml(cfg)


def test_the_groups_with_options_of_their_own():
    from vit_train.schema.typed import registered

    (count,) = stated("docs/architecture.md", r"the bases of the (\w+) option groups \([a-z, ]+\)")
    text = (ROOT / "docs" / "architecture.md").read_text()
    named = re.search(r"the bases of the \w+ option groups \(([a-z, ]+)\)", text).group(1).split(", ")
    single = [group for group, found in registered().items() if not any(cls.listed for cls in found.values())]
    assert sorted(named) == sorted(single) == sorted(OPTION_GROUPS) and count == len(single)


def test_the_objectives_of_your_own_in_docs_extending():
    from vit_train.schema.typed import registered

    (count,) = stated("docs/extending.md", r"\(`data=stripes`\), (\w+) objectives")
    before = {group: set(found) for group, found in registered().items()}
    with tempfile.TemporaryDirectory() as tmp, your_options(Path(tmp)):
        added = {group: set(found) - before.get(group, set()) for group, found in registered().items()}
    assert count == len(added["objective"]) and added["objective"] == {"hinge", "brier"}, added
    assert added["model"] == {"tinycnn"} and added["data"] == {"stripes"}, added  # the model family it names


def test_the_commands_counted_in_docs_mae():
    text = (ROOT / "docs" / "mae.md").read_text()

    def commands_after(anchor: str, skip: int = 0) -> int:  # the command lines of a code block after `anchor`
        block = list(FENCE.finditer(text, text.index(anchor)))[skip].group(1)
        return len([line for line in block.splitlines() if re.match(r"(vit-\w+|python) ", line)])

    shown = [commands_after("commands below show the mechanics"), commands_after("The commands of seed 0")]  # the per-seed block
    assert stated("docs/mae.md", r"The (\w+) commands below show the mechanics") == [shown[0]]
    assert stated("docs/mae.md", r"measures the case MAE exists for\. It runs (\w+) commands") == [shown[1]]


def test_the_keys_counted_in_docs_finetuning():
    (count,) = stated("docs/finetuning.md", r"(\w+) more keys change how saved weights are trained and evaluated")
    text = (ROOT / "docs" / "finetuning.md").read_text()
    after = text[text.index("more keys change how saved weights"):]
    sections = re.findall(r"^## .*`(?:vit-eval \.\.\. )?([\w.]+)", after, re.M)
    assert count == len(sections), sections  # one section a key, the last of the page
    named = {f[1].split("=")[0] for f in ARCHITECTURE_FIELDS}  # (change, "model.field=... (here ...)", revealed)
    assert stated("docs/finetuning.md", r"forced both ways, (\w+) architecture fields") == [len(named)]


def test_the_cases_counted_in_docs_vit_options():
    assert stated("docs/vit-options.md", r"over all (\d+) combinations of option, pool and position embedding") == \
        [len(VIT_OPTIONS) * len(VIT_LAYOUTS)]


def test_the_cases_counted_in_docs_reliability():
    assert stated("docs/reliability.md", r"exact resume after kill -9 at (\d+) moments") == [len(KILL_MOMENTS)]
    assert stated("docs/reliability.md", r"(\d+) cases in the fast suite, (\d+) with `-m slow`") == \
        [len(FAST_KILL_MOMENTS), len(KILL_MOMENTS) - len(FAST_KILL_MOMENTS)]
    assert set(FAST_KILL_MOMENTS) <= set(KILL_MOMENTS)
    assert stated("docs/reliability.md", r"\((\d+) places from the first byte to the last: refused") == [FLIPPED_PLACES]


def test_the_file_system_calls_of_the_saves_counted_in_docs_reliability(tmp_path):
    """The save sequence tests/outputs/test_save_order.py kills call by call, listed as it lists it."""
    import json
    import os

    from helpers.fs_killer import SAVES, arm, save_all

    pid = os.fork()
    if pid == 0:
        calls: list = []
        arm(tmp_path / "run", 0, calls)
        save_all(tmp_path / "run" / "checkpoints", SAVES)
        (tmp_path / "calls.json").write_text(json.dumps(calls))
        os._exit(0)
    os.waitpid(pid, 0)
    calls = json.loads((tmp_path / "calls.json").read_text())
    starts = [i for i, call in enumerate(calls) if call == ["open", "last.pt.tmp"]]  # each save's first call
    at_best = starts[6] - starts[5]  # the save at step 12, a new best with rotation
    assert stated("docs/reliability.md", r"at each of the (\d+) calls of the save at a new best with rotation, and "
                                         r"with `-m slow` at each of the (\d+) calls of a run's (\d+) saves") == \
        [at_best, len(calls), len(SAVES)]
    assert stated("docs/reliability.md", r"\((\d+) calls of all (\d+) saves with `-m slow`") == [len(calls), len(SAVES)]


# ---------------------------------------------------------------- every key --help prints, in docs/configs.md

def _flat(node, prefix: str = "") -> list[str]:
    if not isinstance(node, dict):
        return [prefix]
    return [key for name, value in node.items() for key in _flat(value, f"{prefix}.{name}" if prefix else str(name))]


def help_keys() -> set[str]:
    """The keys `vit-train --help` prints (the composed default config, flattened), plus each registered option's
    own keys (`group.field`, from the option classes: `vit-train group=option --help` prints them)."""
    import dataclasses

    from vit_train.schema.typed import registered

    cfg = compose("train", [])
    with open_dict(cfg):
        cfg.pop("hydra", None)
    keys = set(_flat(OmegaConf.to_container(cfg, resolve=False)))
    for group, found in registered().items():
        for name, cls in found.items():
            place = f"{group}.{name}" if cls.listed else group  # a list group's option: logger.wandb.project
            keys |= {f"{place}.{field.name}" for field in dataclasses.fields(cls)}
    return keys


def documented_keys(text: str) -> set[str]:
    """The keys docs/configs.md names in a table row or list item: a dotted `group.key` in backticks anywhere in one,
    a top-level key (`seed`, `name`) in backticks in a table row's first cell (a row of its own)."""
    rows = [line for line in text.splitlines() if line.lstrip().startswith(("|", "- "))]
    found = {key for line in rows for key in re.findall(r"`(\w+\.[\w.]+)`", line)}
    found |= {key for line in rows if line.lstrip().startswith("|") and len(line.split("|")) > 3
              for key in re.findall(r"`(\w+)`", line.split("|")[1])}
    return found


def test_configs_md_names_every_key_help_prints():
    keys = help_keys()
    assert {"name", "tags", "seed", "trainer.epochs", "model.embed_dim", "data.shuffle_buffer"} <= keys
    missing = sorted(keys - documented_keys((ROOT / "docs" / "configs.md").read_text()))
    assert not missing, f"docs/configs.md lacks {len(missing)} keys that vit-train --help prints: {missing}"


def test_the_key_check_can_fail():
    found = documented_keys("| `trainer.epochs` | x |\n| y | `model.arch` |\ntext `seed` `a.b`\n| `resume` | y |\n- `c.d`\n")
    assert found == {"trainer.epochs", "model.arch", "resume", "c.d"}
    assert not {"seed", "a.b", "trainer.depth"} & found
