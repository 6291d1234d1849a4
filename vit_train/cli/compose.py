"""The command line, read once before Hydra runs it (`read`): Hydra's flags, the arguments' own checks
(arguments.py), then Hydra's composition of it (its Compose API, the same config tree, search path and
overrides) whose refusals are one line (nodes.py), and for one run the typed `Config` it trains with.
`resume=PATH` finds its checkpoint here, once (`run_config`): its config is the checkpoint's with the key
overrides on top, and the job is handed the checkpoint. A sweep composes each swept value once (a value of
the wrong type, a key of another option than that job's) and checks that its jobs report its objective,
before Hydra makes its directory."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from vit_train.cli.arguments import (
    GROUPS,
    apply_overrides,
    check_arguments,
    group_values,
    is_resume_path,
    read_override,
    search_dirs,
)
from vit_train.cli.flags import read_flags
from vit_train.cli.nodes import refusal  # the schema's nodes in ConfigStore (every option registered)
from vit_train.errors import ConfigError
from vit_train.schema.config import (
    OPTION_GROUPS,
    Config,
    config_dir,
    ignored_keys,
    known_keys,
    override_keys,
    run_dir_of,
)
from vit_train.schema.legacy import rename_old_keys
from vit_train.schema.sections import ObjectiveConfig
from vit_train.schema.typed import (
    ALIASES,
    chooser,
    group_keys,
    not_this_option,
    option_class,
    options,
    section_keys,
    unknown_key_message,
)


@dataclasses.dataclass
class Run:
    """What one run trains with: its typed config, the overrides that made it (a resumed run's checkpoint's
    first), the checkpoint it resumes (resume=PATH: (path, checkpoint), found once) and its warning lines."""

    config: Config
    overrides: list[str]
    start: tuple[Path, dict] | None
    warnings: list[str]


@dataclasses.dataclass
class CommandLine:
    """A vit-train command line as read and checked: Hydra's flags, the overrides (old spellings renamed, one line
    each in `renamed`), whether it sweeps, and for one run (or --cfg) the run (`Run`)."""

    flags: argparse.Namespace
    overrides: list[str]
    renamed: list[str]
    multirun: bool
    run: Run | None = None
    help: str | None = None  # --help's text (help.py), from the composition read here

    def hydra_argv(self) -> list[str]:
        """The arguments Hydra reads (its flags as Hydra spells them, then the overrides as renamed)."""
        f, argv = self.flags, []
        for name, value in (
            ("--cfg", f.cfg),
            ("--package", f.package),
            ("--info", f.info),
            ("--config-path", f.config_path),
            ("--config-name", f.config_name),
            ("--config-dir", f.config_dir),
            ("--experimental-rerun", f.experimental_rerun),
        ):
            argv += [f"{name}={value}"] if value is not None else []
        for name, on in (
            ("--help", f.help),
            ("--hydra-help", f.hydra_help),
            ("--version", f.version),
            ("--resolve", f.resolve),
            ("--run", f.run),
            ("--multirun", f.multirun),
            ("--shell-completion", f.shell_completion),
        ):
            argv += [name] if on else []
        return [*argv, *self.overrides]


def read(argv: list[str]) -> CommandLine:
    """The command line `argv` (without the program), checked as Hydra would run it. ConfigError (one line) for
    anything it would refuse, or run otherwise than it says."""
    flags = read_flags(argv)
    if flags.version or flags.shell_completion or flags.experimental_rerun is not None:
        return CommandLine(flags, flags.overrides, [], flags.multirun)  # Hydra's: nothing of vit-train's to check
    overrides, renamed = rename_old_keys(flags.overrides)
    multirun = flags.multirun or any(o.startswith("hparams_search=") for o in overrides)
    command = CommandLine(flags, overrides, renamed, multirun)
    places = search_places(flags, overrides)
    resume = resume_of(overrides)
    check_arguments(overrides, multirun, is_resume_path(resume), search_dirs(places))
    runs = not (flags.help or flags.hydra_help or flags.info)
    if is_resume_path(resume) and multirun and runs:  # a job would train the run again in the sweep's folder
        raise ConfigError(
            f"resume={resume} continues one run in its own directory, not a sweep: drop "
            f"{'-m' if flags.multirun else 'hparams_search'} (a sweep's unfinished jobs resume when the same sweep "
            f"command runs again with its hydra.sweep.dir)"
        )
    if is_resume_path(resume) and not multirun:
        command.run = run_config(overrides) if runs else None  # its config is its checkpoint's
        return command
    points = sweep_points(overrides, places) if multirun else [overrides]
    cfgs = [composed(point, places, flags.config_name) for point in points]
    checked = [
        typed_config(cfg, override_keys(point), typed=not multirun and runs, shown=flags.cfg is not None)
        for cfg, point in zip(cfgs, points, strict=True)
    ]
    for cfg, point in zip(checked, points, strict=True):
        check_deletions(point, cfg[0])
    if flags.help and not flags.hydra_help:
        from vit_train.cli.help import help_text

        command.help = help_text(cfgs[0], search_dirs(places), flags.resolve)
    if multirun:
        check_sweep_objective(cfgs)
    elif runs:
        config, warnings = checked[0]
        assert isinstance(config, Config)  # typed: one run's
        command.run = Run(
            config,
            task_overrides(overrides),
            None,
            warnings + ignored_keys(config, override_keys(task_overrides(overrides))),
        )
    return command


def check_deletions(overrides: list[str], config: Any) -> None:
    """ConfigError for a `~key` deletion of a key the run's config has: every key has a value, so the run would
    train with its default while `--cfg job` (Hydra's composition) showed it gone. (Hydra's own keys, and a key the
    chosen option lacks, are said elsewhere.)"""
    plain = config.to_dict() if hasattr(config, "to_dict") else config
    for arg in overrides:
        if not arg.startswith("~") or arg.lstrip("~").startswith("hydra"):
            continue
        key = arg.lstrip("~").split("=", 1)[0]
        place, found = plain, True
        for part in key.split("."):
            found = isinstance(place, dict) and part in place
            if not found:
                break
            place = place[part]
        if found and not isinstance(place, dict):
            shown = "null" if place is None else str(place).lower() if isinstance(place, bool) else repr(place)
            raise ConfigError(
                f"{arg}: every key of the config has a value, so the run would train with {key}'s "
                f"default ({shown}) while --cfg job showed it gone; give {key}=VALUE to change it"
            )


def resume_of(overrides: list[str]) -> Any:
    """The value `resume=...` gives (the last one), or None."""
    given = [read_override(o).value() for o in overrides if o.lstrip("+").startswith("resume=")]
    return given[-1] if given else None


def task_overrides(overrides: list[str]) -> list[str]:
    """The overrides of the run's own config (Hydra's task overrides: not hydra.* or hydra/...), `resume=` aside."""
    return [o for o in overrides if not o.lstrip("+~").startswith(("hydra.", "hydra/", "resume="))]


def search_places(flags: argparse.Namespace, overrides: list[str]) -> list[str]:
    """The config search path the command line adds, as Hydra spells it: --config-dir's folder (file://DIR), then
    hydra.searchpath's entries (file://DIR, pkg://PACKAGE)."""
    places = [f"file://{Path(flags.config_dir).absolute()}"] if flags.config_dir else []
    for arg in overrides:
        if arg.lstrip("+").startswith("hydra.searchpath="):
            value = read_override(arg).value()
            places += [str(p) for p in (value if isinstance(value, list) else [value])]
    return places


