"""The on-device pipeline for small-image data sets (CIFAR, shapes): the uint8 images live on the
training device and are augmented and normalised there, a whole batch at a time.

A CPU DataLoader cannot feed a GPU with a small ViT on 32x32 images; this can. The epoch order is
the loader path's (the same EpochSampler permutation, with the same per-process shares), and every
`aug` option's per-image work is done here as its loader path does it, in the same order: the padded
random crop and horizontal flip (`device_crop`), the option's policy on the uint8 pixels (AutoAugment,
RandAugment, TrivialAugmentWide: data/device/ops.py, torchvision's operations per image), scaling and
normalisation, then random erasing (aug.random_erasing) on the normalised image with per-pixel noise.

The draws are a function of (seed, epoch, global batch, position in the global batch): each global
batch has a generator seeded by (seed, epoch, global batch), which draws for the whole global batch
(`draws`: crop offsets, flips, the policy's plan, erasing, in that order) and each process takes its
slice (rank r the images r * share ...). So a run resumed mid-epoch sees the same batches, several
processes see what one would, and the copies of an image under repeated augmentation (data.repeated_aug:
consecutive positions) get their own draws. Batches are (images, labels) like the loader's, so the
training loop does not know which pipeline it reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torchvision.transforms.v2 import functional as TF

from vit_train.data.aug.base import Augmentation
from vit_train.data.device.ops import Plan, apply_plan
from vit_train.data.sampler import EpochSampler

# torchvision's RandomErasing defaults, which the loader path uses (transforms.py `build_transforms`)
ERASE_SCALE = (0.02, 0.33)
ERASE_RATIO = (0.3, 3.3)
ERASE_ATTEMPTS = 10


@dataclass
class Erasing:
    """Random erasing's draws for a batch (B images of side `size`), as torchvision's RandomErasing makes
    them per image: whether it erases (with probability p, and where one of the 10 tries at a rectangle fit),
    the rectangle (top, left, height, width), and its noise. `noise` holds the erased rectangles' normal
    values one after the other, image by image, each (3, height, width) in row-major order (images that do
    not erase take none); `start` (B + 1,) is where each image's values begin."""

    applied: torch.Tensor  # (B,) bool
    top: torch.Tensor  # (B,) int64
    left: torch.Tensor
    height: torch.Tensor
    width: torch.Tensor
    noise: torch.Tensor  # (sum of 3 * height * width over the erasing images,) float32
    start: torch.Tensor  # (B + 1,) int64

    def part(self, rows: slice) -> Erasing:
        """The draws of images `rows` (a slice of the batch)."""
        first, last = int(self.start[rows.start]), int(self.start[rows.stop])
        return Erasing(
            self.applied[rows],
            self.top[rows],
            self.left[rows],
            self.height[rows],
            self.width[rows],
            self.noise[first:last],
            self.start[rows.start : rows.stop + 1] - first,
        )

    def values(self, i: int) -> torch.Tensor:
        """Image i's noise, (3, height, width)."""
        h, w = int(self.height[i]), int(self.width[i])
        return self.noise[int(self.start[i]) : int(self.start[i + 1])].view(3, h, w)


def batch_generator(seed: int, epoch: int, batch: int, device: torch.device) -> torch.Generator:
    """The generator of global batch `batch` of `epoch` on `device`, seeded by (seed, epoch, batch): what the
    on-device augmentation of that batch draws from, whichever process and however many loader workers."""
    return torch.Generator(device=device).manual_seed((seed * 1_000_003 + epoch) * 1_000_003 + batch)


