"""Per-sample transforms (torchvision.transforms.v2) for training and evaluation."""

from __future__ import annotations

import torch
from torchvision.transforms import v2

from vit_train.config.schema import AugConfig
from vit_train.data.preprocess import eval_transform, spec



def policy(aug: AugConfig, small_images: bool) -> list[v2.Transform]:
    """The automatic augmentation policy `aug.name` selects (applied after crop and flip)."""
    if aug.name in ("randaug", "deit"):
        return [v2.RandAugment(num_ops=aug.randaug_n, magnitude=aug.randaug_m)]
    if aug.name == "autoaug":
        name = aug.autoaug_policy or ("cifar10" if small_images else "imagenet")
        return [v2.AutoAugment(v2.AutoAugmentPolicy(name))]
    if aug.name == "trivial":
        return [v2.TrivialAugmentWide()]
    return []


def build_transforms(aug: AugConfig, img_size: int, stats: tuple, native_size: int | None) -> tuple[v2.Compose, v2.Compose]:
    """(train, eval) transforms ending in normalised float tensors; eval is preprocess.py's.

    `native_size` set: inputs are uint8 tensors of that side (CIFAR, shapes), augmented by padded
    random crops. `native_size` None: inputs are PIL images of any size (image folders), augmented
    by RandomResizedCrop and evaluated by resize + centre crop. Training then runs the policy
    (RandAugment, ...) on uint8 pixels, normalises, and erases a random rectangle (with per-pixel
    noise, as DeiT does) with probability `aug.random_erasing`.
    """
    finish = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(*stats)]
    if native_size is not None:
        resize = [v2.Resize(img_size, antialias=True)] if native_size != img_size else []
        padding = img_size // 8 if aug.crop_padding is None else aug.crop_padding
        crop = [v2.RandomCrop(img_size, padding=padding), v2.RandomHorizontalFlip(aug.hflip)]
    else:
        resize = []
        crop = [v2.RandomResizedCrop(img_size, scale=(aug.scale_min, 1.0), antialias=True),
                v2.RandomHorizontalFlip(aug.hflip)]
    evaluate = eval_transform(spec(img_size, native_size is not None, stats))
    if aug.name == "none":
        train = list(evaluate.transforms)
    else:
        train = resize + crop + [v2.ToImage()] + policy(aug, native_size is not None) + finish
    if aug.random_erasing > 0:
        train.append(v2.RandomErasing(aug.random_erasing, value="random"))
    return v2.Compose(train), evaluate
