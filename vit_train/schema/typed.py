"""Typed config sections from plain data, and the registry of options. No torch, no Hydra.

A section is a dataclass (`Section`); `build` makes one from a plain dict, checking every key and
type and raising one-line ConfigErrors that name the key. A varying config group (data, aug,
objective, ...) is a base dataclass whose subclasses are its options (`Option`): a subclass that sets its
own `name` default registers itself under (group, name) when its class statement runs, so the module
that defines an option is the only place that names it. The registry imports the modules of the options on
its first lookup (`load_options`): vit-train's own, listed in `BUILT_IN`, then those that installed packages
name in the entry-point group `vit_train.options`. None of them imports torch at its top, so reading a config
imports no torch; the layers below an option see only its group's base.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import logging
import threading
import types
import typing
from importlib.metadata import entry_points
from typing import Any, ClassVar, Literal, Union

from vit_train.errors import ConfigError

# Names users bring from other trainers (timm, Lightning, DeiT), for "did you mean" hints.
ALIASES = {
    "learning_rate": "lr",
    "wd": "weight_decay",
    "grad_clip": "clip_grad",
    "clip_grad_norm": "clip_grad",
    "max_epochs": "epochs",
    "warmup": "warmup_epochs",
    "drop_path_rate": "drop_path",
    "workers": "num_workers",
    "batch": "batch_size",
    "patch": "patch_size",
    "input_size": "img_size",
    "global_pool": "pool",
    "mixup": "mixup_alpha",
    "cutmix": "cutmix_alpha",
    "reprob": "random_erasing",
    "smoothing": "label_smoothing",
    "mixup_prob": "mix_prob",
    "mixup_switch_prob": "switch_prob",
    "repeated_aug_count": "repeated_aug",
    "model_ema_decay": "ema_decay",
    "finetune": "pretrained",
}


class Section:
    """A config section: a dataclass whose fields are its keys (a comment on each gives its meaning and
    unit). What the run does with it lives next to the fields:

    - `check(cfg)`: refuse (ConfigError, one line naming the key) a value that cannot run; `cfg` is the
      whole Config, for the checks that read another section too. Called by Config.validate.
    - `ignored(cfg)`: the keys this section holds that `cfg`'s choices do not read, as (key, the choice
      that ignores it, what reads it); a changed one gets one warning line (schema/config.py `ignored_keys`).
    - `refused_on_resume`: {key: why} for the keys whose change would make a checkpoint's state mean
      something else; a resumed run with one changed is refused (train/resume.py).
    """

    refused_on_resume: ClassVar[dict[str, str]] = {}
    # every section class is a dataclass (declared for the type checker: dataclasses.asdict takes its instances)
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    # `cfg: Any` here only: its type, schema/sections.py RunConfig (the Config by its fields), lives in a module
    # that imports this one; the sections and options annotate cfg with it
    def check(self, cfg: Any) -> None:
        """Refuse what cannot run (ConfigError); the default accepts everything the types allow."""

    def ignored(self, cfg: Any) -> list[tuple[str, str, str]]:
        """(key, the choice that ignores it, what reads it) for each key `cfg`'s choices leave unread."""
        return []

    def resume_refusal(self, key: str, saved: Any) -> str | None:
        """Why a resumed run may not change `key` from its `saved` value to this section's value, or None."""
        return self.refused_on_resume.get(key)


REGISTRY: dict[str, dict[str, type[Option]]] = {}  # group -> option name -> its class
BASES: dict[str, type[Option]] = {}  # group -> its base class (the keys every option of it has)

