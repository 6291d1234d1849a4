"""logger=[tensorboard] (the default): the run's numbers, its config and trainer.viz_every's figures in
TensorBoard event files under tb/, written by the run itself (outputs/metrics.py RunLogger). logger=[] (or a
list without it) writes no tb/ folder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vit_train.callbacks.base import Callback, LoggerConfig


@dataclass
class TensorBoardConfig(LoggerConfig):
    """TensorBoard event files in the run's tb/ folder (no keys)."""

    name = "tensorboard"

    def build(self, cfg: Any) -> Callback | None:
        return None  # RunLogger writes the events (outputs/metrics.py)