def sweep_points(overrides: list[str], places: list[str]) -> list[list[str]]:
    """The command lines that cover a sweep's values one by one: every swept key at its first value, then each other
    value of each swept key in turn (a value of the wrong type, or a job whose options lack a key given, is in one)."""
    fixed, swept = [], []
    for arg in overrides:
        override = read_override(arg, sweep=True)
        if not override.is_sweep_override():
            fixed.append(arg)
            continue
        prefix = arg.split("=", 1)[0]
        group = override.key_or_group.lstrip("+~")
        if group.startswith("hydra.") or type(override.value()).__name__ == "IntervalSweep":
            continue  # the sweeper's own (Optuna's ranges): a job is given one number of them
        values = (
            group_values(override, group, search_dirs(places))
            if group in GROUPS
            else list(override.sweep_string_iterator())
        )
        swept.append([f"{prefix}={v}" for v in values] or [arg])
    first = [values[0] for values in swept]
    points = [[*fixed, *first]]
    for i, values in enumerate(swept):
        points += [[*fixed, *first[:i], value, *first[i + 1 :]] for value in values[1:]]
    return points


def composed(overrides: list[str], places: Sequence[str] = (), config_name: str | None = None) -> DictConfig:
    """Hydra's composition of train.yaml (or --config-name's) with `overrides` and the search path `places`, its hydra
    node included, in this process (an outer Hydra app set aside and back). ConfigError (one line) for what Hydra
    refuses (nodes.py `refusal`; a key deleted with '~' that the chosen option lacks: as a key given)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    given = [o for o in overrides if not o.lstrip("+").startswith("hydra.searchpath=")]
    given += [f"hydra.searchpath=[{','.join(places)}]"] if places else []
    outer = GlobalHydra.instance().hydra if GlobalHydra.instance().is_initialized() else None
    GlobalHydra.instance().clear()  # a Hydra app that ran in this process (a test, a notebook) is set aside
    try:
        with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
            return compose(config_name or "train", overrides=given, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as e:
        said = f"{e} {e.__cause__ or ''}"
        gone = re.search(r"Could not delete from config\. '([^']+)' does not exist", said) or re.search(
            r"Error merging override ~([\w.]+)\b.*does not support deletion", said, re.S
        )
        if gone:  # Hydra says the first of a key whose value is null too, the second of a key of a typed section
            rest = [o for o in overrides if o.lstrip("~").split("=")[0] != gone.group(1)]
            whole = composed(rest, places, config_name)
            if gone.group(1).split(".")[0] in OPTION_GROUPS:  # which option lacks it: the rest composed
                typed_config(whole, [gone.group(1)], typed=False)
            check_deletions([f"~{gone.group(1)}"], OmegaConf.to_container(whole))  # a key it has, null
        raise refusal(e, overrides) from None
    finally:
        GlobalHydra.instance().clear()
        if outer is not None:
            GlobalHydra.instance().initialize(outer)


def typed_config(
    cfg: DictConfig, given: list[str], typed: bool = True, shown: bool = False, choices: Any = None
) -> tuple[Config | dict[str, Any], list[str]]:
    """(the typed Config of Hydra's composition `cfg`, its warning lines) for a command line that set the dotted keys
    `given`; with `typed` False (a sweep, --help) its plain data, checked but not validated. Each option section
    must be its chosen option's: ConfigError (one line) for an option YAML that does not make its option (no
    `/schema/<group>/<name>` line), a config that renames a section (data.name in a recipe), a key given that the
    option lacks (naming the options that have it, or the closest key); a key a config file set (a recipe's, for
    the option it picked) that the option chosen over it lacks is dropped with a warning line. `shown` (--cfg): a
    data.root still to give is no refusal. `choices`: Hydra's group choices, for a `cfg` without its hydra node."""
    from omegaconf.errors import OmegaConfBaseException

    if choices is None:
        choices = cfg.hydra.runtime.choices if "hydra" in cfg else {}
    try:
        container = OmegaConf.to_container(
            OmegaConf.masked_copy(cfg, [str(k) for k in cfg if k != "hydra"]), resolve=True
        )
    except OmegaConfBaseException as e:  # ${oops}: an interpolation of a key that does not exist
        raise ConfigError(f"the config does not resolve: {' '.join(str(e).splitlines()[0].split())}") from None
    assert isinstance(container, dict)  # a DictConfig's
    plain = {str(k): v for k, v in container.items()}
    recipe, warnings, valid = choices.get("experiment"), [], known_keys()
    for key in given:  # a key no section has (one with '+', or Hydra's would have said it)
        group = key.split(".")[0]
        if key not in valid and group not in OPTION_GROUPS and key not in GROUPS and group.split("/")[0] != "hydra":
            raise ConfigError(unknown_key_message(key, valid))
    for group in OPTION_GROUPS:
        choice, section, key = choices.get(group), plain.get(group), chooser(group)
        if choice is None or not isinstance(section, dict):
            continue
        if section.get(key) is None:
            raise ConfigError(
                f"{group}={choice}'s YAML file does not make the option: its defaults list must start "
                f"with `- /schema/{group}/{choice if key == 'name' else '<family>'}` (docs/extending.md)"
            )
        if key == "name" and section["name"] != choice:
            raise ConfigError(
                f"{'experiment=' + recipe if recipe else 'the config'} sets {group}.name={section['name']} "
                f"over {group}={choice}: choose the option itself, with `- override /{group}: "
                f"{section['name']}` in the recipe's defaults list (or {group}={section['name']})"
            )
        name = section[key]
        own = section_keys(option_class(group, name))
        for leaf in [k.partition(".")[2] for k in given if k.startswith(f"{group}.")]:
            if leaf.split(".")[0] not in own:
                raise ConfigError(
                    not_this_option(group, name, leaf.split(".")[0]) or option_key_message(f"{group}.{leaf}", name)
                )
        for leaf in [k for k in section if k not in own]:
            warnings.append(
                f"{group}.{leaf}={section.pop(leaf)} (set by {f'experiment={recipe}' if recipe else 'a config file'})"
                f" is not a key of {group}={choice}: ignored"
            )
    if not typed:
        return plain, warnings
    if shown and isinstance(plain.get("data"), dict) and plain["data"].get("root", "") is None:
        plain["data"]["root"] = "data.root"  # the config may be shown before its data.root is given: a run asks for it
    return Config.from_dict(plain), warnings


