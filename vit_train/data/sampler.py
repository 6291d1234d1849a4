"""Data order and augmentation randomness as pure functions of (seed, epoch, position).

The sampler yields (index, sample_seed) keys; the data set seeds the sample's augmentation with
sample_seed. So a run's batches do not depend on worker count or process RNG state, and a run
resumed in the middle of an epoch sees exactly the batches it would have seen.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch
from torch.utils.data import Dataset, Sampler

from ..errors import DataError
from .imagefolder import UnreadableImage


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


class EpochSampler(Sampler):
    """A fresh permutation per (seed, epoch), skipping the first `start` samples on resume.

    With `repeats` > 1 (DeiT's repeated augmentation) the epoch keeps its length but holds the
    first size / repeats images of the permutation, each `repeats` times in a row: the copies land
    in one global batch and get different augmentations (each position has its own sample seed).
    """

    def __init__(self, size: int, seed: int, repeats: int = 1, batch_size: int = 1, rank: int = 0,
                 world_size: int = 1):
        self.size, self.seed, self.repeats = size, seed, repeats
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """`start`: samples of the epoch already trained on, counted over all processes."""
        self.epoch, self.start = epoch, start

    def _positions(self) -> torch.Tensor:
        """The epoch positions this process takes. With several processes each global batch of
        `batch_size` positions is cut into `world_size` consecutive shares, one per rank, and only
        whole global batches are used: the global order does not depend on the number of processes."""
        positions = torch.arange(self.start, self.size)
        if self.world_size == 1:
            return positions
        share = self.batch_size // self.world_size
        positions = positions[positions < self.size // self.batch_size * self.batch_size]
        return positions[(positions % self.batch_size) // share == self.rank]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        g = epoch_generator(self.seed, self.epoch)
        order = torch.randperm(self.size, generator=g).repeat_interleave(self.repeats)[:self.size]
        sample_seeds = torch.randint(0, 2**62, (self.size,), generator=g)
        positions = self._positions()
        yield from zip(order[positions].tolist(), sample_seeds[positions].tolist())

    def __len__(self) -> int:
        return len(self._positions())


class ShardSampler(Sampler):
    """Evaluation with several processes: rank r takes indices r, r + world, ...; every image once,
    no padding, so the summed counts are exact."""

    def __init__(self, size: int, rank: int, world_size: int):
        self.indices = list(range(rank, size, world_size))

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


MAX_REPLACEMENTS = 16  # unreadable images in a row before loading gives up


class TransformedDataset(Dataset):
    """Transforms (image, label) pairs of a base data set; keys are an index or (index, seed).

    Items are (image, label, unreadable): an image the base cannot read is replaced by the next
    readable one and its index returned as `unreadable` (-1 when the image was fine), so the
    training process, not a worker, decides what to do about it.
    """

    def __init__(self, base: Any, transform: Callable):
        self.base, self.transform = base, transform

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
        else:
            raise DataError(f"{MAX_REPLACEMENTS} unreadable images in a row after index {index}; check the data")
        if seed is None:
            return self.transform(image), label, unreadable
        with torch.random.fork_rng(devices=[]):  # leave the caller's RNG (dropout, ...) untouched
            torch.random.default_generator.manual_seed(seed)
            return self.transform(image), label, unreadable


class TensorImages(Dataset):
    """(N, 3, H, W) uint8 images and (N,) labels held in memory."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index], int(self.labels[index])
