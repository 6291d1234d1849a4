"""The callback API: what a callback sees of a run and when (`Callback`'s hooks), and (from the schema, named here
too) the option bases of the two list groups that choose them, `callbacks=[...]` (`CallbackConfig`) and
`logger=[...]` (`LoggerConfig`).

A run's callbacks run in its rank-0 process only (where its files are written); rank 0's `should_stop` decision
is sent to every process at each evaluation, so all of them stop at the same step. The order of the hooks in one
run (docs/extending.md, "A callback of your own"):

    on_train_start(info)                    once an attempt, after the run is built (and restored)
    on_step_end(step)                       after each optimiser step
    on_metrics(split, step, values)         each row metrics.jsonl gets, when it gets it (once per attempt)
    on_eval_end(step, metrics)              after each evaluation, before its checkpoint
    should_stop() -> reason or None         right after on_eval_end: a reason ends the run there
    on_checkpoint(step, path, best)         after last.pt (and best.pt) is written
    on_train_end(results, status)           once an attempt, after results.json is written

`state_dict()` is saved in every checkpoint under the callback's name (the option's name) and handed back to
`load_state_dict` when the run resumes, so that a resumed run decides as the uninterrupted one; a checkpoint
without it (written before the callback was chosen) leaves the callback's fresh state. A callback that raises
fails the run, as any error in the loop does (results.json `failed`, its `error` the reason); a tracker's
errors are caught by its adapter (trackers.py): one warning line, then the tracker is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vit_train.schema.sections import CallbackConfig, LoggerConfig  # the options' bases, in the schema layer


@dataclass(frozen=True)
class RunInfo:
    """What a callback is told of the run when it starts (each attempt: a resumed run starts again)."""

    run_dir: Path  # the run's directory (train.log, metrics.jsonl, checkpoints/)
    config: dict[str, Any]  # the run's config as plain data (Config.to_dict())
    name: str  # the config's `name` ("" if none)
    tags: list[str]  # the config's `tags`
    run_id: str  # vit-train's run id, kept across resumes (results.json's run_id)
    step: int  # the step this attempt starts at: 0, or the resumed checkpoint's
    total_steps: int  # the step the run ends at if nothing stops it earlier
    resumed: bool  # this attempt continues a checkpoint
    group: str | None = None  # a sweep job's sweep (its directory's name); None for a single run
    trial: int | None = None  # a sweep job's number (Hydra's job number, an Optuna trial's); None for a single run
    objective_metric: str = ""  # the evaluation's key the objective is scored by ("top1", MAE's "loss")
    higher_is_better: bool = True  # that metric's direction


class Callback:
    """A callback: override the hooks you need (each does nothing by default). Every hook runs in rank 0 only.
    `name` is the option's name, under which the checkpoint keeps `state_dict()`."""

    name: str = ""

    def on_train_start(self, info: RunInfo) -> None:
        """The run (or a resumed attempt of it) starts at `info.step`."""

    def on_step_end(self, step: int) -> None:
        """Optimiser step `step` (counted from 1; skipped steps count) is done."""

    def on_metrics(self, split: str, step: int, values: dict[str, float]) -> None:
        """One row of metrics.jsonl: `split` ("train", "val", "val_ema", "compile"), the step, {name: value}
        (a non-finite value as it is: metrics.jsonl writes it as null). Each (split, step) once per attempt; a
        resumed attempt writes again the rows after its checkpoint's step that a stopped attempt had written."""

    def on_eval_end(self, step: int, metrics: dict[str, float]) -> None:
        """The evaluation of step `step`: {"val/top1": %, "val/loss": ..., "val_ema/top1": ... with an EMA}: the
        keys of its val (and val_ema) rows, as "split/name"."""

    def should_stop(self) -> str | None:
        """A sentence saying why the run should end now (results.json's `stop_reason`), or None to go on. Asked
        after each evaluation and when a run resumes (a run that had stopped stays stopped)."""
        return None

    def on_checkpoint(self, step: int, path: Path, best: bool) -> None:
        """`path` (checkpoints/last.pt) now holds step `step`; `best`: best.pt was written too."""

    def on_train_end(self, results: dict[str, Any], status: str) -> None:
        """results.json's contents, and its `status`: completed, stopped_early, interrupted, diverged, failed."""

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to decide as this one would (plain data: numbers, strings, lists, dicts)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """`state_dict()`'s value from the checkpoint the run resumes."""


__all__ = ["Callback", "CallbackConfig", "LoggerConfig", "RunInfo"]
