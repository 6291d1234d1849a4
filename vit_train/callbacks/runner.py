"""The run's callbacks, called in the order the config lists them (`Callbacks`): logger=[...]'s first (their
adapters, trackers.py), then callbacks=[...]'s. Built in rank 0 only; the other processes get none (and learn a
stop from rank 0, train/trainer.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from vit_train.callbacks.base import Callback, CallbackConfig, LoggerConfig, RunInfo

log = logging.getLogger("vit_train")


class Callbacks:
    """A run's callbacks, each under its option's name; every hook calls each in turn. An error raised by one
    ends the run (a tracker's adapter catches its tracker's own)."""

    def __init__(self, callbacks: list[Callback]) -> None:
        self.callbacks = callbacks

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def on_train_start(self, info: RunInfo) -> None:
        for callback in self.callbacks:
            callback.on_train_start(info)

    def on_step_end(self, step: int) -> None:
        for callback in self.callbacks:
            callback.on_step_end(step)

    def on_metrics(self, split: str, step: int, values: dict[str, float]) -> None:
        for callback in self.callbacks:
            callback.on_metrics(split, step, values)

    def on_eval_end(self, step: int, metrics: dict[str, float]) -> None:
        for callback in self.callbacks:
            callback.on_eval_end(step, dict(metrics))

    def should_stop(self) -> str | None:
        """The first callback's reason to stop now, or None."""
        for callback in self.callbacks:
            reason = callback.should_stop()
            if reason:
                return str(reason)
        return None

    def on_checkpoint(self, step: int, path: Path, best: bool) -> None:
        for callback in self.callbacks:
            callback.on_checkpoint(step, path, best)

    def on_train_end(self, results: dict[str, Any], status: str) -> None:
        for callback in self.callbacks:
            callback.on_train_end(dict(results), status)

    def state_dict(self) -> dict[str, Any]:
        """{callback name (logger.wandb, callbacks.early_stopping): its state_dict()}: the checkpoint's "callbacks"."""
        return {callback.name: callback.state_dict() for callback in self.callbacks}

    def load_state_dict(self, saved: dict[str, Any] | None) -> None:
        """Each callback's state from a checkpoint's "callbacks"; one the checkpoint does not hold (chosen since,
        or a checkpoint written before callbacks were kept) keeps its fresh state."""
        for callback in self.callbacks:
            if saved and callback.name in saved:
                callback.load_state_dict(saved[callback.name])


def build_callbacks(cfg: Any, main: bool) -> Callbacks:
    """The callbacks of config `cfg` (its logger=[...] options' that have one, then its callbacks=[...]) in the
    rank-0 process (`main`); none in the others."""
    if not main:
        return Callbacks([])
    made: list[Callback] = []
    for name, option in [
        *((f"logger.{n}", o) for n, o in cfg.logger.items()),
        *((f"callbacks.{n}", o) for n, o in cfg.callbacks.items()),
    ]:
        assert isinstance(option, (LoggerConfig, CallbackConfig))  # the list groups' options
        callback = option.build(cfg)
        if callback is not None:
            callback.name = name
            made.append(callback)
    return Callbacks(made)