# The modules of vit-train's own options, by group: imported by the first lookup of the registry, before the modules
# that installed packages name in the entry-point group ENTRY_POINTS (docs/extending.md). Importing one registers its
# classes and imports no torch (tests/config/test_registry.py).
BUILT_IN = {
    "model": ("vit_train.models.families.vit", "vit_train.models.families.resnet"),
    "optim": ("vit_train.optim.adamw", "vit_train.optim.sgd"),
    "schedule": ("vit_train.schedules.cosine", "vit_train.schedules.constant"),
    "data": (
        "vit_train.data.sources.shapes",
        "vit_train.data.sources.cifar",
        "vit_train.data.sources.imagefolder",
        "vit_train.data.sources.webdataset",
        "vit_train.data.sources.hf",
    ),
    "aug": (
        "vit_train.data.aug.none",
        "vit_train.data.aug.basic",
        "vit_train.data.aug.randaug",
        "vit_train.data.aug.autoaug",
        "vit_train.data.aug.trivial",
        "vit_train.data.aug.deit",
    ),
    "objective": ("vit_train.objectives.classify", "vit_train.objectives.distill", "vit_train.objectives.mae"),
    "logger": ("vit_train.callbacks.tensorboard", "vit_train.callbacks.wandb", "vit_train.callbacks.mlflow"),
    "callbacks": ("vit_train.callbacks.early_stopping",),
}
ENTRY_POINTS = "vit_train.options"
_BUILT_IN_MODULES = frozenset(module for modules in BUILT_IN.values() for module in modules)
_lock = threading.RLock()
_loaded = False  # every module of BUILT_IN and of the entry points imported
_loading = False  # being imported, by this thread while it holds _lock


def load_options() -> None:
    """Import the modules of the options, once in a process: vit-train's own (`BUILT_IN`), then those that installed
    packages name in the entry-point group vit_train.options. A package's module that cannot be imported, or an
    option of it that cannot be chosen (`unusable`), is said in one warning line and left out; everything else works.
    Every lookup of the registry calls it first; a lookup made while the modules are being imported sees those
    registered so far."""
    global _loaded, _loading
    if _loaded:
        return
    with _lock:
        if _loaded or _loading:
            return
        _loading = True
        try:
            for modules in BUILT_IN.values():
                for module in modules:
                    importlib.import_module(module)
            for plugin in entry_points(group=ENTRY_POINTS):
                load_plugin(plugin)
            _loaded = True
        finally:
            _loading = False


def load_plugin(plugin: Any) -> None:
    """Import the module that entry point `plugin` names; one warning line for it when it cannot be imported (the
    options it registered before the error stay), and one for each option it registered that cannot be chosen
    (which is taken out again)."""
    log = logging.getLogger("vit_train")
    before = {group: dict(found) for group, found in REGISTRY.items()}
    try:
        plugin.load()
    except (Exception, SystemExit) as error:  # noqa: BLE001 - another package's code: said in one line, the rest goes on
        dist = getattr(plugin, "dist", None)
        package = f", package {dist.name} {dist.version}" if dist is not None else ""
        first = str(error).splitlines()[0] if str(error) else ""
        log.warning(
            "the options of %s (entry point %s of %s%s) are not available: %s: %s",
            plugin.value,
            plugin.name,
            ENTRY_POINTS,
            package,
            type(error).__name__,
            first,
        )
    for group, found in REGISTRY.items():
        for name, cls in list(found.items()):
            problem = None if before.get(group, {}).get(name) is cls else unusable(cls)
            if problem:  # one line, and the option is not there: every other command works
                del found[name]
                log.warning(
                    "%s=%s (%s.%s) is not available: %s", group, name, cls.__module__, cls.__qualname__, problem
                )


def unusable(cls: type[Option]) -> str | None:
    """Why another package's option class cannot be chosen (None when it can): its defaults must make it and pass
    its own types, and the group's default stays vit-train's (the command line also drops one whose keys a Hydra
    node cannot hold: cli/train.py `register_options`)."""
    try:
        plain = dataclasses.asdict(cls())
    except Exception as e:  # noqa: BLE001 - their code
        return f"its class cannot be made from its defaults ({type(e).__name__}: {e}); give every key a default"
    try:
        build(cls, plain, f"{cls.group}.", [])
    except ConfigError as e:
        return f"its defaults do not pass its own types ({e})"
    if cls.__dict__.get("default"):
        return f"it sets default = True, but the default {cls.group} is vit-train's; drop that line"
    return None


def chooser(group: str) -> str:
    """The key whose value picks `group`'s option: "name", or "arch" for the model group."""
    return BASES[group].chooser if group in BASES else "name"


