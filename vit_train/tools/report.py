"""What vit-eval reports: metrics, per-class accuracy, the confusion matrix and figures."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from vit_train.outputs.checkpoint import check_classes
from vit_train.config.schema import run_dir_of
from vit_train.data import build_data
from vit_train.extras import available
from vit_train.runtime.device import autocast_dtype, pick_device
from vit_train.objectives import objective_of
from vit_train.outputs.checkpoint import checkpoint_file
from vit_train.tools.inference import Weights, load_for_inference
from vit_train.outputs.metrics import write_atomic
from vit_train.models.mae import MaskedAutoencoder
from vit_train.viz.figures import first_images, model_figures, reconstruction_figures, save_figure

log = logging.getLogger("vit_train")


def per_class_accuracy(confusion: torch.Tensor, class_names: list[str]) -> dict[str, float | None]:
    counts = confusion.sum(dim=1)
    return {name: 100 * confusion[i, i].item() / counts[i].item() if counts[i] else None
            for i, name in enumerate(class_names)}


def evaluate_checkpoint(path: str | Path, overrides: dict | None = None, weights: Weights = "auto",
                        attention_images: int = 8, out_dir: str | Path | None = None,
                        progress: bool = True) -> dict[str, Any]:
    """Evaluate a checkpoint on its val set (or another with the same classes); write metrics.json and
    the figures to `out_dir` (default: the run's eval/ folder); returns the metrics."""
    path = checkpoint_file(path)
    model, cfg, ckpt, source = load_for_inference(path, weights, overrides)
    objective = objective_of(cfg)
    device = pick_device(cfg.trainer.device)
    data = build_data(cfg, device, labels=objective.READS_LABELS)
    check_classes(ckpt, data.class_names)
    model.to(device)
    # the run's own evaluation (objectives/): a classifier's with its confusion matrix, MAE's reconstruction loss
    metrics = objective.evaluate(model, data.val_loader, device, autocast_dtype(cfg.trainer.precision, device), cfg,
                                 progress, confusion=True)
    if "confusion" not in metrics:
        return report_pretraining(model, cfg, ckpt, source, data, metrics, path, attention_images, out_dir)
    confusion = metrics.pop("confusion")
    out = Path(out_dir) if out_dir else run_dir_of(str(path)) / "eval"
    out.mkdir(parents=True, exist_ok=True)
    results = {"checkpoint": str(path), "step": ckpt["step"], "weights": source, "data": cfg.data.name,
               "images": int(confusion.sum()), **metrics,
               "per_class": per_class_accuracy(confusion, data.class_names), "confusion": confusion.tolist(),
               "figures": []}
    if attention_images > 0 and not available("matplotlib"):
        log.warning("figures skipped: they need matplotlib (pip install 'vit-train[viz]')")
    elif attention_images > 0:
        images, labels = first_images(data.val_loader, attention_images)
        figures = model_figures(model, images, labels, data.class_names, data.stats, confusion)
        results["figures"] = [str(save_figure(fig, out / f"{name}.png")) for name, fig in figures.items()]
    write_atomic(out / "metrics.json", json.dumps(results, indent=2) + "\n")
    results["out_dir"] = str(out)
    return results


def report_pretraining(model: MaskedAutoencoder, cfg, ckpt: dict, source: str, data, metrics: dict[str, float],
                       path: Path, images: int, out_dir: str | Path | None) -> dict[str, Any]:
    """vit-eval on a masked-autoencoder checkpoint: its `metrics` (the val reconstruction loss with the
    training run's fixed val masks), and the original / masked / reconstruction figure of the first
    `images` val images."""
    out = Path(out_dir) if out_dir else run_dir_of(str(path)) / "eval"
    out.mkdir(parents=True, exist_ok=True)
    results = {"checkpoint": str(path), "step": ckpt["step"], "weights": source, "data": cfg.data.name,
               "objective": objective_of(cfg).NAME, **metrics, "figures": []}
    if images > 0 and not available("matplotlib"):
        log.warning("figures skipped: they need matplotlib (pip install 'vit-train[viz]')")
    elif images > 0:
        figures = reconstruction_figures(model, first_images(data.val_loader, images)[0], data.stats)
        results["figures"] = [str(save_figure(fig, out / f"{name}.png")) for name, fig in figures.items()]
    write_atomic(out / "metrics.json", json.dumps(results, indent=2) + "\n")
    results["out_dir"] = str(out)
    return results
