"""The training loop: build, maybe resume, train with periodic eval/checkpoint/log, final eval.

`train(cfg, run_dir)` is the whole run; read it top to bottom. It takes a plain typed `Config`
(no Hydra), so tests and notebooks call it directly.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from . import distributed
from .checkpoint import check_classes, check_compatible, find_resume_checkpoint, run_checkpoints, save_run_checkpoint
from .config import Config
from .data import build_data
from .data.mix import BatchMix
from .errors import CheckpointError, RunStopped
from .evaluate import autocast_dtype, evaluate, pick_device
from .metrics import NullLogger, RunLogger, TrainWindow, write_results
from .model import build_model
from .optim import build_optimizer, build_scheduler
from .preemption import StopRequest
from .pretrained import load_pretrained
from .report import TrainingVisuals
from .speed import flops_per_image, peak_tflops
from .state import TrainState, build_ema, checkpoint_state, restore

log = logging.getLogger("vit_train")

DATA_BOUND = 0.2  # warn when more than this share of the step time waits for data


def due(step: int, every: int | None) -> bool:
    return bool(every) and step % every == 0


def train(cfg: Config, run_dir: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Train as `cfg` says, writing checkpoints and logs under `run_dir`; returns the results summary.

    Raises RunStopped when a stop signal or diverging losses end the run early (after writing
    results.json, and for a signal a checkpoint to resume from).
    """
    run_dir = Path(run_dir)
    start_time = time.time()
    t = cfg.trainer
    ctx = distributed.setup(t.device)  # several processes under torchrun; else rank 0 of 1
    distributed.check_batch(cfg.data.batch_size, t.accum_steps)
    if ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    else:
        log.setLevel(logging.WARNING)  # rank 0 reports; the others only warn
    device = pick_device(t.device, ctx.local_rank)
    ckpt_path, ckpt = find_resume_checkpoint(cfg.resume, run_dir) or (None, None)
    if ckpt is None and run_checkpoints(run_dir):
        raise CheckpointError(f"{run_dir} already holds checkpoints; continue that run with resume=auto (or "
                              f"resume={run_dir}), or start this one in another directory (hydra.run.dir=...)")
    changes = check_compatible(ckpt, cfg.to_dict()) if ckpt else []

    torch.manual_seed(cfg.seed)
    data = build_data(cfg, device, ctx.rank, ctx.world_size)
    model = build_model(cfg.model, len(data.class_names))
    if cfg.model.pretrained and not ckpt:
        load_pretrained(model, cfg.model.pretrained)
    model.to(device)
    optimizer = build_optimizer(model, cfg.optim, device, lr=cfg.lr)
    total_steps = min(t.epochs * data.steps_per_epoch, t.max_steps or math.inf)
    amp_dtype = autocast_dtype(t.precision, device)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    state = TrainState()
    if ckpt:
        check_classes(ckpt, data.class_names)
        state = restore(ckpt, model, optimizer, scaler)
    if ctx.enabled:  # dropout and drop path draw differently on each process
        torch.manual_seed(cfg.seed * 1_000_003 + 7919 * state.step + ctx.rank)
    ema = build_ema(model, t.ema_decay, ckpt)
    scheduler = build_scheduler(optimizer, cfg.optim, cfg.schedule, data.steps_per_epoch, total_steps, state.step,
                                lr=cfg.lr)
    ddp = distributed.wrap(model)  # DistributedDataParallel with several processes, else the model itself
    step_fn = torch.compile(ddp, mode=t.compile_mode) if t.compile else ddp
    eval_fn = model if ctx.enabled else step_fn  # each process evaluates its share with the plain module
    progress = t.progress and ctx.is_main
    criterion = nn.CrossEntropyLoss(label_smoothing=cfg.aug.label_smoothing)  # takes class indices or probabilities
    mix = BatchMix(cfg.aug, len(data.class_names), cfg.seed) if BatchMix.wanted(cfg.aug) else None

    logger = RunLogger(run_dir, resume_step=state.step if ckpt else None) if ctx.is_main else NullLogger()
    if ckpt:
        log.info("resumed from %s at epoch %d, step %d", ckpt_path, state.epoch, state.step)
        for change in changes:
            log.warning("changed since the checkpoint: %s", change)
    else:
        logger.config(cfg.to_dict(), step=0)
    visuals = TrainingVisuals(logger.tb, t.viz_every, data) if t.viz_every and ctx.is_main else None
    log.info("%s: %.2fM parameters, %d classes, %d steps (%d per epoch), device %s%s, precision %s", cfg.model.name,
             sum(p.numel() for p in model.parameters()) / 1e6, len(data.class_names), total_steps,
             data.steps_per_epoch, device, f" x {ctx.world_size} processes" if ctx.enabled else "",
             amp_dtype or torch.float32)

    counts = DeviceCounts(state, device) if skips_on_device(optimizer, scaler) else None

    def save(best: bool = False) -> None:
        if counts is not None:
            counts.settle(state, t.max_bad_steps)
        distributed.barrier()
        if ctx.is_main:  # one writer; the weights are the same on every process
            save_run_checkpoint(checkpoint_state(model, optimizer, scheduler, scaler, ema, state, cfg, overrides,
                                                 data.class_names), run_dir / "checkpoints", t.keep_last, best)
        distributed.barrier()

    def run_eval() -> dict[str, float]:
        """Evaluates the model (and its EMA); best.pt follows whichever of the two scores higher."""
        metrics = evaluate(eval_fn, data.val_loader, device, amp_dtype, progress, data.val_unreadable,
                           confusion=visuals is not None)
        if visuals is not None:
            visuals.after_eval(model, state.step, metrics.pop("confusion"))
        logger.scalars("val", state.step, metrics)
        scores, ema_text = {"model": metrics["top1"]}, ""
        if ema is not None:
            ema_metrics = evaluate(ema.module, data.val_loader, device, amp_dtype, progress)
            logger.scalars("val_ema", state.step, ema_metrics)
            metrics["ema_top1"] = scores["ema"] = ema_metrics["top1"]
            ema_text = f", EMA top-1 {ema_metrics['top1']:.2f}%"
        source = max(scores, key=scores.get)  # the raw model wins a tie
        if scores[source] > state.best_top1:
            state.best_top1, state.best_step, state.best_source = scores[source], state.step, source
        log.info("step %d (epoch %d): val loss %.4f, top-1 %.2f%%, top-5 %.2f%%%s (best %.2f%%, %s)", state.step,
                 state.epoch, metrics["loss"], metrics["top1"], metrics["top5"], ema_text, state.best_top1,
                 state.best_source)
        return metrics

    def finish(status: str, metrics: dict[str, float]) -> dict[str, Any]:
        if counts is not None:
            counts.settle(state, t.max_bad_steps)
        results = summary(status, state, metrics, data.steps_per_epoch, time.time() - start_time, run_dir)
        if ctx.is_main:
            write_results(run_dir, results)
        best = f"best top-1 {state.best_top1:.2f}% (step {state.best_step})" if state.best_top1 >= 0 else "not evaluated"
        log.info("%s: %s, %d steps (%d skipped), %.0f images/s, %.0f s; outputs in %s", status, best, state.step,
                 state.skipped_steps, results["images_per_s"] or 0, results["wall_seconds"], run_dir)
        logger.close()
        return results

    metrics: dict[str, float] = {}
    flops = flops_per_image(cfg.model, len(data.class_names))
    window = TrainWindow(device, flops, peak_tflops(device, amp_dtype, t.peak_tflops))
    log.info("%.2f GFLOP per training image; peak %s", flops / 1e9,
             f"{window.peak_tflops:g} TFLOP/s (MFU logged)" if window.peak_tflops else
             "unknown (set trainer.peak_tflops to log MFU)")
    with logging_redirect_tqdm(), StopRequest(deferred=ctx.enabled) as stop:
        while state.step < total_steps and not stop:
            data.train_sampler.set_epoch(state.epoch, start=state.batch_in_epoch * cfg.data.batch_size)
            bar = tqdm(total=data.steps_per_epoch, initial=state.batch_in_epoch, disable=not progress,
                       desc=f"epoch {state.epoch + 1}/{t.epochs}", dynamic_ncols=True, leave=False)
            window.start()
            batches = iter(data.train_loader)
            while True:
                fetch = time.perf_counter()
                batch = next_batch(batches, stop)
                window.wait(time.perf_counter() - fetch)
                if ctx.enabled:  # every process stops at the same step, whichever got the signal
                    stop.agree(distributed.max_all(stop.received or 0, device))
                if batch is None or stop:
                    break
                images, targets, unreadable = batch
                if data.train_unreadable:
                    data.train_unreadable.check(unreadable)
                images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
                if mix is not None:
                    images, targets = mix(images, targets, state.step)
                if visuals is not None and not visuals.batch_shown:
                    visuals.training_batch(images, targets, state.step)
                loss, grad_norm, hits, finite = train_step(step_fn, model, images, targets, optimizer, scaler,
                                                           criterion, amp_dtype, t.accum_steps, cfg.optim.clip_grad)
                scheduler.step()
                state.step += 1
                state.batch_in_epoch += 1
                if counts is not None:
                    counts.add(finite)
                else:
                    count_step(state, finite, t.max_bad_steps)
                if ema is not None and (counts is not None or finite):  # a skipped update left the weights
                    ema.update_parameters(model)
                window.add(loss, grad_norm, hits, len(images) * ctx.world_size, finite)
                bar.update()
                if counts is not None and (due(state.step, t.log_every) or state.step == total_steps):
                    counts.settle(state, t.max_bad_steps)
                if due(state.step, t.log_every) or state.step == total_steps:
                    log_train(logger, bar, window, state, scheduler.get_last_lr()[0], scaler)
                if state.bad_in_a_row >= t.max_bad_steps:
                    finish("diverged", metrics)
                    raise RunStopped(diverged_message(state, run_dir), exit_code=3)
                epoch_done = state.batch_in_epoch == data.steps_per_epoch
                if epoch_done:
                    state.epoch, state.batch_in_epoch = state.epoch + 1, 0
                    if data.train_unreadable:
                        data.train_unreadable.report(state.epoch)
                final = state.step >= total_steps
                window.pause()
                if final or (due(state.step, t.eval_every) if t.eval_every else epoch_done):
                    metrics = run_eval()
                    save(best=state.best_step == state.step)
                elif epoch_done or due(state.step, t.ckpt_every):
                    save()
                if final:
                    break
                window.start()
            window.pause()
            bar.close()
        if stop:
            save()
            finish("interrupted", metrics)
            raise RunStopped(f"stopped by {stop.name} at step {state.step}; checkpoints/last.pt holds it: rerun the "
                             f"same command with resume=auto (or resume={run_dir}) to continue", stop.exit_code)
        if not metrics:  # resumed a run that had already finished
            log.info("the run already reached its last step (%d); raise trainer.epochs or trainer.max_steps to "
                     "train longer", total_steps)
            metrics = run_eval()
            save(best=state.best_step == state.step)
    return finish("completed", metrics)


