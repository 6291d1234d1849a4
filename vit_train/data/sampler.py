"""Data order and augmentation randomness as pure functions of (seed, epoch, position).

The sampler yields (index, sample_seed) keys; the data set seeds the sample's augmentation with
sample_seed. So a run's batches do not depend on worker count or process RNG state, and a run
resumed in the middle of an epoch sees exactly the batches it would have seen.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch
from torch.utils.data import Dataset, Sampler


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


class EpochSampler(Sampler):
    """A fresh permutation per (seed, epoch), skipping the first `start` samples on resume."""

    def __init__(self, size: int, seed: int):
        self.size, self.seed = size, seed
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def __iter__(self) -> Iterator[tuple[int, int]]:
        g = epoch_generator(self.seed, self.epoch)
        order = torch.randperm(self.size, generator=g)
        sample_seeds = torch.randint(0, 2**62, (self.size,), generator=g)
        yield from zip(order[self.start:].tolist(), sample_seeds[self.start:].tolist())

    def __len__(self) -> int:
        return self.size - self.start


class TransformedDataset(Dataset):
    """Applies a transform to the images of (image, label) pairs; keys are an index or (index, seed)."""

    def __init__(self, base: Any, transform: Callable):
        self.base, self.transform = base, transform

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, int]:
        if isinstance(key, int):
            image, label = self.base[key]
            return self.transform(image), label
        index, seed = key
        image, label = self.base[index]
        with torch.random.fork_rng(devices=[]):  # leave the caller's RNG (dropout, ...) untouched
            torch.random.default_generator.manual_seed(seed)
            return self.transform(image), label


class TensorImages(Dataset):
    """(N, 3, H, W) uint8 images and (N,) labels held in memory."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index], int(self.labels[index])
