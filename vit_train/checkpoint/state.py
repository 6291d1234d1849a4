"""The smallest state a run needs to continue exactly: the loop's position (`TrainState`, whose methods are its
one writer) and every RNG's state. The rest a checkpoint holds (weights, optimiser, EMA, schedule, scaler,
config, identity) is the run's own objects' state (contents.py).
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from vit_train.checkpoint.scores import better, winner
from vit_train.errors import CheckpointError


@dataclass
class TrainState:
    epoch: int = 0  # epochs completed
    step: int = 0  # optimiser steps completed (skipped ones included)
    batch_in_epoch: int = 0  # batches of the current epoch already trained on
    sample_in_epoch: int = 0  # positions of the epoch's permutation already trained on (images, all processes)
    epoch_end: int = 0  # the position where the current epoch ends (data/sampler.py); 0 before it begins
    train_images: int = 0  # the size of the training set the current epoch permutes; 0 before the first
    best_score: float | None = None  # the objective's best val score so far (best.pt's); None before the first eval
    best_metric: str = ""  # what best_score is: the objective's METRIC, "top1" (%, higher is better) or "loss" (lower)
    best_step: int = 0
    best_source: str = "model"  # which weights scored best_score: "model" or "ema"
    best_partial: bool = False  # best_score came from a partial validation (trainer.limit_val_batches)
    last_eval: dict | None = None  # the latest evaluation: {"step", "metric": "top1"|"loss", "model", "ema"}
    skipped_steps: int = 0  # steps whose update was skipped for a non-finite loss or gradient norm
    bad_in_a_row: int = 0
    images_seen: int = 0  # training images processed, and the seconds they took: for images/s
    train_seconds: float = 0.0
    wall_seconds: float = 0.0  # wall time of every attempt of the run, up to this checkpoint
    run_id: str = ""  # made when the run starts fresh, kept across resumes (identity.py); "" = not yet

    def begin_epoch(self, sampler) -> None:
        """Set `sampler` (data/sampler.py) to the current epoch from the run's position in it; the epoch's end and
        the training set's size are kept (a resume in the middle of the epoch continues the same permutation)."""
        sampler.set_epoch(self.epoch, start=self.sample_in_epoch, end=self.epoch_end)
        self.epoch_end, self.train_images = sampler.end, sampler.size

    def advance(self, sampler) -> bool:
        """One optimiser step taken over the epoch's next global batch (the one place steps are counted); True
        when it ended the epoch (`end_epoch`). The position is kept in images, so a run resumed with another
        data.batch_size continues from the same image."""
        self.step += 1
        self.batch_in_epoch += 1
        self.sample_in_epoch = sampler.advance(self.sample_in_epoch)
        if self.sample_in_epoch == self.epoch_end:
            self.end_epoch()
            return True
        return False

    def end_epoch(self) -> None:
        self.epoch, self.batch_in_epoch, self.sample_in_epoch, self.epoch_end = self.epoch + 1, 0, 0, 0

    def add_skipped(self, skipped: int, in_a_row: int) -> None:
        """Non-finite steps settled from the device (train/skips.py): `skipped` more, `in_a_row` now."""
        self.skipped_steps, self.bad_in_a_row = self.skipped_steps + skipped, in_a_row

    def set_wall_seconds(self, seconds: float) -> None:
        """The wall time of every attempt of the run up to now (checkpoints keep it for the next attempt)."""
        self.wall_seconds = seconds

    def add_trained(self, images: int, seconds: float) -> None:
        """Training images processed and the seconds they took, for the run's images/s."""
        self.images_seen, self.train_seconds = self.images_seen + images, self.train_seconds + seconds

    def record_eval(self, metric: str, scores: dict[str, float], partial: bool = False) -> str:
        """One evaluation's `scores` {"model": ..., "ema"?: ...} for `metric`: the better of the two (the
        model wins a tie) becomes the best score when it beats it. A `partial` validation (a share of the
        val set, trainer.limit_val_batches) is compared only with partial ones: a full validation's score
        replaces a partial best, a partial one never replaces a full best. Returns which weights won."""
        source = winner(metric, scores)
        self.last_eval = {
            "step": self.step,
            "metric": metric,
            **scores,  # weights=auto (vit-eval/predict/export)
            **({"partial": True} if partial else {}),
        }
        current = self.best_score if self.best_metric == metric else None
        if current is not None and partial != self.best_partial:
            new = not partial and math.isfinite(scores[source])  # the full validation's score wins, whatever it is
        else:
            new = better(metric, scores[source], current)
        if new:
            self.best_score, self.best_metric, self.best_partial = scores[source], metric, partial
            self.best_step, self.best_source = self.step, source
        return source

    def best_of(self, metric: str) -> float | None:
        """The best score if it is `metric`'s, else None (results.json's best_top1 and best_loss)."""
        return self.best_score if self.best_metric == metric else None

    def checkpoint_fields(self) -> dict[str, Any]:
        """The state as a checkpoint keeps it: every field, under its own name."""
        return asdict(self)

    @classmethod
    def from_checkpoint(cls, ckpt: dict[str, Any]) -> TrainState:
        """The state a checkpoint (read by files.py `load_checkpoint`: its older fields upgraded) holds; a field the
        checkpoint lacks (written before it was kept) takes its default."""
        return cls(**{k: ckpt[k] for k in cls.__dataclass_fields__ if k in ckpt})

    @property
    def epochs_done(self) -> float:
        """Epochs trained, with the current one's fraction: 1.38 = one epoch and 38% of the next."""
        return self.epoch + (self.sample_in_epoch / self.epoch_end if self.epoch_end else 0.0)


def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng(state: dict[str, Any]) -> None:
    """Restore every RNG; a failure is an error, since the run would silently diverge."""
    try:
        random.setstate(state["python"])
        name, keys, *rest = state["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
        torch.set_rng_state(state["torch"])
        if state["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(
            f"the checkpoint's RNG states cannot be restored ({e}); the resumed run would not match the original"
        ) from None
