"""Evaluation of a model over a data loader: loss, top-1, top-5 and the confusion matrix."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vit_train.runtime.distributed import sum_all
from vit_train.runtime.progress import progress_iter


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader,
    device: torch.device,
    amp_dtype: torch.dtype | None,
    progress: bool = False,
    confusion: bool = False,
) -> dict:
    """Mean cross-entropy, top-1 and top-5 accuracy (%) over the whole loader; with `confusion`,
    also the (classes, classes) confusion matrix (rows: true class, columns: predicted) as "confusion".
    A loader that yields nothing (a stop signal ended it before its first batch: train/batches.py's
    UntilStop) gives NaN figures and no matrix; the trainer drops such an evaluation."""
    was_training = model.training
    model.eval()
    totals = torch.zeros(4, device=device, dtype=torch.float64)  # loss sum, top-1 hits, top-5 hits, count
    matrix = None
    for images, targets in progress_iter(loader, "eval", progress):
        images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            logits = model(images)
        classes = logits.shape[1]
        if confusion:
            pairs = torch.bincount(targets * classes + logits.argmax(dim=1), minlength=classes * classes)
            matrix = pairs if matrix is None else matrix + pairs
        hits = logits.topk(min(5, classes), dim=1).indices == targets[:, None]  # (B, k)
        totals += torch.stack(
            [
                F.cross_entropy(logits.float(), targets, reduction="sum"),
                hits[:, 0].sum(),
                hits.any(dim=1).sum(),
                torch.tensor(len(targets), device=device),
            ]
        ).double()
    model.train(was_training)
    sum_all(totals)  # with several processes, each evaluated its share: the sums are the whole set's
    if confusion and matrix is not None:
        matrix = sum_all(matrix)
    loss, top1, top5, count = totals.tolist()
    count = count or float("nan")
    metrics = {"loss": loss / count, "top1": 100 * top1 / count, "top5": 100 * top5 / count}
    if confusion and matrix is not None:
        metrics["confusion"] = matrix.reshape(classes, classes).cpu()
    return metrics
