"""Data order and augmentation randomness as pure functions of (seed, epoch, position).

The sampler yields (index, sample_seed) keys; the data set (datasets.TransformedDataset) seeds the
sample's augmentation with sample_seed. So a run's batches do not depend on worker count or process RNG state, and a run
resumed in the middle of an epoch sees exactly the batches it would have seen.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import Sampler


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
