"""schedule=cosine, the default: linear warmup to the peak lr, then a cosine down to schedule.min_lr at the last
step (Loshchilov and Hutter 2017, without restarts; timm's and DeiT's schedule, by optimiser step)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vit_train.schedules.warmup import warmup_factor
from vit_train.schema.sections import ScheduleConfig
from vit_train.schema.typed import require

if TYPE_CHECKING:
    from vit_train.schema.sections import RunConfig


@dataclass
class Cosine(ScheduleConfig):
    default = True

    name: str = "cosine"
    min_lr: float = 1e-5  # learning rate at the last step

    def check(self, cfg: RunConfig) -> None:
        super().check(cfg)
        require(
            0 <= self.min_lr <= cfg.lr,
            f"schedule.min_lr ({self.min_lr}) must be between 0 and optim.lr "
            f"({cfg.lr:g}{' after batch scaling' if cfg.optim.lr_base_batch else ''})",
        )

    def factor(self, step: int, warmup_steps: int, total_steps: int, lr: float) -> float:
        """Warmup rises to 1 at step warmup_steps - 1; the cosine falls from 1 to min_lr / lr at the last step,
        total_steps - 1."""
        if step < warmup_steps:
            return warmup_factor(step, warmup_steps)
        peak = max(warmup_steps - 1, 0)  # the step at which the lr peaks
        progress = min(1.0, (step - peak) / max(1, total_steps - 1 - peak))
        low = self.min_lr / lr
        return low + (1 - low) * 0.5 * (1 + math.cos(math.pi * progress))
