"""Non-finite steps, counted on the device: a fused optimiser skips such an update by itself, and
the counts are settled into the TrainState before each log and checkpoint (train/step.py)."""

from __future__ import annotations

import logging

import torch

from vit_train.checkpoint import TrainState

log = logging.getLogger("vit_train")


def skips_on_device(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> bool:
    """True for a fused optimiser without fp16 loss scaling: it can skip a non-finite update by itself."""
    return bool(optimizer.defaults.get("fused")) and not scaler.is_enabled()


class SkippedSteps:
    """Non-finite steps, counted on the device and settled into the TrainState (`settle`)."""

    def __init__(self, state: TrainState, device: torch.device, on_device: bool, max_bad_steps: int):
        self.on_device, self.max_bad_steps = on_device, max_bad_steps
        self.skipped = torch.zeros((), dtype=torch.long, device=device)
        self.run = torch.full((), state.bad_in_a_row, dtype=torch.long, device=device)  # non-finite steps in a row

    def add(self, finite: torch.Tensor) -> None:
        """Count one step, finite or not, in place (the same in a compiled step: train/compiled_step.py)."""
        bad = (~finite).long()
        self.skipped.add_(bad)
        self.run.add_(1).mul_(bad)

    def settle(self, state: TrainState) -> int:
        """Move the counts into `state` (a host sync); returns the steps skipped since the last settle."""
        skipped = int(self.skipped.item())
        self.skipped.zero_()
        state.add_skipped(skipped, int(self.run.item()))
        if skipped:
            log.warning(
                "up to step %d: %d non-finite steps skipped (%d in a row now, the run stops at %d)",
                state.step,
                skipped,
                state.bad_in_a_row,
                self.max_bad_steps,
            )
        return skipped

    def reset(self, state: TrainState) -> None:
        """Counts as `state` has them, dropping what was counted since the last settle (a step abandoned midway)."""
        self.skipped.zero_()
        self.run.fill_(state.bad_in_a_row)
