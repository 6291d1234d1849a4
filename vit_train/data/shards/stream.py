"""Reading tar shards as streams (data=webdataset's loaders, data/sources/webdataset.py), in an order that is a
pure function of the run (shards/order.py), resumed exactly in the middle of an epoch without decoding what was
already trained on: each (process, worker) reads its slot of the epoch's plan.

`build_stream_loaders` gives the train and val loaders and the train plan, which offers what train/batches.py
uses of a sampler (set_epoch, batches_left, advance, steps_left: EpochSampler's arithmetic over the stream's
positions). Loader workers are started afresh for each epoch (persistent_workers=False): each takes the
epoch and the resume point from the data set as it stands when the epoch's iterator is made.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from vit_train.data.decoding import image as decode
from vit_train.data.sampler import EpochSampler
from vit_train.data.shards.index import IMAGE_EXTS, Missing, ShardIndex, Split, label_of, read_samples
from vit_train.data.shards.order import (
    Slot,
    buffered_order,
    locate,
    resumed_slot,
    sample_seeds,
    shard_order,
    slot_seed,
    stream_starts,
    train_slots,
    val_slots,
)
from vit_train.errors import DataError

if TYPE_CHECKING:
    from vit_train.schema.config import Config

log = logging.getLogger("vit_train")

MAX_REPLACEMENTS = 16  # unreadable samples in a row before reading gives up (as for image folders)


class ShardStream(IterableDataset):
    """One split's samples as (image tensor, label, problem) from this process's slots; `problem` is "" or
    "<shard>:<key> (<why>)" for an unreadable sample, replaced by the slot's next readable one (the
    training process applies data.bad_images: `StreamUnreadable`).

    Train: shuffled (shard order, buffered shuffle), from `start_step` of `epoch`; val: index order."""

    def __init__(
        self,
        split: Split,
        classes: int,
        transform: Callable,
        train: bool,
        seed: int,
        batch: int,
        rank: int,
        world_size: int,
        workers: int,
        buffer: int,
        labels: bool = True,
    ):
        self.split, self.classes, self.transform, self.train, self.seed = split, classes, transform, train, seed
        self.batch, self.rank, self.world_size, self.workers, self.buffer = batch, rank, world_size, workers, buffer
        self.labels = labels
        self.epoch, self.start_step = 0, 0

    def slots(self) -> list[Slot]:
        if self.train:
            return train_slots(self.split.samples, self.batch, self.world_size, self.workers)
        return val_slots(self.split.samples, self.world_size, self.workers)

    def shard_order(self) -> list[int]:
        return (
            shard_order(len(self.split.counts), self.seed, self.epoch)
            if self.train
            else list(range(len(self.split.counts)))
        )

    def __len__(self) -> int:
        """Samples this process gives in a whole pass."""
        return sum(len(s) for s in self.slots() if s.rank == self.rank)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int, str]]:
        info = get_worker_info()
        worker = info.id if info is not None else 0
        slots = {s.worker: s for s in self.slots() if s.rank == self.rank}
        if not self.train:
            yield from self._read(slots[worker], list(range(len(slots[worker]))), None)
            return
        which, done = resumed_slot(self.start_step, worker, self.workers)
        slot = slots[which]
        seed = slot_seed(self.seed, self.epoch, self.rank, which)
        order = buffered_order(len(slot), self.buffer, seed)
        yield from self._read(slot, order[done * self.batch // self.world_size :], sample_seeds(len(slot), seed))

    def _read(self, slot: Slot, order: list[int], seeds: list[int] | None) -> Iterator[tuple[torch.Tensor, int, str]]:
        """The slot's samples at local positions `order`, in that order, each opened once; an unreadable one
        replaced by the next readable one in `order` (else the slot's first readable one)."""
        if not order:
            return
        ahead = deque()  # (position, opened) read ahead to find a replacement
        samples = self._raw(slot, order)
        while True:
            if ahead:
                position, opened = ahead.popleft()
            else:
                item = next(samples, None)
                if item is None:
                    return
                position, opened = item[0], self._open(item[1])
            problem = ""
            if opened[0] is None:
                problem = opened[2]
                if not self.train:
                    raise DataError(
                        f"val sample {problem} cannot be read; every val image is evaluated, so fix or "
                        f"replace its shard (data.bad_images applies to training images)"
                    )
                opened = self._replacement(slot, order, samples, ahead, problem)
            image, label, _ = opened
            yield self._transform(image, None if seeds is None else seeds[position]), label, problem

    def _replacement(self, slot, order, samples, ahead, problem):
        for candidate in list(ahead):
            if candidate[1][0] is not None:
                return candidate[1]
        while len(ahead) < MAX_REPLACEMENTS:
            item = next(samples, None)
            if item is None:
                break
            ahead.append((item[0], self._open(item[1])))
            if ahead[-1][1][0] is not None:
                return ahead[-1][1]
        if len(ahead) >= MAX_REPLACEMENTS:
            raise DataError(
                f"{MAX_REPLACEMENTS} unreadable samples in a row from {problem} (a damaged or cut shard?); "
                f"check the shards, then resume"
            )
        # nothing readable after it: the slot's first readable sample (read again from the slot's start)
        for _position, raw in self._raw(slot, list(range(len(slot)))):
            opened = self._open(raw)
            if opened[0] is not None:
                return opened
        raise DataError(
            f"no sample of {problem.split(':')[0].split('#')[0]} and the shards after it can be read "
            f"(first: {problem}); check the shards"
        )

    def _raw(self, slot: Slot, order: list[int]) -> Iterator[tuple[int, dict | Missing]]:
        """(local position, raw sample) in `order`: shards read in stream order from the first position
        needed (whole shards before it not opened); only samples still to be emitted are kept."""
        shards, counts = self.shard_order(), self.split.counts
        starts = stream_starts(shards, counts)
        wanted, kept, i = set(order), {}, 0
        position = slot.start + min(order)
        while position < slot.start + max(order) + 1:
            shard, offset = locate(position, shards, starts)
            stop = min(counts[shard], offset + slot.start + max(order) + 1 - position)
            for at, raw in read_samples(
                self.split.urls[shard], self.split.shards[shard], offset, stop, counts[shard], self.labels
            ):
                local = position + at - offset - slot.start
                if local in wanted:
                    kept[local] = raw if isinstance(raw, Missing) else {**raw, "__shard__": self.split.shards[shard]}
                while i < len(order) and order[i] in kept:
                    yield order[i], kept.pop(order[i])
                    i += 1
            position += stop - offset

    def _open(self, raw: dict | Missing):
        """(PIL image or None, label, problem) of a raw sample; decoding is the only costly step."""
        if isinstance(raw, Missing):
            return None, 0, f"{raw.key} ({raw.reason})"
        where = f"{raw['__shard__']}:{raw['__key__']}"
        label = label_of(raw, self.classes, where) if self.labels else 0
        images = [(ext, raw[ext]) for ext in IMAGE_EXTS if ext in raw]
        if not images:
            return None, label, f"{where}.? (no .jpg/.png/.webp member)"
        errors = []
        for ext, data in images:  # a sample with several images: the first that decodes
            try:
                return self._decode(data, f"{where}.{ext}"), label, ""
            except decode.IMAGE_ERRORS as e:
                errors.append(f"{where}.{ext} ({type(e).__name__}: {e})")
        return None, label, "; ".join(errors)

    def _decode(self, data: bytes, name: str):
        """An image member's bytes as the transform takes them: decoded by decoding/image.py (PIL RGB)."""
        return decode.decode_rgb(data, name)

    def _transform(self, image, seed: int | None) -> torch.Tensor:
        if seed is None:
            return self.transform(image)
        with torch.random.fork_rng(devices=[]):  # leave the caller's RNG untouched
            torch.random.default_generator.manual_seed(seed)
            return self.transform(image)


class StreamPlan(EpochSampler):
    """The train stream's epoch arithmetic as the loop sees a sampler (positions counted in images over all
    processes, an epoch = the whole global batches of the stream), telling the stream where an epoch starts."""

    def __init__(self, stream: ShardStream, batch_size: int):
        self.stream = stream
        super().__init__(stream.split.samples, stream.seed, 1, batch_size, stream.rank, stream.world_size)

    def set_epoch(self, epoch: int, start: int = 0, end: int = 0) -> None:
        """`start` must fall on a global batch's boundary of this batch size (train/resume.py refuses a changed
        data.batch_size in the middle of a webdataset epoch); `end` (0: the fresh epoch's) likewise."""
        super().set_epoch(epoch, start, end)
        if start % self.batch_size or self.end != self.full_end():
            raise DataError(
                f"data=webdataset cannot continue epoch {epoch + 1} from image {start} with "
                f"data.batch_size={self.batch_size}; resume with the batch size the epoch began with"
            )
        self.stream.epoch, self.stream.start_step = epoch, start // self.batch_size

    def __iter__(self):
        raise TypeError("the webdataset stream orders itself; StreamPlan is its epoch arithmetic only")

    def __len__(self) -> int:
        return self.batches_left()


class StreamUnreadable:
    """data.bad_images for a stream: each unreadable sample logged once; `error` stops at the first, `skip`
    once more than data.max_bad_fraction of the split's samples were unreadable."""

    def __init__(self, split: str, mode: str, max_fraction: float, samples: int):
        self.split, self.mode, self.max_fraction, self.samples = split, mode, max_fraction, samples
        self.seen: dict[str, None] = {}  # in the order they were logged
        self.replaced = 0

    def check(self, problems: list[str]) -> None:
        for problem in problems:
            if not problem:
                continue
            if self.mode == "error":
                raise DataError(
                    f"{self.split} sample {problem} cannot be read; fix or replace its shard, or set "
                    f"data.bad_images=skip to replace unreadable samples"
                )
            if problem not in self.seen:
                self.seen[problem] = None
                log.warning("unreadable %s sample replaced: %s", self.split, problem)
            self.replaced += 1
        if len(self.seen) > self.max_fraction * self.samples:
            raise DataError(
                f"{len(self.seen)} of {self.samples} {self.split} samples are unreadable, more than "
                f"data.max_bad_fraction={self.max_fraction}; first: {next(iter(self.seen))} (fix the "
                f"shards, or raise data.max_bad_fraction to train without them)"
            )

    def report(self, epoch: int) -> None:
        if self.replaced:
            log.warning(
                "epoch %d: %d unreadable %s sample%s replaced (%d distinct so far)",
                epoch,
                self.replaced,
                self.split,
                "" if self.replaced == 1 else "s",
                len(self.seen),
            )
            self.replaced = 0


class StreamLoader:
    """A DataLoader over a ShardStream whose batches are (images, labels, problems), as (images, labels);
    its length is this process's exact batch count (worker batches are cut per worker)."""

    def __init__(self, loader: DataLoader, unreadable: StreamUnreadable | None, batches: Callable[[], int]):
        self.loader, self.unreadable, self._batches = loader, unreadable, batches
        self.dataset = loader.dataset

    def __len__(self) -> int:
        return self._batches()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for images, labels, problems in self.loader:
            if self.unreadable is not None:
                self.unreadable.check(list(problems))
            yield images, labels


def build_stream_loaders(
    index: ShardIndex,
    cfg: Config,
    train_tf: Callable,
    eval_tf: Callable,
    device: torch.device,
    rank: int,
    world_size: int,
    labels: bool,
    loader_options: dict,
    decoding=None,
):
    """(train loader, val loader, train plan, train StreamUnreadable) for this process of `world_size`.

    `loader_options`: the DataLoader keywords the other data sets use (worker_init_fn, context, pinning);
    the worker count and persistence are this module's. `decoding` (data.decode=gpu: files.DeviceDecoding):
    the streams hand over encoded images, decoded and augmented on the device. Raises DataError when
    data.batch_size exceeds the training samples."""
    d = cfg.data
    if index.train.samples < d.batch_size:
        raise DataError(
            f"data.batch_size ({d.batch_size}) is larger than the training shards ({index.train.samples} "
            f"samples); lower data.batch_size"
        )
    count = loader_options["num_workers"]
    slots = max(1, count)
    common = dict(
        classes=len(index.classes),
        seed=cfg.seed,
        rank=rank,
        world_size=world_size,
        workers=slots,
        buffer=d.shuffle_buffer,
        labels=labels,
    )
    stream = ShardStream if decoding is None else decoding.stream
    train = stream(index.train, transform=train_tf, train=True, batch=d.batch_size, **common)
    val = stream(index.val, transform=eval_tf, train=False, batch=1, **common)
    # Each DataLoader draws its base seed from its own generator, not the global RNG, which drop path, dropout
    # and MixUp draw from: an iterator started by a resume must leave their draws as the uninterrupted run's.
    options = {
        **loader_options,
        "persistent_workers": False,
        "prefetch_factor": 4 if count else None,
        **({} if decoding is None else {"collate_fn": decoding.collate}),
    }
    share, eval_batch = d.batch_size // world_size, max(1, (d.eval_batch_size or d.batch_size) // world_size)
    train_loader = DataLoader(train, batch_size=share, generator=torch.Generator(), **options)
    val_loader = DataLoader(val, batch_size=eval_batch, generator=torch.Generator(), **options)
    plan = StreamPlan(train, d.batch_size)
    own = [s for s in val.slots() if s.rank == rank]
    val_batches = sum(-(-len(s) // eval_batch) for s in own)
    unreadable = StreamUnreadable("train", d.bad_images, d.max_bad_fraction, index.train.samples)
    train_loader = StreamLoader(train_loader, unreadable, plan.batches_left)
    val_loader = StreamLoader(val_loader, None, lambda: val_batches)
    if decoding is not None:
        train_loader, val_loader = decoding.train(train_loader, plan, unreadable), decoding.val(val_loader, None)
    return train_loader, val_loader, plan, unreadable
