"""What a training run is made of (`Run`) and how it is built (`build_run`): processes, device, data,
model, optimiser, schedule, EMA, the objective's loss, logger, restored from a checkpoint when resuming.
The run is built whole before the loop starts; what changes as it trains is its `state` (TrainState).

The order of the random draws in `build_run` is what exact resume relies on; trainer.py runs it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from vit_train.callbacks.runner import Callbacks, build_callbacks
from vit_train.checkpoint import (
    TrainState,
    check_classes,
    new_run_id,
    restore,
    restore_ema,
    restore_loop,
    restore_weights,
)
from vit_train.config import Config
from vit_train.data.loaders import Data
from vit_train.data.mix import BatchMix
from vit_train.objectives.base import Loss, Objective, state_fingerprint
from vit_train.objectives.weights_in import load_pretrained
from vit_train.outputs.metrics import EarlyRecords, NullLogger, RunLogger
from vit_train.runtime import distributed
from vit_train.runtime.cpu import set_cpu_threads
from vit_train.runtime.device import autocast_dtype, pick_device
from vit_train.runtime.progress import EpochProgress
from vit_train.schema.legacy import upgrade_saved
from vit_train.schema.sections import ModelConfig
from vit_train.train import sharding
from vit_train.train.compiled_step import CompiledStep
from vit_train.train.compiling import compile_scope, evaluators
from vit_train.train.lp_ft import lp_ft_lr, lp_ft_steps, start_lp_ft
from vit_train.train.optim import build_optimizer, build_scheduler
from vit_train.train.resume import check_data_position, cli_value, config_changes
from vit_train.train.skips import SkippedSteps, skips_on_device
from vit_train.train.throughput import TrainWindow, peak_tflops
from vit_train.viz.figures import TrainingVisuals

log = logging.getLogger("vit_train")


@dataclass(frozen=True)
class Run:
    """Everything one training run is made of; built once by `build_run`, never reassigned (its parts change
    inside: the state, the model's weights, the optimiser's moments)."""

    cfg: Config
    run_dir: Path
    overrides: list[str]
    ctx: distributed.Context  # this process's place among the processes (rank 0 of 1 without torchrun)
    device: torch.device
    amp_dtype: torch.dtype | None  # autocast dtype; None = fp32
    data: Data
    model: nn.Module  # the plain model: its weights are saved, averaged and evaluated
    step_fn: nn.Module  # what the eager step calls: the model, or DDP / torch.compile around it
    compiled: CompiledStep | None  # trainer.compile_scope=step: the whole step as one graph (else, or failing, eager)
    eval_model: nn.Module  # what evaluates the model: the plain model, or compiled at one batch shape
    eval_ema: nn.Module | None  # what evaluates the EMA's weights
    compile_seconds: dict[str, float]  # trainer.compile: seconds compiling the "step" and the "eval" (this attempt)
    resumed_with: list[str]  # a resumed run: its config's changes from the checkpoint's, as key=value overrides
    loss: Loss  # the objective's (cfg.objective.build_loss)
    mix: BatchMix | None
    ema: AveragedModel | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    skips: SkippedSteps
    logger: RunLogger | NullLogger
    visuals: TrainingVisuals | None
    window: TrainWindow
    progress: EpochProgress  # each epoch's bar (batches.py), which the train rows update
    state: TrainState  # what crosses a restart (the checkpoint's TrainState)
    latest: dict  # the latest evaluation's metrics in this attempt (results.json's final_*); empty before the first
    total_steps: int
    started: float  # time.time() when this attempt began (before its checkpoint was found)
    earlier_seconds: float  # wall time of earlier attempts, up to their last checkpoint
    # the loss's attributes when built (objectives/base.py `state_fingerprint`), and whether what changed was said
    loss_built: dict = field(default_factory=lambda: {"attributes": {}, "said": True})
    callbacks: Callbacks = field(default_factory=lambda: Callbacks([]))  # logger=[...]'s and callbacks=[...]'s (rank 0)
    # the latest evaluation's rows as {"val/top1": ..., "val_ema/top1": ...} (the callbacks' on_eval_end)
    evaluated: dict = field(default_factory=dict)
    lp_steps: int = 0  # LP-FT (model.lp_epochs): the steps that train the head alone; 0 = off


def build_run(
    cfg: Config, run_dir: Path, overrides: Sequence[str] = (), ckpt: dict | None = None, started: float | None = None
) -> Run:
    """Data, model, optimiser, schedule, EMA, logger: all of the run, restored from `ckpt` when given.

    `started` is when this attempt began (time.time(), default now), for the wall times.

    The order of the random draws (seed, data, model init, restore) is what exact resume relies on.
    What is logged while the run is built (the weights model.pretrained loaded, the teacher) reaches
    train.log too, whose handler comes last: rank 0 keeps those records until then (EarlyRecords).
    """
    with EarlyRecords() as early:
        return _build_run(cfg, run_dir, overrides, ckpt, started, early)


def _build_run(
    cfg: Config, run_dir: Path, overrides: Sequence[str], ckpt: dict | None, started: float | None, early: EarlyRecords
) -> Run:
    objective, t = cfg.objective, cfg.trainer
    objective.check_run(cfg)  # what the objective needs beyond the config (a teacher's file), before any work
    ctx = distributed.setup(t.device)  # several processes under torchrun; else rank 0 of 1
    distributed.check_batch(cfg.data.batch_size, t.accum_steps)
    if ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        if log.level == logging.NOTSET:  # as RunLogger sets it, but now: the build's INFO lines are kept
            log.setLevel(logging.INFO)
    else:
        log.setLevel(logging.WARNING)  # rank 0 reports; the others only warn
        log.removeHandler(early)  # and write no train.log
    device = pick_device(t.device, ctx.local_rank)
    said: list[str] = []  # the thread count, logged once the data loads (a data error is then the only line)
    set_cpu_threads(t.cpu_threads, ckpt.get("cpu_threads") if ckpt else None, said)  # a resume keeps the run's count
    torch.manual_seed(cfg.seed)
    data = cfg.data.build(cfg, device, ctx.rank, ctx.world_size, labels=objective.reads_labels)
    log.info("%s", said[0])
    classes = len(data.class_names)
    model = objective.build_model(cfg, classes)  # MAE: the autoencoder around the ViT (docs/mae.md)
    if cfg.model.pretrained and not ckpt:
        load_pretrained(
            objective.pretrained_target(model), cfg.model.pretrained, data.class_names, cfg.model.reset_head
        )
    model.to(device)
    amp_dtype = autocast_dtype(t.precision, device)
    if ckpt:  # into the whole model, before any sharding: checkpoints hold whole tensors whatever wrote them
        check_classes(ckpt, data.class_names)
        restore_weights(ckpt, model)
    ema = build_ema(model, t.ema_decay)  # from the restored weights: the EMA of a checkpoint without one starts there
    if ckpt:
        restore_ema(ckpt, ema)
    if sharding.wanted(cfg, ctx):  # trainer.strategy=fsdp: model and EMA sharded in place (FSDP2)
        sharding.shard(model, ema, cfg, amp_dtype)
    elif t.strategy == "fsdp":
        log.info("trainer.strategy=fsdp with one process: nothing to shard, the model trains whole")
    scope = compile_scope(
        t, device, ctx.world_size, amp_dtype == torch.float16, sharding.is_sharded(model), ctx.is_main
    )
    optimizer = build_optimizer(
        model,
        cfg.optim,
        device,
        lr=cfg.lr,
        capturable=scope == "step",  # on the shards when sharded
        family=cfg.model,
    )
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    state = TrainState(run_id=new_run_id())  # os.urandom: no RNG of the run moves
    if ckpt:
        state = restore(ckpt, model, optimizer, scaler, weights=False)
        if not state.run_id:  # a checkpoint written before run ids were kept
            state.run_id = new_run_id()
            log.info("the checkpoint records no run id; this run is run %s from here on", state.run_id[:8])
        check_data_position(state, ckpt, cfg, data.train_sampler.size, ctx.world_size)
    # the epochs left, the current one from where it stands (its steps follow a changed data.batch_size)
    steps_left = data.train_sampler.steps_left(state.sample_in_epoch, state.epoch_end, t.epochs - state.epoch)
    total_steps = min(state.step + steps_left, t.max_steps or math.inf)
    lp_steps = lp_ft_steps(cfg, data.steps_per_epoch, ckpt)
    if lp_steps:  # after the optimiser, which holds every parameter: the frozen ones have no gradient until they train
        start_lp_ft(objective.pretrained_target(model), cfg, ctx, state.step, lp_steps, total_steps)
    scheduler = build_scheduler(
        optimizer,
        cfg.optim,
        cfg.schedule,
        data.steps_per_epoch,
        total_steps,
        state.step,
        lr=cfg.lr,
        restart_at=lp_steps,
        lp_lr=lp_ft_lr(cfg),
    )
    # DistributedDataParallel with several processes (FSDP's model is its own wrapper), else the model itself
    ddp = model if sharding.is_sharded(model) else distributed.wrap(model)
    loss = objective.build_loss(cfg, model, classes, data.class_names, ctx.rank)
    mix = BatchMix(cfg.aug, classes, cfg.seed) if BatchMix.wanted(cfg.aug) else None
    window = TrainWindow(device, objective.flops_per_image(cfg, classes), peak_tflops(device, amp_dtype, t.peak_tflops))
    restore_loop(ckpt, loss, window)  # the objective's state, the train row's window (its terms too)
    window.advice = cfg.data.data_bound_advice(device)
    # counted on the device and read at logs and saves: a fused optimiser's, and the compiled step's on a GPU (whose
    # graph skips the update itself); elsewhere read every step, as the eager step decides with it
    on_device = skips_on_device(optimizer, scaler) or (scope == "step" and device.type == "cuda")
    skips = SkippedSteps(state, device, on_device, t.max_bad_steps)
    compile_seconds: dict[str, float] = {}
    step_fn = torch.compile(ddp, mode=t.compile_mode, backend=t.compile_backend) if scope == "model" else ddp
    compiled = (
        CompiledStep(
            model,
            loss,
            optimizer,
            cfg.optim,
            ema,
            window,
            skips,
            t.accum_steps,
            amp_dtype,
            device,
            scheduler.lr_lambdas[0],
            t.ema_decay,
            t.compile_mode,
            t.compile_backend,
            compile_seconds,
        )
        if scope == "step"
        else None
    )
    eval_model, eval_ema = evaluators(
        scope, t, model, step_fn, ema, cfg.data.eval_batch_size or cfg.data.batch_size, device, ctx.enabled
    )
    # last: from here train.log has a handler, which train() removes however the run ends
    callbacks = build_callbacks(cfg, ctx.is_main)  # rank 0's; a tracker's library is imported when it starts
    callbacks.load_state_dict(ckpt.get("callbacks") if ckpt else None)  # early stopping's count: resume stays exact
    logger = (
        RunLogger(
            run_dir,
            resume_step=state.step if ckpt else None,
            early=early,
            tensorboard="tensorboard" in cfg.logger,
            listeners=[callbacks.on_metrics],
        )
        if ctx.is_main
        else NullLogger()
    )
    try:
        draw = partial(objective.figures, class_names=data.class_names, stats=data.stats)
        visuals = TrainingVisuals(logger.tb, t.viz_every, data, draw) if t.viz_every and ctx.is_main else None
    except BaseException:  # matplotlib missing, unreadable val images
        logger.close()
        raise
    return Run(
        cfg=cfg,
        run_dir=run_dir,
        overrides=list(overrides),
        ctx=ctx,
        device=device,
        amp_dtype=amp_dtype,
        data=data,
        model=model,
        step_fn=step_fn,
        compiled=compiled,
        eval_model=eval_model,
        eval_ema=eval_ema,
        compile_seconds=compile_seconds,
        resumed_with=resumed_with(cfg, ckpt),
        loss=loss,
        mix=mix,
        ema=ema,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=scaler,
        skips=skips,
        logger=logger,
        visuals=visuals,
        window=window,
        progress=EpochProgress(t.progress and ctx.is_main),
        state=state,
        latest={},
        total_steps=total_steps,
        started=time.time() if started is None else started,
        earlier_seconds=state.wall_seconds,
        loss_built={"attributes": state_fingerprint(loss), "said": False},
        callbacks=callbacks,
        lp_steps=lp_steps,
    )


def build_ema(model: nn.Module, decay: float | None) -> AveragedModel | None:
    """An EMA of the weights (and buffers) at `decay` per step; None without one (trainer.ema_decay=null)."""
    if decay is None:
        return None
    return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)


def resumed_with(cfg: Config, ckpt: dict | None) -> list[str]:
    """The overrides that give `cfg` from the checkpoint's config (`resume` aside), as the command line writes them:
    what a stop that saves nothing must repeat to continue this attempt."""
    if not ckpt:
        return []
    return [
        f"{key}={cli_value(value)}" for key, _, value in config_changes(upgrade_saved(ckpt["config"]), cfg.to_dict())
    ]


def describe(run: Run) -> None:
    """The run's size, device and throughput reference, in the log."""
    cfg, window = run.cfg, run.window
    labels = cfg.objective.data_text(len(run.data.class_names))
    strategy = "FSDP: weights, gradients and optimiser state sharded" if sharding.is_sharded(run.model) else "DDP"
    if cfg.name or cfg.tags:  # name, tags: also in results.json and a sweep's summary.csv
        log.info("run %s%s", cfg.name or "(no name)", f", tags: {', '.join(cfg.tags)}" if cfg.tags else "")
    log.info(
        "%s: %.2fM parameters, %s, %d steps (%d per epoch), device %s%s, precision %s",
        cfg.model.name,
        sum(p.numel() for p in run.model.parameters()) / 1e6,
        labels,
        run.total_steps,
        run.data.steps_per_epoch,
        run.device,
        f" x {run.ctx.world_size} processes ({strategy})" if run.ctx.enabled else "",
        run.amp_dtype or torch.float32,
    )
    if not window.flops_per_image:
        model_counts = type(cfg.model).flops_per_image is not ModelConfig.flops_per_image  # the family counts
        objective_counts = type(cfg.objective).flops_per_image is not Objective.flops_per_image
        missing = (
            f"model.arch={cfg.model.arch} defines no flops_per_image"
            if objective_counts and not model_counts
            else f"objective={cfg.objective.name} defines no flops_per_image"
        )
        log.info("FLOPs per image unknown (%s): no TFLOP/s or MFU logged", missing)
    else:
        log.info(
            "%.2f GFLOP per training image; peak %s",
            window.flops_per_image / 1e9,
            f"{window.peak_tflops:g} TFLOP/s (MFU logged)"
            if window.peak_tflops
            else "unknown (set trainer.peak_tflops to log MFU)",
        )
