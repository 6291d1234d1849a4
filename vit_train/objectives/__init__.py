"""Training objectives (`objective.name`): the complete unit of variation. The loop, the evaluation,
best.pt, weights=auto, vit-eval and the CLI ask the run's objective and know nothing else of it.

An objective is a module (classify.py, distill.py, mae.py) with these names; `OBJECTIVES` below is
the table of them, and no module outside this package tells objectives apart by name:

    check(cfg)                               refuse (ConfigError, one line) the models (`model.arch`),
                                             `model.trainable` modes and options it cannot train; runs
                                             before any work (train/run.py build_run, the CLI's compose_config)
    build_model(cfg, num_classes)            the model it trains (mae: the autoencoder around the ViT)
    pretrained_target(model)                 the module `model.pretrained` loads into (mae: the encoder)
    flops_per_image(cfg, num_classes)        training FLOPs of one image (for TFLOP/s and MFU)
    build_loss(cfg, model, num_classes, class_names)  the loss the loop calls, see below
    evaluate(model, loader, device, amp_dtype, cfg, progress, confusion) -> metrics (floats; "confusion")
    METRIC, HIGHER_IS_BETTER                 the metrics key it is scored by, and its direction: best.pt,
                                             results.json's best, weights=auto (score.py)
    inference_model(cfg, trained_img_size, num_classes, weights)   the model rebuilt from a checkpoint
    eval_text(metrics, ema_metrics, classes), score_text(score), BEST_TEXT, data_text(num_classes)
                                             how the log reads an evaluation, the best score and the labels
    NAME, READS_LABELS                       its objective.name; whether the data must have labels
    SECTIONS                                 the config sections it owns (mae.*, distill.*)

The loss (`build_loss`, or `build_objective` here):

    loss, logits = objective(module, images, targets)        # once per micro-batch

- `model` is the plain model being trained (not wrapped); what the loss needs besides it (a frozen
  teacher, say) is built with it and kept on it. Anything that is trained belongs in the model
  itself, so that the optimiser, DDP, the EMA and the checkpoints see it.
- The call runs under the loop's `torch.autocast`. `module` is what the loop trains through (the
  model, or DDP / torch.compile around it): call it, not `model`, for the forward whose gradients
  count. `images`: (B, 3, H, W) normalised floats on the training device. `targets`: (B,) class
  indices, or (B, classes) probabilities after MixUp/CutMix (aug.mixup_alpha, aug.cutmix_alpha).
- `loss`: a scalar tensor, the mean over the micro-batch; the loop divides it by
  trainer.accum_steps, backpropagates it, clips, steps and skips non-finite steps.
- `logits`: (B, classes), from which the loop counts the training top-1, or None for an objective
  without class predictions (MAE's reconstruction): the loop then logs no training top-1.
- Optional `state_dict()` / `load_state_dict(state)`: state that must survive a restart for exact
  resume (a mask sampler's counter, a teacher's SHA-256), as plain tensors and primitives; it is
  saved in the checkpoint under "objective" and restored before the first step of a resumed run.
- Optional `terms()`: its own train metrics since the last call (distill: the two loss terms and the
  teacher agreement), logged with the train rows (metrics.jsonl, TensorBoard).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Iterable, Optional, Protocol

import torch
from torch import nn

from vit_train.config.schema import Config
from vit_train.config.unused_keys import ignored_keys as ignored_config_keys
from vit_train.errors import ConfigError
from vit_train.objectives import classify, distill, mae
from vit_train.objectives.classify import Classify  # noqa: F401  (the classification loss, for subclassing)

OBJECTIVES: dict[str, ModuleType] = {"classify": classify, "distill": distill, "mae": mae}  # each its NAME


class Objective(Protocol):
    def __call__(self, module: nn.Module, images: torch.Tensor,
                 targets: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]: ...


def named(name: str) -> ModuleType:
    """The objective called `name`; ConfigError naming the choices for any other."""
    if name not in OBJECTIVES:
        raise ConfigError(f"objective.name={name} is not available; choose one of {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]


def objective_of(cfg: Config) -> ModuleType:
    """The objective `cfg.objective.name` names."""
    return named(cfg.objective.name)


def check_objective(cfg: Config) -> ModuleType:
    """The config's objective, once it has accepted the config (else ConfigError, one line)."""
    objective = objective_of(cfg)
    objective.check(cfg)
    return objective


def build_objective(cfg: Config, model: nn.Module, num_classes: int, class_names: list[str] | None = None) -> Objective:
    """The loss of the objective `cfg.objective.name` names, for `model` (plain, unwrapped), `num_classes` classes
    (`class_names`, the data's in label order, when known: a teacher's are compared with them)."""
    return objective_of(cfg).build_loss(cfg, model, num_classes, class_names)


def objective_terms(objective: Objective) -> dict[str, float]:
    """The objective's own train metrics since the last call (distill: loss_label, loss_teacher,
    teacher_agreement), or none."""
    return objective.terms() if hasattr(objective, "terms") else {}


def objective_state(objective: Objective) -> dict[str, Any] | None:
    """What the checkpoint keeps of the objective's loss (None when it has no state)."""
    return objective.state_dict() if hasattr(objective, "state_dict") else None


def objective_window(objective: Objective) -> dict[str, float] | None:
    """The sums of the objective's own train metrics since the last `objective_terms` (plain data; None: it has
    none), kept in the checkpoint's "train_window" so a resumed run logs the uninterrupted run's row."""
    return objective.window_state() if hasattr(objective, "window_state") else None


def restore_objective(objective: Objective, ckpt: dict | None) -> None:
    """Give a resumed run's objective its saved state, if both have one, and its train metrics' window."""
    if ckpt and ckpt.get("objective") is not None and hasattr(objective, "load_state_dict"):
        objective.load_state_dict(ckpt["objective"])
    terms = ((ckpt or {}).get("train_window") or {}).get("terms")
    if terms and hasattr(objective, "load_window"):
        objective.load_window(terms)


def unread_sections(cfg: Config) -> dict[str, str]:
    """{config section: the choice that reads it} for the sections other objectives own (e.g. mae: objective=mae)."""
    return {section: f"objective={name}" for name, module in OBJECTIVES.items() if name != cfg.objective.name
            for section in module.SECTIONS}


def section_owner(section: str) -> str | None:
    """The objective whose own config section `section` is (e.g. mae.* is objective mae's), None for a shared one."""
    return next((name for name, module in OBJECTIVES.items() if section in module.SECTIONS), None)


def ignored_keys(cfg: Config, named_keys: Iterable[str] = ()) -> list[str]:
    """config/unused_keys.py's warnings, with the keys of the sections the chosen objective does not read."""
    return ignored_config_keys(cfg, named_keys, unread_sections(cfg))
