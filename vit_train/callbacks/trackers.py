"""The adapter that runs a tracker (W&B, MLflow: an object of the `Tracker` protocol) as one of a run's callbacks
(`TrackerCallback`), for the logger=[...] options: it starts (or continues) the tracker's run with the composed
config flattened, the run's name and tags, a sweep's group and the job's number; hands it every metrics.jsonl row
once; and ends it with results.json's summary and the run's status.

Exactly once across resumes: the tracker's own run id is kept in the checkpoint (this callback's state), `start`
is given it again, and the rows the tracker already holds (its `held()`, read back from its own store) are not
sent again. A tracker that fails (its library missing, its store full or unreachable) is said in one warning line
naming it and the reason, then dropped for the rest of the run: training goes on, metrics.jsonl stays the record.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from vit_train.callbacks.base import Callback, RunInfo

log = logging.getLogger("vit_train")


# The protocol the tracker modules follow (vit_train/trackers/base.py holds the same definitions).
@dataclass
class TrackerStart:
    run_dir: Path  # the run's directory
    params: dict[str, Any]  # the composed config flattened: {"optim.lr": 0.001, "model.depth": 12, ...}
    name: str  # cfg.name ("" if none)
    tags: list[str]  # cfg.tags
    run_id: str  # vit-train's own run id, kept across resumes
    tracker_id: str | None  # the id this tracker returned for this run before (kept in the checkpoint)
    group: str | None  # a sweep's group (the sweep dir's name) or None for a single run
    trial: int | None  # a sweep job's number, or None


class Tracker(Protocol):
    name: str

    def start(self, start: TrackerStart) -> str: ...

    def held(self) -> set[tuple[str, int]]: ...

    def log(self, split: str, step: int, values: dict[str, float]) -> None: ...

    def summary(self, results: dict[str, Any]) -> None: ...

    def close(self, status: str) -> None: ...


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"optim.lr": 0.001, "logger.wandb.project": "vit", ...}: every key of a plain config by its dotted name; a
    list stays a list, an empty section is left out."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class TrackerCallback(Callback):
    """Runs `tracker` as a callback, guarding every call (`_guarded`): the first error is one warning line, then
    the tracker is dropped. Its state (the checkpoint's) is the tracker's run id."""

    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker
        self.tracker_id: str | None = None
        self.held: set[tuple[str, int]] = set()
        self.dropped = False

    def _guarded(self, what: str, call: Any, *args: Any) -> Any:
        if self.dropped:
            return None
        try:
            return call(*args)
        except Exception as e:  # noqa: BLE001 - a tracker's failure never stops the run
            self.dropped = True
            reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
            log.warning(
                "logger=%s stopped working (%s: %s%s): it gets nothing more from this run; metrics.jsonl and "
                "results.json hold every number",
                getattr(self.tracker, "name", type(self.tracker).__name__),
                what,
                type(e).__name__,
                f": {reason}" if reason else "",
            )
            return None

    def on_train_start(self, info: RunInfo) -> None:
        start = TrackerStart(
            run_dir=info.run_dir,
            params=flatten(info.config),
            name=info.name,
            tags=list(info.tags),
            run_id=info.run_id,
            tracker_id=self.tracker_id,
            group=info.group,
            trial=info.trial,
        )
        found = self._guarded("start", self.tracker.start, start)
        if found is not None:
            self.tracker_id = str(found)
            self.held = set(self._guarded("held", self.tracker.held) or set())

    def on_metrics(self, split: str, step: int, values: dict[str, float]) -> None:
        if (split, step) in self.held:  # sent by an earlier attempt that got past the checkpoint resumed
            return
        self._guarded("log", self.tracker.log, split, step, values)

    def on_train_end(self, results: dict[str, Any], status: str) -> None:
        self._guarded("summary", self.tracker.summary, results)
        self._guarded("close", self.tracker.close, status)

    def state_dict(self) -> dict[str, Any]:
        return {"tracker_id": self.tracker_id}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tracker_id = state.get("tracker_id")