def option_key_message(key: str, name: str) -> str:
    """The line for `key` of an option group that no option has: the closest key of the option `name` chosen, with
    its keys; or, when only another option has a close key, that one and the options that have it."""
    group, _, leaf = key.partition(".")
    own = sorted(section_keys(options(group)[name]))
    every = group_keys(group)
    alias = ALIASES.get(leaf)
    near = (
        [alias]
        if alias in every
        else difflib.get_close_matches(leaf, own, n=1, cutoff=0.6)
        or difflib.get_close_matches(leaf, sorted(every), n=1, cutoff=0.6)
    )
    keys = f"{group}={name} has {', '.join(own)}"
    if not near:
        return f"unknown config key '{key}' ({keys})"
    if near[0] in own:
        return f"unknown config key '{key}'; did you mean '{group}.{near[0]}'? ({keys})"
    owners = every[near[0]]
    which = owners[0] if len(owners) == 1 else f"{', '.join(owners[:-1])} and {owners[-1]}"
    return f"unknown config key '{key}'; did you mean '{group}.{near[0]}', a key of {group}={which}? ({keys})"


def run_config(overrides: list[str], cfg: DictConfig | None = None, choices: Any = None) -> Run:
    """The run `overrides` make: for `resume=PATH` its checkpoint's config with the key overrides on top (the
    checkpoint found here, once, and handed to the trainer); otherwise the typed config of `cfg`, Hydra's
    composition of `overrides` (composed here when not given; `choices`: its group choices, for a sweep job's)."""
    resume, mine = resume_of(overrides), task_overrides(overrides)
    if not is_resume_path(resume):
        cfg = composed(overrides) if cfg is None else cfg
        config, warnings = typed_config(cfg, override_keys(overrides), choices=choices)
        assert isinstance(config, Config)  # typed
        return Run(config, mine, None, warnings + ignored_keys(config, override_keys(mine)))
    from vit_train.train.resume import find_start  # whose checkpoint: said before any other check of the config

    start = find_start(str(resume), run_dir_of(str(resume)))
    assert start is not None  # resume=PATH: its checkpoint, or find_start refused it
    path, ckpt = start
    Config.from_saved({**ckpt["config"], "resume": None}, source=path)  # its own config first: a cause of its own
    config = Config.from_dict({**apply_overrides(ckpt["config"], mine), "resume": str(resume)})
    return Run(config, list(ckpt.get("overrides", [])) + mine, (path, ckpt), ignored_keys(config, override_keys(mine)))


