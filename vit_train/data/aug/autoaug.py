"""aug=autoaug: crop and flip, then AutoAugment with a learned policy (Cubuk et al. 2019;
torchvision.transforms.v2): CIFAR-10's, ImageNet's or SVHN's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from torchvision.transforms import v2

from vit_train.data.aug.basic import Basic


@dataclass
class AutoAug(Basic):
    on_device = False

    name: str = "autoaug"
    autoaug_policy: Optional[Literal["cifar10", "imagenet", "svhn"]] = None  # null: cifar10 for small images, else imagenet

    def policy(self, small_images: bool) -> list[v2.Transform]:
        name = self.autoaug_policy or ("cifar10" if small_images else "imagenet")
        return [v2.AutoAugment(v2.AutoAugmentPolicy(name))]
