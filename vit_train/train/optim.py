"""The optimiser's parameter groups (weight decay, layer-wise lr decay) and the per-step learning-rate schedule;
the optimiser and the schedule themselves are the options optim=NAME (vit_train/optim/) and schedule=NAME
(vit_train/schedules/)."""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from vit_train.schema.sections import ModelConfig, OptimConfig, ScheduleConfig

log = logging.getLogger("vit_train")

# The ViT's learned tokens and positions (timm's no_weight_decay(), reg_token included: timm issue #2712).
NO_DECAY_NAMES = ("pos_embed", "cls_token", "dist_token", "reg_token")


def param_groups(
    model: nn.Module, weight_decay: float, layer_decay: float | None = None, family: ModelConfig | None = None
) -> list[dict]:
    """Weight decay on matrices and conv kernels only: never on norms, biases, positions or prefix tokens.

    With `layer_decay` (BEiT, Bao et al. 2022; MAE fine-tuning) each group also has an `lr_scale`:
    decay ** (layers - 1 - layer), the layer of each parameter and their count by the model's `family`
    (models/families/: for a ViT block i trains at lr x decay ** (depth - i), the embeddings at the deepest
    decay, decay ** (depth + 1), and the final norm and head at lr). Frozen parameters are left out (they take no
    part in the layer count either). Raises ValueError for a `layer_decay` without a `family`.
    """
    if layer_decay is not None and family is None:
        raise ValueError("layer-wise lr decay reads the model family's layers: pass family=cfg.model")
    layers = family.layers(model) if layer_decay is not None else 1
    groups: dict[tuple[int, bool], dict] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        decays = not (p.ndim <= 1 or name in NO_DECAY_NAMES)
        layer = family.layer_of(name, layers) if layer_decay is not None else 0
        if (layer, decays) not in groups:
            scale = layer_decay ** (layers - 1 - layer) if layer_decay is not None else 1.0
            groups[layer, decays] = {"params": [], "weight_decay": weight_decay if decays else 0.0, "lr_scale": scale}
        groups[layer, decays]["params"].append(p)
    if layer_decay is None:  # the two plain groups, decayed first, even when one is empty
        return [
            groups.get((0, d), {"params": [], "weight_decay": weight_decay if d else 0.0, "lr_scale": 1.0})
            for d in (True, False)
        ]
    return [groups[key] for key in sorted(groups)]


def build_optimizer(
    model: nn.Module,
    cfg: OptimConfig,
    device: torch.device,
    lr: float | None = None,
    capturable: bool = False,
    family: ModelConfig | None = None,
) -> torch.optim.Optimizer:
    """optim=NAME's optimiser over `param_groups`; `lr` is the peak rate (Config.lr), by default cfg.lr; each
    group starts at lr x its lr_scale (the schedule keeps that factor). `capturable`: for a compiled step
    (train/compiled_step.py); `family`: the model's (layer-wise lr decay reads its layers)."""
    groups = param_groups(model, cfg.weight_decay, cfg.layer_decay, family)
    lr = cfg.lr if lr is None else lr
    for group in groups:
        group["lr"] = lr * group["lr_scale"]
    return cfg.build(groups, lr, device, capturable)


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    optim: OptimConfig,
    cfg: ScheduleConfig,
    steps_per_epoch: int,
    total_steps: int,
    start_step: int = 0,
    lr: float | None = None,
    restart_at: int = 0,
    lp_lr: float | None = None,
) -> LambdaLR:
    """Stepped once per optimiser step; spans `total_steps` (the epochs, or the max_steps cap).

    The schedule (schedule=NAME's `factor`) is a pure function of the step, so a resumed run rebuilds it at
    `start_step` from its current config: a run resumed with more epochs continues on the longer curve.
    `lr` is the peak rate (Config.lr), by default optim.lr; a group with an `lr_scale` (layer decay)
    follows the same curve times its scale, min_lr included (as timm and MAE do). `restart_at` (LP-FT's
    change, model.lp_epochs, in steps; 0 = none): the steps before it follow the schedule over their own span (up to
    `total_steps` where the run ends first), warmup included, and the schedule starts again for the steps after it. `lp_lr`: the peak rate of the steps before it
    (model.lp_lr, batch-scaled; None = `lr`), each group's times its lr_scale as after it.
    """
    lr = optim.lr if lr is None else lr
    asked = round(cfg.warmup_epochs * steps_per_epoch)
    if asked > total_steps:
        log.warning(
            "schedule.warmup_epochs=%g is %d steps, longer than the run's %d: the lr rises for the whole run "
            "and reaches its peak (%g) only at the last step, with no %s after it; lower "
            "schedule.warmup_epochs or train longer",
            cfg.warmup_epochs,
            asked,
            total_steps,
            lr,
            cfg.name,
        )
    for group in optimizer.param_groups:
        group["initial_lr"] = lr * group.get("lr_scale", 1.0)
    if restart_at > 0:  # a run that ends inside the probe stage (trainer.max_steps) has its curve up to the end
        span = min(restart_at, total_steps)
        first, rest = min(asked, span), min(asked, max(0, total_steps - restart_at))
        probe_lr = lr if lp_lr is None else lp_lr

        def factor(step: int) -> float:  # LambdaLR's step: the optimiser steps taken (0 for the first)
            if step < restart_at:
                return cfg.factor(step, first, span, probe_lr) * probe_lr / lr
            return cfg.factor(step - restart_at, rest, total_steps - restart_at, lr)

    else:
        warmup = min(asked, total_steps)

        def factor(step: int) -> float:
            return cfg.factor(step, warmup, total_steps, lr)

    scheduler = LambdaLR(optimizer, factor, last_epoch=start_step - 1)
    scheduler._step_count = start_step + 1  # what an uninterrupted run's scheduler counts (it checks call order)
    return scheduler
