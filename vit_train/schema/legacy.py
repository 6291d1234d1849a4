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
from vit_train.schema.typed import REGISTRY, section_keys


def moved_options() -> dict[str, list[type]]:
    """{old top-level section: the options whose keys it held}, e.g. {"mae": [Mae]}."""
    found: dict[str, list[type]] = {}
    for group in REGISTRY.values():
        for cls in group.values():
            if cls.moved_from:
                found.setdefault(cls.moved_from, []).append(cls)
    return found


def upgrade_saved(plain: dict[str, Any]) -> dict[str, Any]:
    """A saved config in this version's layout: an old section's keys (mae.*) moved into the option they
    belong to when it is the one chosen, dropped otherwise (that run never read them); each option section
    cut to the keys of its chosen option (the others were ignored by that run). A config already in this
    layout comes back equal."""
    plain = dict(plain)
    for old, owners in moved_options().items():
        keys = plain.pop(old, None)
        for cls in owners:
            section = dict(plain.get(cls.group) or {})
            if isinstance(keys, dict) and section.get("name") == cls.name:
                plain[cls.group] = {**keys, **section}
    for group, known in REGISTRY.items():
        section = plain.get(group)
        if isinstance(section, dict) and section.get("name") in known:
            own = set(section_keys(known[section["name"]]))
            plain[group] = {k: v for k, v in section.items() if k in own}
    return plain


def refuse_old_sections(plain: dict[str, Any]) -> None:
    """ConfigError (one line, the new spelling) for a top-level section whose keys moved (mae: {...})."""
    for old, owners in moved_options().items():
        if old in plain:
            cls = owners[0]
            example = next(iter(plain[old]), "...") if isinstance(plain[old], dict) and plain[old] else "..."
            raise ConfigError(f"'{old}' is no longer a section: {cls.group}={cls.name}'s keys are {cls.group}.* now "
                              f"(e.g. {cls.group}.{example}); move them under {cls.group}")


def rename_old_keys(args: list[str]) -> tuple[list[str], list[str]]:
    """(`args` with old-section keys renamed, one line per renamed key): `mae.mask_ratio=0.6` becomes
    `objective.mask_ratio=0.6` (a +, ++ or ~ prefix kept). Arguments that are no key=value are kept."""
    moved = moved_options()
    renamed, notes = [], []
    for arg in args:
        prefix = arg[:len(arg) - len(arg.lstrip("+~"))]
        key, eq, value = arg[len(prefix):].partition("=")
        section, _, leaf = key.partition(".")
        owner = next((cls for cls in moved.get(section, []) if leaf in section_keys(cls)), None)
        if arg.startswith("-") or not eq and not prefix.startswith("~") or owner is None:
            renamed.append(arg)
            continue
        renamed.append(f"{prefix}{owner.group}.{leaf}{eq}{value}")
        notes.append(f"{key} is spelled {owner.group}.{leaf} now ({owner.group}={owner.name}'s keys moved under "
                     f"{owner.group}.*); the old spelling works until the next release")
    return renamed, notes
