"""aug=deit: DeiT's training augmentation (Touvron et al. 2021, facebookresearch/deit main.py defaults):
crop and flip, RandAugment, then per batch MixUp (alpha 0.8) or CutMix (alpha 1.0), each chosen with
probability 0.5, random erasing 0.25 with per-pixel noise, label smoothing 0.1. DeiT's RandAugment is
timm's rand-m9-mstd0.5-inc1 (magnitude drawn around 9); torchvision's uses a fixed magnitude and a
slightly different operation set."""

from __future__ import annotations

from dataclasses import dataclass

from vit_train.data.aug.randaug import RandAug


@dataclass
class Deit(RandAug):
    name: str = "deit"
    mixup_alpha: float = 0.8
    cutmix_alpha: float = 1.0
    random_erasing: float = 0.25
    label_smoothing: float = 0.1
