"""aug=basic, the default: a random crop and a horizontal flip. Small images (CIFAR, shapes): a random
crop of the padded image; image files: RandomResizedCrop(scale=(scale_min, 1)). The options with an
automatic policy (randaug, autoaug, trivial, deit) add it after the crop and flip: `policy` on the loader
path, `device_plan` (data/device/ops.py) on the device pipeline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vit_train.data.aug.base import Augmentation
from vit_train.schema.sections import DataConfig
from vit_train.schema.typed import fraction, options, require

if TYPE_CHECKING:
    from torchvision.transforms import v2

    from vit_train.schema.sections import RunConfig


@dataclass
class Basic(Augmentation):
    default = True
    on_device = True  # padded crop and flip (and a subclass's policy, by its device_plan), on the device pipeline too

    name: str = "basic"
    hflip: float = 0.5  # probability of a horizontal flip
    crop_padding: int | None = None  # small images: crop padding in pixels; null = img_size // 8
    scale_min: float = 0.08  # image files: smallest area fraction of RandomResizedCrop

    def check(self, cfg: RunConfig) -> None:
        super().check(cfg)
        fraction("aug.hflip", self.hflip)
        require(0.0 < self.scale_min <= 1.0, f"aug.scale_min must be in (0, 1], got {self.scale_min}")

    def ignored(self, cfg: RunConfig) -> list[tuple[str, str, str]]:
        key = "crop_padding" if cfg.data.encoded else "scale_min"  # padded crops of arrays, resized crops of files
        users = [
            name
            for name, source in options("data").items()
            if issubclass(source, DataConfig) and source.encoded == (key == "scale_min")
        ]
        return super().ignored(cfg) + [(key, f"aug={self.name}, data={cfg.data.name}", f"data={', '.join(users)}")]

    def padding(self, img_size: int) -> int:
        return img_size // 8 if self.crop_padding is None else self.crop_padding

    def policy(self, small_images: bool) -> list[v2.Transform]:
        """The automatic augmentation policy applied after the crop and flip, on uint8 pixels: none here."""
        return []

    def train_transform(self, img_size: int, stats: tuple, native_size: int | None) -> list[v2.Transform]:
        from torchvision.transforms import v2

        from vit_train.data.transforms import finish

        if native_size is not None:
            resize = [v2.Resize(img_size, antialias=True)] if native_size != img_size else []
            crop = [
                *resize,
                v2.RandomCrop(img_size, padding=self.padding(img_size)),
                v2.RandomHorizontalFlip(self.hflip),
            ]
        else:
            crop = [
                v2.RandomResizedCrop(img_size, scale=(self.scale_min, 1.0), antialias=True),
                v2.RandomHorizontalFlip(self.hflip),
            ]
        return crop + [v2.ToImage()] + self.policy(native_size is not None) + finish(stats)

    def device_crop(self, img_size: int) -> tuple[int, float] | None:
        return self.padding(img_size), self.hflip
