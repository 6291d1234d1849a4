"""The crop of decoded images of any size on the device (data.decode=gpu), as the loader path's training
transform does it: torchvision's RandomResizedCrop and horizontal flip, or (aug=none) the evaluation's resize and
centre crop. The parameters are read from the option's own transforms (`Geometry.of`), so they are the loader
path's (scale, ratio, interpolation, antialias, flip probability); RandomResizedCrop's window is chosen by
torchvision's rule (`crop_windows`) from uniforms drawn for a whole batch; each image is cropped and resized by
torchvision's own kernel (`resized_crop`: the same result as torchvision's transform given the same window, bit
for bit on the same device), then the batch is stacked and flipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torchvision.transforms import InterpolationMode, v2
from torchvision.transforms.v2 import functional as TF

from vit_train.errors import ConfigError

ATTEMPTS = 10  # RandomResizedCrop's tries at a window before its central-crop fallback (torchvision's)


@dataclass(frozen=True)
class Geometry:
    """What the option's transform does to an image of any size before its policy: a RandomResizedCrop to `size`
    (`scale`, `ratio`, `interpolation`, `antialias`) and a flip with probability `hflip`; or, with `resize` set,
    a resize of the shorter side to `resize` and a centre crop to `size` (aug=none: evaluation's)."""

    size: int
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    interpolation: InterpolationMode = InterpolationMode.BILINEAR
    antialias: bool = True
    hflip: float = 0.0
    resize: int | None = None

    @classmethod
    def of(cls, transforms: list, aug: str) -> Geometry:
        """The geometry of a training transform's list (an option's `train_transform` for image files). Raises
        ConfigError (one line) when it starts with something else."""
        first, second = (transforms + [None, None])[:2]
        if isinstance(first, v2.RandomResizedCrop) and first.size[0] == first.size[1]:
            flip = second.p if isinstance(second, v2.RandomHorizontalFlip) else 0.0
            return cls(
                first.size[0],
                tuple(first.scale),
                tuple(first.ratio),
                InterpolationMode(first.interpolation),
                bool(first.antialias),
                flip,
            )
        if isinstance(first, v2.Resize) and isinstance(second, v2.CenterCrop) and len(first.size) == 1:
            return cls(second.size[0], resize=first.size[0])
        raise ConfigError(
            f"data.decode=gpu crops on the device what starts with a square RandomResizedCrop (and a "
            f"flip) or a Resize and CenterCrop; aug={aug}'s transform starts with "
            f"{type(first).__name__}; use data.decode=cpu"
        )

    @property
    def random(self) -> bool:
        """Whether the crop draws anything (RandomResizedCrop), else it is evaluation's resize and centre crop."""
        return self.resize is None


def crop_uniforms(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RandomResizedCrop's draws for n images, on the generator's device, in this order: the area fractions'
    uniforms (n, ATTEMPTS), the log aspect ratios' (n, ATTEMPTS), the window positions' (n, 2); float32 in [0, 1)."""
    device = generator.device
    return (
        torch.rand(n, ATTEMPTS, generator=generator, device=device),
        torch.rand(n, ATTEMPTS, generator=generator, device=device),
        torch.rand(n, 2, generator=generator, device=device),
    )


def crop_windows(
    sizes: torch.Tensor, uniforms: tuple, scale: tuple[float, float], ratio: tuple[float, float]
) -> torch.Tensor:
    """(n, 4) int64 windows (top, left, height, width) of images of `sizes` (n, 2) (height, width), by
    torchvision's RandomResizedCrop rule from `uniforms` (`crop_uniforms`, any device; computed on the CPU):
    attempt t takes the area fraction scale[0] + u * (scale[1] - scale[0]) and the aspect ratio
    exp(log ratio[0] + u * (log ratio[1] - log ratio[0])) (float32, as torchvision draws them), width and height
    round(sqrt(area * aspect)), round(sqrt(area / aspect)) (half to even, Python's round); the first window that
    fits is placed at floor(u * (height - h + 1)), floor(u * (width - w + 1)) (torchvision's randint). When none
    fits: the central crop of the whole image clamped to the ratio range, torchvision's fallback."""
    area_u, ratio_u, where_u = (u.cpu() for u in uniforms)
    height, width = sizes[:, 0:1].double(), sizes[:, 1:2].double()
    fraction = (torch.tensor(scale[0]) + area_u * (scale[1] - scale[0])).double()  # float32 arithmetic, then double
    log_ratio = torch.log(torch.tensor(ratio))
    aspect = torch.exp(log_ratio[0] + ratio_u * (log_ratio[1] - log_ratio[0])).double()
    target = height * width * fraction
    w, h = torch.sqrt(target * aspect).round(), torch.sqrt(target / aspect).round()  # (n, ATTEMPTS)
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = fits.int().argmax(1, keepdim=True)
    w, h = w.gather(1, first).squeeze(1), h.gather(1, first).squeeze(1)
    height, width = height.squeeze(1), width.squeeze(1)
    top = (where_u[:, 0].double() * (height - h + 1)).floor()
    left = (where_u[:, 1].double() * (width - w + 1)).floor()
    windows = torch.stack([top, left, h, w], 1).long()
    for k in (~fits.any(1)).nonzero().flatten().tolist():  # rare: a very long or tall image
        windows[k] = torch.tensor(central_window(int(height[k]), int(width[k]), ratio))
    return windows


def central_window(height: int, width: int, ratio: tuple[float, float]) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop fallback: the whole image, clamped to the ratio range, centred."""
    if width / height < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif width / height > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def resized_crops(
    images: list[torch.Tensor], windows: torch.Tensor, geometry: Geometry, native_uint8: bool | None = None
) -> torch.Tensor:
    """(n, 3, size, size) uint8: each (3, H, W) uint8 image's window (top, left, height, width) resized to
    geometry.size, per image (the images differ in size), as torchvision's resized_crop resizes it on their
    device: on the CPU by its native uint8 kernel; elsewhere (a GPU) torchvision resizes uint8 as float32 and
    rounds, which is done here with one float32 output and one rounding for the batch, the same numbers with
    fewer kernels. `native_uint8` (default: images on the CPU) picks the first way."""
    size = [geometry.size, geometry.size]
    bilinear = geometry.interpolation == InterpolationMode.BILINEAR
    native = images[0].device.type == "cpu" if native_uint8 is None else native_uint8
    if native or not bilinear:  # torchvision's own call (another interpolation: its own handling)
        return torch.stack(
            [
                TF.resized_crop(
                    image, *window, size, interpolation=geometry.interpolation, antialias=geometry.antialias
                )
                for image, window in zip(images, windows.tolist(), strict=True)
            ]
        )
    out = torch.empty(len(images), 3, *size, device=images[0].device)
    for k, (image, (top, left, height, width)) in enumerate(zip(images, windows.tolist(), strict=True)):
        window = image[None, :, top : top + height, left : left + width].float()  # (1, 3, h, w)
        out[k] = F.interpolate(window, size=size, mode="bilinear", align_corners=False, antialias=geometry.antialias)[0]
    return out.round_().to(torch.uint8)  # values in [0, 255]: bilinear weights are non-negative


def resize_centre_crops(images: list[torch.Tensor], resize: int, size: int) -> torch.Tensor:
    """(n, 3, size, size) uint8: each image's shorter side resized to `resize` (bilinear, antialiased: evaluation's
    Resize), then its centre `size` x `size`, stacked."""
    return torch.stack([TF.center_crop(TF.resize(image, [resize], antialias=True), [size]) for image in images])


def flip(images: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) images with those where `flips` (B,) bool is true mirrored left to right."""
    return torch.where(flips.to(images.device)[:, None, None, None], images.flip(-1), images)


def crop(images: list[torch.Tensor], geometry: Geometry, uniforms: tuple | None, flips: torch.Tensor | None):
    """The geometry applied to a list of decoded (3, H, W) uint8 images: (B, 3, size, size) uint8."""
    if not geometry.random:
        return resize_centre_crops(images, geometry.resize, geometry.size)
    sizes = torch.tensor([list(image.shape[-2:]) for image in images])
    out = resized_crops(images, crop_windows(sizes, uniforms, geometry.scale, geometry.ratio), geometry)
    return out if flips is None else flip(out, flips)
