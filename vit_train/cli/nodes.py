"""The typed schema as Hydra's structured configs, so that Hydra (OmegaConf) itself refuses a value of the wrong
type (`trainer.epochs=abc`, `model.depth=1.5`, in a YAML file too), and its refusal as vit-train's one line.

ConfigStore's `schema` node is the `Config` dataclass (configs/train.yaml lists it first); each option of the six
varying groups is the node `schema/<group>/<name>`, its option's dataclass with the defaults it composes to
(`Option.composed`), which the option's YAML lists first. Merged over the group's base, it makes the section that
option's type: its keys and their types only. OmegaConf 2.3 reads every annotation of the schema but `Literal`: a
literal is a string here, and the schema's own check (`Config.from_dict`) names its values. An option's section
takes keys it does not have (a recipe's, for the option it picked, over which the command line picked another):
`compose.option_sections` warns and drops them, or refuses one the command line gave, naming the option that has it.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException, ValidationError

from vit_train.errors import ConfigError
from vit_train.schema.config import LIST_GROUPS, OPTION_GROUPS, config_dir, known_keys, run_dir_of
from vit_train.schema.typed import BASES, chooser, coerce, field_types, option_base, options, unknown_key_message

ORIGINAL: dict[type, type] = {}  # a node's dataclass -> the schema's class it mirrors (to name a refused value)
NODES: dict[type, type] = {}  # a section's class -> its node's dataclass (an option's own node aside)

# hydra.run.dir reads it: `resume=PATH` runs in PATH's own directory. A PATH that does not exist gets a fresh
# directory (removed again when the run is refused), never a new folder at PATH.
OmegaConf.register_new_resolver(
    "vit_run_dir",
    lambda resume, default: (
        str(run_dir_of(resume))
        if resume not in (None, "auto", "null", "") and Path(str(resume)).expanduser().exists()
        else default
    ),
    replace=True,
)


def node_type(tp: Any) -> Any:
    """The annotation OmegaConf reads for the schema's `tp`: a literal's values are strings, a section its node."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return type(args[0])
    if origin in (Union, types.UnionType):
        inner = [node_type(a) for a in args if a is not type(None)]
        kind = inner[0] if len(inner) == 1 else Any
        return kind | None if type(None) in args else kind
    return node_class(tp) if dataclasses.is_dataclass(tp) else tp


def node_class(cls: type, defaults: dict[str, Any] | None = None) -> type:
    """The dataclass of Hydra's node for section class `cls`: its fields with OmegaConf's annotations, a subclass of
    its group's base's node (so that an option's node merged over the base makes the section its type). `defaults`:
    the option's composed values; a field it leaves out (the model's input size, which the data set's node puts in)
    is missing in the node, so that merging it keeps the value before."""
    if defaults is None and cls in NODES:
        return NODES[cls]  # one node class per section class: an option's node subclasses its group's base's
    is_option = bool(getattr(cls, "group", "")) and BASES.get(cls.group) is not cls
    fields = []
    for f in dataclasses.fields(cls):
        tp = node_type(field_types(cls)[f.name])
        if f.name in LIST_GROUPS and not is_option:  # logger=[...]: the defaults list composes each option's node in
            fields.append((f.name, dict[str, Any], dataclasses.field(default_factory=dict)))
            continue
        if defaults is not None:
            value = defaults.get(f.name, MISSING)
        elif option_base(cls) and f.name == chooser(cls.group):
            tp, value = str | None, None  # no option yet: a YAML without its /schema/<group>/<name> line is refused
        elif f.default is not dataclasses.MISSING:
            value = f.default
        else:
            value = f.default_factory() if f.default_factory is not dataclasses.MISSING else MISSING
        if dataclasses.is_dataclass(value) and not isinstance(value, type) and dataclasses.is_dataclass(tp):
            value = node_value(tp, value)  # a section's default (the Config's ViT): the values its node has
        made = (
            dataclasses.field(default_factory=lambda v=value: v)
            if isinstance(value, (list, dict)) or dataclasses.is_dataclass(value) or isinstance(value, type)
            else dataclasses.field(default=value)
        )
        fields.append((f.name, tp, made))
    node = dataclasses.make_dataclass(cls.__name__, fields, bases=(node_class(BASES[cls.group]),) if is_option else ())
    ORIGINAL[node] = cls
    if defaults is None:
        NODES[cls] = node
    return node


def node_value(node: type, value: Any) -> Any:
    """The section `value` (an option's instance, say) as the node class `node` holds it: the fields the node has,
    with the key that picks a group's option null in a group's base node (an option's node sets it)."""
    base = ORIGINAL.get(node)
    kept = {f.name: getattr(value, f.name) for f in dataclasses.fields(node) if hasattr(value, f.name)}
    if base is not None and option_base(base):
        kept[chooser(base.group)] = None
    return node(
        **{
            k: node_value(f.type, v)
            if isinstance(f.type, type) and dataclasses.is_dataclass(f.type) and dataclasses.is_dataclass(v)
            else v
            for f in dataclasses.fields(node)
            if (k := f.name) in kept
            for v in [kept[k]]
        }
    )