class Option(Section):
    """One choice of a varying config group (`group`), e.g. data=cifar10: a Section whose fields are that
    option's keys, `name` among them. A subclass that sets its own `name` default is an option and
    registers itself under (group, name) when its class is made; one that does not (a shared base such
    as EncodedImages) is not. `chooser`: the key whose value picks the option, `name` but for the model group,
    whose `model.arch` picks the family (`model.name` labels the size preset, model=vit_tiny).
    `default`: the option a config that names none gets (one per group).
    `moved_from`: the top-level section its keys had before they moved under `group` (e.g. mae.*), whose
    old spelling still works for one release (schema/legacy.py).
    `listed`: a list group's option (logger=[tensorboard,wandb], callbacks=[early_stopping]): any number of the
    group's options are chosen at once, each section under its own name (`logger.wandb.project`); its `name` is a
    class attribute, not a key (`ListedOption`)."""

    group: ClassVar[str] = ""
    chooser: ClassVar[str] = "name"
    default: ClassVar[bool] = False
    listed: ClassVar[bool] = False
    moved_from: ClassVar[str | None] = None
    name: str  # every option's label (each group's base declares the field with its comment)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "group" in cls.__dict__:  # a group's base (DataConfig, ModelConfig, ...)
            BASES[cls.group] = cls
        name = cls.__dict__.get(cls.chooser)
        if isinstance(name, str) and name and cls.group:
            if cls.__module__ not in _BUILT_IN_MODULES:
                load_options()  # vit-train's own first, whatever was imported first: a name of theirs is refused here
            known = REGISTRY.setdefault(cls.group, {})
            other = known.get(name)
            if other is not None and (other.__module__, other.__qualname__) != (cls.__module__, cls.__qualname__):
                raise ConfigError(
                    f"{cls.group}={name} is {other.__module__}.{other.__qualname__} already; give "
                    f"{cls.__module__}.{cls.__qualname__} another name"
                )  # never a silent last-wins
            known[name] = cls  # a module imported again (importlib.reload) registers its class anew

    @classmethod
    def unimplemented(cls) -> list[str]:
        """What a usable option of its group defines and this class does not (its base's contract: methods
        left as the base's, class attributes left empty); [] for a complete one. Checked when it is chosen."""
        return []

    @classmethod
    def composed(cls) -> dict[str, Any]:
        """What choosing this option puts into the composed config, as plain data by section: its own section
        with its defaults (vit-train's Hydra node for group=NAME, cli/nodes.py)."""
        return {cls.group: dataclasses.asdict(cls())}


class ListedOption(Option):
    """The base of a list group's options (logger=[...], callbacks=[...]): any number of them are chosen at once,
    each under its own name. A subclass sets `name = "..."` as a class attribute (not a key: the section's place
    names it) and is a dataclass whose fields are its keys."""

    listed: ClassVar[bool] = True

    @classmethod
    def composed(cls) -> dict[str, Any]:
        """{group: {name: its keys with their defaults}}: choosing it adds its section under its name."""
        return {cls.group: {cls.name: dataclasses.asdict(cls())}}


def list_groups() -> list[str]:
    """The list groups (logger, callbacks): those whose base is a ListedOption."""
    load_options()
    return [group for group, base in BASES.items() if base.listed]


def options(group: str) -> dict[str, type[Option]]:
    """{name: class} of the options registered in `group`, by name."""
    load_options()
    return dict(sorted(REGISTRY.get(group, {}).items()))


def registered() -> dict[str, dict[str, type[Option]]]:
    """{group: {name: class}} of every group's options."""
    load_options()
    return {group: options(group) for group in sorted(REGISTRY)}


def option_class(group: str, name: Any) -> type[Option]:
    """The class of option `name` of `group`; ConfigError naming the choices for any other name."""
    known = options(group)
    if not isinstance(name, str) or name not in known:
        choices = ", ".join(sorted(known)) or "none registered"
        chooser = next(iter(known.values())).chooser if known else "name"
        raise ConfigError(f"{group}.{chooser} must be one of {choices}; got {name!r}")
    missing = known[name].unimplemented()
    if missing:  # a user's option short of its group's contract: refused when chosen, not a traceback mid-run
        cls = known[name]
        raise ConfigError(
            f"{group}={name} ({cls.__module__}.{cls.__qualname__}) does not define {', '.join(missing)}, "
            f"which every {group} option defines; add {'it' if len(missing) == 1 else 'them'} "
            f"(docs/extending.md)"
        )
    return known[name]


def overridden(cls: type, base: type, method: str) -> bool:
    """Whether `cls` (a subclass of `base`) defines `method` otherwise than `base` does."""

    def function(owner: type) -> Any:
        found = getattr(owner, method)
        return getattr(found, "__func__", found)  # a classmethod's function

    return function(cls) is not function(base)


