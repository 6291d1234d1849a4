"""Data order and augmentation randomness as pure functions of (seed, epoch, position).

The sampler yields (index, sample_seed) keys; the data set (datasets.TransformedDataset) seeds the
sample's augmentation with sample_seed. So a run's batches do not depend on worker count or process RNG state, and a run
resumed in the middle of an epoch sees exactly the batches it would have seen.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


class EpochSampler(Sampler):
    """A fresh permutation per (seed, epoch), from position `start` to position `end`.

    An epoch is the whole global batches of `batch_size` that fit (`end` = size // batch_size *
    batch_size; the rest of the permutation is left out, like drop_last). A run resumed in the
    middle of an epoch continues from the same position of the same permutation. If the batch size
    changed since the epoch began, the epoch keeps the `end` it began with (`set_epoch`) and its last
    global batch is shorter: every image of it is trained on once, as in an uninterrupted epoch.

    With `repeats` > 1 (DeiT's repeated augmentation) the epoch keeps its length but holds the
    first size / repeats images of the permutation, each `repeats` times in a row: the copies land
    in one global batch and get different augmentations (each position has its own sample seed).
    """

    def __init__(self, size: int, seed: int, repeats: int = 1, batch_size: int = 1, rank: int = 0, world_size: int = 1):
        self.size, self.seed, self.repeats = size, seed, repeats
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.epoch, self.start, self.end, self.left_out = 0, 0, self.full_end(), 0

    def full_end(self) -> int:
        """Where a fresh epoch ends: after the whole global batches that fit."""
        return self.size // self.batch_size * self.batch_size

    def set_epoch(self, epoch: int, start: int = 0, end: int = 0) -> None:
        """`start`: positions of the epoch already trained on, counted over all processes; `end`:
        where the epoch ends (0: a fresh epoch's, `full_end()`); see `bounds`."""
        self.epoch, self.start = epoch, start
        self.end, self.left_out = self.bounds(start, end)

    def bounds(self, start: int = 0, end: int = 0) -> tuple[int, int]:
        """(end, left_out) of an epoch run from `start` to `end` (0: `full_end()`; at most the size).

        A last global batch shorter than `batch_size` is cut into `world_size` equal shares; the
        remainder of fewer than `world_size` positions cannot be shared and is left out (it arises
        only if the batch size and the number of processes both changed in the middle of an epoch).
        """
        end = min(end or self.full_end(), self.size)
        tail = (end - start) % self.batch_size
        return end - (tail if tail < self.world_size else 0), tail % self.world_size

    def batches_left(self) -> int:
        """Global batches from `start` to `end` (a shorter last one included)."""
        return -(-max(self.end - self.start, 0) // self.batch_size)

    def steps_left(self, start: int, end: int, epochs: int) -> int:
        """Global batches in `epochs` more epochs, the first of them run from `start` to `end`."""
        if epochs <= 0:
            return 0
        return -(-max(self.bounds(start, end)[0] - start, 0) // self.batch_size) + (epochs - 1) * (
            self.size // self.batch_size
        )

    def advance(self, position: int) -> int:
        """The epoch position after the global batch that begins at `position`."""
        return min(position + self.batch_size, self.end)

    def _positions(self) -> torch.Tensor:
        """The epoch positions this process takes. With several processes each global batch is cut
        into `world_size` consecutive equal shares, one per rank: the global order does not depend
        on the number of processes."""
        positions = torch.arange(self.start, self.end)
        if self.world_size == 1:
            return positions
        offset = (positions - self.start) % self.batch_size  # place in its global batch
        length = (self.end - (positions - offset)).clamp(max=self.batch_size)  # that batch's length
        share = length // self.world_size
        return positions[(offset < share * self.world_size) & (offset // share.clamp(min=1) == self.rank)]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        g = epoch_generator(self.seed, self.epoch)
        order = torch.randperm(self.size, generator=g).repeat_interleave(self.repeats)[: self.size]
        sample_seeds = torch.randint(0, 2**62, (self.size,), generator=g)
        positions = self._positions()
        yield from zip(order[positions].tolist(), sample_seeds[positions].tolist(), strict=True)

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
