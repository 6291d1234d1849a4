"""The lr a run logs is the lr each step trained with (read from the optimiser as it steps), on every schedule
(the compiled step's: train/test_compiled_step.py); a warmup longer than the run is said once at the start, with
its numbers (Lightning's and timm's users compared runs that never reached their lr)."""

from __future__ import annotations

import logging

import pytest
from torch.optim.optimizer import register_optimizer_step_pre_hook

from helpers.files import logged
from vit_train.train.trainer import train


@pytest.fixture
def stepped_lrs():
    """The largest group lr at each optimiser step of this test (torch's global step pre-hook): the head's."""
    seen: list[float] = []
    handle = register_optimizer_step_pre_hook(
        lambda optimizer, args, kwargs: seen.append(max(float(g["lr"]) for g in optimizer.param_groups)))
    yield seen
    handle.remove()


@pytest.mark.parametrize("layer_decay", [None, 0.5])
@pytest.mark.parametrize("schedule", ["cosine", "constant"])
@pytest.mark.parametrize("warmup_epochs", [3.0, 1.0, 0.5, 0.0])
def test_each_logged_lr_is_the_lr_its_step_trained_with(tmp_path, make_config, caplog, stepped_lrs, schedule,
                                                        warmup_epochs, layer_decay):
    cfg = make_config(schedule={"name": schedule, "warmup_epochs": warmup_epochs},
                      optim={"layer_decay": layer_decay}, trainer={"epochs": 2, "log_every": 1})
    with caplog.at_level(logging.WARNING, logger="vit_train"):
        results = train(cfg, tmp_path)
    steps = results["steps"]
    lrs = [row["lr"] for row in logged(tmp_path, "train")]
    assert len(lrs) == len(stepped_lrs) == steps
    assert lrs == stepped_lrs
    warnings = [r.getMessage() for r in caplog.records if "schedule.warmup_epochs" in r.getMessage()]
    asked = round(warmup_epochs * steps / 2)
    if asked > steps:
        assert warnings == [f"schedule.warmup_epochs={warmup_epochs:g} is {asked} steps, longer than the run's {steps}: "
                            f"the lr rises for the whole run and reaches its peak ({cfg.lr:g}) only at the last step, "
                            f"with no {schedule} after it; lower schedule.warmup_epochs or train longer"]
        assert lrs == pytest.approx([cfg.lr * (s + 1) / steps for s in range(steps)], rel=1e-12)
    else:
        assert warnings == []
        if asked:
            assert lrs[asked - 1] == pytest.approx(cfg.lr, rel=1e-12)  # the peak at the warmup's last step
    if schedule == "cosine" and asked < steps:
        assert lrs[-1] == pytest.approx(cfg.schedule.min_lr, rel=1e-12)  # the cosine's floor at the last step
