"""aug=autoaug: crop and flip, then AutoAugment with a learned policy (Cubuk et al. 2019;
torchvision.transforms.v2): CIFAR-10's, ImageNet's or SVHN's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from vit_train.data.aug.basic import Basic

if TYPE_CHECKING:
    import torch
    from torchvision.transforms import v2

    from vit_train.data.device import ops as device_ops


@dataclass
class AutoAug(Basic):
    on_device = True  # device_ops' AutoAugment, on the device pipeline too

    name: str = "autoaug"
    autoaug_policy: Literal["cifar10", "imagenet", "svhn"] | None = (
        None  # null: cifar10 for small images, else imagenet
    )

    def policy_name(self, small_images: bool) -> str:
        return self.autoaug_policy or ("cifar10" if small_images else "imagenet")

    def policy(self, small_images: bool) -> list[v2.Transform]:
        from torchvision.transforms import v2

        return [v2.AutoAugment(v2.AutoAugmentPolicy(self.policy_name(small_images)))]

    def device_plan(
        self, batch_size: int, height: int, width: int, generator: torch.Generator, small_images: bool = True
    ) -> device_ops.Plan:
        from vit_train.data.device import ops as device_ops

        return device_ops.auto_augment_plan(batch_size, height, width, self.policy_name(small_images), generator)
