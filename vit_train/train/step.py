"""One optimiser step, and the one path for non-finite steps.

A step whose loss or gradient norm is not finite is skipped (the weights and the optimiser's
moments stay as they were) and counted; `trainer.max_bad_steps` in a row stop the run. Whether a
step was finite is always a device tensor. With a fused optimiser (AdamW on CUDA) the fused kernel
skips the update itself (its found_inf input), so the step has no host sync, and the counts are
settled at log time and before checkpoints. Otherwise the counts are settled within every step:
that is the step's one host sync, which decides whether the optimiser steps.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from vit_train.checkpoint import TrainState, run_checkpoints
from vit_train.runtime import distributed
from vit_train.train.sharding import clip_grad_norm

if TYPE_CHECKING:
    from vit_train.train.run import Run

log = logging.getLogger("vit_train")


def train_step(run: Run, images: torch.Tensor, targets: torch.Tensor) -> None:
    """One optimiser step over a global batch split into `trainer.accum_steps` micro-batches, then the
    LR schedule and the EMA; the loss, gradient norm and top-1 hits go to the run's window.

    `images` (B, 3, H, W) and `targets` (B,) class indices or (B, classes) probabilities, on the
    device; `run.state.step` is already this step's number. The loss is the run's objective's (`run.loss`).
    With trainer.compile_scope=step the compiled step takes it (train/compiled_step.py), unless it could not
    be compiled. The first step of a compiled run compiles: its seconds are kept apart (`compile_seconds`).
    """
    if run.compiled is not None:
        if run.compiled(images, targets, run.state.step):
            run.scheduler.step()
            if not run.skips.on_device:  # counted in the graph; read now on the CPU, as the eager step does
                run.skips.settle(run.state)
        else:  # could not be compiled, or a batch of another shape
            with run.compiled.eager_optimizer():
                eager_step(run, images, targets)
        return
    if run.cfg.trainer.compile and run.compile_seconds.get("step") is None:  # the compiled model's first step
        with run.window.paused():
            started = time.perf_counter()
            eager_step(run, images, targets)
            if images.is_cuda:
                torch.cuda.synchronize(images.device)
            run.compile_seconds["step"] = time.perf_counter() - started
        run.window.images -= len(images) * run.ctx.world_size  # out of images/s with its time
        return
    eager_step(run, images, targets)


def eager_step(run: Run, images: torch.Tensor, targets: torch.Tensor) -> None:
    """`train_step` as PyTorch runs it op by op (or through the compiled model: trainer.compile_scope=model)."""
    optimizer, scaler, t = run.optimizer, run.scaler, run.cfg.trainer
    optimizer.zero_grad(set_to_none=True)
    total = torch.zeros((), device=images.device)
    hits = torch.zeros((), device=images.device, dtype=torch.long)
    counted = False  # whether the objective gave logits to count top-1 hits from
    chunks = list(zip(images.chunk(t.accum_steps), targets.chunk(t.accum_steps), strict=True))
    for i, (x, y) in enumerate(chunks):
        with distributed.no_sync(
            run.step_fn, last=i == len(chunks) - 1
        ):  # one gradient all-reduce (FSDP: reduce-scatter) per step
            with torch.autocast(images.device.type, dtype=run.amp_dtype, enabled=run.amp_dtype is not None):
                loss, logits = run.loss(run.step_fn, x, y, **run.loss.draws(x))
                # each micro-batch weighs as its images: a short last batch (batch size changed mid-epoch)
                # may split unevenly, or into fewer than accum_steps micro-batches
                loss = loss / t.accum_steps if len(x) * t.accum_steps == len(images) else loss * (len(x) / len(images))
            scaler.scale(loss).backward()
        total += loss.detach()
        if logits is not None:
            counted = True
            hits += (logits.detach().argmax(1) == (y.argmax(1) if y.ndim == 2 else y)).sum()
    total, hits = distributed.mean_loss_and_hits(total, hits)  # over processes: the same on each
    scaler.unscale_(optimizer)
    # over every process's shards with FSDP: the same norm, and so the same skip decision, on each
    grad_norm = clip_grad_norm(run.model.parameters(), run.cfg.optim.clip_grad or math.inf)
    # With fp16 an overflowing gradient is routine: the scaler skips that step and lowers its scale.
    finite = torch.isfinite(total) if scaler.is_enabled() else torch.isfinite(total) & torch.isfinite(grad_norm)
    run.skips.add(finite)
    updated = True  # as far as the host knows: on the device path a skip is decided there
    if run.skips.on_device:  # no host sync: the fused kernel skips the update itself
        optimizer.grad_scale, optimizer.found_inf = None, (~finite).float()
        optimizer.step()
    else:
        updated = not run.skips.settle(run.state)
        if updated:
            scaler.step(optimizer)
        scaler.update()
    run.scheduler.step()
    if run.ema is not None and updated:  # on the device path a skipped step's weights are the step before's
        run.ema.update_parameters(run.model)
    run.window.add(total, grad_norm, hits if counted else None, len(images) * run.ctx.world_size, finite)


def step_seed(seed: int, step: int, rank: int) -> int:
    """The torch seed of process `rank` for optimiser step `step` (counted from 1) with several processes: each
    process draws differently, and a resumed run draws as the uninterrupted one did (a single process instead
    keeps one RNG stream and restores it from the checkpoint)."""
    return seed * 1_000_003 + 7919 * step + rank


def diverged_message(state: TrainState, run_dir: Path) -> str:
    """Why the run stopped after `trainer.max_bad_steps` non-finite steps in a row, and what to do."""
    kept = run_checkpoints(run_dir)
    where = (
        f"the checkpoints in {run_dir / 'checkpoints'} are from before" if kept else "it had written no checkpoint yet"
    )
    return (
        f"{state.bad_in_a_row} steps in a row had a non-finite loss or gradient norm (up to step {state.step}), so "
        f"the run stopped; {where}. Lower optim.lr, set optim.clip_grad, or use trainer.precision=bf16 or fp32, "
        f"and {'start again or resume' if kept else 'start again'}"
    )
