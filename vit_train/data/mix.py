"""Batch-level MixUp and CutMix (torchvision.transforms.v2), drawn from a seed per optimiser step."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchvision.transforms import v2

from vit_train.schema.sections import AugConfig


class BatchMix:
    """Mixes each training batch with probability `mix_prob`: CutMix with probability `switch_prob`
    when both are on, else MixUp. Targets come back as (B, num_classes) probabilities that sum to 1,
    whether or not the batch was mixed.

    The draw for step s depends only on (seed, s), so a resumed run mixes as the original did.
    """

    def __init__(self, aug: AugConfig, num_classes: int, seed: int):
        self.num_classes, self.seed = num_classes, seed
        self.mix_prob, self.switch_prob = aug.mix_prob, aug.switch_prob
        self.mixup = v2.MixUp(alpha=aug.mixup_alpha, num_classes=num_classes) if aug.mixup_alpha > 0 else None
        self.cutmix = v2.CutMix(alpha=aug.cutmix_alpha, num_classes=num_classes) if aug.cutmix_alpha > 0 else None

    @staticmethod
    def wanted(aug: AugConfig) -> bool:
        return aug.mix_prob > 0 and (aug.mixup_alpha > 0 or aug.cutmix_alpha > 0)

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.random.fork_rng(devices=[]):  # v2's MixUp/CutMix draw from the global CPU generator
            torch.random.default_generator.manual_seed((self.seed << 32) + step)
            if torch.rand(()) >= self.mix_prob:
                return images, F.one_hot(labels, self.num_classes).float()
            use_cutmix = self.mixup is None or (self.cutmix is not None and torch.rand(()) < self.switch_prob)
            return (self.cutmix if use_cutmix else self.mixup)(images, labels)
