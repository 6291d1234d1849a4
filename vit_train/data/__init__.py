"""Data sets, transforms and loaders: `build_data` turns the config into train and val loaders."""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass
from typing import Iterable

import torch
from torch.utils.data import DataLoader

from vit_train.config.schema import IMAGE_FILES, Config
from vit_train.errors import ConfigError, DataError
from vit_train.data import cifar, hf, imagefolder
from vit_train.data.preprocess import SHAPES_STATS, data_stats  # noqa: F401 (SHAPES_STATS: public)
from vit_train.data.on_device import DeviceEvalPipeline, DeviceTrainPipeline
from vit_train.data.datasets import TensorImages, TransformedDataset
from vit_train.data.sampler import EpochSampler, ShardSampler
from vit_train.data.shapes import CLASS_NAMES as SHAPES_CLASSES, generate_shapes
from vit_train.data.transforms import build_transforms
from vit_train.data.unreadable import CheckedLoader, UnreadableImages
from vit_train.data.shard_index import load_index
from vit_train.data.webdataset import build_stream_loaders, loader_workers

log = logging.getLogger("vit_train")

@dataclass
class Data:
    """A run's data: loaders whose batches are (images, targets), (B, 3, H, W) normalised floats and
    (B,) class indices; unreadable images are dealt with inside (data.bad_images)."""

    train_loader: Iterable[tuple[torch.Tensor, torch.Tensor]]
    val_loader: Iterable[tuple[torch.Tensor, torch.Tensor]]
    train_sampler: EpochSampler  # set_epoch(epoch, start, end) before each pass over train_loader
    class_names: list[str]
    steps_per_epoch: int  # optimiser steps (global batches) per fresh epoch; the last partial batch is dropped
    stats: tuple = ((0.0,) * 3, (1.0,) * 3)  # (mean, std) the images were normalised with
    train_unreadable: UnreadableImages | None = None  # image folders only

    def epoch_done(self, epoch: int) -> None:
        """Report the unreadable training images replaced in the epoch that just ended."""
        if self.train_unreadable is not None:
            self.train_unreadable.report(epoch)


# the start methods the standard library has; joblib's loky workers (hydra/launcher=parallel) make
# their own default, under which DataLoader workers cannot start ("'Process' object has no attribute 'env'")
STANDARD_START_METHODS = ("fork", "spawn", "forkserver")


def worker_context() -> str | None:
    """The multiprocessing start method for loader workers: the process's default when it is a standard
    one (None: the DataLoader's own choice), else the platform's standard default ("fork" on Linux,
    "spawn" elsewhere), so that loaders start inside a parallel sweep job's worker process too."""
    import multiprocessing

    current = multiprocessing.get_start_method(allow_none=True)
    if current is None or current in STANDARD_START_METHODS:
        return None
    return "fork" if "fork" in multiprocessing.get_all_start_methods() and os.name == "posix" else "spawn"


def _worker_signals(worker_id: int) -> None:
    """Workers leave SIGINT (Ctrl-C reaches the whole process group) and SIGUSR1 to the training
    process, which checkpoints and then stops them. SIGTERM, from the loader's own shutdown or a
    cluster ending the job, ends a worker quietly: a zero exit status is not a loader failure."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(0))


def load_splits(cfg: Config, labels: bool = True):
    """(train base, val base, class names, normalisation stats, native image side or None). Without
    `labels` (an objective that reads none), an image folder's images are read without class folders."""
    d, size = cfg.data, cfg.model.img_size
    if d.name == "shapes":
        train = TensorImages(*generate_shapes(d.train_size, size, seed=2 * d.seed))
        val = TensorImages(*generate_shapes(d.val_size, size, seed=2 * d.seed + 1))
        return train, val, list(SHAPES_CLASSES), data_stats(d.name), size
    if d.name in cifar.FORMATS:
        root = d.root or "data"
        (train_x, train_y), (val_x, val_y), names = cifar.load_cifar(d.name, root, d.download)
        return TensorImages(train_x, train_y), TensorImages(val_x, val_y), names, data_stats(d.name), 32
    if d.name == "hf":
        train, val, names = hf.load_hf_splits(d.root, d.image_key, d.label_key, d.train_split, d.val_split, labels)
    elif not labels:  # any folder of images will do
        train, val, names = imagefolder.load_unlabelled_folders(d.root)
    else:
        train, val, names = imagefolder.load_image_folders(d.root)
    return train, val, names, data_stats(d.name), None


DEVICE_AUGS = ("none", "basic")  # what the on-device pipeline does; the rest need the loader


