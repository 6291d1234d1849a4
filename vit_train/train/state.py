"""What a run carries across a restart: the loop's position (`TrainState`, whose methods are its one
writer), the EMA, every RNG's state, the objective's state and the checkpoint's contents
(train/resume.py: finding the checkpoint and which config changes a resumed run may make).

outputs/checkpoint.py only writes, reads and finds the files.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import InitVar, asdict, dataclass, field
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from vit_train.config import Config
from vit_train.errors import CheckpointError
from vit_train.models.architecture import identity
from vit_train.objectives.base import Loss
from vit_train.objectives.score import better, checkpoint_best, winner
from vit_train.outputs.checkpoint import versions
from vit_train.outputs.weights import saved_ema, strip_wrappers
from vit_train.runtime import distributed
from vit_train.train.optimizer_state import load_optimizer_state

log = logging.getLogger("vit_train")


@dataclass
class TrainState:
    epoch: int = 0  # epochs completed
    step: int = 0  # optimiser steps completed (skipped ones included)
    batch_in_epoch: int = 0  # batches of the current epoch already trained on
    sample_in_epoch: int = 0  # positions of the epoch's permutation already trained on (images, all processes)
    epoch_end: int = 0  # the position where the current epoch ends (data/sampler.py); 0 before it begins
    train_images: int = 0  # the size of the training set the current epoch permutes; 0 before the first
    best_score: Optional[float] = None  # the objective's best val score so far (best.pt's); None before the first eval
    best_metric: str = ""  # what best_score is: the objective's METRIC, "top1" (%, higher is better) or "loss" (lower)
    best_step: int = 0
    best_source: str = "model"  # which weights scored best_score: "model" or "ema"
    best_partial: bool = False  # best_score came from a partial validation (trainer.limit_val_batches)
    last_eval: Optional[dict] = None  # the latest evaluation: {"step", "metric": "top1"|"loss", "model", "ema"}
    skipped_steps: int = 0  # steps whose update was skipped for a non-finite loss or gradient norm
    bad_in_a_row: int = 0
    images_seen: int = 0  # training images processed, and the seconds they took: for images/s
    train_seconds: float = 0.0
    wall_seconds: float = 0.0  # wall time of every attempt of the run, up to this checkpoint
    run_id: str = ""  # made when the run starts fresh, kept across resumes (outputs/identity.py); "" = not yet
    # a stream's data set (webdataset): what the epoch's plan was made for (its `stream_layout`); else None
    stream_layout: Optional[dict] = None
    # the latest evaluation's metrics in this attempt (results.json's final_*); not kept in checkpoints
    metrics: dict = field(default_factory=dict, repr=False)
    # checkpoints written before best_score kept these two: read into best_score (__post_init__)
    best_top1: InitVar[Optional[float]] = None
    best_loss: InitVar[Optional[float]] = None

    def __post_init__(self, best_top1: float | None, best_loss: float | None) -> None:
        if self.best_score is None:
            legacy = checkpoint_best({"best_top1": best_top1, "best_loss": best_loss})
            if legacy is not None:
                self.best_metric, self.best_score = legacy

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

    def position_from_batches(self, batch_size: int, train_images: int) -> None:
        """A checkpoint written before positions were counted in images: its position from its batch size."""
        if self.batch_in_epoch and not self.sample_in_epoch:
            self.sample_in_epoch, self.epoch_end = self.batch_in_epoch * batch_size, train_images // batch_size * batch_size

    def record_eval(self, metric: str, scores: dict[str, float], partial: bool = False,
                    metrics: dict | None = None) -> str:
        """One evaluation's `scores` {"model": ..., "ema"?: ...} for `metric`: the better of the two (the
        model wins a tie) becomes the best score when it beats it. A `partial` validation (a share of the
        val set, trainer.limit_val_batches) is compared only with partial ones: a full validation's score
        replaces a partial best, a partial one never replaces a full best. `metrics`: the evaluation's
        whole metrics, kept as this attempt's latest (`metrics`). Returns which weights won."""
        source = winner(metric, scores)
        if metrics is not None:
            self.metrics = dict(metrics)
        self.last_eval = {"step": self.step, "metric": metric, **scores,  # weights=auto (vit-eval/predict/export)
                          **({"partial": True} if partial else {})}
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
        """The state as a checkpoint keeps it: every field but this attempt's `metrics`."""
        fields = asdict(self)
        del fields["metrics"]
        return fields

    @property
    def epochs_done(self) -> float:
        """Epochs trained, with the current one's fraction: 1.38 = one epoch and 38% of the next."""
        return self.epoch + (self.sample_in_epoch / self.epoch_end if self.epoch_end else 0.0)


