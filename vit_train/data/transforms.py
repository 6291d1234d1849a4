"""Per-sample transforms (torchvision.transforms.v2) for training and evaluation, and what an augmentation
option is (`Augmentation`). Each option is one module in data/aug/ (aug=NAME): its keys, their checks and
its transform; setting its own `name` registers it (schema/typed.py `Option`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torchvision.transforms import v2

from vit_train.data.preprocess import Preprocessing, eval_transform, spec
from vit_train.schema.sections import AugConfig
from vit_train.schema.typed import overridden

if TYPE_CHECKING:
    from vit_train.data.device.ops import Plan


@dataclass
class Augmentation(AugConfig):
    """An augmentation option. `train_transform` gives its per-sample transforms up to normalised floats;
    random erasing (aug.random_erasing) follows whatever the option. `on_device`: the on-device pipeline
    (data/device/pipeline.py) does it too, with `device_crop`'s padding and flip probability and `device_plan`'s
    policy (random erasing it always does)."""

    on_device: ClassVar[bool] = False

    @classmethod
    def unimplemented(cls) -> list[str]:
        return [] if overridden(cls, Augmentation, "train_transform") else ["train_transform"]

    def train_transform(self, img_size: int, stats: tuple, native_size: int | None) -> list[v2.Transform]:
        """Transforms of one image to a normalised float tensor. `native_size` set: a uint8 tensor of that side
        (CIFAR, shapes); None: a PIL image of any size (image files)."""
        raise NotImplementedError

    def device_crop(self, img_size: int) -> tuple[int, float] | None:
        """(crop padding in pixels, horizontal flip probability) on the device pipeline; None: neither."""
        return None

    def device_plan(self, batch_size: int, height: int, width: int, generator: torch.Generator,
                    small_images: bool = True) -> Plan | None:
        """The device pipeline's draws of the option's policy (the loader path's, after the crop and flip, on
        uint8 pixels) for a batch of (height, width) images, from `generator` (data/device/ops.py); None: no
        policy (nothing is drawn). `small_images`: the policy of small-image sets (CIFAR, shapes), else that of
        image files (data.decode=gpu), as `train_transform` picks it by its `native_size`."""
        return None


def finish(stats: tuple) -> list[v2.Transform]:
    """To a float tensor in [0, 1], normalised by `stats` (mean, std)."""
    return [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(*stats)]


def build_transforms(aug: Augmentation, img_size: int, stats: tuple, native_size: int | None) -> tuple[v2.Compose, v2.Compose]:
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
    changed = [m for m in ("train_transform", "policy", "device_crop", "device_plan")
               if hasattr(declared, m) and overridden(cls, declared, m)]
    if not declared.on_device or changed:
        return f"aug={aug.name}'s transform is done by the loader only"
    return None
