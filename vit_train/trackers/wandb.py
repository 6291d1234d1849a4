"""`logger=wandb`: the run in Weights & Biases, offline by default (compute nodes have no network; `wandb sync`
uploads the files later), its files in the run's directory, one W&B run per vit-train run across resumes."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from vit_train.trackers.base import RowRefused, TrackerStart, import_library, scalars
from vit_train.trackers.wandb_files import history, run_files

DONE_WELL = ("completed", "stopped_early")  # exit code 0 (W&B: finished); any other status: 1 (W&B: failed)
TAG_LENGTH = 64  # W&B refuses a run whose tags are longer (or empty): cut, the whole list stays in the config


@dataclass
class Settings:
    """The keys of `logger.wandb.*`."""

    project: str | None = None  # the W&B project; None: WANDB_PROJECT from the environment, else "vit-train"
    entity: str | None = None  # the W&B team or user; None: wandb's (WANDB_ENTITY, else the login's default)
    mode: Literal["offline", "online", "disabled"] | None = None  # None: WANDB_MODE from the environment, else offline
    dir: str | None = None  # the folder W&B writes its wandb/ folder in; None: the run's directory
    # W&B's group (its `group`; the key `group` names an option's config group here); None: a sweep's (its folder's
    # name) for a sweep's job, none for a single run
    run_group: str | None = None
    job_type: str = "train"  # W&B's job type


class WandbTracker:
    """A W&B run through wandb's public API (`wandb.init`, `Run.log`, `Run.summary`, `Run.finish`).

    Steps: every row is logged with `step=` the optimiser step, which W&B needs non-decreasing within a run: a
    row below the run's current step is refused here (W&B would drop it with a warning only). A resumed attempt
    starts a new offline file for the same run id (`wandb/offline-run-<time>-<id>/`); `held()` reads what every
    earlier file for the id holds, the caller skips those rows, so each step is in exactly one file and
    `wandb sync` of the folders, oldest first, gives the run each step once.

    Writes: wandb's core process (a child process, one per Python process) writes a file block (32 KiB) when it
    is full and when it shuts down; it reports no write error to `log()` (a full disk drops the rows silently), so
    `close` shuts it down (`wandb.teardown()`), reads the files back and raises OSError when they hold fewer rows
    than this attempt sent. A core process that died makes `log()` raise ConnectionError.
    """

    name = "wandb"

    def __init__(self, settings: Settings | None = None):
        self.settings = settings or Settings()
        self.run: Any = None
        self.folder: Path | None = None  # the wandb/ folder
        self.floor = 0  # the lowest step W&B still takes: the highest held or logged
        self.sent: list[tuple[str, int]] = []  # this attempt's rows, to check at close that the files hold them

    @property
    def mode(self) -> str:
        return self.settings.mode or os.environ.get("WANDB_MODE") or "offline"

    def start(self, start: TrackerStart) -> str:
        wandb = import_library("wandb", "wandb", self.name)
        parent = Path(self.settings.dir) if self.settings.dir else start.run_dir
        parent.mkdir(parents=True, exist_ok=True)
        group = self.settings.run_group or start.group
        config: dict[str, Any] = dict(start.params)
        config.setdefault("name", start.name)
        config.setdefault("tags", list(start.tags))
        config.update(
            {
                "vit_train.run_id": start.run_id,
                "vit_train.group": group,
                "vit_train.trial": start.trial,
                "vit_train.job_type": self.settings.job_type,
            }
        )
        self.run = wandb.init(
            project=self.settings.project or os.environ.get("WANDB_PROJECT") or "vit-train",
            entity=self.settings.entity,
            name=start.display_name,
            tags=[tag[:TAG_LENGTH] for tag in start.tags if tag],
            group=group,
            job_type=self.settings.job_type,
            config=config,
            dir=str(parent),
            mode=self.mode,
            id=start.tracker_id,
            resume="allow" if start.tracker_id else None,
            reinit="create_new",  # a sweep's jobs in one process: each its own run, none finishing another's
            settings=wandb.Settings(console="off"),  # train.log keeps the console; W&B's copy wrapped sys.stdout
        )
        self.folder = parent / "wandb"
        held = self.held()
        self.floor = max((step for _, step in held), default=0)
        self.sent = []
        return str(self.run.id)

    def held(self) -> set[tuple[str, int]]:
        assert self.run is not None and self.folder is not None, "start() first"
        rows = set()
        for path in run_files(self.folder, self.run.id):
            for step, row in history(path):
                rows |= {(key.split("/", 1)[0], step) for key in row if "/" in key}
        return rows

    def log(self, split: str, step: int, values: dict[str, float]) -> None:
        floor = max(self.floor, self.run.step)
        if step < floor:
            raise RowRefused(f"W&B takes steps in order: {split} row at step {step} after step {floor}")
        self.run.log({f"{split}/{k}": float(v) for k, v in values.items() if v is not None}, step=step)
        self.floor = step
        self.sent.append((split, step))

    def summary(self, results: dict[str, Any]) -> None:
        self.run.summary.update(scalars(results))

    def close(self, status: str) -> None:
        import wandb

        run, self.run = self.run, None
        run.finish(exit_code=0 if status in DONE_WELL else 1)
        # `finish` returns before the core process has written the file's last block (measured: 3 of 8 times the
        # file lacked the last rows); shutting the core down waits for it. A later run starts a new core.
        wandb.teardown()
        if self.mode == "disabled" or not self.sent:
            return
        self.run = run  # held() reads the files of this run id
        try:
            missing = set(self.sent) - self.held()
        finally:
            self.run = None
        if missing:
            split, step = min(missing, key=lambda row: (row[1], row[0]))
            raise OSError(
                f"W&B's files under {self.folder} hold {len(self.sent) - len(missing)} of the {len(self.sent)} rows "
                f"this attempt sent (the first missing: {split} at step {step}): its folder could not be written"
            )
