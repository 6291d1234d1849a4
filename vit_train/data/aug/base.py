"""What an augmentation option is (aug=NAME): `Augmentation`. Each option is one module in this folder: its keys,
their checks and its transform (torchvision.transforms.v2, imported when the transform is built); setting its own
`name` registers it (schema/typed.py `Option`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from vit_train.schema.sections import AugConfig
from vit_train.schema.typed import overridden

if TYPE_CHECKING:
    import torch
    from torchvision.transforms import v2

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

    def device_plan(
        self, batch_size: int, height: int, width: int, generator: torch.Generator, small_images: bool = True
    ) -> Plan | None:
        """The device pipeline's draws of the option's policy (the loader path's, after the crop and flip, on
        uint8 pixels) for a batch of (height, width) images, from `generator` (data/device/ops.py); None: no
        policy (nothing is drawn). `small_images`: the policy of small-image sets (CIFAR, shapes), else that of
        image files (data.decode=gpu), as `train_transform` picks it by its `native_size`."""
        return None
