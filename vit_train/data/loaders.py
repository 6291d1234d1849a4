"""A run's loaders (`Data`), made by its data set's `build` (data/sources/): the random-access path
shared by all but streams (`random_access_data`), the pipeline choice, what every loader's
workers share (signals, start method), and the line a training run warns with when the image files are far
smaller than the model's input (`small_images`, from a few images' headers)."""

from __future__ import annotations

import io
import logging
import os
import signal
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from PIL import Image
from torch.utils.data import DataLoader

from vit_train.data.datasets import TransformedDataset
from vit_train.data.decoding.regular import open_regular
from vit_train.data.decoding.unreadable import CheckedLoader, UnreadableImages
from vit_train.data.device.pipeline import DeviceEvalPipeline, DeviceTrainPipeline
from vit_train.data.sampler import EpochSampler, ShardSampler
from vit_train.data.transforms import build_transforms, device_augmentation
from vit_train.errors import ConfigError, DataError
from vit_train.schema.typed import options

if TYPE_CHECKING:
    from vit_train.schema.config import Config

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
    start_warnings: tuple[str, ...] = ()  # lines a training run warns with at its start (`small_images`, ...)
    decoder: Any = None  # data.decode=gpu: the training batches' decoder (batched.BatchDecoder), its counts

    def epoch_done(self, epoch: int) -> None:
        """Report the unreadable training images replaced, and with data.decode=gpu those decoded on the CPU, in
        the epoch that just ended."""
        if self.train_unreadable is not None:
            self.train_unreadable.report(epoch)
        if self.decoder is not None:
            self.decoder.report(epoch)


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


def pipeline(cfg: Config, device: torch.device, splits: tuple | None = None) -> str:
    """`device` or `loader`: data.pipeline, with `auto` choosing the device pipeline on a GPU when the data
    set is held in memory as uint8 arrays (not image files: `splits`' sets hold `images` and `labels` tensors)
    and the augmentation is one it does all of (`device_augmentation`: every aug option of data/aug/, not an
    option a user wrote without a device version). ConfigError (one line) for
    data.pipeline=device where it cannot do the same work."""
    d, aug = cfg.data, cfg.aug
    arrays = splits is None or all(isinstance(getattr(base, "images", None), torch.Tensor) for base in splits[:2])
    possible = not d.encoded and arrays and device_augmentation(aug) is None
    if d.pipeline == "device" and not possible:
        sets = ", ".join(n for n, c in options("data").items() if not c.encoded)
        why = device_augmentation(aug) or (
            f"data={d.name}'s sets are not uint8 tensors (images, labels)"
            if not arrays
            else f"data={d.name} reads image files"
        )
        raise ConfigError(
            f"data.pipeline=device does the augmentation of data={sets} and yours only where it does "
            f"all of it: {why}; use data.pipeline=loader (or auto)"
        )
    if d.pipeline == "auto":
        return "device" if device.type == "cuda" and possible else "loader"
    return d.pipeline


def loader_options(num_workers: int | None, device: torch.device) -> dict[str, Any]:
    """The DataLoader keywords every data set's loaders share: workers (data.num_workers; null = min(8, CPUs)),
    their signals and start method, pinned memory on a GPU."""
    count = loader_workers(num_workers)
    return dict(
        num_workers=count,
        pin_memory=device.type == "cuda",
        worker_init_fn=_worker_signals,
        multiprocessing_context=worker_context() if count else None,
    )


def loader_workers(num_workers: int | None) -> int:
    """data.num_workers resolved (null: min(8, CPUs))."""
    return min(8, os.cpu_count() or 1) if num_workers is None else num_workers


