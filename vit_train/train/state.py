"""What a run carries across a restart: the loop's position, the EMA, every RNG's state, the
objective's state and the checkpoint's contents (train/resume_checks.py: which config changes a
resumed run may make).

outputs/checkpoint.py only writes, reads and finds the files.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import InitVar, asdict, dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from vit_train.outputs.checkpoint import versions
from vit_train.config.schema import Config
from vit_train.models.architecture import identity
from vit_train.errors import CheckpointError
from vit_train.data.preprocess import eval_spec
from vit_train.data.shard_index import train_fingerprint
from vit_train.data.webdataset import loader_workers
from vit_train.runtime import distributed
from vit_train.objectives import Objective, objective_state
from vit_train.objectives.score import better, checkpoint_best, winner
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
    # data=webdataset: what the epoch's stream plan was made for, {"world_size", "loader_workers", "train_index"}
    # (train_index: shard_index.train_fingerprint of the shards' index; absent in older checkpoints); else None
    stream_layout: Optional[dict] = None
    # checkpoints written before best_score kept these two: read into best_score (__post_init__)
    best_top1: InitVar[Optional[float]] = None
    best_loss: InitVar[Optional[float]] = None

    def __post_init__(self, best_top1: float | None, best_loss: float | None) -> None:
        if self.best_score is None:
            legacy = checkpoint_best({"best_top1": best_top1, "best_loss": best_loss})
            if legacy is not None:
                self.best_metric, self.best_score = legacy

    def record_eval(self, metric: str, scores: dict[str, float], partial: bool = False) -> str:
        """One evaluation's `scores` {"model": ..., "ema"?: ...} for `metric`: the better of the two (the
        model wins a tie) becomes the best score when it beats it. A `partial` validation (a share of the
        val set, trainer.limit_val_batches) is compared only with partial ones: a full validation's score
        replaces a partial best, a partial one never replaces a full best. Returns which weights won."""
        source = winner(metric, scores)
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
        """The state as a checkpoint keeps it: every field, plus best_top1 (-1 when none) and best_loss
        (inf when none) written from the one best score, as checkpoints always had them."""
        top1, loss = self.best_of("top1"), self.best_of("loss")
        return {**asdict(self), "best_top1": -1.0 if top1 is None else top1,
                "best_loss": float("inf") if loss is None else loss}

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
        ema.load_state_dict(ckpt["ema"])
    elif ckpt:
        log.warning("the checkpoint has no EMA weights; the EMA starts from the current weights")
    return ema


def checkpoint_state(model: nn.Module, optimizer, scheduler, scaler, ema: AveragedModel | None, state: TrainState,
                     cfg: Config, overrides: Sequence[str], class_names: list[str],
                     objective: Objective | None = None, gathered: tuple | None = None) -> dict[str, Any]:
    """Everything a resumed run needs, as plain tensors and primitives (see docs/resuming.md, 'What is in a checkpoint');
    `objective`'s own state (MAE's mask counter, the distillation teacher's identity) under "objective".
    `gathered`: a sharded run's (model, optimiser, EMA) state dicts, gathered whole (sharding.full_states)."""
    weights, moments, averaged = gathered or (model.state_dict(), optimizer.state_dict(),
                                              ema.state_dict() if ema is not None else None)
    return {
        "model": weights, "optimizer": moments, "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(), "ema": averaged, **state.checkpoint_fields(),
        "stream_layout": stream_layout(cfg),
        "rng": rng_state(),
        "config": cfg.to_dict(), "overrides": list(overrides), "class_names": list(class_names),
        "identity": identity(cfg.to_dict(), class_names, state.run_id),  # what the weights are, for every door
        "preprocess": eval_spec(cfg),
        "versions": versions(),
        "cpu_threads": torch.get_num_threads(),  # a resume takes the same count (runtime/cpu.py): exact on the CPU
        "objective": objective_state(objective) if objective is not None else None,
    }


def restore_weights(ckpt: dict, model: nn.Module) -> None:
    """The checkpoint's weights into the whole (not yet sharded) model; CheckpointError when they do not fit."""
    try:
        model.load_state_dict(ckpt["model"])
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
    return TrainState(**{k: ckpt[k] for k in TrainState.__dataclass_fields__ if k in ckpt})


def stream_layout(cfg: Config) -> dict[str, int | str] | None:
    """data=webdataset: the world size and loader worker count (data.num_workers resolved) the epoch's stream
    plan is cut for (data/stream_order.py), and the fingerprint of the index's training shards and classes
    (train_index, when the index can be read); None for other data sets."""
    if cfg.data.name != "webdataset":
        return None
    layout = {"world_size": distributed.context().world_size,
              "loader_workers": max(1, loader_workers(cfg.data.num_workers))}
    fingerprint = train_fingerprint(cfg.data.root)
    return layout if fingerprint is None else {**layout, "train_index": fingerprint}


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
