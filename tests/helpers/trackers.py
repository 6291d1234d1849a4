"""What the tracker tests share: a tracker's start, the rows a run logs, W&B's run files read back, and an
attempt run in a process of its own (tests/helpers/tracker_attempt.py) that ends as the test says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from vit_train.trackers import mlflow as mlflow_tracker
from vit_train.trackers import wandb as wandb_tracker
from vit_train.trackers.base import Tracker, TrackerStart
from vit_train.trackers.wandb_files import run_files

ATTEMPT = Path(__file__).with_name("tracker_attempt.py")
Row = tuple[str, int, dict[str, float]]


def make_tracker(name: str, **settings: Any) -> Tracker:
    if name == "wandb":
        return wandb_tracker.WandbTracker(wandb_tracker.Settings(**settings))
    return mlflow_tracker.MlflowTracker(mlflow_tracker.Settings(**settings))


def make_start(run_dir: Path, **over: Any) -> TrackerStart:
    fields: dict[str, Any] = dict(
        run_dir=run_dir, params={"optim.lr": 0.001, "model.depth": 2}, name="", tags=[], run_id="run-1",
        tracker_id=None, group=None, trial=None,
    )
    fields.update(over)
    return TrackerStart(**fields)


def rows(first: int, last: int) -> list[Row]:
    """A train and a val row per step, values exact in binary (k/8) so a read-back compares with ==."""
    out: list[Row] = []
    for step in range(first, last + 1):
        out.append(("train", step, {"loss": step / 8, "lr": 1 / 1024}))
        out.append(("val", step, {"top1": (step % 64) / 8}))
    return out


def leet(path: Path) -> list[dict[str, Any]]:
    """The records of one W&B run file as W&B's own reader prints them (`wandb leet inspect --json`, wandb's Go
    core: independent of vit-train's reader, vit_train/trackers/wandb_files.py)."""
    done = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)],
                          capture_output=True, text=True, timeout=120, check=True)
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def wandb_records(folder: Path, tracker_id: str, kind: str | None = None) -> list[dict[str, Any]]:
    """The W&B run's records (of one kind: "run", "history", "summary", "exit", ...), every attempt's file in order."""
    return [r for path in run_files(folder, tracker_id) for r in leet(path) if kind is None or r["type"] == kind]


def wandb_rows(folder: Path, tracker_id: str) -> list[Row]:
    """Every row the W&B run's files hold, file by file, as (split, step, values); a history record holding
    two splits at one step is two rows."""
    out: list[Row] = []
    for record in wandb_records(folder, tracker_id, "history"):
        items, step = record["history"]["item"], record["history"]["step"]["num"]
        for split in sorted({key.split("/", 1)[0] for key in items if "/" in key}, key=["train", "val"].index):
            out.append((split, step, {k.split("/", 1)[1]: v for k, v in items.items() if k.startswith(split + "/")}))
    return out


def wandb_items(folder: Path, tracker_id: str, kind: str) -> dict[str, Any]:
    """The W&B run's `config` or `summary` as its files hold it (later updates over earlier ones; the run record
    carries the first)."""
    out: dict[str, Any] = {}
    for record in wandb_records(folder, tracker_id):
        part = record.get(kind) if record["type"] == kind else record["run"].get(kind) if record["type"] == "run" else None
        out.update((part or {}).get("update", {}))
    return out


def attempt(spec: dict[str, Any], timeout: float = 120) -> tuple[int, dict[str, Any]]:
    """Run one tracker attempt in its own process (tracker_attempt.py); its exit status and the JSON it printed
    last ({} when it printed none, e.g. killed before)."""
    done = subprocess.run(
        [sys.executable, str(ATTEMPT), json.dumps(spec)], capture_output=True, text=True, timeout=timeout
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return done.returncode, (json.loads(lines[-1]) if lines else {"stderr": done.stderr[-3000:]})
