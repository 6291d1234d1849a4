"""Resuming a run that already reached its last step: the line says which setting ended it, and the
advice it gives trains on when followed (both causes forced: trainer.max_steps and trainer.epochs)."""

from __future__ import annotations

import logging

import pytest

from helpers.configs import tiny_config
from vit_train.train.trainer import train

SMALL = {"data": {"train_size": 64, "val_size": 32, "batch_size": 32}}  # 2 steps per epoch


def resumed(run_dir, caplog, **trainer):
    cfg = tiny_config(**SMALL, trainer=trainer, resume="auto")
    with caplog.at_level(logging.INFO, logger="vit_train"):
        caplog.clear()
        results = train(cfg, run_dir)
    return results, [r.getMessage() for r in caplog.records if "already reached its last step" in r.getMessage()]


@pytest.mark.parametrize("cap, first, raised, expected_steps", [
    ("max_steps", {"epochs": 3, "max_steps": 2}, {"epochs": 4, "max_steps": None}, 8),
    ("epochs", {"epochs": 1}, {"epochs": 2}, 4),
])
def test_the_finished_run_names_what_ended_it_and_the_advice_trains_on(tmp_path, caplog, cap, first, raised,
                                                                       expected_steps):
    train(tiny_config(**SMALL, trainer=first), tmp_path)
    _, lines = resumed(tmp_path, caplog, **first)
    assert len(lines) == 1
    if cap == "max_steps":
        assert "trainer.max_steps=2 ended it" in lines[0] and "trainer.max_steps=null" in lines[0]
        _, still = resumed(tmp_path, caplog, epochs=4, max_steps=2)  # raising epochs alone cannot help
        assert "trainer.max_steps=2 ended it" in still[0]
    else:
        assert "raise trainer.epochs (now 1)" in lines[0] and "max_steps" not in lines[0]
    results, lines = resumed(tmp_path, caplog, **raised)  # the advice, followed
    assert lines == [] and results["steps"] == expected_steps

