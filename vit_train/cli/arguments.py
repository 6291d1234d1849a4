"""What Hydra cannot say in one line about vit-train's arguments, said before Hydra reads them (ConfigError): a
value its override grammar refuses (with the quoting that works), a bare word, a comma without -m, a plugin not
installed (with the extra that installs it), an option that does not exist or has no YAML or no class, a deletion
or a renamed section that would silently train the default option, a run directory that cannot be written.
`apply_overrides` puts a resumed run's key overrides on its saved config. Hydra's own refusals of the composition
(a wrong type, a key a section lacks) are turned into one line in nodes.py, a key of another option in compose.py.
"""

from __future__ import annotations

import importlib.util
import re
import tempfile
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Glob, Override
from omegaconf import OmegaConf

from vit_train.errors import ConfigError
from vit_train.extras import require
from vit_train.schema.config import LIST_GROUPS, OPTION_GROUPS, config_dir, run_dir_of
from vit_train.schema.typed import BASES, chooser, group_keys, options, section_keys, unknown_key_message

GROUPS = (
    "model",
    "data",
    "aug",
    "optim",
    "schedule",
    "trainer",
    "objective",
    "logger",
    "callbacks",
    "experiment",
    "hparams_search",
    "hydra",
)
# Optional Hydra plugins a command line may ask for (extras.py names the extra that installs each).
PLUGINS = {
    "hparams_search=optuna": "hydra_plugins.hydra_optuna_sweeper",
    "hydra/sweeper=optuna": "hydra_plugins.hydra_optuna_sweeper",
    "hydra/launcher=joblib": "hydra_plugins.hydra_joblib_launcher",
    "hydra/launcher=parallel": "hydra_plugins.hydra_joblib_launcher",
    "hydra/launcher=slurm": "hydra_plugins.hydra_submitit_launcher",
}


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
        raise ConfigError(
            f"cannot read the argument {arg!r} ({why}); quote the value, e.g. {quoted(key, text)} "
            f"(see docs/troubleshooting.md, 'Quoting paths')"
        ) from None
    if override.is_sweep_override() and not sweep:
        raise ConfigError(
            f"{arg!r} is a sweep over several values (a ',' separates them); quote one value that holds "
            f"a comma, e.g. {quoted(key, text)}, or add -m to sweep"
        )
    return override


