"""Reading vit-train's command line before Hydra does: group options that do not exist, keys the schema (or
the chosen option) does not have, values its override grammar refuses, plugins not installed and run
directories that cannot be written are refused in one line (ConfigError); old spellings of moved keys are
renamed (schema/legacy.py); `apply_overrides` puts a resumed run's key overrides on its saved config.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from omegaconf import OmegaConf

from vit_train.errors import ConfigError
from vit_train.extras import require
from vit_train.schema.config import OPTION_GROUPS, config_dir, known_keys, run_dir_of
from vit_train.schema.typed import not_this_option, options, section_keys, unknown_key_message

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
    from vit_train import config  # noqa: F401 (registers every option, whose keys are valid here)

    valid, keys = known_keys(), []
    # a resumed run's options are its checkpoint's: its keys are checked on the saved config (train/resume.py)
    resuming = any(is_resume_path(read_override(a).value()) for a in args if a.startswith("resume="))
    for arg in args:
        if arg in PLUGINS:
            require(PLUGINS[arg], arg, needs="a Hydra plugin that is not installed")
        if arg.startswith("-") or "=" not in arg:
            continue
        override = read_override(arg, sweep=sweeps)
        key = override.get_key_element().lstrip("+~")
        if key in GROUPS and key != "hydra":
            check_choices(key, list(override.sweep_string_iterator()) if override.is_sweep_override()
                          else [str(override.value())], search_dirs(args))
        if key in GROUPS or "/" in key or key.split(".")[0] == "hydra":  # group choices and Hydra's own keys
            continue
        if key not in valid:
            raise ConfigError(unknown_key_message(key, valid))
        group = key.split(".")[0]
        if key == f"{group}.name" and group in OPTION_GROUPS and not resuming:
            raise ConfigError(f"{arg!r} renames the {group} section but keeps the option's keys; choose the option "
                              f"with {group}={override.value()}")  # Hydra #2670: app.db=mysql for app/db=mysql
        keys.append(key)
    chosen = chosen_options(args) if not resuming and any(k.split(".")[0] in OPTION_GROUPS for k in keys) else {}
    for key in keys:
        group, _, leaf = key.partition(".")
        for name in chosen.get(group, ()):
            if leaf and leaf not in section_keys(options(group)[name]):
                raise ConfigError(not_this_option(group, name, leaf) or unknown_key_message(key, valid))


def search_dirs(args: list[str]) -> list[Path]:
    """The config folders the command line composes from: vit-train's configs/, then those a
    `hydra.searchpath=[file://DIR,...]` argument adds (your own options' YAML files, docs/extending.md)."""
    dirs = [Path(config_dir())]
    for arg in args:
        if arg.lstrip("+").startswith("hydra.searchpath="):
            value = read_override(arg).value()
            dirs += [Path(str(p).removeprefix("file://")) for p in (value if isinstance(value, list) else [value])
                     if str(p).startswith("file://")]
    return dirs


def resumed_keys(args: list[str]) -> list[str]:
    """`args` of a `resume=PATH` command line with each key of a data, aug or objective section spelled `++key`
    (Hydra's add-or-override): Hydra composes the command line's options, which need not be the resumed run's
    (its checkpoint's, on whose config `apply_overrides` puts the keys and the schema checks them)."""
    if not any(a.startswith("resume=") and resumes_existing(read_override(a).value()) for a in args):
        return args
    return [f"++{a.lstrip('+')}" if "=" in a and a.lstrip("+").split(".")[0] in OPTION_GROUPS and "." in a.split("=")[0]
            else a for a in args]


def check_choices(group: str, names: list[str], dirs: list[Path]) -> None:
    """ConfigError (one line, the choices) for an option of `group` that no config folder (`dirs`) has a file for."""
    unknown = [n for n in names if n != "null" and not any((d / group / f"{n}.yaml").is_file() for d in dirs)]
    if unknown:
        available = sorted({p.stem for d in dirs for p in (d / group).glob("*.yaml")})
        raise ConfigError(f"{group}={unknown[0]} is not an option; choose one of {', '.join(available)}")


def chosen_options(args: list[str]) -> dict[str, list[str]]:
    """{group: the options the command line picks} for the data, aug and objective groups: each value of its own
    `group=NAME` (a sweep's too), else what the rest of the command line composes to (a recipe's choice,
    train.yaml's default; read by composing the group choices alone). ConfigError (one line) for an option or
    recipe that does not exist."""
    picked, fixed = {}, []
    for arg in args:
        if arg.startswith("-") or "=" not in arg:
            continue
        override = read_override(arg, sweep=True)
        group = override.key_or_group.lstrip("+~")
        if group in OPTION_GROUPS:
            values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [str(override.value())]
            unknown = [v for v in values if v not in options(group)]
            if unknown:  # a YAML file without a registered class (check_choices found the file)
                raise ConfigError(f"{group}={unknown[0]} is not a registered option (its module was not imported); "
                                  f"registered: {', '.join(options(group))}")
            picked[group] = values
        elif (group in GROUPS and group != "hydra" or group == "hydra.searchpath") and not override.is_sweep_override():
            fixed.append(arg)
    if set(picked) == set(OPTION_GROUPS):
        return picked
    return {**{group: [choice] for group, choice in composed_choices(fixed).items()}, **picked}


def composed_choices(group_args: list[str]) -> dict[str, str]:
    """{group: option} for the data, aug and objective groups of the config that the group choices
    `group_args` (e.g. experiment=cifar10_vit_tiny) compose to. ConfigError for a choice that does not exist."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import MissingConfigException

    outer = GlobalHydra.instance().hydra if GlobalHydra.instance().is_initialized() else None
    GlobalHydra.instance().clear()  # a Hydra app that ran in this process (a test, a notebook) is set aside
    try:
        with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
            choices = compose("train", overrides=group_args, return_hydra_config=True).hydra.runtime.choices
    except MissingConfigException as e:
        missing = re.search(r"Could not find '([^']+)'", str(e))
        which = missing.group(1).replace("/", "=", 1) if missing else " ".join(group_args)
        group = which.partition("=")[0]
        available = sorted(p.stem for p in (Path(config_dir()) / group).glob("*.yaml"))
        raise ConfigError(f"{which} is not an option; choose one of {', '.join(available)}") from None
    finally:
        if outer is not None:
            GlobalHydra.instance().initialize(outer)
    return {group: str(choices[group]) for group in OPTION_GROUPS}


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
    """The saved config (upgraded to this version's layout) with key=value overrides applied; group choices
    cannot change on resume. `data.name=X` (and aug.name, objective.name) makes that section option X's, with
    its defaults under the keys given, so that the resume's own check names the change (train/resume.py)."""
    import dataclasses

    from vit_train.schema.legacy import upgrade_saved
    from vit_train.schema.typed import option_class

    cfg = OmegaConf.create(upgrade_saved(saved))
    for override in OverridesParser.create().parse_overrides([o.removeprefix("++") for o in overrides]):
        key = override.key_or_group
        if key == "resume":
            continue
        if key in GROUPS:
            raise ConfigError(f"'{override.input_line}' picks a config group, but a resumed run keeps its saved "
                              f"config; override single keys (e.g. trainer.epochs=300) or start a new run")
        group, _, leaf = key.partition(".")
        if group in OPTION_GROUPS and leaf == "name" and override.value() != OmegaConf.select(cfg, key):
            cfg[group] = dataclasses.asdict(option_class(group, override.value())())  # another option's section
        OmegaConf.update(cfg, key, override.value(), merge=True)
    return OmegaConf.to_container(cfg)
