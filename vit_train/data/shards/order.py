"""The order of a sharded data set's epoch (data=webdataset) as pure functions: nothing is read to make it.

An epoch's plan depends on (seed, epoch, world size, loader workers, global batch, shuffle buffer) and the
index's sample counts only:

- the shards are taken in a permutation seeded by (seed, epoch); concatenated, they are the epoch's input
  stream of N samples, of which the first steps * B are trained on (steps = N // B, B the global batch; the
  remainder, under B samples, is left out, and differs per epoch);
- the stream is cut into world_size * W slots (W = max(1, loader workers)), one per (rank, worker), rank
  after rank: a DataLoader takes worker batches round-robin, so worker w of a rank gives that rank's
  batches w, w + W, ...: slot (r, w) holds exactly `slot_batches(steps, w, W)` batches of B / world_size
  samples. Every sample is read by one worker of one process; every rank takes `steps` steps, however
  few shards there are;
- each slot shuffles its samples with a buffer (`buffered_order`), from its own seed.

A run resumed after `k` steps of an epoch gives new worker w' the part of slot (k + w') % W that was not yet
emitted (`resumed_slot`): its batches are the uninterrupted run's, in the same order.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Slot:
    """Stream positions [start, stop) that worker `worker` of process `rank` reads."""

    rank: int
    worker: int
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


def shard_order(shards: int, seed: int, epoch: int) -> list[int]:
    """The epoch's order of the index's shards (their numbers in the index): a permutation of (seed, epoch)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(shards, generator=g).tolist()


def slot_batches(steps: int, worker: int, workers: int) -> int:
    """The batches worker `worker` of `workers` gives in an epoch of `steps` batches per rank (round-robin)."""
    return max(0, -(-(steps - worker) // workers))


def train_slots(samples: int, batch: int, world_size: int, workers: int) -> list[Slot]:
    """The (rank, worker) slots of an epoch of `samples` stream samples with global batch `batch`, rank-major.

    Slot (r, w) holds `slot_batches(steps, w, workers) * batch / world_size` samples (steps = samples // batch);
    together they cover the stream's first steps * batch samples, each once. Raises ValueError when `batch`
    does not split over `world_size` (distributed.check_batch refuses that first)."""
    if batch % world_size:
        raise ValueError(f"batch {batch} does not split over {world_size} processes")
    steps, share = samples // batch, batch // world_size
    slots, start = [], 0
    for rank in range(world_size):
        for worker in range(workers):
            stop = start + slot_batches(steps, worker, workers) * share
            slots.append(Slot(rank, worker, start, stop))
            start = stop
    return slots


def val_slots(samples: int, world_size: int, workers: int) -> list[Slot]:
    """Contiguous near-equal ranges of the val stream (index order), rank-major: every sample once, no padding."""
    slots, parts = [], world_size * workers
    for i in range(parts):
        slots.append(Slot(i // workers, i % workers, i * samples // parts, (i + 1) * samples // parts))
    return slots


def slot_seed(seed: int, epoch: int, rank: int, worker: int) -> int:
    """The seed of slot (rank, worker)'s shuffle and of its samples' augmentations."""
    return ((seed * 1_000_003 + epoch) * 10_007 + rank) * 1_009 + worker


def buffered_order(length: int, buffer: int, seed: int) -> list[int]:
    """The order in which a shuffle buffer of `buffer` samples emits positions 0..length-1 read in order.

    The standard buffered shuffle (webdataset's, tf.data's): fill the buffer, then for each new sample
    emit a random buffered one and put the new one in its place; at the end emit the rest in random
    order. A position is emitted at most `buffer` - 1 reads after it is read, so a reader holds at most
    `buffer` samples."""
    rng = random.Random(seed)
    held, order = [], []
    for position in range(length):
        if len(held) < buffer:
            held.append(position)
            continue
        i = rng.randrange(buffer)
        order.append(held[i])
        held[i] = position
    rng.shuffle(held)
    return order + held


def sample_seeds(length: int, seed: int) -> list[int]:
    """One augmentation seed per slot position (a sample's seed whatever the worker that emits it)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2**62, (length,), generator=g).tolist()


def resumed_slot(step: int, worker: int, workers: int) -> tuple[int, int]:
    """(slot worker, batches it already gave) for loader worker `worker` of a run resumed after `step`
    steps of the epoch: its batches are step + worker, step + worker + workers, ..., which slot
    (step + worker) % workers gave in the uninterrupted epoch."""
    slot = (step + worker) % workers
    return slot, slot_batches(step, slot, workers)


def locate(position: int, order: list[int], starts: list[int]) -> tuple[int, int]:
    """(shard number in the index, sample offset in it) of stream `position`; `starts`: the stream
    position where each shard of `order` begins (`stream_starts`)."""
    i = bisect.bisect_right(starts, position) - 1
    return order[i], position - starts[i]


def stream_starts(order: list[int], counts: list[int]) -> list[int]:
    """Where each shard of `order` begins in the stream (counts: samples per shard, in index order)."""
    starts, at = [], 0
    for shard in order:
        starts.append(at)
        at += counts[shard]
    return starts