def next_batch(batches, stop: StopRequest):
    """The loader's next batch; None at the end of the epoch, or when a stop signal has also ended
    the loader's workers (the last step is whole). Any other error, or one without a signal, is raised."""
    try:
        return next(batches)
    except StopIteration:
        return None
    except (RuntimeError, OSError, EOFError):  # a worker the signal ended, or a connection reset by it
        if not stop.received:
            raise
        return None


def skips_on_device(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> bool:
    """True for a fused optimiser without fp16 loss scaling: it can skip a non-finite update by itself."""
    return bool(optimizer.defaults.get("fused")) and not scaler.is_enabled()


class DeviceCounts:
    """Non-finite steps counted on the device (when the optimiser skips them there), settled into
    the TrainState at log time and before each checkpoint, so the loop never waits for them."""

    def __init__(self, state: TrainState, device: torch.device):
        self.skipped = torch.zeros((), dtype=torch.long, device=device)
        self.run = torch.full((), state.bad_in_a_row, dtype=torch.long, device=device)

    def add(self, finite: torch.Tensor) -> None:
        bad = (~finite).long()
        self.skipped += bad
        self.run = (self.run + 1) * bad  # consecutive non-finite steps

    def settle(self, state: TrainState, max_bad_steps: int) -> None:
        skipped = int(self.skipped.item())
        self.skipped.zero_()
        state.skipped_steps += skipped
        state.bad_in_a_row = int(self.run.item())
        if skipped:
            log.warning("up to step %d: %d non-finite steps skipped (%d in a row now, the run stops at %d)",
                        state.step, skipped, state.bad_in_a_row, max_bad_steps)


def count_step(state: TrainState, finite: bool, max_bad_steps: int) -> None:
    if finite:
        state.bad_in_a_row = 0
        return
    state.skipped_steps += 1
    state.bad_in_a_row += 1
    log.warning("step %d: non-finite loss or gradient norm, update skipped (%d in a row, the run stops at %d)",
                state.step, state.bad_in_a_row, max_bad_steps)


def diverged_message(state: TrainState, run_dir: Path) -> str:
    return (f"{state.bad_in_a_row} steps in a row had a non-finite loss or gradient norm (up to step {state.step}), so "
            f"the run stopped; the checkpoints in {run_dir / 'checkpoints'} are from before. Lower optim.lr, set "
            f"optim.clip_grad, or use trainer.precision=bf16 or fp32, and start again or resume")


def summary(status: str, state: TrainState, metrics: dict[str, float], steps_per_epoch: int, wall_seconds: float,
            run_dir: Path) -> dict[str, Any]:
    """results.json: how the run ended and its numbers (final_* are null if it never evaluated)."""
    return {
        "status": status, "best_top1": state.best_top1 if state.best_top1 >= 0 else None,
        "best_step": state.best_step, "best_source": state.best_source, "final_top1": metrics.get("top1"),
        "final_top5": metrics.get("top5"), "final_loss": metrics.get("loss"), "final_ema_top1": metrics.get("ema_top1"),
        "epochs": state.epoch + state.batch_in_epoch / steps_per_epoch,
        "steps": state.step, "skipped_steps": state.skipped_steps,
        "images_per_s": state.images_seen / state.train_seconds if state.train_seconds else None,
        "wall_seconds": wall_seconds, "run_dir": str(run_dir),
    }


def train_step(step_fn: nn.Module, model: nn.Module, images: torch.Tensor, targets: torch.Tensor,
               optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, criterion: nn.Module,
               amp_dtype: torch.dtype | None, accum_steps: int, clip_grad: float | None):
    """One optimiser step over a global batch split into `accum_steps` micro-batches.

    `targets` are class indices (B,) or probabilities (B, classes) from MixUp/CutMix. Returns the
    mean loss, the pre-clip gradient norm and the top-1 hits (device tensors; with probabilities a
    hit is the argmax of the target) and whether loss and norm were finite; if not, the update is
    skipped. With a fused optimiser (AdamW on CUDA) "finite" is a device tensor and the fused kernel
    skips the update itself (its found_inf input): the step has no host sync. Otherwise the check
    is the step's one host sync.
    """
    optimizer.zero_grad(set_to_none=True)
    total = torch.zeros((), device=images.device)
    hits = torch.zeros((), device=images.device, dtype=torch.long)
    chunks = list(zip(images.chunk(accum_steps), targets.chunk(accum_steps)))
    for i, (x, y) in enumerate(chunks):
        with distributed.no_sync(step_fn, last=i == len(chunks) - 1):  # one gradient all-reduce per step
            with torch.autocast(images.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                logits = step_fn(x)
                loss = criterion(logits, y) / accum_steps
            scaler.scale(loss).backward()
        total += loss.detach()
        hits += (logits.detach().argmax(1) == (y.argmax(1) if y.ndim == 2 else y)).sum()
    total, hits = distributed.mean_loss_and_hits(total, hits)  # over processes: the same on each
    scaler.unscale_(optimizer)
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), clip_grad or math.inf)
    if skips_on_device(optimizer, scaler):  # no host sync: the fused kernel skips the update itself
        finite = torch.isfinite(total) & torch.isfinite(grad_norm)
        optimizer.grad_scale, optimizer.found_inf = None, (~finite).float()
        optimizer.step()
        return total, grad_norm, hits, finite
    # With fp16 an overflowing gradient is routine: the scaler skips that step and lowers its scale.
    finite = bool(torch.isfinite(total) if scaler.is_enabled() else torch.isfinite(total) & torch.isfinite(grad_norm))
    if finite:
        scaler.step(optimizer)
    scaler.update()
    return total, grad_norm, hits, finite


def log_train(logger: RunLogger, bar, window: TrainWindow, state: TrainState, lr: float,
              scaler: torch.amp.GradScaler) -> None:
    values, images, seconds = window.read()
    values.update(lr=lr, skipped_steps=state.skipped_steps)
    if scaler.is_enabled():
        values["loss_scale"] = scaler.get_scale()
    state.images_seen += images
    state.train_seconds += seconds
    logger.scalars("train", state.step, values)
    extra = {"mfu": f"{100 * values['mfu']:.1f}%"} if "mfu" in values else {}
    bar.set_postfix(loss=f"{values['loss']:.4f}", lr=f"{lr:.2e}", img_s=f"{values['images_per_s']:.0f}",
                    wait=f"{100 * values['data_wait']:.0f}%", **extra)
    window.logs += 1
    if values["data_wait"] > DATA_BOUND and window.logs > 1 and not window.warned:  # the first window warms up
        window.warned = True
        log.warning("the run is data-bound: %.0f%% of the step time waits for data. Raise data.num_workers, or on "
                    "a GPU use data.pipeline=device (shapes/CIFAR)", 100 * values["data_wait"])


