"""The training loop: build, maybe resume, train with periodic eval/checkpoint/log, final eval.

`train(cfg, run_dir)` is the whole run; read it top to bottom. It takes a plain typed `Config`
(no Hydra), so tests and notebooks call it directly.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from .checkpoint import (check_compatible, copy_checkpoint, load_checkpoint, resolve_checkpoint, restore_rng,
                         rng_state, save_checkpoint, versions)
from .config import Config
from .data import build_data
from .errors import CheckpointError, ConfigError
from .metrics import RunLogger, TrainWindow, write_results
from .model import build_model
from .optim import build_optimizer, build_scheduler

log = logging.getLogger("vit_train")


@dataclass
class TrainState:
    epoch: int = 0  # epochs completed
    step: int = 0  # optimiser steps completed
    batch_in_epoch: int = 0  # batches of the current epoch already trained on
    best_top1: float = -1.0  # best val top-1 so far (%), -1 before the first eval
    best_step: int = 0
    images_seen: int = 0  # training images processed, and the seconds they took: for images/s
    train_seconds: float = 0.0


def due(step: int, every: int | None) -> bool:
    return bool(every) and step % every == 0


def pick_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device=cuda but no CUDA GPU is visible; use trainer.device=auto or cpu")
    device = torch.device("cuda" if name != "cpu" and torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 for fp32 matmuls on Ampere and newer
        torch.backends.cudnn.allow_tf32 = True
    return device


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for full fp32."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else None
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision]


def train(cfg: Config, run_dir: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Train as `cfg` says, writing checkpoints and logs under `run_dir`; returns the results summary."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    start_time = time.time()
    t = cfg.trainer
    device = pick_device(t.device)
    ckpt_path = resolve_checkpoint(cfg.resume, run_dir)
    ckpt = load_checkpoint(ckpt_path) if ckpt_path else None
    changes = check_compatible(ckpt, cfg.to_dict()) if ckpt else []

    torch.manual_seed(cfg.seed)
    data = build_data(cfg, device)
    model = build_model(cfg.model, len(data.class_names)).to(device)
    optimizer = build_optimizer(model, cfg.optim, device)
    total_steps = min(t.epochs * data.steps_per_epoch, t.max_steps or math.inf)
    amp_dtype = autocast_dtype(t.precision, device)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    state = TrainState()
    if ckpt:
        check_compatible(ckpt, cfg.to_dict(), data.class_names)
        state = restore(ckpt, model, optimizer, scaler)
    scheduler = build_scheduler(optimizer, cfg.optim, cfg.schedule, data.steps_per_epoch, total_steps, state.step)
    step_fn = torch.compile(model) if t.compile else model
    criterion = nn.CrossEntropyLoss(label_smoothing=cfg.aug.label_smoothing)

    logger = RunLogger(run_dir, resume_step=state.step if ckpt else None)
    if ckpt:
        log.info("resumed from %s at epoch %d, step %d", ckpt_path, state.epoch, state.step)
        for change in changes:
            log.warning("changed since the checkpoint: %s", change)
    else:
        logger.config(cfg.to_dict(), step=0)
    log.info("%s: %.2fM parameters, %d classes, %d steps (%d per epoch), device %s, precision %s", cfg.model.name,
             sum(p.numel() for p in model.parameters()) / 1e6, len(data.class_names), total_steps,
             data.steps_per_epoch, device, amp_dtype or torch.float32)

    def save(evaluated: dict | None) -> None:
        folder = run_dir / "checkpoints"
        save_checkpoint(checkpoint_state(model, optimizer, scheduler, scaler, state, cfg, overrides,
                                         data.class_names), folder / "last.pt")
        if evaluated is not None and state.best_step == state.step:
            copy_checkpoint(folder / "last.pt", folder / "best.pt")

    def run_eval() -> dict[str, float]:
        metrics = evaluate(step_fn, data.val_loader, device, amp_dtype, t.progress)
        if metrics["top1"] > state.best_top1:
            state.best_top1, state.best_step = metrics["top1"], state.step
        logger.scalars("val", state.step, metrics)
        log.info("step %d (epoch %d): val loss %.4f, top-1 %.2f%%, top-5 %.2f%% (best %.2f%%)", state.step,
                 state.epoch, metrics["loss"], metrics["top1"], metrics["top5"], state.best_top1)
        return metrics

    metrics: dict[str, float] = {}
    window = TrainWindow(device)
    with logging_redirect_tqdm():
        while state.step < total_steps:
            data.train_sampler.set_epoch(state.epoch, start=state.batch_in_epoch * cfg.data.batch_size)
            bar = tqdm(total=data.steps_per_epoch, initial=state.batch_in_epoch, disable=not t.progress,
                       desc=f"epoch {state.epoch + 1}/{t.epochs}", dynamic_ncols=True, leave=False)
            window.start()
            for images, targets in data.train_loader:
                images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
                loss, grad_norm = train_step(step_fn, model, images, targets, optimizer, scaler, criterion,
                                             amp_dtype, t.accum_steps, cfg.optim.clip_grad)
                scheduler.step()
                state.step += 1
                state.batch_in_epoch += 1
                window.add(loss, grad_norm, len(images))
                bar.update()
                if due(state.step, t.log_every) or state.step == total_steps:
                    log_train(logger, bar, window, state, scheduler.get_last_lr()[0])
                epoch_done = state.batch_in_epoch == data.steps_per_epoch
                if epoch_done:
                    state.epoch, state.batch_in_epoch = state.epoch + 1, 0
                final = state.step >= total_steps
                window.pause()
                if final or (due(state.step, t.eval_every) if t.eval_every else epoch_done):
                    metrics = run_eval()
                    save(metrics)
                elif epoch_done or due(state.step, t.ckpt_every):
                    save(None)
                if final:
                    break
                window.start()
            window.pause()
            bar.close()
        if not metrics:  # resumed a run that had already finished
            log.info("the run already reached its last step (%d); raise trainer.epochs or trainer.max_steps to "
                     "train longer", total_steps)
            metrics = run_eval()
            save(metrics)

    results = {
        "status": "completed", "best_top1": state.best_top1, "best_step": state.best_step,
        "final_top1": metrics["top1"], "final_top5": metrics["top5"], "final_loss": metrics["loss"],
        "epochs": state.epoch + state.batch_in_epoch / data.steps_per_epoch, "steps": state.step,
        "images_per_s": state.images_seen / state.train_seconds if state.train_seconds else None,
        "wall_seconds": time.time() - start_time, "run_dir": str(run_dir),
    }
    write_results(run_dir, results)
    log.info("done: best top-1 %.2f%% (step %d), final top-1 %.2f%%, %d steps, %.0f images/s, %.0f s; outputs in %s",
             state.best_top1, state.best_step, metrics["top1"], state.step, results["images_per_s"] or 0,
             results["wall_seconds"], run_dir)
    logger.close()
    return results


def train_step(step_fn: nn.Module, model: nn.Module, images: torch.Tensor, targets: torch.Tensor,
               optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, criterion: nn.Module,
               amp_dtype: torch.dtype | None, accum_steps: int, clip_grad: float | None):
    """One optimiser step over a global batch split into `accum_steps` micro-batches.

    Returns the mean loss and the pre-clip gradient norm as device tensors (no host sync).
    """
    optimizer.zero_grad(set_to_none=True)
    total = torch.zeros((), device=images.device)
    for x, y in zip(images.chunk(accum_steps), targets.chunk(accum_steps)):
        with torch.autocast(images.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = criterion(step_fn(x), y) / accum_steps
        scaler.scale(loss).backward()
        total += loss.detach()
    scaler.unscale_(optimizer)
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), clip_grad or math.inf)
    scaler.step(optimizer)
    scaler.update()
    return total, grad_norm


@torch.no_grad()
def evaluate(model: nn.Module, loader, device: torch.device, amp_dtype: torch.dtype | None,
             progress: bool = False) -> dict[str, float]:
    """Mean cross-entropy, top-1 and top-5 accuracy (%) over the whole loader."""
    was_training = model.training
    model.eval()
    totals = torch.zeros(4, device=device, dtype=torch.float64)  # loss sum, top-1 hits, top-5 hits, count
    for images, targets in tqdm(loader, desc="eval", leave=False, disable=not progress, dynamic_ncols=True):
        images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            logits = model(images)
        hits = logits.topk(min(5, logits.shape[1]), dim=1).indices == targets[:, None]  # (B, k)
        totals += torch.stack([F.cross_entropy(logits.float(), targets, reduction="sum"), hits[:, 0].sum(),
                               hits.any(dim=1).sum(), torch.tensor(len(targets), device=device)]).double()
    model.train(was_training)
    loss, top1, top5, count = totals.tolist()
    return {"loss": loss / count, "top1": 100 * top1 / count, "top5": 100 * top5 / count}


def log_train(logger: RunLogger, bar, window: TrainWindow, state: TrainState, lr: float) -> None:
    values, images, seconds = window.read()
    values["lr"] = lr
    state.images_seen += images
    state.train_seconds += seconds
    logger.scalars("train", state.step, values)
    bar.set_postfix(loss=f"{values['loss']:.4f}", lr=f"{lr:.2e}", img_s=f"{values['images_per_s']:.0f}")


def checkpoint_state(model: nn.Module, optimizer, scheduler, scaler, state: TrainState, cfg: Config,
                     overrides: Sequence[str], class_names: list[str]) -> dict[str, Any]:
    return {
        "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(), "ema": None, **asdict(state), "rng": rng_state(),
        "config": cfg.to_dict(), "overrides": list(overrides), "class_names": list(class_names),
        "versions": versions(),
    }


def restore(ckpt: dict, model: nn.Module, optimizer, scaler) -> TrainState:
    """Load weights, optimiser, scaler and RNG states; returns the loop's position."""
    try:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
    except (RuntimeError, ValueError, KeyError) as e:
        raise CheckpointError(f"the checkpoint's weights do not fit this model: {str(e).splitlines()[0]}") from None
    if ckpt.get("scaler"):
        scaler.load_state_dict(ckpt["scaler"])
    restore_rng(ckpt["rng"])
    return TrainState(**{k: ckpt[k] for k in TrainState.__dataclass_fields__ if k in ckpt})