def pipeline(cfg: Config, device: torch.device) -> str:
    """`device` or `loader`: data.pipeline, with `auto` choosing the device pipeline on a GPU for
    the small-image data sets when the augmentation is one it does."""
    d, aug = cfg.data, cfg.aug.name
    if d.pipeline == "device" and (d.name in IMAGE_FILES or aug not in DEVICE_AUGS):
        raise ConfigError(f"data.pipeline=device does aug={' or aug='.join(DEVICE_AUGS)} on shapes and CIFAR; got "
                          f"data={d.name}, aug={aug}: use data.pipeline=loader (or auto)")
    if d.pipeline == "auto":
        small = d.name not in IMAGE_FILES and aug in DEVICE_AUGS
        return "device" if device.type == "cuda" and small else "loader"
    return d.pipeline


def build_data(cfg: Config, device: torch.device, rank: int = 0, world_size: int = 1, labels: bool = True) -> Data:
    """Loaders for this process: with several, each gets its share of every global batch and of the val set.
    `labels`: whether the objective reads them (objectives' READS_LABELS); without, see `load_splits`."""
    if cfg.data.name == "webdataset":
        return _stream_data(cfg, device, rank, world_size, labels)
    train_base, val_base, class_names, stats, native = load_splits(cfg, labels)
    train_tf, eval_tf = build_transforms(cfg.aug, cfg.model.img_size, stats, native)
    d = cfg.data
    if len(train_base) < d.batch_size:
        raise DataError(f"data.batch_size ({d.batch_size}) is larger than the training set ({len(train_base)} "
                        f"images); lower data.batch_size")
    sampler = EpochSampler(len(train_base), cfg.seed, d.repeated_aug, d.batch_size, rank, world_size)
    eval_batch = max(1, (d.eval_batch_size or d.batch_size) // world_size)
    steps = len(train_base) // d.batch_size
    if pipeline(cfg, device) == "device":
        train = DeviceTrainPipeline(train_base.images, train_base.labels, sampler, cfg.aug, cfg.model.img_size, stats,
                                    device)
        val = DeviceEvalPipeline(val_base.images, val_base.labels, eval_batch, eval_tf, device, rank, world_size)
        log.info("data pipeline: on %s (%d training images held there as uint8)", device, len(train_base))
        return Data(train, val, sampler, class_names, steps, stats)
    count = min(8, os.cpu_count() or 1) if d.num_workers is None else d.num_workers
    workers = dict(num_workers=count, persistent_workers=count > 0, pin_memory=device.type == "cuda",
                   worker_init_fn=_worker_signals, prefetch_factor=4 if count else None,
                   multiprocessing_context=worker_context() if count else None)
    # Each loader owns a generator, so creating an iterator never draws from the global RNG. The sampler
    # yields whole global batches (and a shorter last one after a batch-size change mid-epoch): nothing to drop.
    train_loader = DataLoader(TransformedDataset(train_base, train_tf, d.bad_images),
                              batch_size=d.batch_size // world_size,
                              sampler=sampler, drop_last=False, generator=torch.Generator(), **workers)
    val_sampler = ShardSampler(len(val_base), rank, world_size) if world_size > 1 else None
    val_loader = DataLoader(TransformedDataset(val_base, eval_tf), batch_size=eval_batch, sampler=val_sampler,
                            shuffle=False, generator=torch.Generator(), **workers)
    folders = cfg.data.name in IMAGE_FILES
    train_unreadable = UnreadableImages(train_base, "train", d.bad_images, d.max_bad_fraction) if folders else None
    val_unreadable = UnreadableImages(val_base, "val", d.bad_images, d.max_bad_fraction) if folders else None
    return Data(CheckedLoader(train_loader, train_unreadable), CheckedLoader(val_loader, val_unreadable), sampler,
                class_names, steps, stats, train_unreadable)


def _stream_data(cfg: Config, device: torch.device, rank: int, world_size: int, labels: bool) -> Data:
    """data=webdataset: shards read as streams in a planned order (data/webdataset.py)."""
    pipeline(cfg, device)  # refuses data.pipeline=device
    if cfg.data.repeated_aug > 1:  # its copies must land in one global batch: a stream cannot place them
        raise ConfigError(f"data.repeated_aug={cfg.data.repeated_aug} works with random-access data sets only, not "
                          f"data=webdataset (a stream cannot repeat a sample inside one batch); use data.repeated_aug=1")
    index = load_index(cfg.data.root, cfg.data.train_shards, cfg.data.val_shards)
    stats = data_stats(cfg.data.name)
    train_tf, eval_tf = build_transforms(cfg.aug, cfg.model.img_size, stats, None)
    count = loader_workers(cfg.data.num_workers)
    options = dict(pin_memory=device.type == "cuda", worker_init_fn=_worker_signals,
                   multiprocessing_context=worker_context() if count else None)
    train, val, plan, unreadable = build_stream_loaders(index, cfg, train_tf, eval_tf, device, rank, world_size,
                                                        labels, options)
    return Data(train, val, plan, list(index.classes), index.train.samples // cfg.data.batch_size, stats, unreadable)