def check_sweep_objective(points: list[Any]) -> None:
    """Refuse a sweep whose jobs (`points`: one composition per swept value) would not report its objective
    (sweep.objective, a results.json key of each job's objective), or would score different numbers."""
    objective = str(points[0].sweep.objective)
    classes: dict[str, type[ObjectiveConfig]] = {}
    for name in dict.fromkeys(str(cfg.objective.name) for cfg in points):
        cls = option_class("objective", name)
        assert issubclass(cls, ObjectiveConfig)  # the objective group's options subclass its base
        classes[name] = cls
    metrics = {cls.metric for cls in classes.values()}  # one score in common: theirs; else none compares
    for name, cls in classes.items():
        if objective in cls.results:
            continue  # a number its jobs never report: each such job's would be empty
        fix = (
            f"add sweep.objective=best_{cls.metric}{'' if cls.higher_is_better else ' sweep.direction=minimize'}"
            if len(metrics) == 1
            else f"sweep one objective at a time ({' and '.join(f'objective={n}' for n in classes)}"
            f" score different numbers)"
        )
        raise ConfigError(
            f"objective={name} jobs report {', '.join(cls.results)} in results.json, not {objective}, so "
            f"sweep.objective={objective} would be empty for "
            f"{'every job' if len(classes) == 1 else 'them'}: {fix}"
        )
    if len(metrics) > 1:  # each reports it, but not the same thing (classify's final_loss and MAE's)
        raise ConfigError(
            f"{' and '.join(f'objective={n}' for n in classes)} jobs score different numbers, so "
            f"sweep.objective={objective} would rank unlike things together: sweep one objective at a time"
        )


def show(command: CommandLine) -> str:
    """What `--cfg job` (or all) prints for a resumed run: its checkpoint's config with the overrides, as Hydra
    prints a config (--package picks a part of it)."""
    assert command.run is not None  # a resumed run's command line
    cfg = OmegaConf.create(command.run.config.to_dict())
    if command.flags.cfg == "all":
        places = search_places(command.flags, command.overrides)
        cfg.hydra = composed(command.overrides, places, command.flags.config_name).hydra
    package = None if command.flags.package in (None, "_global_") else command.flags.package
    shown = cfg if package is None else OmegaConf.select(cfg, package)
    if shown is None:
        raise ConfigError(f"package '{package}' not found in config")
    if not OmegaConf.is_config(shown):
        return f"{shown}\n"
    if command.flags.resolve:
        OmegaConf.resolve(shown)
    return (f"# @package {package}\n" if package else "") + OmegaConf.to_yaml(shown)
