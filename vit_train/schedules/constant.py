"""schedule=constant: linear warmup to the peak lr, then the peak lr to the end."""

from __future__ import annotations

from dataclasses import dataclass

from vit_train.schedules.warmup import warmup_factor
from vit_train.schema.sections import ScheduleConfig


@dataclass
class Constant(ScheduleConfig):
    name: str = "constant"

    def factor(self, step: int, warmup_steps: int, total_steps: int, lr: float) -> float:
        return warmup_factor(step, warmup_steps) if step < warmup_steps else 1.0
