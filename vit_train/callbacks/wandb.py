"""logger=[...,wandb]: the run's numbers, config, name, tags and results in W&B (vit_train/trackers/wandb.py, through the
tracker adapter, callbacks/trackers.py); its keys, logger.wandb.*, are the tracker's Settings (docs/logging.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vit_train.callbacks.base import Callback, LoggerConfig
from vit_train.trackers import wandb as tracker


@dataclass
class WandbLogger(LoggerConfig, tracker.Settings):
    """W&B as one of the run's loggers; the library is imported when the run starts (its extra: vit-train[wandb])."""

    name = "wandb"

    def build(self, cfg: Any) -> Callback:
        from vit_train.callbacks.trackers import TrackerCallback

        return TrackerCallback(tracker.WandbTracker(self))
