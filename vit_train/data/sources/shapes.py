"""`shapes`: a procedural data set of ten coloured geometric shapes on noisy backgrounds.

Built in, so the quick start, demos and tests need no download. Learnable (a small ViT gets far
above chance in a minute on a CPU) and spatial (the class is the shape, not the colour), so
attention maps mean something. Images are a pure function of (seed, split, index count, size).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vit_train.data.sources.base import DataSource
from vit_train.schema.typed import positive

if TYPE_CHECKING:
    import torch

    from vit_train.schema.sections import RunConfig

CLASS_NAMES = ["circle", "square", "diamond", "ring", "plus", "cross", "triangle", "hbar", "vbar", "frame"]
SHAPES_STATS = ((0.28, 0.28, 0.28), (0.236, 0.236, 0.236))  # measured on 10k images; the same at any size


@dataclass
class Shapes(DataSource):
    """data=shapes, the default: generated in memory at the model's image size (32x32 in 4-pixel patches by
    default), 10 balanced classes."""

    default = True
    stats = SHAPES_STATS
    loading_keys = ("train_size",)

    name: str = "shapes"
    train_size: int = 10000  # number of training images
    val_size: int = 2000  # number of validation images
    seed: int = 0  # seed of the generated images (independent of the run's seed)

    def check(self, cfg: RunConfig) -> None:
        super().check(cfg)
        positive(("data.train_size", self.train_size), ("data.val_size", self.val_size))

    def splits(self, img_size: int, labels: bool = True) -> tuple:
        from vit_train.data.datasets import TensorImages

        train = TensorImages(*generate_shapes(self.train_size, img_size, seed=2 * self.seed))
        val = TensorImages(*generate_shapes(self.val_size, img_size, seed=2 * self.seed + 1))
        return train, val, list(CLASS_NAMES), img_size


def _masks(u: torch.Tensor, v: torch.Tensor, label: int) -> torch.Tensor:
    """Inside-shape mask from coordinates normalised by the shape's centre and radius."""
    au, av = u.abs(), v.abs()
    box = au.maximum(av)
    r = (u**2 + v**2).sqrt()
    return [
        r < 1.0,  # circle
        box < 0.85,  # square
        au + av < 1.1,  # diamond
        (r > 0.55) & (r < 1.0),  # ring
        ((au < 0.3) & (av < 1.0)) | ((av < 0.3) & (au < 1.0)),  # plus
        (((u - v).abs() < 0.4) | ((u + v).abs() < 0.4)) & (box < 0.9),  # cross (x)
        (v > -1.0) & (v < 0.8) & (au < (v + 1.0) * 0.5),  # triangle, apex up
        (av < 0.3) & (au < 1.0),  # horizontal bar
        (au < 0.3) & (av < 1.0),  # vertical bar
        (box < 0.9) & (box > 0.55),  # hollow square
    ][label]


def generate_shapes(count: int, img_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` images (count, 3, img_size, img_size) uint8 and their labels (count,) int64, balanced."""
    images, labels, _ = generate_shapes_with_masks(count, img_size, seed)
    return images, labels


def generate_shapes_with_masks(count: int, img_size: int, seed: int) -> tuple[torch.Tensor, ...]:
    """generate_shapes' images and labels, and each shape's pixel mask (count, img_size, img_size) bool."""
    import torch

    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(count) % len(CLASS_NAMES)
    labels = labels[torch.randperm(count, generator=g)]
    centre = (0.3 + 0.4 * torch.rand(count, 2, generator=g)) * img_size  # (count, 2): x, y
    radius = (0.18 + 0.14 * torch.rand(count, generator=g)) * img_size
    background = 0.4 * torch.rand(count, 3, generator=g)  # dark, random colour
    foreground = 0.55 + 0.45 * torch.rand(count, 3, generator=g)  # bright, random colour: shape != colour
    noise = 0.08 * torch.randn(count, 3, img_size, img_size, generator=g)

    pixels = torch.arange(img_size, dtype=torch.float32) + 0.5
    u = (pixels[None, None, :] - centre[:, 0, None, None]) / radius[:, None, None]  # (count, 1, W)
    v = (pixels[None, :, None] - centre[:, 1, None, None]) / radius[:, None, None]  # (count, H, 1)
    u, v = torch.broadcast_tensors(u, v)  # (count, H, W)
    inside = torch.zeros(count, img_size, img_size, dtype=torch.bool)
    for label in range(len(CLASS_NAMES)):
        idx = labels == label
        inside[idx] = _masks(u[idx], v[idx], label)
    colour = torch.where(inside[:, None], foreground[:, :, None, None], background[:, :, None, None])
    images = ((colour + noise).clamp(0, 1) * 255).round().to(torch.uint8)
    return images, labels, inside
