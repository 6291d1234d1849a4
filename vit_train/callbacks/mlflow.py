"""logger=[...,mlflow]: the run's numbers, config, name, tags and results in MLflow (vit_train/trackers/mlflow.py, through the
tracker adapter, callbacks/trackers.py); its keys, logger.mlflow.*, are the tracker's Settings (docs/logging.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vit_train.callbacks.base import Callback, LoggerConfig
from vit_train.trackers import mlflow as tracker


@dataclass
class MlflowLogger(LoggerConfig, tracker.Settings):
    """MLflow as one of the run's loggers; the library is imported when the run starts (its extra: vit-train[mlflow])."""

    name = "mlflow"

    def build(self, cfg: Any) -> Callback:
        from vit_train.callbacks.trackers import TrackerCallback

        return TrackerCallback(tracker.MlflowTracker(self))
