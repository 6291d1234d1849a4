"""Per-sample transforms (torchvision.transforms.v2) for training and evaluation: an augmentation option's
(data/aug/, `Augmentation` in data/aug/base.py) with random erasing after it, and whether the on-device pipeline
does the option's."""

from __future__ import annotations

import torch
from torchvision.transforms import v2

from vit_train.data.aug.base import Augmentation
from vit_train.data.preprocess import Preprocessing, eval_transform, spec
from vit_train.schema.typed import overridden


def finish(stats: tuple) -> list[v2.Transform]:
    """To a float tensor in [0, 1], normalised by `stats` (mean, std)."""
    return [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(*stats)]


def build_transforms(
    aug: Augmentation, img_size: int, stats: tuple, native_size: int | None
) -> tuple[v2.Compose, v2.Compose]:
    """(train, eval) transforms ending in normalised float tensors; eval is preprocess.py's.

    `native_size` set: inputs are uint8 tensors of that side (CIFAR, shapes), evaluated at full frame.
    `native_size` None: inputs are PIL images of any size (image files), evaluated by resize + centre crop.
    Training runs the option's transforms, then erases a random rectangle (with per-pixel noise, as DeiT
    does) with probability `aug.random_erasing`.

    Both check the resize of each decoded image as the evaluation's (preprocess.py `Preprocessing`), so that a
    train image and a val image are refused alike, by the training process and by each loader worker however
    it was started: an image whose resize to the model's input would exceed the image-bomb pixel limit is an
    unreadable image (data.bad_images) in every split, even where RandomResizedCrop would bound it.
    """
    evaluate = eval_transform(spec(img_size, native_size is not None, stats))
    train = aug.train_transform(img_size, stats, native_size)
    if aug.random_erasing > 0:
        train.append(v2.RandomErasing(aug.random_erasing, value="random"))
    return Preprocessing(train, evaluate.resize), evaluate


def device_augmentation(aug: Augmentation) -> str | None:
    """None when the on-device pipeline (data/device/pipeline.py) does all of `aug`'s per-image work, else why not.
    Every option of data/aug/ it does, random erasing included; a transform it does not know it does not do:
    an option sets `on_device` where it defines `train_transform` (or, on Basic, `policy` with its
    `device_plan`), so a subclass that changes the transform, the policy or the device's draws and keeps its
    base's flag is done by the loader only."""
    cls = type(aug)
    declared = next((c for c in cls.__mro__ if "on_device" in c.__dict__), Augmentation)
    changed = [
        m
        for m in ("train_transform", "policy", "device_crop", "device_plan")
        if hasattr(declared, m) and overridden(cls, declared, m)
    ]
    if not declared.on_device or changed:
        return f"aug={aug.name}'s transform is done by the loader only"
    return None
