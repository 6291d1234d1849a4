"""Training FLOPs per image of a classifier, counted once on the meta device (for throughput and MFU)."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from vit_train.schema.sections import ModelConfig
from vit_train.models.vit import build_model, set_grad_checkpointing


def flops_per_image(cfg: ModelConfig, num_classes: int) -> float:
    """Training FLOPs (forward and backward) for one image through the full ViT, every token through
    every block, as model FLOP utilisation counts them. With class-token pooling the loop's forward
    skips most of the last block for the patch tokens, so it executes ~6% fewer FLOPs than this."""
    with torch.device("meta"):
        model = build_model(cfg, num_classes)
        set_grad_checkpointing(model, False)  # model FLOPs: grad checkpointing's recomputation is not counted
        images = torch.empty(2, 3, cfg.img_size, cfg.img_size)  # two: a linear probe's BatchNorm needs a batch
    with FlopCounterMode(display=False) as counter:
        logits = model.forward_head(model.forward_features(images)) if cfg.arch == "vit" else model(images)
        logits.sum().backward()
    return float(counter.get_total_flops()) / len(images)