def random_access_data(
    cfg: Config, splits: tuple, device: torch.device, rank: int = 0, world_size: int = 1, decoding: Any = None
) -> Data:
    """Loaders for this process over a random-access data set's `splits` (DataSource.splits): each process gets
    its share of every global batch (EpochSampler) and of the val set, through the loader or, for uint8 arrays
    on a GPU, the on-device pipeline (`pipeline`). `decoding` (data.decode=gpu: files.DeviceDecoding): the
    workers hand over encoded images, decoded and augmented on the device."""
    train_base, val_base, class_names, native = splits
    d, stats = cfg.data, cfg.data.stats
    train_tf, eval_tf = build_transforms(cfg.aug, cfg.model.img_size, stats, native)
    if len(train_base) < d.batch_size:
        raise DataError(
            f"data.batch_size ({d.batch_size}) is larger than the training set ({len(train_base)} "
            f"images); lower data.batch_size"
        )
    sampler = EpochSampler(len(train_base), cfg.seed, d.repeated_aug, d.batch_size, rank, world_size)
    eval_batch = max(1, (d.eval_batch_size or d.batch_size) // world_size)
    steps = len(train_base) // d.batch_size
    if pipeline(cfg, device, splits) == "device":
        train = DeviceTrainPipeline(
            train_base.images, train_base.labels, sampler, cfg.aug, cfg.model.img_size, stats, device
        )
        val = DeviceEvalPipeline(val_base.images, val_base.labels, eval_batch, eval_tf, device, rank, world_size)
        log.info("data pipeline: on %s (%d training images held there as uint8)", device, len(train_base))
        return Data(train, val, sampler, class_names, steps, stats)
    options = loader_options(d.num_workers, device)
    count = options["num_workers"]
    workers = dict(options, persistent_workers=count > 0, prefetch_factor=4 if count else None)
    bad_images = d.bad_images if d.encoded else "skip"  # image files have a policy; arrays are never unreadable
    # Each loader owns a generator, so creating an iterator never draws from the global RNG. The sampler
    # yields whole global batches (and a shorter last one after a batch-size change mid-epoch): nothing to drop.
    if decoding is not None:  # data.decode=gpu: encoded images in one buffer per batch
        workers["collate_fn"] = decoding.collate
    train_set = (
        TransformedDataset(train_base, train_tf, bad_images)
        if decoding is None
        else decoding.raw(train_base, bad_images)
    )
    train_loader = DataLoader(
        train_set,
        batch_size=d.batch_size // world_size,
        sampler=sampler,
        drop_last=False,
        generator=torch.Generator(),
        **workers,
    )
    val_sampler = ShardSampler(len(val_base), rank, world_size) if world_size > 1 else None
    val_set = TransformedDataset(val_base, eval_tf) if decoding is None else decoding.raw(val_base)
    val_loader = DataLoader(
        val_set, batch_size=eval_batch, sampler=val_sampler, shuffle=False, generator=torch.Generator(), **workers
    )
    # image files of any size: a few headers read (rank 0 says it), the line said by a training run only
    small = (
        small_images(image_sizes(train_base), cfg.model.img_size, reads_patch_size(cfg))
        if d.encoded and rank == 0
        else None
    )
    train_unreadable = UnreadableImages(train_base, "train", d.bad_images, d.max_bad_fraction) if d.encoded else None
    val_unreadable = UnreadableImages(val_base, "val", d.bad_images, d.max_bad_fraction) if d.encoded else None
    train, val = CheckedLoader(train_loader, train_unreadable), CheckedLoader(val_loader, val_unreadable)
    if decoding is not None:
        train, val = decoding.train(train, sampler, train_unreadable), decoding.val(val, val_unreadable)
    return Data(
        train,
        val,
        sampler,
        class_names,
        steps,
        stats,
        train_unreadable,
        (small,) if small else (),
        None if decoding is None else train.decoder,
    )


SIZE_SAMPLE = 16  # images whose headers the size check reads, spread evenly over the training set


def image_sizes(base: Any, count: int = SIZE_SAMPLE) -> list[tuple[int, int]]:
    """(width, height) of up to `count` images spread evenly over `base`, a split of image files (an image
    folder's: `samples` of (path, label)) or of encoded images (a Hugging Face dataset's: `encoded(i)`), read
    from their headers only (Pillow decodes no pixels to open one). An image that cannot be read, or that
    claims a size over Pillow's pixel limit, is passed over: the loader says what is wrong with it."""
    n, sizes = len(base), []
    for i in sorted({k * n // count for k in range(count)}) if n else []:
        try:
            if hasattr(base, "encoded"):
                source = io.BytesIO(base.encoded(i))
            else:
                source = open_regular(base.samples[i][0])  # a FIFO is never waited on
            with source, warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                warnings.filterwarnings("ignore", category=UserWarning, module="PIL")
                with Image.open(source) as image:
                    sizes.append(image.size)
        except Exception:  # noqa: BLE001 - unreadable here is the loader's to report, not the size check's
            continue
    return sizes


def reads_patch_size(cfg: Config) -> int | None:
    """model.patch_size where the model's family reads one (a ViT), else None (a ResNet: no patches to name)."""
    return cfg.model.patch_size if type(cfg.model).reads_patches else None


def small_images(
    sizes: list[tuple[int, int]], img_size: int, patch_size: int | None, where: str | None = None
) -> str | None:
    """One line when the images (`sizes`, (width, height) of a sample) are far smaller than the model's input:
    a median shorter side below half of model.img_size, so each image is blown up more than twice (a 28x28
    image at the image-folder default of 224 is one 8x8-pixel blob per 16-pixel patch); None otherwise. The
    fix it names is an input side of the next power of two at least the median side, in 8x8 patches (`patch_size`
    None: a model without patches, a ResNet; no patches named). `where`:
    where the sizes come from (default: "N images sampled")."""
    if not sizes:
        return None
    sides = sorted(min(w, h) for w, h in sizes)
    median = sides[len(sides) // 2]
    if 2 * median >= img_size:
        return None
    fit = 1 << max(3, (median - 1).bit_length())  # 28 -> 32, 50 -> 64, 100 -> 128
    seen = [f"{w}x{h}" for w, h in sorted(set(sizes), key=lambda s: (min(s), s))]
    example = ", ".join(seen[:3]) + (", ..." if len(seen) > 3 else "")
    where = where or f"{len(sizes)} images sampled"
    patches = f" (patch {patch_size})" if patch_size is not None else ""  # a family without patches: none named
    fix = f"model.img_size={fit}" + (f" model.patch_size={max(1, fit // 8)}" if patch_size is not None else "")
    return (
        f"the images are far smaller than the model's input: a median shorter side of {median} px ({example}; "
        f"{where}) against model.img_size={img_size}{patches}, so each is upscaled "
        f"{img_size / median:.1f}x; for images this small set {fix}"
    )