def quoted(key: str, text: str) -> str:
    """`key=text` quoted for Hydra and for the shell: "key='text'", or 'key=["a","b"]' for a list."""
    if text.startswith("[") and text.endswith("]"):
        items = [item.strip().strip("'\"") for item in text[1:-1].split(",")] if text[1:-1].strip() else []
        inner = ",".join('"' + item.replace('"', '\\"') + '"' for item in items)
        return "'" + f"{key}=[{inner}]".replace("'", "'\\''") + "'"
    body = (text[1:-1] if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"" else text).replace("'", "\\'")
    return (
        '"' + f"{key}='{body}'".replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`") + '"'
    )


def check_arguments(overrides: list[str], multirun: bool, resuming: bool, dirs: list[Path]) -> None:
    """Refuse, one line each, the arguments Hydra would refuse in a traceback or several lines, or run otherwise
    than they say: a bare word, a value its grammar refuses (naming the quoting that works), a comma-separated value
    without -m (Hydra's sweep syntax), a plugin not installed (naming the extra), an option that does not exist
    (`dirs`: the config folders) or is null, a deletion or a renamed section that would train the default option."""
    for arg in overrides:
        if arg in PLUGINS:
            require(PLUGINS[arg], arg, needs="a Hydra plugin that is not installed")
        if "=" not in arg and not arg.startswith("~"):
            raise ConfigError(
                f"{arg!r} is not an override: vit-train takes key=value (model.depth=12) and group=option "
                f"(model=vit_tiny) arguments; see vit-train --help"
            )  # else Hydra's parser trace, exit 1
        override = read_override(arg, sweep=multirun)
        key = override.get_key_element().lstrip("+~")
        group = key.split(".")[0]
        if key.startswith("hydra.sweeper.params.") and override.is_sweep_override():
            swept = key.removeprefix("hydra.sweeper.params.")  # Hydra reads a dotted name as nested keys, then
            raise ConfigError(
                f"{arg}: Hydra cannot sweep over its own config, and reads {swept} there as nested "  # exits 1
                f"keys; give the search space as the key itself: '{swept}={arg.split('=', 1)[1]}' "
                f"(the Optuna sweeper reads it from the command line: docs/sweeps.md)"
            )
        if override.is_delete():
            check_deletion(arg, key, resuming)
        elif key in GROUPS and key != "hydra":
            check_choices(key, group_values(override, key, dirs), dirs)
        if group in OPTION_GROUPS and key == f"{group}.{chooser(group)}" and not resuming:
            raise ConfigError(renaming_message(arg, group, str(override.value()), dirs))


def check_deletion(arg: str, key: str, resuming: bool) -> None:
    """ConfigError for a `~KEY` deletion that would not do what it says: on a resumed run (whose keys are its
    checkpoint's: a deleted key would be null, not its default), and of an option's section or name (the section
    would become the group's default option, silently)."""
    group = key.split(".")[0]
    if resuming:
        raise ConfigError(
            f"{arg}: a resumed run keeps its saved config, so a key cannot be deleted; give {key}=<value> instead"
        )
    if group in OPTION_GROUPS and key in (group, f"{group}.{chooser(group)}"):
        raise ConfigError(
            f"{arg} would leave the {group} section without its option, which would silently become "
            f"the default {group}; choose the option with {group}=NAME"
        )


def search_dirs(places: list[str]) -> list[Path]:
    """The config folders the command line composes from: vit-train's configs/, then those it adds (your own
    options' YAML files, docs/extending.md): `places` (compose.py `search_places`), file://DIR and
    pkg://PACKAGE[/folder] entries."""
    dirs = [Path(config_dir())]
    for place in places:
        if place.startswith("file://"):
            dirs.append(Path(place.removeprefix("file://")))
        elif place.startswith("pkg://"):
            module, _, folder = place.removeprefix("pkg://").partition("/")
            try:
                spec = importlib.util.find_spec(module)
            except (ImportError, ValueError):
                spec = None
            if spec is not None and (spec.submodule_search_locations or spec.origin):
                base = (
                    Path(next(iter(spec.submodule_search_locations)))
                    if spec.submodule_search_locations
                    else Path(spec.origin).parent
                )
                dirs.append(base / folder)
    return dirs


def group_values(override: Override, group: str, dirs: list[Path]) -> list[str]:
    """The options a `group=...` override picks: one, or a sweep's (a list, or a glob(...) over the group's YAML
    files in `dirs`, as Hydra expands it)."""
    if not override.is_sweep_override():
        if group in LIST_GROUPS and isinstance(override.value(), list):  # logger=[tensorboard,wandb]
            return [str(v) for v in override.value()]
        return ["null" if override.value() is None else str(override.value())]
    if isinstance(override.value(), Glob):
        return override.value().filter(sorted({p.stem for d in dirs for p in (d / group).glob("*.yaml")}))
    return list(override.sweep_string_iterator())


def check_choices(group: str, names: list[str], dirs: list[Path]) -> None:
    """ConfigError (one line, the choices) for an option of `group` that no config folder (`dirs`) has a file for,
    and for null as a data, aug or objective option (the section would silently be the default option's)."""
    if group in OPTION_GROUPS and "null" in names:
        raise ConfigError(
            f"{group}=null would leave the {group} section without its option, which would silently "
            f"become the default {group}; choose an option" + (" (aug=none: no augmentation)" if group == "aug" else "")
        )
    unknown = [n for n in names if not any((d / group / f"{n}.yaml").is_file() for d in dirs)]
    if unknown and group in OPTION_GROUPS and unknown[0] in options(group) and chooser(group) == "name":  # no YAML
        cls = options(group)[unknown[0]]
        raise ConfigError(
            f"{group}={unknown[0]} ({cls.__module__}.{cls.__qualname__}) has no {group}/{unknown[0]}.yaml "
            f"in the config folders; give the folder that holds it: hydra.searchpath=[file:///path/to/"
            f"configs] (docs/extending.md)"
        )
    if unknown:
        available = sorted({p.stem for d in dirs for p in (d / group).glob("*.yaml")})
        raise ConfigError(f"{group}={unknown[0]} is not an option; choose one of {', '.join(available)}")
    if group in OPTION_GROUPS or group in LIST_GROUPS:
        registered(group, [option_of_choice(group, n, dirs) for n in names])  # a YAML whose class is not registered


def option_of_choice(group: str, choice: str, dirs: list[Path]) -> str:
    """The option (its registered name) that `group=choice` picks: `choice` itself, but for the model group, whose
    choices are presets of a family: the family its YAML's defaults list names (`- /schema/model/<arch>`), else the
    `arch` it sets, else `choice` (refused later, naming the line to add)."""
    if chooser(group) == "name":
        return choice
    for folder in dirs:
        path = folder / group / f"{choice}.yaml"
        if path.is_file():
            found = re.search(rf"^\s*-\s*/schema/{group}/([\w.-]+)", path.read_text(), re.M) or re.search(
                rf"^{chooser(group)}:\s*([\w.-]+)", path.read_text(), re.M
            )
            return found.group(1) if found else choice
    return choice


def renaming_message(arg: str, group: str, value: str, dirs: list[Path]) -> str:
    """The line for `group.<chooser>=value` on the command line: it would keep the section's keys of the option chosen
    (Hydra #2670: app.db=mysql for app/db=mysql); the option is chosen with group=NAME."""
    if chooser(group) == "name":
        return (
            f"{arg!r} renames the {group} section but keeps the option's keys; choose the option with {group}={value}"
        )
    presets = sorted(
        {p.stem for d in dirs for p in (d / group).glob("*.yaml") if option_of_choice(group, p.stem, dirs) == value}
    )
    return (
        f"{arg!r} changes the {group} family but keeps the preset's keys; choose a preset of {group}.{chooser(group)}="
        f"{value} with {group}=NAME" + (f" ({', '.join(presets)})" if presets else "")
    )


def registered(group: str, names: list[str]) -> None:
    """ConfigError (one line) for a name of `group` that has a YAML file (check_choices found it) but no class."""
    unknown = [v for v in names if v not in options(group)]
    if unknown:
        raise ConfigError(
            f"{group}={unknown[0]} has a YAML file but no class: its module was not imported "
            f"(name it in the entry-point group vit_train.options, docs/extending.md); "
            f"registered: {', '.join(options(group))}"
        )


def check_writable(overrides: list[str], multirun: bool = False) -> None:
    """Refuse, before Hydra creates it, a run (or with `multirun` a sweep) directory that cannot be written (a
    read-only working directory, say), naming the key that moves it."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    given = [str(read_override(a).value()) for a in overrides if a.lstrip("+").startswith(key + "=")]
    resume = [str(read_override(a).value()) for a in overrides if a.lstrip("+").startswith("resume=")]
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
        raise ConfigError(
            f"cannot create the {kind} directory {target}: {folder} is not a folder; give "
            f"another one with {key}=/path/to/dir"
        )
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        where = (
            f"the {kind} directory {target} cannot be written"
            if folder == target.absolute()
            else f"cannot create the {kind} directory {target} in {folder}"
        )
        raise ConfigError(
            f"{where} ({e.strerror}); give a writable one with {key}=/path/to/dir, or run from a writable directory"
        ) from None


def apply_overrides(saved: dict, overrides: list[str]) -> dict:
    """The saved config (upgraded to this version's layout) with key=value overrides applied, in any order; group
    choices cannot change on resume. `data.name=X` (and aug.name, objective.name) makes that section option X's:
    its defaults, with the run's own values (those it changed from its option's defaults) of the keys both options
    have, under the keys given, so that the resume's own check names the change (train/resume.py). ConfigError (one line) for a key the resumed run's option (or the
    one named) does not have."""
    from vit_train.schema.legacy import upgrade_saved
    from vit_train.schema.typed import option_class

    cfg = OmegaConf.create(upgrade_saved(saved))
    parsed = [
        o
        for o in OverridesParser.create().parse_overrides([o.removeprefix("++") for o in overrides])
        if o.key_or_group != "resume"
    ]
    for override in [o for o in parsed if o.key_or_group in LIST_GROUPS]:  # another list may be chosen on resume
        group, value = override.key_or_group, override.value()
        names = [str(v) for v in value] if isinstance(value, list) else [str(value)]
        before = OmegaConf.to_container(cfg[group]) if group in cfg else {}
        assert isinstance(before, dict)  # a list group's saved sections, by name
        cfg[group] = {
            n: before.get(n, option_class(group, n).composed()[group][n]) if n in options(group) else {} for n in names
        }  # a name not registered: refused by the config's own check, naming the options
    parsed = [o for o in parsed if o.key_or_group not in LIST_GROUPS]
    for override in parsed:
        if override.key_or_group in GROUPS:
            switch = (
                f" (to change the augmentation: aug.name={override.value()})" if override.key_or_group == "aug" else ""
            )
            raise ConfigError(
                f"'{override.input_line}' picks a config group, but a resumed run keeps its saved "
                f"config{switch}; override single keys (e.g. trainer.epochs=300) or start a new run"
            )
    names = [
        o
        for o in parsed
        if o.key_or_group.partition(".")[0] in OPTION_GROUPS
        and o.key_or_group == f"{o.key_or_group.partition('.')[0]}.{chooser(o.key_or_group.partition('.')[0])}"
    ]
    for override in names:  # first, so that the other keys land in the section of the option named
        group = override.key_or_group.partition(".")[0]
        was = OmegaConf.select(cfg, override.key_or_group)
        if override.value() != was:
            fresh = option_class(group, override.value()).composed()[group]
            try:
                old = option_class(group, was).composed()[group]
            except ConfigError:  # an option no longer registered: its values are all the run's own
                old = {}
            # another option's section: its defaults (as group=NAME composes it), and the run's own values of the keys
            # both have, those it changed from its option's defaults; a key at the old option's default takes the new
            # one's (basic's mixup_alpha 0 is not a choice to keep: aug.name=deit trains with deit's 0.8)
            kept = {
                k: v
                for k, v in OmegaConf.to_container(cfg[group]).items()
                if k in fresh and k != chooser(group) and (k not in old or v != old[k])
            }
            cfg[group] = {**fresh, **kept}
    for override in parsed:
        group, _, leaf = override.key_or_group.partition(".")
        name = leaf.partition(".")[0]
        if group in LIST_GROUPS and name and (group not in cfg or name not in cfg[group]):
            chosen = list(cfg[group]) if group in cfg else []
            raise ConfigError(
                f"{override.key_or_group} is a key of {group} option {name}, which the resumed run's "
                f"{group}=[{','.join(chosen)}] does not choose; add it to the list: {group}=[{','.join([*chosen, name])}]"
            )
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
    change = (
        f"give {group}.{key}={owners[0]} with it to change the {WORDS.get(group, group)}, or drop {group}.{leaf}"
        if may_change
        else f"a resumed run keeps its {group}: drop {group}.{leaf}"
    )
    return f"{group}.{leaf} is a key of {choice}={which}, not of the resumed run's {choice}={name}; {change}"
