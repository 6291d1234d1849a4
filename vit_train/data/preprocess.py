"""The one evaluation preprocessing: how an image becomes the model's input outside training's
augmentation. Training's evaluation (loader and on-device pipelines), vit-eval and vit-predict all
use it, and checkpoints and exported weights carry its spec, so a model is always fed the same way.

The spec, as plain data: resize the short side to `resize` pixels, centre-crop `size`, scale to
[0, 1], normalise by `mean` and `std`. Image files use the ImageNet convention (resize to size / 0.875,
then crop); data sets of fixed-size arrays (CIFAR, shapes) are evaluated at full frame. A data set's
`eval_spec` (data/sources/base.py) gives its own.
"""

from __future__ import annotations

from typing import Any

import torch
from torchvision.transforms import v2

CROP_FRACTION = 0.875  # the centre crop's share of the resized side (ImageNet evaluation, since AlexNet)


def spec(size: int, full_frame: bool, stats: tuple) -> dict[str, Any]:
    """The spec for a model of input side `size`: full frame (small-image sets) or resize-and-crop;
    `stats`: the (mean, std) per channel the model was trained with."""
    mean, std = stats
    return {"size": size, "resize": size if full_frame else int(size / CROP_FRACTION), "mean": list(mean),
            "std": list(std)}


def eval_transform(spec: dict[str, Any]) -> v2.Compose:
    """The spec as a transform of a PIL image, or of a (3, H, W) or (B, 3, H, W) uint8 tensor, to
    normalised float32. Resizing happens before the conversion to a tensor, so a PIL image is
    resized by PIL, as the training loader's evaluation always did."""
    return v2.Compose([v2.Resize(spec["resize"], antialias=True), v2.CenterCrop(spec["size"]), v2.ToImage(),
                       v2.RGB(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(spec["mean"], spec["std"])])
