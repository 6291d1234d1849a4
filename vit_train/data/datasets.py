"""The data sets the loaders read: images held in memory (CIFAR, shapes), and any base data set
with its per-sample transform, seeded per sample by the sampler's key (sampler.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import Dataset

from vit_train.data.decoding.image import UnreadableImage, describe_unreadable
from vit_train.errors import DataError

MAX_REPLACEMENTS = 16  # unreadable images in a row before loading gives up


class TransformedDataset(Dataset):
    """Transforms (image, label) pairs of a base data set; keys are an index or (index, seed).

    Items are (image, label, unreadable): an image the base cannot read is replaced by the next
    readable one and its index returned as `unreadable` (-1 when the image was fine), so the
    training process, not a worker, decides what to do about it. With `bad_images="error"` the first
    unreadable image raises DataError at once (there is no readable one to carry its index when the
    next ones are unreadable too); MAX_REPLACEMENTS unreadable images in a row raise DataError naming
    the first and why it cannot be read.
    """

    def __init__(self, base: Any, transform: Callable, bad_images: str = "skip"):
        self.base, self.transform, self.bad_images = base, transform, bad_images

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, int, int]:
        index, seed = key if isinstance(key, tuple) else (key, None)
        unreadable = -1
        for offset in range(MAX_REPLACEMENTS):
            try:
                image, label = self.base[(index + offset) % len(self.base)]
                break
            except UnreadableImage:
                unreadable = index if unreadable < 0 else unreadable
                if self.bad_images == "error":
                    raise DataError(
                        f"{self._name(index)} cannot be read ({self._why(index)}); fix or remove it, "
                        f"or set data.bad_images=skip to replace unreadable images"
                    ) from None
        else:
            hint = getattr(self.base, "unreadable_hint", "a whole class folder gone or damaged?")
            raise DataError(
                f"{MAX_REPLACEMENTS} unreadable images in a row from {self._name(index)} "
                f"({self._why(index)}; {hint}); check that the data is in place and readable, then "
                f"resume"
            )
        if seed is None:
            return self.transform(image), label, unreadable
        with torch.random.fork_rng(devices=[]):  # leave the caller's RNG (dropout, ...) untouched
            torch.random.default_generator.manual_seed(seed)
            return self.transform(image), label, unreadable

    def _name(self, index: int) -> str:
        samples = getattr(self.base, "samples", None)
        return str(samples[index][0]) if samples else f"image {index}"

    def _why(self, index: int) -> str:
        """Why image `index` cannot be read: the base's own words (a dataset cell), else the file's."""
        describe = getattr(self.base, "describe_unreadable", None)
        if describe is not None:
            return describe(index)
        samples = getattr(self.base, "samples", None)
        return describe_unreadable(samples[index][0]) if samples else "it could not be read"


class TensorImages(Dataset):
    """(N, 3, H, W) uint8 images and (N,) labels held in memory."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index], int(self.labels[index])
