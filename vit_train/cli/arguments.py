"""Reading vit-train's command line before Hydra does: group options that do not exist, keys the schema (or
the chosen option) does not have, values its override grammar refuses, plugins not installed and run
directories that cannot be written are refused in one line (ConfigError); old spellings of moved keys are
renamed (schema/legacy.py); `apply_overrides` puts a resumed run's key overrides on its saved config.
"""

from __future__ import annotations

import difflib
import importlib.util
import itertools
import logging
import re
import tempfile
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Glob, Override
from omegaconf import OmegaConf

from vit_train.errors import ConfigError
from vit_train.extras import require
from vit_train.schema.config import OPTION_GROUPS, config_dir, known_keys, override_keys, run_dir_of
from vit_train.schema.typed import (ALIASES, BASES, chooser, group_keys, not_this_option, options, section_keys,
                                    unknown_key_message)

GROUPS = ("model", "data", "aug", "optim", "schedule", "trainer", "objective", "experiment", "hparams_search", "hydra")
# Optional Hydra plugins a command line may ask for (extras.py names the extra that installs each).
PLUGINS = {"hparams_search=optuna": "hydra_plugins.hydra_optuna_sweeper",
           "hydra/sweeper=optuna": "hydra_plugins.hydra_optuna_sweeper",
           "hydra/launcher=joblib": "hydra_plugins.hydra_joblib_launcher",
           "hydra/launcher=parallel": "hydra_plugins.hydra_joblib_launcher",
           "hydra/launcher=slurm": "hydra_plugins.hydra_submitit_launcher"}



def is_resume_path(resume: object) -> bool:
    """Whether `resume` names a path (a run directory or a file), not auto or nothing."""
    return resume not in (None, "auto", "null", "")


def resumes_existing(resume: object) -> bool:
    """Whether `resume` names a path that exists (the run continues in its directory)."""
    return is_resume_path(resume) and Path(str(resume)).expanduser().exists()



def parse_override(arg: str, sweep: bool = False) -> tuple[str, object]:
    """(key, value) of one `key=value` argument, read by Hydra's override grammar in every command.

    Raises ConfigError, one line naming the argument and the quoting that works, for a value the
    grammar refuses ('#', '=', '[', '~', non-ASCII letters unquoted) and, unless `sweep`, for a
    comma-separated value (Hydra's sweep syntax).
    """
    override = read_override(arg, sweep)
    return override.get_key_element().lstrip("+~"), override.value()


def read_override(arg: str, sweep: bool = False) -> Override:
    """`parse_override`'s Hydra Override (its sweep values too)."""
    from hydra.errors import HydraException

    key, _, text = arg.partition("=")
    try:
        override = OverridesParser.create().parse_override(arg)
    except HydraException as e:
        found = re.search(r"(?:token recognition error at: |mismatched input )'(.)", str(e))
        why = f"{found.group(1)!r} needs quotes" if found else str(e).strip().splitlines()[0]
        raise ConfigError(f"cannot read the argument {arg!r} ({why}); quote the value, e.g. {quoted(key, text)} "
                          f"(see docs/troubleshooting.md, 'Quoting paths')") from None
    if override.is_sweep_override() and not sweep:
        raise ConfigError(f"{arg!r} is a sweep over several values (a ',' separates them); quote one value that holds "
                          f"a comma, e.g. {quoted(key, text)}, or add -m to sweep")
    return override


