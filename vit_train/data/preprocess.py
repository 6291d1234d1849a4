"""The one evaluation preprocessing: how an image becomes the model's input outside training's
augmentation. Training's evaluation (loader and on-device pipelines), vit-eval and vit-predict all
use it, and checkpoints and exported weights carry its spec, so a model is always fed the same way.

The spec, as plain data: resize the short side to `resize` pixels, centre-crop `size`, scale to
[0, 1], normalise by `mean` and `std`. Image files use the ImageNet convention (resize to size / 0.875,
then crop); data sets of fixed-size arrays (CIFAR, shapes) are evaluated at full frame. A data set's
`eval_spec` (data/sources/base.py) gives its own.

The resize is the one step whose output is not bounded by the input's pixel count: an image of an extreme
aspect ratio (20000x3) within the image-bomb limit would become a giant one (256 x 1.7 M pixels). Every
transform built here (`Preprocessing`) therefore makes decoding/image.py refuse, as an image bomb, an image whose
resize would exceed the limit (`decode.check_resizes`), in the process that builds it and in each loader
worker that unpickles it. RandomResizedCrop (training's augmentation) crops first and is bounded.
"""

from __future__ import annotations

from typing import Any

import torch
from torchvision.transforms import v2

from vit_train.data.decoding import image as decode

CROP_FRACTION = 0.875  # the centre crop's share of the resized side (ImageNet evaluation, since AlexNet)


def spec(size: int, full_frame: bool, stats: tuple) -> dict[str, Any]:
    """The spec for a model of input side `size`: full frame (small-image sets) or resize-and-crop;
    `stats`: the (mean, std) per channel the model was trained with."""
    mean, std = stats
    return {
        "size": size,
        "resize": size if full_frame else int(size / CROP_FRACTION),
        "mean": list(mean),
        "std": list(std),
    }


class Preprocessing(v2.Compose):
    """v2.Compose of the transforms of images decoded by decoding/image.py, which resize them (at most) to a shorter
    side of `resize` pixels: built, or unpickled in a loader worker (spawn, forkserver), it sets decoding/image.py's
    resize check (`decode.check_resizes`), so that an image whose resize would exceed the pixel limit is refused
    when decoded, as an image bomb, and goes to the unreadable-image policy instead of exhausting memory."""

    def __init__(self, transforms: list, resize: int):
        super().__init__(transforms)
        self.resize = resize
        decode.check_resizes(resize)

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        decode.check_resizes(self.resize)


def eval_transform(spec: dict[str, Any]) -> Preprocessing:
    """The spec as a transform of a PIL image, or of a (3, H, W) or (B, 3, H, W) uint8 tensor, to
    normalised float32. Resizing happens before the conversion to a tensor, so a PIL image is
    resized by PIL, as the training loader's evaluation always did; images decoded afterwards whose
    resize would exceed the pixel limit are refused as image bombs (`Preprocessing`)."""
    return Preprocessing(
        [
            v2.Resize(spec["resize"], antialias=True),
            v2.CenterCrop(spec["size"]),
            v2.ToImage(),
            v2.RGB(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(spec["mean"], spec["std"]),
        ],
        spec["resize"],
    )
