"""Per-sample transforms (torchvision.transforms.v2) for training and evaluation."""

from __future__ import annotations

import torch
from torchvision.transforms import v2

from ..config import AugConfig

CROP_FRACTION = 0.875  # eval: resize to size / 0.875, then centre-crop size (the ImageNet convention)


def build_transforms(aug: AugConfig, img_size: int, stats: tuple, native_size: int | None) -> tuple[v2.Compose, v2.Compose]:
    """(train, eval) transforms ending in normalised float tensors.

    `native_size` set: inputs are uint8 tensors of that side (CIFAR, shapes), augmented by padded
    random crops. `native_size` None: inputs are PIL images of any size (image folders), augmented
    by RandomResizedCrop and evaluated by resize + centre crop.
    """
    finish = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(*stats)]
    if native_size is not None:
        resize = [v2.Resize(img_size, antialias=True)] if native_size != img_size else []
        padding = img_size // 8 if aug.crop_padding is None else aug.crop_padding
        train = [v2.RandomCrop(img_size, padding=padding), v2.RandomHorizontalFlip(aug.hflip)]
        return v2.Compose(resize + (train if aug.name == "basic" else []) + finish), v2.Compose(resize + finish)
    evaluate = [v2.Resize(int(img_size / CROP_FRACTION), antialias=True), v2.CenterCrop(img_size)]
    if aug.name == "none":
        return v2.Compose(evaluate + finish), v2.Compose(evaluate + finish)
    train = [v2.RandomResizedCrop(img_size, scale=(aug.scale_min, 1.0), antialias=True),
             v2.RandomHorizontalFlip(aug.hflip)]
    return v2.Compose(train + finish), v2.Compose(evaluate + finish)