def quoted(key: str, text: str) -> str:
    """`key=text` quoted for Hydra and for the shell: "key='text'", or 'key=["a","b"]' for a list."""
    if text.startswith("[") and text.endswith("]"):
        items = [item.strip().strip("'\"") for item in text[1:-1].split(",")] if text[1:-1].strip() else []
        inner = ",".join('"' + item.replace('"', '\\"') + '"' for item in items)
        return "'" + f"{key}=[{inner}]".replace("'", "'\\''") + "'"
    body = (text[1:-1] if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"" else text).replace("'", "\\'")
    return '"' + f"{key}='{body}'".replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`") + '"'


def is_multirun(args: list[str]) -> bool:
    """Whether a vit-train command line runs a sweep (-m, --multirun, or an Optuna search)."""
    return "-m" in args or "--multirun" in args or any(a.startswith("hparams_search=") for a in args)


def check_override_keys(args: list[str], sweeps: bool = True) -> None:
    """Refuse command-line keys the schema does not know, naming the closest valid key, and keys of a data, aug
    or objective option other than the one the command line picks (`chosen_options`), naming the option that
    has it; group options that do not exist; values that cannot be parsed (naming the quoting that works; with
    `sweeps` False also a comma-separated value, which Hydra reads as a sweep); and plugins that are not
    installed, naming the extra that installs them."""
    valid, keys, appends = known_keys(), [], []
    # a resumed run's options are its checkpoint's: its keys are checked on the saved config (train/resume.py)
    resuming = any(is_resume_path(read_override(a).value()) for a in args if a.startswith("resume="))
    for i, arg in enumerate(args):
        if arg in PLUGINS:
            require(PLUGINS[arg], arg, needs="a Hydra plugin that is not installed")
        if "=" not in arg and not arg.startswith(("-", "~")) and not (i and args[i - 1].startswith("-")):
            raise ConfigError(f"{arg!r} is not an override: vit-train takes key=value (model.depth=12) and group=option "
                              f"(model=vit_tiny) arguments; see vit-train --help")  # else Hydra's parser trace, exit 1
        if arg.startswith("-") or "=" not in arg and not arg.startswith("~"):
            continue
        override = read_override(arg, sweep=sweeps)
        key = override.get_key_element().lstrip("+~")
        if override.is_delete():
            check_deletion(arg, key, resuming)
        if key in GROUPS and key != "hydra" and not override.is_delete():
            check_choices(key, group_values(override, key, search_dirs(args)), search_dirs(args))
        if key in GROUPS or "/" in key or key.split(".")[0] == "hydra":  # group choices and Hydra's own keys
            continue
        group = key.split(".")[0]
        if arg.startswith("+") and not arg.startswith("++") and key in valid:  # Hydra: "An item is already at"
            appends.append(arg)
        if key not in valid and not (resuming and group in OPTION_GROUPS):  # those: on the saved config (apply_overrides)
            raise ConfigError(option_key_message(key, args) if group in OPTION_GROUPS else unknown_key_message(key, valid))
        if group in OPTION_GROUPS and key == f"{group}.{chooser(group)}" and not resuming:
            raise ConfigError(renaming_message(arg, group, str(override.value()), search_dirs(args)))
        keys.append(key)
    appended = any(a.startswith("+") and a.lstrip("+").split("=")[0] in GROUPS for a in args)  # +experiment=...
    chosen = chosen_options(args) if not resuming and (appended or any(k.split(".")[0] in OPTION_GROUPS
                                                                          for k in keys)) else {}
    for key in keys:
        group, _, leaf = key.partition(".")
        for name in chosen.get(group, ()):
            if leaf and leaf not in section_keys(options(group)[name]):
                raise ConfigError(not_this_option(group, name, leaf) or unknown_key_message(key, valid))
    for arg in appends:  # a key the config has already (the chosen option's): '+' would make Hydra refuse it
        key = arg.lstrip("+").split("=")[0]
        raise ConfigError(f"{arg}: {key} is a config key already ('+' adds one that does not exist); give "
                          f"{arg.removeprefix('+')}")


def check_deletion(arg: str, key: str, resuming: bool) -> None:
    """ConfigError for a `~KEY` deletion that would not do what it says: on a resumed run (whose keys are its
    checkpoint's: a deleted key would be null, not its default), and of an option's section or name (the section
    would become the group's default option, silently)."""
    group = key.split(".")[0]
    if resuming:
        raise ConfigError(f"{arg}: a resumed run keeps its saved config, so a key cannot be deleted; give "
                          f"{key}=<value> instead")
    if group in OPTION_GROUPS and key in (group, f"{group}.{chooser(group)}"):
        raise ConfigError(f"{arg} would leave the {group} section without its option, which would silently become "
                          f"the default {group}; choose the option with {group}=NAME")


def option_key_message(key: str, args: list[str]) -> str:
    """The line for `key` of an option group that no option has: the closest key of the options the command line
    picks, with their keys; or, when only another option has a close key, that one and the options that have it."""
    group, _, leaf = key.partition(".")
    picked = chosen_options(args).get(group, ())
    own = sorted({k for name in picked for k in section_keys(options(group)[name])})
    every = group_keys(group)
    alias = ALIASES.get(leaf)
    near = [alias] if alias in every else difflib.get_close_matches(leaf, own, n=1, cutoff=0.6) or \
        difflib.get_close_matches(leaf, sorted(every), n=1, cutoff=0.6)
    keys = f"{group}={'/'.join(picked)} has {', '.join(own)}"
    if not near:
        return f"unknown config key '{key}' ({keys})"
    if near[0] in own:
        return f"unknown config key '{key}'; did you mean '{group}.{near[0]}'? ({keys})"
    owners = every[near[0]]
    which = owners[0] if len(owners) == 1 else f"{', '.join(owners[:-1])} and {owners[-1]}"
    return f"unknown config key '{key}'; did you mean '{group}.{near[0]}', a key of {group}={which}? ({keys})"


def search_dirs(args: list[str]) -> list[Path]:
    """The config folders the command line composes from: vit-train's configs/, then those it adds (your own
    options' YAML files, docs/extending.md): --config-dir DIR (-cd), and `hydra.searchpath=[...]`'s file://DIR and
    pkg://PACKAGE[/folder] entries."""
    dirs = [Path(config_dir())]
    for place in search_places(args):
        if place.startswith("file://"):
            dirs.append(Path(place.removeprefix("file://")))
        elif place.startswith("pkg://"):
            module, _, folder = place.removeprefix("pkg://").partition("/")
            try:
                spec = importlib.util.find_spec(module)
            except (ImportError, ValueError):
                spec = None
            if spec is not None and (spec.submodule_search_locations or spec.origin):
                base = Path(next(iter(spec.submodule_search_locations))) if spec.submodule_search_locations \
                    else Path(spec.origin).parent
                dirs.append(base / folder)
    return dirs


def search_places(args: list[str]) -> list[str]:
    """The config search path the command line adds, as Hydra spells it (file://DIR, pkg://PACKAGE): --config-dir's
    folder, then hydra.searchpath's entries."""
    places = []
    for i, arg in enumerate(args):
        if arg in ("--config-dir", "-cd") and i + 1 < len(args):
            places.append(f"file://{Path(args[i + 1]).absolute()}")
        elif arg.startswith(("--config-dir=", "-cd=")):
            places.append(f"file://{Path(arg.split('=', 1)[1]).absolute()}")
        elif arg.lstrip("+").startswith("hydra.searchpath="):
            value = read_override(arg).value()
            places += [str(p) for p in (value if isinstance(value, list) else [value])]
    return places

def resumed_keys(args: list[str]) -> list[str]:
    """`args` with each option's own key (`own_key`) spelled `++key` (Hydra's add-or-override), for a
    `resume=PATH` command line and for a sweep (checked already: `check_override_keys`). A resumed run: Hydra
    composes the command line's options, which need not be the resumed run's (its checkpoint's, on whose config
    `apply_overrides` puts the keys and the schema checks them); a path that does not exist is then said in one
    line (train/resume.py). A sweep: Hydra first composes the command line without its swept values (data=a,b,
    experiment=a,b), whose default option need not have the jobs' keys."""
    resuming = any(a.startswith("resume=") and is_resume_path(read_override(a).value()) for a in args)
    if not resuming and not is_multirun(args):
        return args
    return [f"++{a.lstrip('+')}" if "=" in a and own_key(a.lstrip("+").split("=")[0]) else a for a in args]


def own_key(key: str) -> bool:
    """Whether dotted `key` is a key of some options of its group but not of every one (data.root, optim.betas;
    not data.batch_size, optim.lr: every option's section has those)."""
    group, _, leaf = key.partition(".")
    return group in OPTION_GROUPS and bool(leaf) and leaf.split(".")[0] not in section_keys(BASES[group])


def group_values(override: Override, group: str, dirs: list[Path]) -> list[str]:
    """The options a `group=...` override picks: one, or a sweep's (a list, or a glob(...) over the group's YAML
    files in `dirs`, as Hydra expands it)."""
    if not override.is_sweep_override():
        return ["null" if override.value() is None else str(override.value())]
    if isinstance(override.value(), Glob):
        return override.value().filter(sorted({p.stem for d in dirs for p in (d / group).glob("*.yaml")}))
    return list(override.sweep_string_iterator())


def check_choices(group: str, names: list[str], dirs: list[Path]) -> None:
    """ConfigError (one line, the choices) for an option of `group` that no config folder (`dirs`) has a file for,
    and for null as a data, aug or objective option (the section would silently be the default option's)."""
    if group in OPTION_GROUPS and "null" in names:
        raise ConfigError(f"{group}=null would leave the {group} section without its option, which would silently "
                          f"become the default {group}; choose an option" + (" (aug=none: no augmentation)"
                                                                             if group == "aug" else ""))
    unknown = [n for n in names if not any((d / group / f"{n}.yaml").is_file() for d in dirs)]
    if unknown and group in OPTION_GROUPS and unknown[0] in options(group) and chooser(group) == "name":  # no YAML
        cls = options(group)[unknown[0]]
        raise ConfigError(f"{group}={unknown[0]} ({cls.__module__}.{cls.__qualname__}) has no {group}/{unknown[0]}.yaml "
                          f"in the config folders; give the folder that holds it: hydra.searchpath=[file:///path/to/"
                          f"configs] (docs/extending.md)")
    if unknown:
        available = sorted({p.stem for d in dirs for p in (d / group).glob("*.yaml")})
        raise ConfigError(f"{group}={unknown[0]} is not an option; choose one of {', '.join(available)}")
    if group in OPTION_GROUPS:
        registered(group, [option_of_choice(group, n, dirs) for n in names])  # a YAML whose class is not registered


def chosen_options(args: list[str]) -> dict[str, list[str]]:
    """{group: the options the command line picks} for the data, aug and objective groups: each value of its own
    `group=NAME` (a sweep's too), else what the rest of the command line composes to (a recipe's choice,
    train.yaml's default; read by composing the group choices alone, once per combination of a sweep's recipes,
    `experiment=a,b`). ConfigError (one line) for an option or recipe that does not exist."""
    picked, fixed, swept = {}, [], []
    for arg in args:
        if arg.startswith("-") or "=" not in arg:
            continue
        override = read_override(arg, sweep=True)
        group = override.key_or_group.lstrip("+~")
        if group in OPTION_GROUPS:
            values = [option_of_choice(group, v, search_dirs(args)) for v in group_values(override, group, search_dirs(args))]
            registered(group, values)
            picked[group] = values
            if arg.startswith("+") and not arg.startswith("++") and not override.is_sweep_override():
                fixed.append(arg)  # composed too, for Hydra's word on +aug=NAME where train.yaml picks one
        elif group in GROUPS and group != "hydra":
            if not override.is_sweep_override():
                fixed.append(arg)
            else:  # each of a swept recipe's values composes its own options
                prefix = arg.split("=", 1)[0]
                swept.append([f"{prefix}={v}" for v in group_values(override, group, search_dirs(args))])
    if set(picked) == set(OPTION_GROUPS) and not any(a.startswith("+") for a in fixed):
        return picked
    places = search_places(args)
    fixed += [f"hydra.searchpath=[{','.join(places)}]"] if places else []
    found: dict[str, list[str]] = {}
    for combination in itertools.islice(itertools.product(*swept), 64):  # a larger grid: its first 64 jobs' recipes
        for group, choice in composed_choices([*fixed, *combination]).items():
            found.setdefault(group, []).extend([] if choice in found.get(group, []) else [choice])
    return {**found, **picked}


def option_of_choice(group: str, choice: str, dirs: list[Path]) -> str:
    """The option (its registered name) that `group=choice` picks: `choice` itself, but for the model group, whose
    choices are presets of a family: the family its YAML's defaults list names (`- /schema/model/<arch>`), else the
    `arch` it sets, else `choice` (refused later, naming the line to add)."""
    if chooser(group) == "name":
        return choice
    for folder in dirs:
        path = folder / group / f"{choice}.yaml"
        if path.is_file():
            found = re.search(rf"^\s*-\s*/schema/{group}/([\w.-]+)", path.read_text(), re.M) or \
                re.search(rf"^{chooser(group)}:\s*([\w.-]+)", path.read_text(), re.M)
            return found.group(1) if found else choice
    return choice


def renaming_message(arg: str, group: str, value: str, dirs: list[Path]) -> str:
    """The line for `group.<chooser>=value` on the command line: it would keep the section's keys of the option chosen
    (Hydra #2670: app.db=mysql for app/db=mysql); the option is chosen with group=NAME."""
    if chooser(group) == "name":
        return f"{arg!r} renames the {group} section but keeps the option's keys; choose the option with {group}={value}"
    presets = sorted({p.stem for d in dirs for p in (d / group).glob("*.yaml") if option_of_choice(group, p.stem, dirs) == value})
    return (f"{arg!r} changes the {group} family but keeps the preset's keys; choose a preset of {group}.{chooser(group)}="
            f"{value} with {group}=NAME" + (f" ({', '.join(presets)})" if presets else ""))


def registered(group: str, names: list[str]) -> None:
    """ConfigError (one line) for a name of `group` that has a YAML file (check_choices found it) but no class."""
    unknown = [v for v in names if v not in options(group)]
    if unknown:
        raise ConfigError(f"{group}={unknown[0]} has a YAML file but no class: its module was not imported "
                          f"(name it in the entry-point group vit_train.options, docs/extending.md); "
                          f"registered: {', '.join(options(group))}")


def composed_choices(group_args: list[str]) -> dict[str, str]:
    """{group: option} for the data, aug and objective groups of the config that the group choices
    `group_args` (e.g. experiment=cifar10_vit_tiny) compose to. ConfigError for a choice that does not exist."""
    cfg = composed(group_args)
    return {group: str(cfg[group][chooser(group)]) if chooser(group) != "name" else str(cfg.hydra.runtime.choices[group])
            for group in OPTION_GROUPS}


def composed(overrides: list[str]) -> Any:
    """Hydra's composition of train.yaml with `overrides` (its hydra node included), as vit-train's command line
    composes it, in this process (an outer Hydra app set aside and back). ConfigError (one line) for a choice that
    does not exist and for Hydra's other refusals of the composition (its first line)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException, MissingConfigException

    outer = GlobalHydra.instance().hydra if GlobalHydra.instance().is_initialized() else None
    GlobalHydra.instance().clear()  # a Hydra app that ran in this process (a test, a notebook) is set aside
    try:
        with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
            return compose("train", overrides=overrides, return_hydra_config=True)
    except MissingConfigException as e:
        missing = re.search(r"Could not find '([^']+)'", str(e))
        if missing is None:  # not a choice of the command line's: Hydra's words
            raise ConfigError(" ".join(str(e).split("\n")[0].split())) from None
        which = missing.group(1).replace("/", "=", 1)
        group = which.partition("=")[0]
        available = sorted(p.stem for p in (Path(config_dir()) / group).glob("*.yaml"))
        raise ConfigError(f"{which} is not an option; choose one of {', '.join(available)}") from None
    except HydraException as e:  # Hydra's own refusal of the composition (+experiment=... where one is set): its words
        plus = [a for a in overrides if a.startswith("+") and not a.startswith("++")]
        hint = f"; give the group choice without '+': {plus[0][1:]}" if plus and "Multiple values" in str(e) else ""
        raise ConfigError(" ".join(str(e).split("\n")[0].split()) + hint) from None
    finally:
        GlobalHydra.instance().clear()
        if outer is not None:
            GlobalHydra.instance().initialize(outer)


def typed_config(cfg: Any, choices: Any, given: list[str]) -> Any:
    """The typed Config of Hydra's composed `cfg` (its hydra node left out), whose group choices were `choices`
    (hydra.runtime.choices) and whose command line set the dotted keys `given`. Each data, aug and objective section
    must be its chosen option's: ConfigError (one line) for an option YAML that does not make its option (no
    `/schema/<group>/<name>` line) and for a config that renames a section (data.name in a recipe). A key a config
    file set (a recipe's, for the option it picked) that the option chosen over it lacks is dropped with one
    warning line; given on the command line, it is refused (check_override_keys said so already)."""
    from omegaconf.errors import OmegaConfBaseException

    from vit_train.config import Config

    if "hydra" in cfg:  # the command line's composition (check_composed): the run's keys without Hydra's own
        cfg = OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"])
    try:
        plain = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:  # ${oops}: an interpolation of a key that does not exist
        raise ConfigError(f"the config does not resolve: {' '.join(str(e).splitlines()[0].split())}") from None
    recipe = choices.get("experiment") if choices is not None else None
    for group in OPTION_GROUPS:
        choice = choices.get(group) if choices is not None else None
        section = plain.get(group)
        if choice is None or not isinstance(section, dict):
            continue
        key = chooser(group)
        if section.get(key) is None:
            node = choice if key == "name" else "<family>"
            raise ConfigError(f"{group}={choice}'s YAML file does not make the option: its defaults list must start "
                              f"with `- /schema/{group}/{node}` (docs/extending.md)")
        if key == "name" and section["name"] != choice:
            raise ConfigError(f"{'experiment=' + recipe if recipe else 'the config'} sets {group}.name={section['name']} "
                              f"over {group}={choice}: choose the option itself, with `- override /{group}: "
                              f"{section['name']}` in the recipe's defaults list (or {group}={section['name']})")
        if section[key] in options(group):
            own = set(section_keys(options(group)[section[key]]))
            for key in [k for k in section if k not in own and f"{group}.{k}" not in given]:
                logging.getLogger("vit_train").warning(
                    "%s.%s=%s (set by %s) is not a key of %s=%s: ignored", group, key, section.pop(key),
                    f"experiment={recipe}" if recipe else "a config file", group, choice)
    return Config.from_dict(plain)


