"""aug=trivial: crop and flip, then TrivialAugmentWide (Müller and Hutter 2021): one random operation at a
random magnitude, no knobs."""

from __future__ import annotations

from dataclasses import dataclass

from torchvision.transforms import v2

from vit_train.data.aug.basic import Basic


@dataclass
class Trivial(Basic):
    on_device = False

    name: str = "trivial"

    def policy(self, small_images: bool) -> list[v2.Transform]:
        return [v2.TrivialAugmentWide()]
