"""Optimiser with weight-decay (and layer-wise lr decay) groups, and the per-step learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from vit_train.schema.sections import OptimConfig, ScheduleConfig

# The ViT's learned tokens and positions (timm's no_weight_decay(), reg_token included: timm issue #2712).
NO_DECAY_NAMES = ("pos_embed", "cls_token", "dist_token", "reg_token")
EMBEDDING_PREFIXES = (*NO_DECAY_NAMES, "patch_embed.")


def layer_id(name: str, depth: int) -> int:
    """A parameter's layer for layer-wise lr decay (BEiT, MAE): 0 for the patch embedding, positions and
    prefix tokens, i + 1 for blocks.i, depth + 1 for the final norm and heads. (timm's group_matcher
    differs in one place: its final norm shares the last block's layer.)"""
    if name.startswith(EMBEDDING_PREFIXES):
        return 0
    if name.startswith("blocks."):
        return int(name.split(".")[1]) + 1
    return depth + 1


def param_groups(model: nn.Module, weight_decay: float, layer_decay: float | None = None) -> list[dict]:
    """Weight decay on matrices and conv kernels only: never on norms, biases, positions or prefix tokens.

    With `layer_decay` (BEiT, Bao et al. 2022; MAE fine-tuning) each group also has an `lr_scale`:
    decay ** (depth + 1 - layer_id), so block i trains at lr x decay ** (depth - i), the embeddings
    at the deepest decay, decay ** (depth + 1), and the final norm and head at lr. Frozen parameters
    are left out (they take no part in the layer count either).
    """
    depth = len(model.blocks) if layer_decay is not None else 0
    groups: dict[tuple[int, bool], dict] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        decays = not (p.ndim <= 1 or name in NO_DECAY_NAMES)
        layer = layer_id(name, depth) if layer_decay is not None else 0
        if (layer, decays) not in groups:
            scale = layer_decay ** (depth + 1 - layer) if layer_decay is not None else 1.0
            groups[layer, decays] = {"params": [], "weight_decay": weight_decay if decays else 0.0, "lr_scale": scale}
        groups[layer, decays]["params"].append(p)
    if layer_decay is None:  # the two plain groups, decayed first, even when one is empty
        return [groups.get((0, d), {"params": [], "weight_decay": weight_decay if d else 0.0, "lr_scale": 1.0})
                for d in (True, False)]
    return [groups[key] for key in sorted(groups)]


def build_optimizer(model: nn.Module, cfg: OptimConfig, device: torch.device,
                    lr: float | None = None, capturable: bool = False) -> torch.optim.Optimizer:
    """AdamW or SGD over `param_groups`; `lr` is the peak rate (Config.lr), by default cfg.lr; each
    group starts at lr x its lr_scale (the schedule keeps that factor). `capturable`: for a compiled step
    (train/compiled_step.py), AdamW's multi-tensor form with its step counts on the device, not the fused one."""
    groups = param_groups(model, cfg.weight_decay, cfg.layer_decay)
    lr = cfg.lr if lr is None else lr
    for group in groups:
        group["lr"] = lr * group["lr_scale"]
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=cfg.momentum, nesterov=True, foreach=capturable or None)
    if capturable:
        return torch.optim.AdamW(groups, lr=lr, betas=tuple(cfg.betas), eps=cfg.eps, foreach=True, capturable=True)
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
    `lr` is the peak rate (Config.lr), by default optim.lr; a group with an `lr_scale` (layer decay)
    follows the same curve times its scale, min_lr included (as timm and MAE do).
    """
    lr = optim.lr if lr is None else lr
    warmup = min(round(cfg.warmup_epochs * steps_per_epoch), total_steps)
    min_ratio = cfg.min_lr / lr
    cosine = cfg.name == "cosine"
    for group in optimizer.param_groups:
        group["initial_lr"] = lr * group.get("lr_scale", 1.0)
    scheduler = LambdaLR(optimizer, lambda step: lr_factor(step, warmup, total_steps, min_ratio, cosine),
                         last_epoch=start_step - 1)
    scheduler._step_count = start_step + 1  # what an uninterrupted run's scheduler counts (it checks call order)
    return scheduler
