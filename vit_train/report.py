"""What vit-eval reports (metrics, per-class accuracy, confusion matrix, figures) and the figures a
training run logs to TensorBoard every `trainer.viz_every` evaluations."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from .checkpoint import check_classes
from .config import run_dir_of
from .data import build_data
from .errors import ConfigError
from .evaluate import autocast_dtype, evaluate, pick_device
from .inference import Weights, load_for_inference
from .metrics import write_atomic
from .model import VisionTransformer
from .visualize import (attention_figure, attention_rollout, confusion_figure, denormalize, filters_figure,
                        heads_figure, images_figure, pooled_attention, position_figure, position_similarity,
                        save_figure)

log = logging.getLogger("vit_train")


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def first_images(loader, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The loader's first `count` images and labels (the same ones every time for a val loader)."""
    images, labels = [], []
    for batch, targets in loader:
        images.append(batch)
        labels.append(targets)
        if sum(len(b) for b in images) >= count:
            break
    return torch.cat(images)[:count], torch.cat(labels)[:count]


@torch.no_grad()
def model_figures(model: VisionTransformer, images: torch.Tensor, labels: torch.Tensor, class_names: list[str],
                  stats: tuple, confusion: torch.Tensor | None = None) -> dict[str, Any]:
    """Figures of `model` on normalised `images`: attention and rollout, per-head attention of the
    first image, position-embedding similarity, patch-embedding filters, and the confusion matrix.
    A model without attention (a ResNet) gets the confusion matrix only."""
    if not isinstance(model, VisionTransformer):
        return {"confusion": confusion_figure(confusion, class_names)} if confusion is not None else {}
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    logits, maps = model.attention_maps(images.to(device))
    model.train(was_training)
    maps = [m.float().cpu() for m in maps]
    prefix, mean_pool, readout = model.num_prefix_tokens, model.pool == "mean", model.readout_weights()
    attention = pooled_attention(maps, prefix, readout)  # (B, L, H, N)
    probs = logits.float().softmax(dim=1).cpu()
    titles = [f"{class_names[t]}\npred {class_names[p]} {probs[i, p]:.2f}"
              for i, (t, p) in enumerate(zip(labels.tolist(), probs.argmax(dim=1).tolist()))]
    shown = denormalize(images.cpu(), stats)
    figures = {
        "attention": attention_figure(shown, attention_rollout(maps, prefix, readout), attention.mean(dim=2), titles,
                                      mean_pool),
        "attention_heads": heads_figure(shown[0], attention[0], mean_pool),
        "position_similarity": position_figure(position_similarity(model.pos_embed.detach().cpu(), prefix)),
        "patch_filters": filters_figure(model.patch_embed.proj.weight.detach().cpu()),
    }
    if confusion is not None:
        figures["confusion"] = confusion_figure(confusion, class_names)
    return figures


def per_class_accuracy(confusion: torch.Tensor, class_names: list[str]) -> dict[str, float | None]:
    counts = confusion.sum(dim=1)
    return {name: 100 * confusion[i, i].item() / counts[i].item() if counts[i] else None
            for i, name in enumerate(class_names)}


def evaluate_checkpoint(path: str | Path, overrides: dict | None = None, weights: Weights = "auto",
                        attention_images: int = 8, out_dir: str | Path | None = None,
                        progress: bool = True) -> dict[str, Any]:
    """Evaluate a checkpoint on its val set (or another with the same classes); write metrics.json and
    the figures to `out_dir` (default: the run's eval/ folder); returns the metrics."""
    path = Path(path)
    model, cfg, ckpt, source = load_for_inference(path, weights, overrides)
    device = pick_device(cfg.trainer.device)
    data = build_data(cfg, device)
    check_classes(ckpt, data.class_names)
    model.to(device)
    metrics = evaluate(model, data.val_loader, device, autocast_dtype(cfg.trainer.precision, device), progress,
                       confusion=True)
    confusion = metrics.pop("confusion")
    out = Path(out_dir) if out_dir else run_dir_of(str(path)) / "eval"
    out.mkdir(parents=True, exist_ok=True)
    results = {"checkpoint": str(path), "step": ckpt["step"], "weights": source, "data": cfg.data.name,
               "images": int(confusion.sum()), **metrics,
               "per_class": per_class_accuracy(confusion, data.class_names), "confusion": confusion.tolist(),
               "figures": []}
    if attention_images > 0 and not have_matplotlib():
        log.warning("figures skipped: they need matplotlib (pip install 'vit-train[viz]')")
    elif attention_images > 0:
        images, labels = first_images(data.val_loader, attention_images)
        figures = model_figures(model, images, labels, data.class_names, data.stats, confusion)
        results["figures"] = [str(save_figure(fig, out / f"{name}.png")) for name, fig in figures.items()]
    write_atomic(out / "metrics.json", json.dumps(results, indent=2) + "\n")
    results["out_dir"] = str(out)
    return results


class TrainingVisuals:
    """Figures for TensorBoard during training: the model's figures on a fixed set of val images
    every `every` evaluations, and one batch of training images as the model sees them."""

    def __init__(self, tb, every: int, data, count: int = 8):
        if not have_matplotlib():
            raise ConfigError("trainer.viz_every needs matplotlib: pip install 'vit-train[viz]', or set "
                              "trainer.viz_every=null")
        self.tb, self.every, self.data = tb, every, data
        self.images, self.labels = first_images(data.val_loader, count)
        self.evals = 0
        self.batch_shown = False

    def after_eval(self, model: VisionTransformer, step: int, confusion: torch.Tensor | None) -> None:
        self.evals += 1
        if self.evals % self.every:
            return
        figures = model_figures(model, self.images, self.labels, self.data.class_names, self.data.stats, confusion)
        for name, fig in figures.items():
            self.tb.add_figure(f"figures/{name}", fig, step)

    def training_batch(self, images: torch.Tensor, targets: torch.Tensor, step: int, count: int = 16) -> None:
        """The first batch after augmentation (and MixUp/CutMix): titles give the target's main class and share."""
        self.batch_shown = True
        names = self.data.class_names
        if targets.ndim == 1:
            titles = [names[t] for t in targets[:count].tolist()]
        else:
            share, index = targets[:count].max(dim=1)
            titles = [f"{names[i]} {s:.2f}" for s, i in zip(share.tolist(), index.tolist())]
        fig = images_figure(denormalize(images[:count].cpu(), self.data.stats), titles)
        self.tb.add_figure("figures/training_images", fig, step)
