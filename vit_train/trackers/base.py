"""What a tracker is: the `Tracker` protocol the `logger=[...]` options implement, what it is started with
(`TrackerStart`), and the flat params every tracker receives (`flatten`)."""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from vit_train.errors import ConfigError

Scalar = str | int | float | bool | None

# A run's end (results.json's `status`) -> whether the tracker run ended well.
STATUSES = ("completed", "stopped_early", "interrupted", "failed", "diverged")


class RowRefused(ValueError):
    """A row the tracker cannot take (W&B: a step below one it holds), said by the caller once; the tracker goes on."""


@dataclass
class TrackerStart:
    """Everything a tracker run is opened with."""

    run_dir: Path  # the run's directory (W&B's offline files / MLflow's default store go under it unless the settings say otherwise)
    params: dict[str, Any]  # the composed config flattened: {"optim.lr": 0.001, "model.depth": 12, ...} (`flatten`)
    name: str  # cfg.name ("" if none): the tracker run's display name ("" -> the run dir's name)
    tags: list[str]  # cfg.tags
    run_id: str  # vit-train's own run id (TrainState.run_id), kept across resumes
    tracker_id: (
        str | None
    )  # the id this tracker returned for this run before (kept in the checkpoint): resume continues it
    group: str | None  # a sweep's group (the sweep dir's name) or None for a single run
    trial: int | None  # an Optuna trial number / sweep job number, or None

    @property
    def display_name(self) -> str:
        return self.name or self.run_dir.name


class Tracker(Protocol):
    """One tracker run per vit-train run, continued across resumes. Every method may raise any `Exception`
    when the tracker's store fails (full, unwritable, unreachable); the caller warns once and drops the tracker."""

    name: str  # "wandb", "mlflow"

    def start(self, start: TrackerStart) -> str:
        """Open (or continue: `start.tracker_id`) the tracker run; return its id, to keep in the checkpoint.
        Raises ConfigError (one line naming the extra) when the tracker's library is not installed."""
        ...

    def held(self) -> set[tuple[str, int]]:
        """The (split, step) rows this tracker run already holds, read back from its own store."""
        ...

    def log(self, split: str, step: int, values: dict[str, float]) -> None:
        """One metrics.jsonl row: `values` {name: value} logged as "split/name" at `step` (the optimiser step)."""
        ...

    def summary(self, results: dict[str, Any]) -> None:
        """results.json's contents at the end: its scalar fields (nested ones as dotted keys)."""
        ...

    def close(self, status: str) -> None:
        """End the tracker run: `status` is results.json's (`STATUSES`)."""
        ...


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Scalar]:
    """A nested config (mappings; a dataclass inside is read as its fields) as one level of dotted keys: {"optim": {"lr": 1e-3}} ->
    {"optim.lr": 1e-3}. Scalars (str, int, float, bool, None) stay as they are; a list or tuple becomes its JSON
    text ("[0.5, 0.5, 0.5]": trackers take scalars only); an empty mapping is kept as "{}" so no key is lost.
    A Path or another value becomes its str."""
    flat: dict[str, Scalar] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = dataclasses.asdict(value)
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}.") if value else {name: "{}"})
        elif isinstance(value, (list, tuple)):
            flat[name] = json.dumps(list(value), default=str)
        elif value is None or isinstance(value, (str, int, float, bool)):
            flat[name] = value
        else:
            flat[name] = str(value)
    return flat


def scalars(results: Mapping[str, Any]) -> dict[str, str | int | float | bool]:
    """results.json's scalar fields for a tracker's summary: nested mappings as dotted keys; lists and nulls left out
    (they are in results.json)."""
    out: dict[str, str | int | float | bool] = {}
    for key, value in results.items():
        if isinstance(value, Mapping):
            out.update({f"{key}.{k}": v for k, v in scalars(value).items()})
        elif isinstance(value, (str, int, float, bool)):
            out[key] = value
    return out


def import_library(module: str, extra: str, tracker: str) -> ModuleType:
    """`module` imported, or ConfigError naming the extra: "logger=wandb needs wandb: pip install 'vit-train[wandb]'"."""
    try:
        return importlib.import_module(module)
    except ImportError as missing:
        raise ConfigError(
            f"logger={tracker} needs {missing.name or module}: pip install 'vit-train[{extra}]'"
        ) from None


def reason(error: BaseException) -> str:
    """One line saying why a tracker call failed, for the warning that drops the tracker: the innermost cause's
    type and first line (MLflow wraps a full disk as a many-line MlflowException around SQLAlchemy's error around
    sqlite3's "disk I/O error")."""
    seen = {id(error)}
    while (inner := error.__cause__ or error.__context__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        error = inner
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