def check_composed(args: list[str]) -> Any:
    """`typed_config` of what the command line `args` composes to (without running): what `--cfg job` shows is
    refused as a run would refuse it (a value no run takes: model.patch_size=5), all but a data.root still to give."""
    overrides = [a for a in args if not a.startswith("-") and ("=" in a or a.startswith("~"))
                 and not a.startswith(("hydra.", "hydra/"))]
    places = search_places(args)
    cfg = composed([*overrides, *([f"hydra.searchpath=[{','.join(places)}]"] if places else [])])
    if cfg.data.get("root", "") is None:  # the config may be shown before its data.root is given: a run asks for it
        cfg.data.root = "data.root"
    return typed_config(cfg, cfg.hydra.runtime.choices, override_keys(overrides))

def check_writable(args: list[str]) -> None:
    """Refuse, before Hydra creates it, a run or sweep directory that cannot be written (a read-only
    working directory, say), naming the key that moves it."""
    multirun = is_multirun(args)
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    given = [a.split("=", 1)[1] for a in args if a.startswith(key + "=")]
    resume = [a.split("=", 1)[1] for a in args if a.startswith("resume=")]
    if given:
        target = Path(given[-1])
    elif not multirun and resume and resumes_existing(resume[-1]):
        target = run_dir_of(resume[-1])
    else:
        target = Path("outputs/multirun" if multirun else "outputs")
    folder = target.absolute()
    while not folder.exists():
        folder = folder.parent
    kind = "sweep" if multirun else "run"
    if not folder.is_dir():  # a file (or a FIFO) where the directory or one above it would be
        raise ConfigError(f"cannot create the {kind} directory {target}: {folder} is not a folder; give "
                          f"another one with {key}=/path/to/dir")
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        where = f"the {kind} directory {target} cannot be written" if folder == target.absolute() else \
            f"cannot create the {kind} directory {target} in {folder}"
        raise ConfigError(f"{where} ({e.strerror}); give a writable one with {key}=/path/to/dir, or run from a "
                          f"writable directory") from None


