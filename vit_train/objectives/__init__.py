"""Training objectives: what the loss is (`objective.name`). The loop calls one and knows nothing else.

The interface, for adding an objective (distill, mae, ...):

    objective = build_objective(cfg, model, num_classes)     # once, after the model is built
    loss, logits = objective(module, images, targets)        # once per micro-batch

- `build_objective` returns the objective `cfg.objective.name` names. `model` is the plain model
  being trained (not wrapped); what the objective needs besides it (a frozen teacher, say) is
  built here and kept on the objective. Anything that is trained belongs in the model itself, so
  that the optimiser, DDP, the EMA and the checkpoints see it.
- The call runs under the loop's `torch.autocast`. `module` is what the loop trains through (the
  model, or DDP / torch.compile around it): call it, not `model`, for the forward whose gradients
  count. `images`: (B, 3, H, W) normalised floats on the training device. `targets`: (B,) class
  indices, or (B, classes) probabilities after MixUp/CutMix (aug.mixup_alpha, aug.cutmix_alpha).
- `loss`: a scalar tensor, the mean over the micro-batch; the loop divides it by
  trainer.accum_steps, backpropagates it, clips, steps and skips non-finite steps.
- `logits`: (B, classes), from which the loop counts the training top-1 (against the argmax of
  probability targets), or None for an objective without class predictions (MAE's reconstruction):
  the loop then logs no training top-1.
- Optional `state_dict()` / `load_state_dict(state)`: state that must survive a restart for exact
  resume (say a mask sampler's counter), as plain tensors and primitives; it is saved in the
  checkpoint under "objective" and restored before the first step of a resumed run.

Evaluation is not the objective's: the loop evaluates the model's logits (`evaluate.py`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol

import torch
from torch import nn

from vit_train.config.schema import Config
from vit_train.errors import ConfigError


class Objective(Protocol):
    def __call__(self, module: nn.Module, images: torch.Tensor,
                 targets: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]: ...


class Classify:
    """Cross-entropy of the model's logits against class indices or probabilities, with
    `aug.label_smoothing` (Szegedy et al. 2016, torch.nn.CrossEntropyLoss)."""

    def __init__(self, label_smoothing: float = 0.0):
        self.criterion = nn.CrossEntropyLoss(label_smoothing=label_smoothing)

    def __call__(self, module: nn.Module, images: torch.Tensor,
                 targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = module(images)  # (B, classes)
        return self.criterion(logits, targets), logits


def build_classify(cfg: Config, model: nn.Module, num_classes: int) -> Classify:
    return Classify(cfg.aug.label_smoothing)


def build_distill(cfg: Config, model: nn.Module, num_classes: int) -> Objective:
    from vit_train.objectives.distill import build_distill as build  # DeiT's distillation: a frozen teacher (distill.py)

    return build(cfg, model, num_classes)


def build_mae(cfg: Config, model: nn.Module, num_classes: int) -> Objective:
    from vit_train.objectives.mae import MaeObjective  # the masked autoencoder's own module (He et al. 2022)

    return MaeObjective(cfg)


BUILDERS: dict[str, Callable[[Config, nn.Module, int], Objective]] = {"classify": build_classify,
                                                                      "distill": build_distill, "mae": build_mae}


def objective_state(objective: Objective) -> dict[str, Any] | None:
    """What the checkpoint keeps of the objective (None when it has no state)."""
    return objective.state_dict() if hasattr(objective, "state_dict") else None


def restore_objective(objective: Objective, ckpt: dict | None) -> None:
    """Give a resumed run's objective its saved state, if both have one."""
    if ckpt and ckpt.get("objective") is not None and hasattr(objective, "load_state_dict"):
        objective.load_state_dict(ckpt["objective"])


def build_objective(cfg: Config, model: nn.Module, num_classes: int) -> Objective:
    """The objective `cfg.objective.name` names, for `model` (plain, unwrapped) over `num_classes` classes."""
    name = cfg.objective.name
    if name not in BUILDERS:
        raise ConfigError(f"objective.name={name} is not available; choose one of {', '.join(BUILDERS)}")
    return BUILDERS[name](cfg, model, num_classes)
