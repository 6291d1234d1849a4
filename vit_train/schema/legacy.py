"""Configs and command lines of the earlier layout, read by this one.

Until this version every section held the keys of all its options side by side (data.shuffle_buffer
in a shapes run), and an objective's own keys had a top-level section (mae.*, distill.*). Now each
option's section holds its own keys, and an objective's keys are objective.* (`Option.moved_from`
names the old section). A checkpoint's config from before is upgraded when it is read
(`upgrade_saved`); the old spelling on the command line still works for one release, with one line
naming the new one (`rename_old_keys`); in a dict or a YAML file it is refused naming the new one.
"""

from __future__ import annotations

from typing import Any

from vit_train.errors import ConfigError
from vit_train.schema.typed import Option, chooser, registered, section_keys

FIRST_FAMILY = "vit"  # every model section written before model.arch existed was a ViT's


def saved_arch(model: dict[str, Any]) -> Any:
    """The model family of a saved config's model section (a plain dict): its `arch`, or the ViT for a section
    written before model.arch existed."""
    return model.get("arch", FIRST_FAMILY)


def moved_options() -> dict[str, list[type[Option]]]:
    """{old top-level section: the options whose keys it held}, e.g. {"mae": [Mae]}."""
    found: dict[str, list[type[Option]]] = {}
    for group in registered().values():
        for cls in group.values():
            if cls.moved_from:
                found.setdefault(cls.moved_from, []).append(cls)
    return found


def upgrade_saved(plain: dict[str, Any]) -> dict[str, Any]:
    """A saved config in this version's layout: an old section's keys (mae.*) moved into the option they
    belong to when it is the one chosen, dropped otherwise (that run never read them); each option section
    cut to the keys of its chosen option, dropping only the keys of its group's other options (the earlier
    layout's, which that run ignored): a key no option has stays, for `Config.from_dict` to refuse. A config
    already in this layout comes back equal. ConfigError (one line) for an old section that is no mapping or
    holds a key its option never had (an edited file)."""
    plain = dict(plain)
    for old, owners in moved_options().items():
        if old not in plain:
            continue
        keys = plain.pop(old)
        known = {k for cls in owners for k in section_keys(cls)}
        if not isinstance(keys, dict) or set(keys) - known:
            what = "is not a mapping" if not isinstance(keys, dict) else f"holds {sorted(set(keys) - known)[0]}"
            raise ConfigError(
                f"the saved config's '{old}' section {what}, which no vit-train wrote: the file was edited or damaged"
            )
        for cls in owners:
            section = plain.get(cls.group)
            if isinstance(section, dict) and section.get("name") == cls.name:
                plain[cls.group] = {**keys, **section}
    for group, found in registered().items():
        section, key = plain.get(group), chooser(group)
        if group == "model" and isinstance(section, dict):
            section = {**section, "arch": saved_arch(section)}
        if isinstance(section, dict) and isinstance(section.get(key), str) and section[key] in found:
            own = set(section_keys(found[section[key]]))
            others = {k for cls in found.values() for k in section_keys(cls)} - own
            plain[group] = {k: v for k, v in section.items() if k not in others}
    return plain


def refuse_old_sections(plain: dict[str, Any]) -> None:
    """ConfigError (one line, the new spelling) for a top-level section whose keys moved (mae: {...})."""
    for old, owners in moved_options().items():
        if old in plain:
            cls = owners[0]
            example = next(iter(plain[old]), None) if isinstance(plain[old], dict) else None
            raise ConfigError(
                f"'{old}' is no longer a section: {cls.group}={cls.name}'s keys are {cls.group}.* now "
                f"(e.g. {cls.group}.{example or [k for k in section_keys(cls) if k != 'name'][0]}); "
                f"move them under {cls.group}"
            )


def rename_old_keys(args: list[str]) -> tuple[list[str], list[str]]:
    """(`args` with old-section keys renamed, one line per renamed key): `mae.mask_ratio=0.6` becomes
    `objective.mask_ratio=0.6` (a +, ++ or ~ prefix kept). Arguments that are no key=value are kept. ConfigError
    (one line) when the new spelling of a renamed key is given too."""
    moved = moved_options()
    renamed, notes = [], []
    for arg in args:
        prefix = arg[: len(arg) - len(arg.lstrip("+~"))]
        key, eq, value = arg[len(prefix) :].partition("=")
        section, _, leaf = key.partition(".")
        owner = next((cls for cls in moved.get(section, []) if leaf in section_keys(cls)), None)
        if section in moved and owner is None and leaf and (eq or prefix.startswith("~")) and not arg.startswith("-"):
            cls = moved[section][0]  # an old section's key that its option never had
            raise ConfigError(
                f"{key}: '{section}' is no longer a section ({cls.group}={cls.name}'s keys are "
                f"{cls.group}.* now) and {cls.group}={cls.name} has no key {leaf} (its keys: "
                f"{', '.join(k for k in section_keys(cls) if k != 'name')})"
            )
        if arg.startswith("-") or not eq and not prefix.startswith("~") or owner is None:
            renamed.append(arg)
            continue
        twin = next((a for a in args if a.lstrip("+~").partition("=")[0] == f"{owner.group}.{leaf}"), None)
        if twin is not None:  # both spellings of one key: which wins would be a guess
            raise ConfigError(
                f"{arg} and {twin} set the same key ({key} is the old spelling of {owner.group}.{leaf}); "
                f"give one: {twin}"
            )
        renamed.append(f"{prefix}{owner.group}.{leaf}{eq}{value}")
        notes.append(
            f"{key} is spelled {owner.group}.{leaf} now ({owner.group}={owner.name}'s keys moved under "
            f"{owner.group}.*); the old spelling works until the next release"
        )
    return renamed, notes
