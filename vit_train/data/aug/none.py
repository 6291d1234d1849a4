"""aug=none: no augmentation; images are only resized (image files: resized and centre-cropped) and
normalised, as in evaluation. Batch mixing and random erasing still apply when set."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vit_train.data.aug.base import Augmentation

if TYPE_CHECKING:
    from torchvision.transforms import v2


@dataclass
class NoAug(Augmentation):
    on_device = True  # the device pipeline only normalises (and erases, with aug.random_erasing)

    name: str = "none"

    def train_transform(self, img_size: int, stats: tuple, native_size: int | None) -> list[v2.Transform]:
        from vit_train.data.preprocess import eval_transform, spec

        return list(eval_transform(spec(img_size, native_size is not None, stats)).transforms)
