"""Five options written as a user writes their own, outside vit_train (docs/extending.md): a data set, two
objectives, a model family and a callback, each one class in this one module; importing it registers data=stripes,
objective=hinge, objective=brier, model.arch=tinycnn and callbacks=[best_so_far].
tests/config/test_new_options.py copies it into a temporary folder beside one YAML file per option.

- data=stripes: images of horizontal or vertical stripes (2 classes), generated in memory; its keys are
  train_size, val_size and stripe_width.
- objective=hinge: a classifier trained with the multi-class hinge loss (torch.nn.MultiMarginLoss), scored
  by its val error (%, lower is better); its key is margin; results.json holds best_error and final_error.
- objective=brier: a classifier trained on the Brier score (the squared error of its probabilities), defining
  only what an objective must (metric, build_model, build_loss, evaluate): every other name is the base's.
- model.arch=tinycnn (model=tinycnn): a small CNN, one strided convolution, average pooling and a linear head; its
  key is width. It defines what a family should for every door: build, FLOPs, its architecture from a saved config
  and from a state dict's tensors (so its weights are recognised, and another width refused by name).
- callbacks=[best_so_far]: docs/extending.md's callback, best_so_far.json in the run directory (the best value of a
  metric and its step); its key is metric.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vit_train.callbacks.base import Callback, CallbackConfig
from vit_train.data.datasets import TensorImages
from vit_train.data.sources.base import DataSource
from vit_train.models.flops import flops_per_image
from vit_train.models.pretrained import at_size
from vit_train.objectives.base import Loss, Objective
from vit_train.objectives.evaluate import evaluate as evaluate_logits
from vit_train.schema.sections import ModelConfig
from vit_train.schema.typed import positive


def stripes(count: int, size: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` images (count, 3, size, size) uint8 of stripes `width` pixels wide, and their labels: 0 horizontal,
    1 vertical; each image has its own colours and phase."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(count) % 2
    phase = torch.randint(0, 2 * width, (count, 1, 1), generator=g)
    position = torch.arange(size)
    rows = ((position[None, :, None] + phase) // width) % 2  # (count, size, 1): horizontal stripes
    columns = ((position[None, None, :] + phase) // width) % 2  # (count, 1, size): vertical stripes
    on = torch.where(labels[:, None, None] == 0, rows.expand(-1, -1, size), columns.expand(-1, size, -1))
    colours = torch.randint(0, 256, (count, 2, 3), generator=g, dtype=torch.uint8)
    images = torch.where(on[:, None].bool(), colours[:, 0, :, None, None], colours[:, 1, :, None, None])
    return images, labels


@dataclass
class Stripes(DataSource):
    """data=stripes: horizontal or vertical stripes."""

    stats = ((0.5, 0.5, 0.5), (0.29, 0.29, 0.29))
    loading_keys = ("train_size",)

    name: str = "stripes"
    train_size: int = 64  # training images
    val_size: int = 32  # validation images
    stripe_width: int = 2  # pixels

    def check(self, cfg: Any) -> None:
        super().check(cfg)
        positive(("data.train_size", self.train_size), ("data.val_size", self.val_size),
                 ("data.stripe_width", self.stripe_width))

    def splits(self, img_size: int, labels: bool = True) -> tuple:
        train = TensorImages(*stripes(self.train_size, img_size, self.stripe_width, seed=1))
        val = TensorImages(*stripes(self.val_size, img_size, self.stripe_width, seed=2))
        return train, val, ["horizontal", "vertical"], img_size


class MultiMargin(Loss):
    """The multi-class hinge loss of the logits; probabilities (after MixUp/CutMix) count as their argmax."""

    def __init__(self, margin: float):
        self.criterion = nn.MultiMarginLoss(margin=margin)

    def __call__(self, module: nn.Module, images: torch.Tensor, targets: torch.Tensor) -> tuple:
        logits = module(images)
        return self.criterion(logits.float(), targets.argmax(1) if targets.ndim == 2 else targets), logits


@dataclass
class Hinge(Objective):
    """objective=hinge: a classifier trained with the hinge loss, scored by its val error."""

    title = "hinge classification"
    metric = "error"
    higher_is_better = False
    best_text = "val error"
    results = {"best_error": "minimize", "final_error": "minimize"}
    summary_columns = {"best_error": ("best error", 2), "final_error": ("final error", 2)}

    name: str = "hinge"
    margin: float = 1.0  # the hinge's margin

    def check(self, cfg: Any) -> None:
        positive(("objective.margin", self.margin))

    def build_model(self, cfg: Any, num_classes: int) -> nn.Module:
        return cfg.model.build(num_classes)

    def flops_per_image(self, cfg: Any, num_classes: int) -> float:
        return flops_per_image(cfg.model, num_classes)

    def build_loss(self, cfg: Any, model: nn.Module, num_classes: int, class_names=None, rank: int = 0) -> Loss:
        return MultiMargin(self.margin)

    def evaluate(self, model, loader, device, amp_dtype, cfg, progress=False, confusion=False) -> dict[str, Any]:
        metrics = evaluate_logits(model, loader, device, amp_dtype, progress)
        return {"error": 100.0 - metrics["top1"]}

    def inference_model(self, cfg: Any, trained_img_size: int, num_classes: int, weights: dict) -> nn.Module:
        model = self.build_model(cfg, num_classes)
        model.load_state_dict(at_size(model, weights))
        return model

    def eval_text(self, metrics: dict, ema: dict | None, classes: int | None = None) -> str:
        return f"val error {metrics['error']:.2f}%" + (f", EMA {ema['error']:.2f}%" if ema is not None else "")

    @classmethod
    def score_text(cls, score: float) -> str:
        return f"{score:.2f}%"

    def results_of(self, best: float | None, metrics: dict) -> dict:
        return {"best_error": best, "final_error": metrics.get("error")}

    @classmethod
    def report(cls, results: dict, what: str) -> str:
        return f"{what}: val error {results['error']:.2f}%"


class SquaredError(Loss):
    """The Brier score: the squared distance of the softmax probabilities from the (possibly mixed) targets."""

    def __call__(self, module: nn.Module, images: torch.Tensor, targets: torch.Tensor) -> tuple:
        logits = module(images)
        wanted = targets if targets.ndim == 2 else F.one_hot(targets, logits.shape[1]).float()
        return (logits.float().softmax(1) - wanted).pow(2).sum(1).mean(), logits


@dataclass
class Brier(Objective):
    """objective=brier: the least an objective defines."""

    metric = "brier"
    higher_is_better = False

    name: str = "brier"

    def build_model(self, cfg: Any, num_classes: int) -> nn.Module:
        return cfg.model.build(num_classes)

    def build_loss(self, cfg: Any, model: nn.Module, num_classes: int, class_names=None, rank: int = 0) -> Loss:
        return SquaredError()

    @torch.no_grad()
    def evaluate(self, model, loader, device, amp_dtype, cfg, progress=False, confusion=False) -> dict[str, Any]:
        was_training, total, count = model.training, 0.0, 0
        model.eval()
        for images, labels in loader:
            probs = model(images.to(device)).float().softmax(1)
            total += (probs - F.one_hot(labels.to(device), probs.shape[1])).pow(2).sum(1).sum().item()
            count += len(labels)
        model.train(was_training)
        return {"brier": total / count}


class TinyNet(nn.Module):
    """(B, 3, H, W) -> (B, classes): a 3x3 stride-2 convolution of `width` channels, ReLU, average pool, `head`."""

    def __init__(self, width: int, num_classes: int):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, width, 3, stride=2, padding=1), nn.ReLU())
        self.head = nn.Linear(width, num_classes) if num_classes else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


@dataclass
class TinyCNN(ModelConfig):
    """model.arch=tinycnn."""

    ARCHITECTURE = ("model.width",)
    refused_on_resume = {**ModelConfig.refused_on_resume, "width": "the weights have another shape"}
    NO_FIT = ("arch", "width")

    arch: str = "tinycnn"
    width: int = 8  # convolution channels

    def check(self, cfg: Any) -> None:
        super().check(cfg)
        positive(("model.width", self.width))

    def build(self, num_classes: int) -> nn.Module:
        return TinyNet(self.width, num_classes)

    def flops_per_image(self, num_classes: int) -> float:
        from vit_train.models.flops import training_flops

        return training_flops(lambda: self.build(num_classes), self.img_size, lambda m, x: m(x))

    @classmethod
    def architecture(cls, saved: dict[str, Any]) -> dict[str, Any]:
        return {"model.arch": "tinycnn", "model.width": saved.get("width", 8)}

    @classmethod
    def reveals(cls, weights: dict[str, torch.Tensor]) -> dict[str, Any] | None:
        conv = weights.get("features.0.weight")
        return {"model.arch": "tinycnn", "model.width": conv.shape[0]} if conv is not None else None


@dataclass
class BestSoFarConfig(CallbackConfig):
    """callbacks=[best_so_far]: best_so_far.json in the run directory, the best value of a metric and its step."""

    name = "best_so_far"

    metric: str = "val/top1"  # an evaluation's "split/name"

    def build(self, cfg: Any) -> Callback:
        return BestSoFar(self.metric)


class BestSoFar(Callback):
    def __init__(self, metric: str):
        self.metric, self.best, self.step, self.run_dir = metric, None, None, None

    def on_train_start(self, info):
        self.run_dir = info.run_dir

    def on_eval_end(self, step, metrics):
        if self.best is None or metrics[self.metric] > self.best:
            self.best, self.step = metrics[self.metric], step

    def on_train_end(self, results, status):
        import json

        record = {"metric": self.metric, "best": self.best, "step": self.step, "status": status}
        (self.run_dir / "best_so_far.json").write_text(json.dumps(record) + "\n")

    def state_dict(self):
        return {"best": self.best, "step": self.step}

    def load_state_dict(self, state):
        self.best, self.step = state["best"], state["step"]
