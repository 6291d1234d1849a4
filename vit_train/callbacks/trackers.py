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

import json
import logging
from pathlib import Path
from typing import Any

from vit_train.callbacks.base import Callback, RunInfo
from vit_train.errors import UserError
from vit_train.trackers.base import RowRefused, Tracker, TrackerStart, flatten, reason

log = logging.getLogger("vit_train")


class TrackerCallback(Callback):
    """Runs `tracker` as a callback, guarding every call (`_guarded`): the first error is one warning line, then
    the tracker is dropped. Its state (the checkpoint's) is the tracker's run id."""

    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker
        self.tracker_id: str | None = None
        self.held: set[tuple[str, int]] = set()
        self.dropped = False
        self.refused = 0  # rows the tracker refused (RowRefused)

    def _guarded(self, what: str, call: Any, *args: Any) -> Any:
        if self.dropped:
            return None
        try:
            return call(*args)
        except RowRefused as e:  # one row it cannot take (W&B: a step below one it holds): said once, it goes on
            if not self.refused:
                log.warning(
                    "logger=%s left out a row (%s) and leaves out any other it cannot take; metrics.jsonl holds "
                    "them all",
                    getattr(self.tracker, "name", type(self.tracker).__name__),
                    e,
                )
            self.refused += 1
            return None
        except Exception as e:  # noqa: BLE001 - a tracker's failure never stops the run
            self.dropped = True
            name = getattr(self.tracker, "name", type(self.tracker).__name__)
            if what == "start" and isinstance(e, UserError):  # its library missing: the line names the extra
                log.warning(
                    "logger=%s is left out of this run: %s; metrics.jsonl and results.json hold every number", name, e
                )
                return None
            log.warning(
                "logger=%s stopped working (%s: %s): it gets nothing more from this run; metrics.jsonl and "
                "results.json hold every number",
                name,
                what,
                reason(e),
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
            self.replay(info.run_dir / "metrics.jsonl")

    def replay(self, rows: Path) -> None:
        """Send the rows metrics.jsonl holds (a resumed run's: up to its checkpoint's step, RunLogger has cut the
        rest) that the tracker does not, in order: what a killed attempt sent but the tracker's store lost (W&B's
        core writes whole blocks; a kill -9 loses the last), or never sent. They count as held from here."""
        if not rows.is_file():
            return
        for line in rows.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
                split, step = row.pop("split"), row.pop("step")
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
            if (split, step) not in self.held:
                values = {k: float("nan") if v is None else v for k, v in row.items()}
                self._guarded("log", self.tracker.log, split, step, values)
                self.held.add((split, step))

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
