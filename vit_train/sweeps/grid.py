"""A sweep's grid as its command gave it (multirun.yaml, which Hydra writes before the first job): which
jobs are points of the sweep now running, so that a re-run of the same grid after a kill tells its own
interrupted jobs from another grid's (sweeps/job.py's `job_home`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def split_values(text: str) -> list[str]:
    """A swept value list `a,b,[c,d]` split at its top-level commas (not inside brackets or quotes)."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


def override_value(text: str) -> Any:
    """An override's value compared as Hydra records it (`1e-3` and `0.001` are one value, `false` and
    `False` too: the command's text against a job's overrides.yaml)."""
    text = text.strip().strip("'\"")
    if text.lower() in ("true", "false", "null"):
        return text.lower()
    try:
        return float(text)
    except ValueError:
        return text


def command_grid(sweep_dir: Path) -> dict[str, set] | None:
    """The sweep command's values per key (multirun.yaml's hydra.overrides.task, `seed=1,2,3` swept),
    or None when the sweep directory has no readable record of its command."""
    try:
        task = (yaml.safe_load((sweep_dir / "multirun.yaml").read_text()) or {})["hydra"]["overrides"]["task"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    grid: dict[str, set] = {}
    for override in task or []:
        key, _, text = str(override).partition("=")
        grid.setdefault(key, set()).update(override_value(v) for v in split_values(text))
    return grid


def in_grid(overrides: list[str], grid: dict[str, set]) -> bool:
    """Whether a job's overrides are a point of the sweep command's grid."""
    for override in overrides:
        key, _, text = override.partition("=")
        if override_value(text) not in grid.get(key, set()):
            return False
    return len(overrides) == len(grid)