def apply_overrides(saved: dict, overrides: list[str]) -> dict:
    """The saved config (upgraded to this version's layout) with key=value overrides applied, in any order; group
    choices cannot change on resume. `data.name=X` (and aug.name, objective.name) makes that section option X's:
    its defaults, with the saved values of the keys both options have, under the keys given, so that the resume's
    own check names the change (train/resume.py). ConfigError (one line) for a key the resumed run's option (or the
    one named) does not have."""
    import dataclasses

    from vit_train.schema.legacy import upgrade_saved
    from vit_train.schema.typed import option_class

    cfg = OmegaConf.create(upgrade_saved(saved))
    parsed = [o for o in OverridesParser.create().parse_overrides([o.removeprefix("++") for o in overrides])
              if o.key_or_group != "resume"]
    for override in parsed:
        if override.key_or_group in GROUPS:
            switch = (f" (to change the augmentation: aug.name={override.value()})"
                      if override.key_or_group == "aug" else "")
            raise ConfigError(f"'{override.input_line}' picks a config group, but a resumed run keeps its saved "
                              f"config{switch}; override single keys (e.g. trainer.epochs=300) or start a new run")
    names = [o for o in parsed if o.key_or_group.partition(".")[0] in OPTION_GROUPS
             and o.key_or_group == f"{o.key_or_group.partition('.')[0]}.{chooser(o.key_or_group.partition('.')[0])}"]
    for override in names:  # first, so that the other keys land in the section of the option named
        group = override.key_or_group.partition(".")[0]
        if override.value() != OmegaConf.select(cfg, override.key_or_group):
            fresh = dataclasses.asdict(option_class(group, override.value())())
            kept = {k: v for k, v in OmegaConf.to_container(cfg[group]).items() if k in fresh and k != chooser(group)}
            cfg[group] = {**fresh, **kept}  # another option's section, the keys both have as the run had them
    for override in parsed:
        group, _, leaf = override.key_or_group.partition(".")
        if group in OPTION_GROUPS and leaf and leaf not in cfg[group]:
            raise ConfigError(resumed_key_message(group, str(cfg[group][chooser(group)]), leaf))
        OmegaConf.update(cfg, override.key_or_group, override.value(), merge=True)
    return OmegaConf.to_container(cfg)


WORDS = {"aug": "augmentation"}  # a group's name in a sentence


def resumed_key_message(group: str, name: str, leaf: str) -> str:
    """The line for `group.leaf` on a resumed run whose `group` option is `name`, which lacks it."""
    owners = sorted(o for o in group_keys(group).get(leaf, []) if o != name)
    if not owners:
        return unknown_key_message(f"{group}.{leaf}", [f"{group}.{k}" for k in section_keys(options(group)[name])])
    which = owners[0] if len(owners) == 1 else f"{', '.join(owners[:-1])} and {owners[-1]}"
    key = chooser(group)
    choice = group if key == "name" else f"{group}.{key}"  # data=cifar10; model.arch=resnet18
    may_change = BASES[group].refused_on_resume.get(key) is None  # aug.name, schedule.name
    change = (f"give {group}.{key}={owners[0]} with it to change the {WORDS.get(group, group)}, or drop {group}.{leaf}" if may_change
              else f"a resumed run keeps its {group}: drop {group}.{leaf}")
    return f"{group}.{leaf} is a key of {choice}={which}, not of the resumed run's {choice}={name}; {change}"