def erasing_plan(batch_size: int, size: int, p: float, generator: torch.Generator) -> Erasing:
    """Random erasing's draws for a batch of (3, size, size) images, on the generator's device. torchvision's
    RandomErasing(p, scale=(0.02, 0.33), ratio=(0.3, 3.3), value="random") per image: it erases with
    probability p; it tries up to 10 rectangles of area `scale` of the image and log-uniform aspect ratio
    `ratio` and takes the first that fits strictly inside (height and width below the side; none: no erasing),
    at a uniform position, filled with standard normal noise per pixel and channel. In this order, for the
    whole batch: rand(B) (erases where < p); the areas, rand(B, 10); the log ratios, rand(B, 10); the
    positions, rand(B, 2); then the noise, randn(total), image after image (one host sync for its length)."""
    device = generator.device
    applied = torch.rand(batch_size, generator=generator, device=device) < p
    scale = torch.rand(batch_size, ERASE_ATTEMPTS, generator=generator, device=device)
    scale = ERASE_SCALE[0] + scale * (ERASE_SCALE[1] - ERASE_SCALE[0])
    log_ratio = torch.log(torch.tensor(ERASE_RATIO, device=device))  # float32, as torchvision's
    ratio = torch.rand(batch_size, ERASE_ATTEMPTS, generator=generator, device=device)
    ratio = torch.exp(log_ratio[0] + ratio * (log_ratio[1] - log_ratio[0]))
    where = torch.rand(batch_size, 2, generator=generator, device=device)
    # torchvision: erase_area = area * u (Python floats), h = int(round(sqrt(erase_area * aspect_ratio))), ...
    area = (size * size) * scale.double()
    heights = torch.sqrt(area * ratio.double()).round().long()  # half to even, as Python's round
    widths = torch.sqrt(area / ratio.double()).round().long()
    fits = (heights < size) & (widths < size)
    attempt = fits.int().argmax(1, keepdim=True)  # the first that fits
    applied = applied & fits.any(1)
    height = heights.gather(1, attempt).squeeze(1).masked_fill(~applied, 0)
    width = widths.gather(1, attempt).squeeze(1).masked_fill(~applied, 0)
    top = (where[:, 0].double() * (size - height + 1)).floor().long()
    left = (where[:, 1].double() * (size - width + 1)).floor().long()
    counts = 3 * height * width
    start = torch.cat([torch.zeros(1, dtype=torch.long, device=device), counts.cumsum(0)])
    noise = torch.randn(int(start[-1]), generator=generator, device=device)
    return Erasing(applied, top, left, height, width, noise, start)


def erase(images: torch.Tensor, erasing: Erasing) -> torch.Tensor:
    """(B, 3, H, W) float images with each erasing image's rectangle set to its noise (torchvision's `erase`)."""
    h, w = images.shape[-2:]
    rows = torch.arange(h, device=images.device)
    cols = torch.arange(w, device=images.device)
    inside_rows = (rows >= erasing.top[:, None]) & (rows < (erasing.top + erasing.height)[:, None])  # (B, H)
    inside_cols = (cols >= erasing.left[:, None]) & (cols < (erasing.left + erasing.width)[:, None])  # (B, W)
    mask = (inside_rows[:, :, None] & inside_cols[:, None, :] & erasing.applied[:, None, None])[:, None]
    mask = mask.expand_as(images)  # (B, 3, H, W): image by image, channel by channel, row-major, as `noise`
    out = images.clone()
    out[mask] = erasing.noise
    return out


def plan_part(plan: Plan, rows: slice) -> Plan:
    return Plan(**{f.name: getattr(plan, f.name)[rows] for f in fields(Plan)})


@dataclass
class Draws:
    """What a global batch drew for its images (B of them; None: nothing of that kind): crop offsets
    (B, 2) in [0, 2 * padding] and flips (B,) (`crop_and_flip`), the policy's plan (device_ops.Plan), and
    random erasing's draws."""

    offsets: torch.Tensor | None = None
    flips: torch.Tensor | None = None
    plan: Plan | None = None
    erasing: Erasing | None = None

    def part(self, rows: slice) -> Draws:
        """The draws of images `rows` of the batch (a process's share)."""
        return Draws(
            None if self.offsets is None else self.offsets[rows],
            None if self.flips is None else self.flips[rows],
            None if self.plan is None else plan_part(self.plan, rows),
            None if self.erasing is None else self.erasing.part(rows),
        )


