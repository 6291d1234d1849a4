"""aug=trivial: crop and flip, then TrivialAugmentWide (Müller and Hutter 2021): one random operation at a
random magnitude, no knobs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vit_train.data.aug.basic import Basic

if TYPE_CHECKING:
    import torch
    from torchvision.transforms import v2

    from vit_train.data.device import ops as device_ops


@dataclass
class Trivial(Basic):
    on_device = True  # device_ops' TrivialAugmentWide, on the device pipeline too

    name: str = "trivial"

    def policy(self, small_images: bool) -> list[v2.Transform]:
        from torchvision.transforms import v2

        return [v2.TrivialAugmentWide()]

    def device_plan(
        self, batch_size: int, height: int, width: int, generator: torch.Generator, small_images: bool = True
    ) -> device_ops.Plan:
        from vit_train.data.device import ops as device_ops

        return device_ops.trivial_augment_wide_plan(batch_size, height, width, generator)
