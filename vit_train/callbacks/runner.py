"""The run's callbacks, called in the order the config lists them (`Callbacks`): logger=[...]'s first (their
adapters, trackers.py), then callbacks=[...]'s. Built in rank 0 only; the other processes get none (and learn a
stop from rank 0, train/trainer.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from vit_train.callbacks.base import Callback, CallbackConfig, LoggerConfig, RunInfo
from vit_train.errors import ConfigError

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
        """{callback name (logger.wandb, callbacks.early_stopping): its state_dict()}: the checkpoint's "callbacks".
        ConfigError (one line, naming the callback and the place) for a value a checkpoint cannot hold: it is read
        back with torch.load(weights_only=True), which takes plain data and tensors only."""
        states = {callback.name: callback.state_dict() for callback in self.callbacks}
        for name, state in states.items():
            check_plain(state, name, "state_dict()")
        return states

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


PLAIN = (str, int, float, bool, type(None))


def check_plain(value: Any, name: str, where: str) -> None:
    """ConfigError unless `value` is plain data (str, int, float, bool, None; dicts with string keys, lists and
    tuples of them) or a torch tensor: what a checkpoint read with weights_only=True holds."""
    if (
        type(value) in PLAIN or type(value).__module__ == "torch" and type(value).__name__ == "Tensor"
    ):  # exact: numpy.float64 is a float
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError(f"{name}'s {where} has the key {key!r}, not a string: a checkpoint keeps string keys")
            check_plain(item, name, f"{where}[{key!r}]")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_plain(item, name, f"{where}[{i}]")
        return
    raise ConfigError(
        f"{name}'s {where} is a {type(value).__module__}.{type(value).__qualname__}, which a checkpoint cannot hold: "
        f"return plain numbers, strings, lists and dicts (e.g. float(x)) or tensors"
    )
