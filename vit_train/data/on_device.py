"""The on-device pipeline for small-image data sets (CIFAR, shapes): the uint8 images live on the
training device and are cropped, flipped and normalised there, a whole batch at a time.

A CPU DataLoader cannot feed a GPU with a small ViT on 32x32 images; this can. The epoch order is
the loader path's (the same EpochSampler permutation, with the same per-process shares), and the
augmentation is the same family with the same probabilities (`aug=basic`: padded random crop,
horizontal flip), drawn from a generator seeded by (seed, epoch, global batch): deterministic, and
a run resumed mid-epoch sees the same batches. Batches are (images, labels) like the loader's, so
the training loop does not know which pipeline it reads.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from vit_train.data.transforms import Augmentation
from vit_train.data.sampler import EpochSampler


class DeviceTrainPipeline:
    """Training batches of this process's share, augmented on `device`."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, sampler: EpochSampler, aug: Augmentation,
                 img_size: int, stats: tuple, device: torch.device):
        self.images = images.to(device)  # (N, 3, H, W) uint8
        self.labels = labels.to(device)
        self.sampler, self.aug, self.size, self.device = sampler, aug, img_size, device
        self.crop = aug.device_crop(img_size)  # (padding, flip probability), or None: normalise only
        self.prepare = Prepare(img_size, stats, device)
        self.global_batch = sampler.batch_size

    def __len__(self) -> int:
        return self.sampler.batches_left()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        keys = torch.tensor([index for index, _ in self.sampler], dtype=torch.long, device=self.device)
        first = self.sampler.start // self.global_batch  # global batches already done this epoch
        taken, position = 0, self.sampler.start
        for b in range(len(self)):  # the last one is shorter after a batch-size change mid-epoch
            after = self.sampler.advance(position)
            share = (after - position) // self.sampler.world_size
            index = keys[taken:taken + share]
            yield self.augment(self.images[index], first + b), self.labels[index]
            taken, position = taken + share, after

    def augment(self, images: torch.Tensor, batch: int) -> torch.Tensor:
        """Crop, flip and normalise a (share, 3, H, W) uint8 batch: the draws of global batch `batch`,
        this process's part of them (rank r takes images r * share ... of the global batch)."""
        images = self.prepare.scale(images)
        if self.crop is None:
            return self.prepare.normalise(images)
        padding, hflip = self.crop
        g = torch.Generator(device=self.device).manual_seed(
            (self.sampler.seed * 1_000_003 + self.sampler.epoch) * 1_000_003 + batch)
        offsets = torch.randint(0, 2 * padding + 1, (self.global_batch, 2), generator=g, device=self.device)
        flips = torch.rand(self.global_batch, generator=g, device=self.device) < hflip
        mine = slice(self.sampler.rank * len(images), (self.sampler.rank + 1) * len(images))
        return self.prepare.normalise(crop_and_flip(images, padding, offsets[mine], flips[mine]))


class Prepare:
    """uint8 images -> [0, 1] at the model's side (`scale`) -> normalised (`normalise`)."""

    def __init__(self, img_size: int, stats: tuple, device: torch.device):
        self.size = img_size
        self.mean = torch.tensor(stats[0], device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(stats[1], device=device).view(1, 3, 1, 1)

    def scale(self, images: torch.Tensor) -> torch.Tensor:
        images = images.float().div_(255)
        if images.shape[-1] != self.size:
            images = F.interpolate(images, size=(self.size, self.size), mode="bilinear", antialias=True,
                                   align_corners=False)
        return images

    def normalise(self, images: torch.Tensor) -> torch.Tensor:
        return (images - self.mean) / self.std


def crop_and_flip(images: torch.Tensor, padding: int, offsets: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
    """Per image: a crop of the zero-padded (black) image at offsets (dy, dx) in [0, 2 * padding],
    then a horizontal flip where `flips` is true."""
    n, _, h, w = images.shape
    padded = F.pad(images, (padding,) * 4)
    rows = offsets[:, 0, None] + torch.arange(h, device=images.device)  # (n, h)
    cols = offsets[:, 1, None] + torch.arange(w, device=images.device)  # (n, w)
    cols = torch.where(flips[:, None], cols.flip(1), cols)
    batch = torch.arange(n, device=images.device)[:, None, None]
    return padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2).contiguous()


class DeviceEvalPipeline:
    """Validation batches, in order (with several processes rank r takes r, r + W, ...), through the
    one evaluation preprocessing (preprocess.py), a whole batch at a time on the device."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, transform: Callable,
                 device: torch.device, rank: int = 0, world_size: int = 1):
        index = torch.arange(rank, len(labels), world_size)
        self.images, self.labels = images[index].to(device), labels[index].to(device)
        self.batch_size, self.transform = batch_size, transform

    def __len__(self) -> int:
        return -(-len(self.labels) // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for start in range(0, len(self.labels), self.batch_size):
            end = start + self.batch_size
            yield self.transform(self.images[start:end]).as_subclass(torch.Tensor), self.labels[start:end]
