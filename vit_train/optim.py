"""Optimiser with weight-decay groups, and the per-step learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from .config import OptimConfig, ScheduleConfig

NO_DECAY_NAMES = ("pos_embed", "cls_token")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices and conv kernels only: never on norms, biases, pos_embed, cls_token."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or name in NO_DECAY_NAMES else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, cfg: OptimConfig, device: torch.device,
                    lr: float | None = None) -> torch.optim.Optimizer:
    """AdamW or SGD over `param_groups`; `lr` is the peak rate (Config.lr), by default cfg.lr."""
    groups = param_groups(model, cfg.weight_decay)
    lr = cfg.lr if lr is None else lr
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=cfg.momentum, nesterov=True)
    fused = device.type == "cuda"  # one kernel for the whole update on GPUs
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(cfg.betas), eps=cfg.eps, fused=fused)


def lr_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float, cosine: bool) -> float:
    """Multiplier of the peak lr for optimiser step `step` (0-based): linear warmup, then cosine.

    Warmup rises to 1 at step warmup_steps - 1; the cosine falls from 1 to `min_ratio` at the
    last step, total_steps - 1.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if not cosine:
        return 1.0
    peak = max(warmup_steps - 1, 0)  # the step at which the lr peaks
    progress = min(1.0, (step - peak) / max(1, total_steps - 1 - peak))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, optim: OptimConfig, cfg: ScheduleConfig,
                    steps_per_epoch: int, total_steps: int, start_step: int = 0, lr: float | None = None) -> LambdaLR:
    """Stepped once per optimiser step; spans `total_steps` (the epochs, or the max_steps cap).

    The schedule is a pure function of the step, so a resumed run rebuilds it at `start_step`
    from its current config: a run resumed with more epochs continues on the longer curve.
    `lr` is the peak rate (Config.lr), by default optim.lr.
    """
    lr = optim.lr if lr is None else lr
    warmup = min(round(cfg.warmup_epochs * steps_per_epoch), total_steps)
    min_ratio = cfg.min_lr / lr
    cosine = cfg.name == "cosine"
    for group in optimizer.param_groups:
        group["initial_lr"] = lr
    scheduler = LambdaLR(optimizer, lambda step: lr_factor(step, warmup, total_steps, min_ratio, cosine),
                         last_epoch=start_step - 1)
    scheduler._step_count = start_step + 1  # what an uninterrupted run's scheduler counts (it checks call order)
    return scheduler