class DeviceTrainPipeline:
    """Training batches of this process's share, augmented on `device`."""

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        sampler: EpochSampler,
        aug: Augmentation,
        img_size: int,
        stats: tuple,
        device: torch.device,
    ):
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
            index = keys[taken : taken + share]
            yield self.augment(self.images[index], first + b), self.labels[index]
            taken, position = taken + share, after

    def generator(self, batch: int) -> torch.Generator:
        """Global batch `batch`'s generator: seeded by (seed, epoch, batch)."""
        return batch_generator(self.sampler.seed, self.sampler.epoch, batch, self.device)

    def draws(self, batch: int) -> Draws:
        """Everything global batch `batch` of this epoch draws, for all its `global_batch` positions, from its
        generator in this order: crop offsets, flips (as aug=basic always has), the option's plan
        (`Augmentation.device_plan`), random erasing (`erasing_plan`). Each kind only where the option has it."""
        g, n, draws = self.generator(batch), self.global_batch, Draws()
        if self.crop is not None:
            padding, hflip = self.crop
            draws.offsets = torch.randint(0, 2 * padding + 1, (n, 2), generator=g, device=self.device)
            draws.flips = torch.rand(n, generator=g, device=self.device) < hflip
        draws.plan = self.aug.device_plan(n, self.size, self.size, g)
        if self.aug.random_erasing > 0:
            draws.erasing = erasing_plan(n, self.size, self.aug.random_erasing, g)
        return draws

    def augment(self, images: torch.Tensor, batch: int) -> torch.Tensor:
        """Augment and normalise a (share, 3, H, W) uint8 batch: the draws of global batch `batch`, this
        process's part of them (rank r takes images r * share ... of the global batch)."""
        mine = slice(self.sampler.rank * len(images), (self.sampler.rank + 1) * len(images))
        draws = self.draws(batch).part(mine)
        padding = None if self.crop is None else self.crop[0]
        images = self.prepare.resize(images)  # uint8 to uint8, as the loader's Resize: rounded to grey levels
        if draws.plan is None:  # crop and flip the [0, 1] floats (no policy: aug=basic's path as it always was)
            images = self.prepare.scale(images)
            if draws.offsets is not None:
                images = crop_and_flip(images, padding, draws.offsets, draws.flips)
        else:  # the policy works on uint8 pixels: crop and flip, policy, then to [0, 1]
            if draws.offsets is not None:
                images = crop_and_flip(images, padding, draws.offsets, draws.flips)
            images = self.prepare.scale(apply_plan(images, draws.plan))
        images = self.prepare.normalise(images)
        if draws.erasing is not None:
            images = erase(images, draws.erasing)
        return images


class Prepare:
    """uint8 images -> the model's side, as uint8 (`resize`: the loader path's Resize of uint8 tensors, which
    rounds to grey levels; resizing the [0, 1] floats instead differs by one level on most images) -> [0, 1]
    (`scale`) -> normalised (`normalise`)."""

    def __init__(self, img_size: int, stats: tuple, device: torch.device):
        self.size = img_size
        self.mean = torch.tensor(stats[0], device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(stats[1], device=device).view(1, 3, 1, 1)

    def resize(self, images: torch.Tensor) -> torch.Tensor:
        if images.shape[-1] != self.size:
            images = TF.resize(images, [self.size], antialias=True)
        return images

    def scale(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images at the model's side (`resize` first) -> float32 in [0, 1] (ToDtype(scale=True))."""
        return images.float().div_(255)

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

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        batch_size: int,
        transform: Callable,
        device: torch.device,
        rank: int = 0,
        world_size: int = 1,
    ):
        index = torch.arange(rank, len(labels), world_size)
        self.images, self.labels = images[index].to(device), labels[index].to(device)
        self.batch_size, self.transform = batch_size, transform

    def __len__(self) -> int:
        return -(-len(self.labels) // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for start in range(0, len(self.labels), self.batch_size):
            end = start + self.batch_size
            yield self.transform(self.images[start:end]).as_subclass(torch.Tensor), self.labels[start:end]