def default_option(group: str) -> type[Option]:
    """The class of the option that `group` defaults to (the one whose `default` is set)."""
    found = [cls for cls in options(group).values() if cls.__dict__.get("default")]
    if len(found) != 1:
        raise ConfigError(
            f"the config group {group} has {len(found)} default options "
            f"({', '.join(getattr(c, c.chooser) for c in found) or 'none'}); exactly one option sets "
            f"default = True"
        )
    return found[0]


def option_base(tp: Any) -> bool:
    """Whether the field type `tp` is the base of a varying group (its value is one of the group's options)."""
    return isinstance(tp, type) and issubclass(tp, Option) and BASES.get(tp.group) is tp


def field_types(cls: type) -> dict[str, Any]:
    """{field: type} of a dataclass (its ClassVars left out)."""
    return {f.name: typing.get_type_hints(cls)[f.name] for f in dataclasses.fields(cls)}


def section_keys(cls: type) -> list[str]:
    """The keys (field names) of a section class."""
    return [f.name for f in dataclasses.fields(cls)]


def group_keys(group: str) -> dict[str, list[str]]:
    """{key: the options of `group` that have it}, for every key of any of its options."""
    found: dict[str, list[str]] = {}
    for name, cls in options(group).items():
        for key in section_keys(cls):
            found.setdefault(key, []).append(name)
    return found


def unknown_key_message(key: str, valid: list[str]) -> str:
    """'unknown config key X; did you mean Y?' plus the valid keys of that section."""
    section, _, leaf = key.rpartition(".")
    alias = f"{section}.{ALIASES[leaf]}" if section and leaf in ALIASES else ALIASES.get(leaf, "")
    close = [alias] if alias in valid else difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    siblings = [k.rpartition(".")[2] for k in valid if k.rpartition(".")[0] == section]
    if section and not siblings:  # no such section at all: name the sections there are
        sections = sorted({k.partition(".")[0] for k in valid if "." in k})
        return f"unknown config key '{key}'{hint}: there is no section '{section}' (sections: {', '.join(sections)})"
    where = f"keys of '{section}'" if section else "top-level keys"
    return f"unknown config key '{key}'{hint} ({where}: {', '.join(siblings)})"


def not_this_option(group: str, name: str, leaf: str) -> str | None:
    """The line for `group.leaf` under option `name` when `leaf` is a key of other options of `group`
    (None when no option has it): which options have it, and the chosen option's keys."""
    owners = sorted(o for o in group_keys(group).get(leaf, []) if o != name)
    if not owners:
        return None
    chooser = options(group)[name].chooser
    mine = ", ".join(k for k in section_keys(options(group)[name]) if k != chooser)
    choice = group if chooser == "name" else f"{group}.{chooser}"  # model.arch=resnet18; data=cifar10
    which = f"{choice}=" + (owners[0] if len(owners) == 1 else f"{', '.join(owners[:-1])} and {owners[-1]}")
    pick = f"{choice}={owners[0]}" if len(owners) == 1 else f"one of {choice}={', '.join(owners)}"
    if chooser != "name":  # a family is picked by its presets: model=vit_small, not model.arch=vit
        pick = f"a {group} of {pick}"
    return (
        f"{group}.{leaf} is a key of {which}, not of {choice}={name} "
        f"({f'its keys: {mine}' if mine else f'it has no keys but {chooser}'}); pick {pick} or drop {group}.{leaf}"
    )


def build(cls: type, data: Any, prefix: str, valid: list[str]) -> Any:
    """An instance of dataclass `cls` from the plain dict `data` (`prefix`: its dotted place, e.g. "model.";
    `valid`: every dotted key, for hints). An option field is built as the option its `name` picks."""
    if not isinstance(data, dict):
        raise ConfigError(f"'{prefix.rstrip('.') or 'config'}' must be a mapping, got {data!r}")
    hints = field_types(cls)
    kwargs = {}
    for name, value in data.items():
        key = prefix + str(name)
        if name not in hints:
            line = None
            if issubclass(cls, Option) and cls.group and not cls.listed:  # a listed option's keys are its own only
                chosen = getattr(cls, cls.chooser, None)  # an option's own name
                if isinstance(chosen, str) and chosen in options(cls.group):
                    line = not_this_option(cls.group, chosen, str(name))
            raise ConfigError(line or unknown_key_message(key, valid))
        kwargs[name] = coerce(hints[name], value, key, valid)
    return cls(**kwargs)