def build_ema(model: nn.Module, decay: float | None, ckpt: dict | None) -> AveragedModel | None:
    """An EMA of the weights (and buffers), restored from the checkpoint when it has one."""
    if decay is None:
        return None
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)
    if ckpt and ckpt.get("ema"):
        ema.load_state_dict(saved_ema(ckpt["ema"]))
    elif ckpt:
        log.warning("the checkpoint has no EMA weights; the EMA starts from the current weights")
    return ema


def checkpoint_state(model: nn.Module, optimizer, scheduler, scaler, ema: AveragedModel | None, state: TrainState,
                     cfg: Config, overrides: Sequence[str], class_names: list[str],
                     loss: Loss | None = None, gathered: tuple | None = None) -> dict[str, Any]:
    """Everything a resumed run needs, as plain tensors and primitives (see docs/resuming.md, 'What is in a checkpoint');
    the objective's `loss`'s own state (MAE's mask counter, the distillation teacher's identity) under "objective".
    `gathered`: a sharded run's (model, optimiser, EMA) state dicts, gathered whole (sharding.full_states)."""
    weights, moments, averaged = gathered or (model.state_dict(), optimizer.state_dict(),
                                              ema.state_dict() if ema is not None else None)
    return {  # weights under the names timm reads, whatever wraps the model (the one door out: outputs/weights.py)
        "model": strip_wrappers(weights), "optimizer": moments, "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(), "ema": saved_ema(averaged), **state.checkpoint_fields(),
        "stream_layout": cfg.data.stream_layout(distributed.context().world_size),
        "rng": rng_state(),
        "config": cfg.to_dict(), "overrides": list(overrides), "class_names": list(class_names),
        "identity": identity(cfg.to_dict(), class_names, state.run_id),  # what the weights are, for every door
        "preprocess": cfg.data.eval_spec(cfg.model.img_size),
        "versions": versions(),
        "cpu_threads": torch.get_num_threads(),  # a resume takes the same count (runtime/cpu.py): exact on the CPU
        "objective": loss.state_dict() if loss is not None else None,
    }


def restore_weights(ckpt: dict, model: nn.Module) -> None:
    """The checkpoint's weights into the whole (not yet sharded) model; CheckpointError when they do not fit."""
    try:
        model.load_state_dict(strip_wrappers(ckpt["model"]))
    except (RuntimeError, ValueError, KeyError) as e:
        raise CheckpointError(f"the checkpoint's weights do not fit this model: {str(e).splitlines()[0]}") from None


def restore(ckpt: dict, model: nn.Module, optimizer, scaler, weights: bool = True) -> TrainState:
    """Load weights (unless `weights` is false: `restore_weights` did), optimiser (sharded or not), scaler
    and RNG states; returns the loop's position.

    The optimiser keeps its saved state (moments, step counts) but takes its hyperparameters
    (weight_decay, betas, eps, momentum, fused) from this run's config, as built: torch's
    `load_state_dict` would put the saved ones back and silently ignore `optim.weight_decay=...` on
    resume. The lr is the schedule's (build_scheduler). Unchanged, they are the saved values.
    """
    configured = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    if weights:
        restore_weights(ckpt, model)
    try:
        load_optimizer_state(model, optimizer, ckpt["optimizer"])
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"the checkpoint's optimiser state does not fit this model ({str(e).splitlines()[0]}): "
                              f"the file is damaged or another model's; resume from another checkpoint of the run, or "
                              f"start a new run from its weights with model.pretrained=<the checkpoint>") from None
    for group, hyper in zip(optimizer.param_groups, configured):
        group.update(hyper)
    if ckpt.get("scaler"):
        scaler.load_state_dict(ckpt["scaler"])
    restore_rng(ckpt["rng"])
    return TrainState(**{k: ckpt[k] for k in TrainState.__dataclass_fields__ if k in ckpt and k != "metrics"})


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
        raise CheckpointError(f"the checkpoint's RNG states cannot be restored ({e}); the resumed run would not "
                              f"match the original") from None