def register_options() -> None:
    """The schema's nodes in Hydra's ConfigStore. Run again for an option registered after this module was
    imported (your own, docs/extending.md)."""
    from vit_train.config import Config  # every option registered (their modules imported)

    store = ConfigStore.instance()
    root = OmegaConf.structured(node_class(Config))
    for group in OPTION_GROUPS:
        OmegaConf.set_struct(root[group], False)  # another option's key from a recipe: warned about and dropped
    store.store(name="schema", node=root)
    for group in LIST_GROUPS:  # each option's section under its name: logger.wandb
        for name, cls in options(group).items():
            store.store(
                group=f"schema/{group}",
                name=name,
                package="_global_",
                node={group: {name: OmegaConf.structured(node_class(cls, cls.composed()[group][name]))}},
            )
    for group in OPTION_GROUPS:
        for name, cls in options(group).items():
            composed = cls.composed()
            store.store(
                group=f"schema/{group}",
                name=name,
                package="_global_",
                node={k: OmegaConf.structured(node_class(cls, v)) if k == group else v for k, v in composed.items()},
            )


register_options()


def refusal(error: Exception, overrides: list[str]) -> ConfigError:
    """Hydra's refusal of a composition (`overrides` composed) as one line naming the key: a value of the wrong type
    as the schema says it (`coerce`'s words, as for a dict), a key a section does not have with the closest one, '+'
    on a key that exists, a choice that does not exist with the choices; otherwise Hydra's own first line."""
    from hydra.errors import MissingConfigException

    text = " ".join(str(error).split("\n")[0].split())
    cause = error.__cause__ or error.__context__
    where = re.match(r"In '([^']+)': ", text)
    if isinstance(error, MissingConfigException) or "Could not find '" in text:
        missing = re.search(r"Could not find '([^']+)'", str(error))
        if missing and not where:
            which = missing.group(1).replace("/", "=", 1)
            group = which.partition("=")[0]
            available = sorted(p.stem for p in (Path(config_dir()) / group).glob("*.yaml"))
            return ConfigError(f"{which} is not an option; choose one of {', '.join(available)}")
        return ConfigError(text)
    if isinstance(cause, ValidationError) and cause.full_key:
        line = typed_line(cause)
        return ConfigError(f"{where.group(1)}.yaml sets {line}" if where else line)
    added = re.match(r"Could not append to config\. An item is already at '([^']+)'", text)
    if added:
        given = next((o for o in overrides if o.startswith(f"+{added.group(1)}=")), f"+{added.group(1)}=...")
        return ConfigError(
            f"{given}: {added.group(1)} is a config key already ('+' adds one that does not exist); give {given[1:]}"
        )
    unknown = re.match(r"Could not (?:override|delete from config)\.? '?([^' ]+)'?", text)
    if unknown and isinstance(cause, OmegaConfBaseException) or unknown and "does not exist" in text:
        return ConfigError(not_listed(unknown.group(1), overrides) or unknown_line(unknown.group(1), cause))
    if "Multiple values for" in text:
        plus = [o for o in overrides if o.startswith("+") and not o.startswith("++")]
        return ConfigError(text + (f"; give the group choice without '+': {plus[0][1:]}" if plus else ""))
    if isinstance(cause, OmegaConfBaseException):
        text += f" ({' '.join(str(cause).split(chr(10))[0].split())})"
    return ConfigError(text)


def typed_line(error: ValidationError) -> str:
    """The line for a value OmegaConf refused at `error.full_key`: the schema's words for that key's type."""
    leaf = str(error.full_key).rpartition(".")[2]
    schema = ORIGINAL.get(error.object_type) if isinstance(error.object_type, type) else None
    tp = field_types(schema).get(leaf) if schema is not None and dataclasses.is_dataclass(schema) else None
    if tp is not None:
        try:
            coerce(tp, error.value, str(error.full_key))
        except ConfigError as e:
            return str(e)
    return f"{error.full_key}: {' '.join(str(error.msg).split())}"


def not_listed(key: str, overrides: list[str]) -> str | None:
    """The line for `logger.NAME.KEY` (callbacks.NAME.KEY) when option NAME exists but the list does not choose it
    (the list `overrides` give, else train.yaml's default); None for any other key."""
    group, _, rest = key.partition(".")
    name = rest.partition(".")[0]
    if group not in LIST_GROUPS:
        return None
    if name not in options(group):
        return f"{key}: {group} has no option {name!r} (its options: {', '.join(options(group))})"
    given = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").split("=", 1)[0] == group and "=" in o]
    chosen = given[-1].strip("[]").split(",") if given else (["tensorboard"] if group == "logger" else [])
    chosen = [c.strip() for c in chosen if c.strip()]
    if name in chosen:  # a key the chosen option lacks: the closest key, as for any option
        return None
    return (
        f"{key} is a key of {group} option {name}, which {group}=[{','.join(chosen)}] does not choose; add it to the "
        f"list: {group}=[{','.join([*chosen, name])}]"
    )


def unknown_line(key: str, cause: Any) -> str:
    """The line for a key that a structured section does not have: the closest key, as for any config key."""
    if key.split(".")[0] == "hydra":  # Hydra's own keys: its node's fields
        node = getattr(cause, "object_type", None)
        fields = [f.name for f in dataclasses.fields(node)] if dataclasses.is_dataclass(node) else []
        parent = key.rpartition(".")[0]
        close = difflib.get_close_matches(key.rpartition(".")[2], fields, n=1, cutoff=0.6)
        hint = f"; did you mean '{parent}.{close[0]}'?" if close else ""
        return f"unknown Hydra key '{key}'{hint} (keys of '{parent}': {', '.join(fields)})"
    return unknown_key_message(key, known_keys())
