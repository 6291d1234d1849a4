"""aug=randaug: crop and flip, then RandAugment (Cubuk et al. 2020; torchvision.transforms.v2):
randaug_n random operations per image at magnitude randaug_m (0-30). RandAugment(2, 10) is big_vision's
plain-ViT setting."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vit_train.data.aug.basic import Basic
from vit_train.schema.typed import require

if TYPE_CHECKING:
    import torch
    from torchvision.transforms import v2

    from vit_train.data.device import ops as device_ops
    from vit_train.schema.sections import RunConfig


@dataclass
class RandAug(Basic):
    on_device = True  # device_ops' RandAugment, on the device pipeline too

    name: str = "randaug"
    randaug_n: int = 2  # RandAugment operations per image
    randaug_m: int = 9  # RandAugment magnitude, 0-30

    def check(self, cfg: RunConfig) -> None:
        super().check(cfg)
        require(0 <= self.randaug_m <= 30, f"aug.randaug_m must be in [0, 30], got {self.randaug_m}")
        require(self.randaug_n >= 0, f"aug.randaug_n must be >= 0, got {self.randaug_n}")

    def policy(self, small_images: bool) -> list[v2.Transform]:
        from torchvision.transforms import v2

        return [v2.RandAugment(num_ops=self.randaug_n, magnitude=self.randaug_m)]

    def device_plan(
        self, batch_size: int, height: int, width: int, generator: torch.Generator, small_images: bool = True
    ) -> device_ops.Plan:
        from vit_train.data.device import ops as device_ops

        return device_ops.rand_augment_plan(batch_size, height, width, self.randaug_n, self.randaug_m, generator)
