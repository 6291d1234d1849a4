"""callbacks=[early_stopping]: end the run when a validation metric stops improving (`patience` evaluations
without a change of more than `min_delta` in its direction) or reaches a `target`. The run ends after the
evaluation that decides it, with its checkpoint; results.json says `status: stopped_early` and `stop_reason`.
Its counter is kept in the checkpoint: a resumed run stops at the same step as the uninterrupted one."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Literal

from vit_train.callbacks.base import Callback, CallbackConfig, RunInfo
from vit_train.errors import ConfigError
from vit_train.schema.typed import positive, require

log = logging.getLogger("vit_train")
SPLITS = ("val", "val_ema")  # the rows an evaluation writes


@dataclass
class EarlyStoppingConfig(CallbackConfig):
    """Early stopping and stop-at-target (callbacks=[early_stopping])."""

    name = "early_stopping"

    monitor: str = ""  # the evaluation's metric, "split/name" (val/top1, val/loss, val_ema/top1); "" = the objective's (val/top1; MAE: val/loss)
    mode: Literal["auto", "max", "min"] = "auto"  # max: higher is better; min: lower; auto: the objective's direction
    patience: int | None = 3  # evaluations without improvement before the run stops; null = never (a target only)
    min_delta: float = 0.0  # an improvement is a change of more than this, in mode's direction (monitor's unit)
    target: float | None = None  # stop once the monitor reaches this value (>= for max, <= for min); null = none

    def check(self, cfg: Any) -> None:
        key = "callbacks.early_stopping"
        positive((f"{key}.patience", self.patience))
        require(self.min_delta >= 0, f"{key}.min_delta must be >= 0, got {self.min_delta}")
        require(
            self.patience is not None or self.target is not None,
            f"{key} with patience=null and target=null never stops the run: give {key}.patience=N or {key}.target=VALUE",
        )
        monitor = self.resolved_monitor(cfg.objective.metric)
        split, _, metric = monitor.partition("/")
        require(
            split in SPLITS and bool(metric),
            f"{key}.monitor must be a metric of the evaluation, val/NAME or val_ema/NAME (e.g. "
            f"val/{cfg.objective.metric}); got {self.monitor!r}",
        )
        require(
            split != "val_ema" or cfg.trainer.ema_decay is not None,
            f"{key}.monitor={monitor} needs an EMA: set trainer.ema_decay (e.g. 0.9998) or monitor val/{metric}",
        )
        require(
            self.mode != "auto" or monitor == f"val/{cfg.objective.metric}",
            f"{key}.monitor={monitor} is not the objective's metric (val/{cfg.objective.metric}), so its direction is "
            f"not known: add {key}.mode=max (higher is better) or {key}.mode=min",
        )

    def resolved_monitor(self, metric: str) -> str:
        """The monitored "split/name": `monitor`, or the objective's val/`metric` when it is ""."""
        return self.monitor or f"val/{metric}"

    def build(self, cfg: Any) -> Callback:
        objective = cfg.objective
        mode = self.mode if self.mode != "auto" else ("max" if objective.higher_is_better else "min")
        return EarlyStopping(self.resolved_monitor(objective.metric), mode, self.patience, self.min_delta, self.target)


class EarlyStopping(Callback):
    """Counts the evaluations since `monitor` last improved by more than `min_delta` in `mode`'s direction; a
    non-finite value is no improvement. `should_stop` says why the run ends: the target reached, or `patience`
    evaluations without improvement. Its state (best, the count, the last value) is what a resume restores."""

    def __init__(
        self, monitor: str, mode: str, patience: int | None, min_delta: float = 0.0, target: float | None = None
    ) -> None:
        self.monitor, self.mode, self.patience, self.min_delta, self.target = monitor, mode, patience, min_delta, target
        self.best: float | None = None
        self.best_step: int | None = None
        self.wait = 0  # evaluations since the best
        self.last: float | None = None
        self.last_step: int | None = None

    def improved(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.best is None:
            return True
        return value - self.min_delta > self.best if self.mode == "max" else value + self.min_delta < self.best

    def on_eval_end(self, step: int, metrics: dict[str, float]) -> None:
        if self.monitor not in metrics:
            raise ConfigError(
                f"callbacks.early_stopping.monitor={self.monitor} is not a metric of the evaluation (it has "
                f"{', '.join(sorted(metrics))}); give one of those"
            )
        value = float(metrics[self.monitor])
        self.last, self.last_step = value, step
        if self.improved(value):
            self.best, self.best_step, self.wait = value, step, 0
        else:
            self.wait += 1

    def reached(self) -> bool:
        if self.target is None or self.last is None or not math.isfinite(self.last):
            return False
        return self.last >= self.target if self.mode == "max" else self.last <= self.target

    def should_stop(self) -> str | None:
        if self.reached():
            return (
                f"{self.monitor} reached the target {self.target:g} ({self.last:g} at step {self.last_step}; "
                f"callbacks.early_stopping.target)"
            )
        if self.patience is not None and self.wait >= self.patience:
            best = "never finite" if self.best is None else f"best {self.best:g} at step {self.best_step}"
            by = f" by more than {self.min_delta:g}" if self.min_delta else ""
            return (
                f"{self.monitor} did not improve{by} for {self.wait} evaluations ({best}; "
                f"callbacks.early_stopping.patience={self.patience})"
            )
        return None

    def state_dict(self) -> dict[str, Any]:
        return {
            "monitor": self.monitor,
            "mode": self.mode,
            "best": self.best,
            "best_step": self.best_step,
            "wait": self.wait,
            "last": self.last,
            "last_step": self.last_step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The saved count; a checkpoint of another monitor or mode (changed on resume) starts the count afresh at
        the resumed step, said in one warning line: its best value is another metric's, or better the other way."""
        saved = (state.get("monitor"), state.get("mode"))
        if saved != (self.monitor, self.mode):
            log.warning(
                "callbacks.early_stopping counts afresh from this step: the checkpoint's count was for monitor=%s "
                "mode=%s, this run's is monitor=%s mode=%s",
                saved[0],
                saved[1],
                self.monitor,
                self.mode,
            )
            return
        self.best, self.best_step, self.wait = state.get("best"), state.get("best_step"), int(state.get("wait", 0))
        self.last, self.last_step = state.get("last"), state.get("last_step")

    def on_train_start(self, info: RunInfo) -> None:
        if info.resumed and self.best is not None:
            log.info(
                "early stopping: %s best %g at step %d, %d evaluations since",
                self.monitor,
                self.best,
                self.best_step or 0,
                self.wait,
            )
