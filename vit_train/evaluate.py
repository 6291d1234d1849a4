"""Evaluation of a model over a data loader: loss, top-1 and top-5."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm


@torch.no_grad()
def evaluate(model: nn.Module, loader, device: torch.device, amp_dtype: torch.dtype | None,
             progress: bool = False, unreadable=None) -> dict[str, float]:
    """Mean cross-entropy, top-1 and top-5 accuracy (%) over the whole loader."""
    was_training = model.training
    model.eval()
    totals = torch.zeros(4, device=device, dtype=torch.float64)  # loss sum, top-1 hits, top-5 hits, count
    for images, targets, bad in tqdm(loader, desc="eval", leave=False, disable=not progress, dynamic_ncols=True):
        if unreadable is not None:
            unreadable.check(bad)
        images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            logits = model(images)
        hits = logits.topk(min(5, logits.shape[1]), dim=1).indices == targets[:, None]  # (B, k)
        totals += torch.stack([F.cross_entropy(logits.float(), targets, reduction="sum"), hits[:, 0].sum(),
                               hits.any(dim=1).sum(), torch.tensor(len(targets), device=device)]).double()
    model.train(was_training)
    loss, top1, top5, count = totals.tolist()
    return {"loss": loss / count, "top1": 100 * top1 / count, "top5": 100 * top5 / count}
