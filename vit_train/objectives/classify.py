"""The `classify` objective (objective.name=classify, the default): cross-entropy on the labels.

Its model is the classifier `model.arch` names (models/vit.py `build_model`: a ViT or a ResNet);
its score is the val top-1 (%), higher is better. It takes every model, `model.trainable` mode and
option that the config's own checks let through. The distill objective shares its model, its
evaluation and its score (distill.py). The interface is in objectives/__init__.py.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vit_train.config.schema import Config
from vit_train.models.flops import flops_per_image as classifier_flops
from vit_train.models.pretrained import at_size
from vit_train.models.vit import build_model as build_classifier
from vit_train.objectives.evaluate import evaluate as evaluate_logits

NAME = "classify"  # objective.name
METRIC = "top1"  # the score: val top-1 (%)
HIGHER_IS_BETTER = True
BEST_TEXT = "top-1"  # how the closing line names the best score
READS_LABELS = True
SECTIONS: tuple[str, ...] = ()  # config sections of its own: none


class Classify:
    """Cross-entropy of the model's logits against class indices or probabilities, with
    `aug.label_smoothing` (Szegedy et al. 2016, torch.nn.CrossEntropyLoss)."""

    def __init__(self, label_smoothing: float = 0.0):
        self.criterion = nn.CrossEntropyLoss(label_smoothing=label_smoothing)

    def __call__(self, module: nn.Module, images: torch.Tensor,
                 targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = module(images)  # (B, classes)
        return self.criterion(logits, targets), logits


def check(cfg: Config) -> None:
    """Everything the config's own checks let through trains a classifier: nothing to refuse. With
    `model.distilled` both heads learn the labels and the prediction is their mean, as timm fine-tunes a
    distilled DeiT on a new task (VisionTransformerDistilled without distilled training)."""


def build_model(cfg: Config, num_classes: int) -> nn.Module:
    """The classifier `cfg.model` describes, with `num_classes` outputs."""
    return build_classifier(cfg.model, num_classes)


def pretrained_target(model: nn.Module) -> nn.Module:
    """The module `model.pretrained` loads into: the whole classifier."""
    return model


def flops_per_image(cfg: Config, num_classes: int) -> float:
    """Training FLOPs (forward and backward) of one image (models/flops.py)."""
    return classifier_flops(cfg.model, num_classes)


def build_loss(cfg: Config, model: nn.Module, num_classes: int, class_names: list[str] | None = None) -> Classify:
    """The loss the loop calls: (module, images, targets) -> (loss, logits)."""
    return Classify(cfg.aug.label_smoothing)


def evaluate(model: nn.Module, loader, device: torch.device, amp_dtype: torch.dtype | None, cfg: Config,
             progress: bool = False, confusion: bool = False) -> dict[str, Any]:
    """{"loss", "top1", "top5"} over the val loader (evaluate.py); with `confusion`, also the
    (classes, classes) confusion matrix under "confusion"."""
    return evaluate_logits(model, loader, device, amp_dtype, progress, confusion)


def inference_model(cfg: Config, trained_img_size: int, num_classes: int, weights: dict) -> nn.Module:
    """The classifier rebuilt from a checkpoint's `weights`; at another `cfg.model.img_size` than it was
    trained at, learned positions are interpolated (models/pretrained.py at_size)."""
    model = build_model(cfg, num_classes)
    model.load_state_dict(at_size(model, weights))
    return model


def eval_text(metrics: dict[str, float], ema: dict[str, float] | None, classes: int | None = None) -> str:
    """An evaluation in the log line: loss, top-1, top-5 (and the EMA's top-1). With `classes` (the
    number of classes) of 5 or fewer, top-5 is left out: every image is then in its top 5, so it is
    100% whatever the model does (metrics keep "top5", top-min(5, classes) accuracy)."""
    ema_text = f", EMA top-1 {ema['top1']:.2f}%" if ema is not None else ""
    top5 = f", top-5 {metrics['top5']:.2f}%" if classes is None or classes > 5 else ""
    return f"val loss {metrics['loss']:.4f}, top-1 {metrics['top1']:.2f}%{top5}{ema_text}"


def score_text(score: float) -> str:
    return f"{score:.2f}%"


def data_text(num_classes: int) -> str:
    """What the run's start line says of the data's labels."""
    return f"{num_classes} classes"
