"""Data sets, transforms and loaders: `build_data` turns the config into train and val loaders."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader

from ..config import Config
from ..errors import DataError
from . import cifar, imagefolder
from .sampler import EpochSampler, TensorImages, TransformedDataset
from .shapes import CLASS_NAMES as SHAPES_CLASSES, generate_shapes
from .transforms import build_transforms

SHAPES_STATS = ((0.28, 0.28, 0.28), (0.236, 0.236, 0.236))  # measured on 10k images; the same at any size


@dataclass
class Data:
    train_loader: DataLoader
    val_loader: DataLoader
    train_sampler: EpochSampler  # set_epoch(epoch, start) before each pass over train_loader
    class_names: list[str]
    steps_per_epoch: int  # optimiser steps (global batches) per epoch; the last partial batch is dropped


def load_splits(cfg: Config):
    """(train base, val base, class names, normalisation stats, native image side or None)."""
    d, size = cfg.data, cfg.model.img_size
    if d.name == "shapes":
        train = TensorImages(*generate_shapes(d.train_size, size, seed=2 * d.seed))
        val = TensorImages(*generate_shapes(d.val_size, size, seed=2 * d.seed + 1))
        return train, val, list(SHAPES_CLASSES), SHAPES_STATS, size
    if d.name in cifar.FORMATS:
        root = d.root or "data"
        (train_x, train_y), (val_x, val_y), names = cifar.load_cifar(d.name, root, d.download)
        return TensorImages(train_x, train_y), TensorImages(val_x, val_y), names, cifar.STATS[d.name], 32
    train, val, names = imagefolder.load_image_folders(d.root)
    return train, val, names, imagefolder.STATS, None


def build_data(cfg: Config, device: torch.device, world_size: int = 1) -> Data:
    train_base, val_base, class_names, stats, native = load_splits(cfg)
    train_tf, eval_tf = build_transforms(cfg.aug, cfg.model.img_size, stats, native)
    d = cfg.data
    if len(train_base) < d.batch_size:
        raise DataError(f"data.batch_size ({d.batch_size}) is larger than the training set ({len(train_base)} "
                        f"images); lower data.batch_size")
    sampler = EpochSampler(len(train_base), cfg.seed)
    workers = dict(num_workers=d.num_workers, persistent_workers=d.num_workers > 0,
                   pin_memory=device.type == "cuda")
    # Each loader owns a generator, so creating an iterator never draws from the global RNG.
    train_loader = DataLoader(TransformedDataset(train_base, train_tf), batch_size=d.batch_size // world_size,
                              sampler=sampler, drop_last=True, generator=torch.Generator(), **workers)
    eval_batch = (d.eval_batch_size or d.batch_size) // world_size
    val_loader = DataLoader(TransformedDataset(val_base, eval_tf), batch_size=max(1, eval_batch),
                            shuffle=False, generator=torch.Generator(), **workers)
    return Data(train_loader, val_loader, sampler, class_names, len(train_base) // d.batch_size)
