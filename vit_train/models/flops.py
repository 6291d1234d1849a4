"""Training FLOPs per image of a network, counted once on the meta device (for throughput and MFU)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from vit_train.schema.sections import ModelConfig


def training_flops(
    network: Callable[[], nn.Module], img_size: int, forward: Callable[[nn.Module, torch.Tensor], torch.Tensor]
) -> float:
    """Training FLOPs (forward and backward) of one image of side `img_size` through the network `network()`
    builds (on the meta device: no memory, no time), its logits by `forward(model, images)`; a model family's
    `flops_per_image` says which forward counts (models/families/)."""
    with torch.device("meta"):
        model = network()
        images = torch.empty(2, 3, img_size, img_size)  # two: a linear probe's BatchNorm needs a batch
    with FlopCounterMode(display=False) as counter:
        forward(model, images).sum().backward()
    return float(counter.get_total_flops()) / len(images)


def flops_per_image(cfg: ModelConfig, num_classes: int) -> float:
    """Training FLOPs of one image of the network model config `cfg` (a family's option) describes."""
    return cfg.flops_per_image(num_classes)
