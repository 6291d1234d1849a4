"""objective=classify, the default: cross-entropy on the labels.

Its model is the classifier the model family (`model.arch`, models/families/) builds: a ViT or a ResNet; its
score is the val top-1 (%), higher is better. It takes every model, `model.trainable` mode and option
that the config's own checks let through: with `model.distilled` both heads learn the labels and the
prediction is their mean, as timm fine-tunes a distilled DeiT on a new task. Distillation
(distill.py) is a classify with a teacher.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vit_train.objectives.base import Loss, Objective

if TYPE_CHECKING:
    import torch
    from torch import nn

    from vit_train.schema.config import Config


class CrossEntropy(Loss):
    """Cross-entropy of the model's logits against class indices or probabilities, with
    `aug.label_smoothing` (Szegedy et al. 2016, torch.nn.CrossEntropyLoss)."""

    def __init__(self, label_smoothing: float = 0.0):
        from torch import nn

        self.criterion = nn.CrossEntropyLoss(label_smoothing=label_smoothing)

    def __call__(
        self, module: nn.Module, images: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = module(images)  # (B, classes)
        return self.criterion(logits, targets), logits


@dataclass
class Classify(Objective):
    default = True
    title = "classification"
    metric = "top1"  # the score: val top-1 (%)
    higher_is_better = True
    best_text = "top-1"
    results = {
        "best_top1": "maximize",
        "final_top1": "maximize",
        "final_top5": "maximize",
        "final_loss": "minimize",
        "final_ema_top1": "maximize",
    }
    summary_columns = {"best_top1": ("best top-1", 2), "final_top1": ("final top-1", 2)}

    name: str = "classify"

    def build_model(self, cfg: Config, num_classes: int) -> nn.Module:
        """The classifier `cfg.model` describes, with `num_classes` outputs."""
        return cfg.model.build(num_classes)

    def flops_per_image(self, cfg: Config, num_classes: int) -> float:
        """Training FLOPs (forward and backward) of one image (models/flops.py)."""
        return cfg.model.flops_per_image(num_classes)

    def build_loss(
        self, cfg: Config, model: nn.Module, num_classes: int, class_names: list[str] | None = None, rank: int = 0
    ) -> Loss:
        return CrossEntropy(cfg.aug.label_smoothing)

    def evaluate(
        self,
        model: nn.Module,
        loader,
        device: torch.device,
        amp_dtype: torch.dtype | None,
        cfg: Config,
        progress: bool = False,
        confusion: bool = False,
    ) -> dict[str, Any]:
        """{"loss", "top1", "top5"} over the val loader (evaluate.py); with `confusion`, also the
        (classes, classes) confusion matrix under "confusion"."""
        from vit_train.objectives.evaluate import evaluate as evaluate_logits

        return evaluate_logits(model, loader, device, amp_dtype, progress, confusion)

    def eval_text(self, metrics: dict[str, float], ema: dict[str, float] | None, classes: int | None = None) -> str:
        """An evaluation in the log line: loss, top-1, top-5 (and the EMA's top-1). With `classes` (the
        number of classes) of 5 or fewer, top-5 is left out: every image is then in its top 5, so it is
        100% whatever the model does (metrics keep "top5", top-min(5, classes) accuracy)."""
        ema_text = f", EMA top-1 {ema['top1']:.2f}%" if ema is not None else ""
        top5 = f", top-5 {metrics['top5']:.2f}%" if classes is None or classes > 5 else ""
        return f"val loss {metrics['loss']:.4f}, top-1 {metrics['top1']:.2f}%{top5}{ema_text}"

    @classmethod
    def score_text(cls, score: float) -> str:
        return f"{score:.2f}%"

    def results_of(self, best: float | None, metrics: dict[str, Any]) -> dict[str, Any]:
        return {
            "best_top1": best,
            "final_top1": metrics.get("top1"),
            "final_top5": metrics.get("top5"),
            "final_loss": metrics.get("loss"),
            "final_ema_top1": metrics.get("ema_top1"),
        }

    def figures(
        self,
        model: nn.Module,
        images: torch.Tensor,
        labels: torch.Tensor,
        class_names: list[str],
        stats: tuple,
        confusion: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """Attention, rollout, per-head attention, positions, patch filters, and the confusion matrix (a ResNet:
        the confusion matrix only; viz/figures.py)."""
        from vit_train.viz.figures import model_figures

        return model_figures(model, images, labels, class_names, stats, confusion)

    def evaluation(self, metrics: dict[str, Any], class_names: list[str]) -> dict[str, Any]:
        """The images counted, loss, top-1, top-5, per-class top-1 and the confusion matrix (rows: true class)."""
        metrics = dict(metrics)
        confusion = metrics.pop("confusion")
        counts = confusion.sum(dim=1)
        per_class = {
            name: 100 * confusion[i, i].item() / counts[i].item() if counts[i] else None
            for i, name in enumerate(class_names)
        }
        return {"images": int(confusion.sum()), **metrics, "per_class": per_class, "confusion": confusion.tolist()}

    @classmethod
    def report(cls, results: dict[str, Any], what: str) -> str:
        """`what` was evaluated, with its image count; the metrics (top-5 only with more than 5 classes: with
        fewer it is 100% by definition) and a table of per-class top-1 with each class's image count."""
        width = max(columns(name) for name in [*results["per_class"], "class"])
        counts = [sum(row) for row in results["confusion"]]
        top5 = f"   top-5 {results['top5']:.2f}%" if len(results["per_class"]) > 5 else ""
        lines = [
            f"{what}, {results['images']} images",
            f"top-1 {results['top1']:.2f}%{top5}   loss {results['loss']:.4f}\n",
            f"{'class':<{width}}  top-1    images",
        ]
        lines += [
            f"{name}{' ' * (width - columns(name))}  {'-' if acc is None else f'{acc:5.1f}%'}  {count:>7}"
            for (name, acc), count in zip(results["per_class"].items(), counts, strict=True)
        ]
        return "\n".join(lines)


def columns(text: str) -> int:
    """Terminal columns `text` takes: East Asian wide and full-width characters (猫, ｶ) take two, combining
    marks none (Unicode's East Asian Width, UAX #11)."""
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)