def build_option(base: type[Option], data: Any, key: str, valid: list[str]) -> Any:
    """The option of `base`'s group that `data[base.chooser]` picks (the group's default when absent), built from
    `data`."""
    if not isinstance(data, dict):
        raise ConfigError(f"'{key}' must be a mapping, got {data!r}")
    cls = option_class(base.group, data[base.chooser]) if base.chooser in data else default_option(base.group)
    valid = [k for k in valid if not k.startswith(key + ".")] + [f"{key}.{k}" for k in section_keys(cls)]
    return build(cls, data, key + ".", valid)


def build_listed(base: type[Option], data: Any, key: str, valid: list[str]) -> dict[str, Any]:
    """{name: option} of a list group (`base.listed`) from {name: its keys} (Hydra's composition of group=[a,b]), or
    from a list of names (each option with its defaults). ConfigError (one line) for a name that is not one of the
    group's options, and for a key of an option that it lacks (naming that option's keys)."""
    if isinstance(data, (list, tuple)):
        data = {name: {} for name in data}
    if not isinstance(data, dict):
        raise ConfigError(f"'{key}' must be a list of {key} options or a mapping of them to their keys, got {data!r}")
    built = {}
    for name, keys in data.items():
        known = options(base.group)
        if name not in known:
            raise ConfigError(
                f"{key}={name} is not an option; choose among {', '.join(known) or 'none registered'} "
                f"({key}=[{','.join(known)}])"
            )
        cls = option_class(base.group, name)
        keys = {} if keys is None else keys
        if not section_keys(cls) and isinstance(keys, dict) and keys:
            raise ConfigError(f"{key}.{name} has no keys; drop {key}.{name}.{next(iter(keys))}")
        built[name] = build(cls, keys, f"{key}.{name}.", [f"{key}.{name}.{k}" for k in section_keys(cls)])
    return built


def coerce(tp: Any, value: Any, key: str, valid: list[str] | None = None) -> Any:
    """Check `value` against type `tp`; return it (ints widened to float where a float is due)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if (origin is dict or tp is dict) and len(args) == 2 and option_base(args[1]) and args[1].listed:
        return build_listed(args[1], value, key, valid or [])
    if option_base(tp):
        return build_option(tp, value, key, valid or [])
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return build(tp, value, key + ".", valid or [])
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return coerce(inner[0], value, key, valid)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key} must be one of {', '.join(map(str, args))}; got {value!r}")
        return value
    if origin is list or tp is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        return [coerce(args[0], v, f"{key}[{i}]") if args else v for i, v in enumerate(value)]
    if origin is tuple or tp is tuple:  # from a list (YAML and Hydra have no tuples)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        fixed = bool(args) and args[-1] is not Ellipsis
        if fixed and len(value) != len(args):
            raise ConfigError(f"{key} must hold {len(args)} values, got {len(value)}")
        return tuple(
            coerce(args[i] if fixed else args[0], v, f"{key}[{i}]") if args else v for i, v in enumerate(value)
        )
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping, got {value!r}")
        return {k: coerce(args[1], v, f"{key}.{k}") if args else v for k, v in value.items()}
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp in (int, bool, str) and type(value) is tp:
        return value
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    raise ConfigError(f"{key} must be {names.get(tp, tp)}, got {value!r} ({type(value).__name__})")


def require(ok: bool, message: str) -> None:
    """ConfigError(`message`) unless `ok`: the one-line refusal of every check."""
    if not ok:
        raise ConfigError(message)


def positive(*pairs: tuple[str, Any]) -> None:
    """Refuse each (key, value) whose value is not > 0; a None value (an optional key left unset) passes."""
    for key, value in pairs:
        require(value is None or value > 0, f"{key} must be > 0, got {value}")


def fraction(key: str, value: float, closed: bool = True) -> None:
    """Refuse a `value` outside [0, 1] (`closed`) or [0, 1)."""
    ok = 0.0 <= value <= 1.0 if closed else 0.0 <= value < 1.0
    require(ok, f"{key} must be in [0, {'1]' if closed else '1)'}, got {value}")
