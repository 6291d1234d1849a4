"""data.decode=gpu: batches of image files decoded and augmented on the training device.

`device_decoding` resolves data.decode for a run: `cpu` and `auto` keep the loader path (`auto` is `cpu` until
scripts/gpu_acceptance.py's decode part shows the device faster: docs/data.md); `gpu` gives a `DeviceDecoding`,
which a data set of encoded images hands to its loaders' builder (loaders.py `random_access_data`,
shards/stream.py `build_stream_loaders`): the splits are read as encoded images (batched.RawImages, or the
shards' RawShardStream), packed per batch (batched.collate), and each batch the loader gives is decoded on the
device (batched.BatchDecoder) and then transformed there:

- training (`DecodedTrain`): the option's crop (device/crops.py: RandomResizedCrop and flip, or aug=none's resize
  and centre crop), its policy on the uint8 pixels (device/ops.py: AutoAugment, RandAugment, TrivialAugmentWide,
  with the policy torchvision's transform uses for image files), scaling and normalisation, random erasing: the
  loader path's per-image work in its order, as device/pipeline.py does it for small images;
- evaluation (`DecodedEval`): the one evaluation preprocessing (preprocess.py), image by image.

The draws are those of device/pipeline.py: each global batch has a generator seeded by (seed, epoch, global batch)
(`on_device.batch_generator`), which draws for all its positions (crop uniforms, flips, the policy's plan,
erasing, in that order) and each process takes its share, so a run resumed mid-epoch sees the same batches and
the result does not depend on data.num_workers. Batches are (images, labels) on the device, (B, 3, S, S)
normalised float32 and (B,) int64, like the loader path's, so the training loop does not know which it reads.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torchvision
from PIL import Image

from vit_train.data.datasets import MAX_REPLACEMENTS, TransformedDataset
from vit_train.data.decoding import image as decode
from vit_train.data.decoding.batched import BatchDecoder, Encoded, RawImages, as_is, batched_decode, collate, encode
from vit_train.data.decoding.unreadable import UnreadableImages
from vit_train.data.device.crops import Geometry, crop, crop_uniforms
from vit_train.data.device.ops import Plan, apply_plan
from vit_train.data.device.pipeline import Erasing, Prepare, batch_generator, erase, erasing_plan, plan_part
from vit_train.data.shards.stream import ShardStream
from vit_train.data.transforms import build_transforms, device_augmentation
from vit_train.errors import ConfigError, DataError

if TYPE_CHECKING:
    from vit_train.schema.config import Config
    from vit_train.schema.sections import RunConfig

log = logging.getLogger("vit_train")


def device_decoding(cfg: Config, device: torch.device, rank: int = 0) -> DeviceDecoding | None:
    """data.decode resolved for a run on `device`: a DeviceDecoding for `gpu`, None (the loader path) for `cpu` and
    for `auto`, which picks `cpu` until a measurement shows the device faster (docs/data.md)."""
    if cfg.data.decode == "auto" and rank == 0:
        log.info(
            "data.decode=auto: JPEGs are decoded by the loader workers on the CPU (data.decode=gpu decodes them on "
            "the device: not yet measured faster, docs/data.md)"
        )
    return DeviceDecoding(cfg, device, rank) if cfg.data.decode == "gpu" else None


class DeviceDecoding:
    """What data.decode=gpu changes in a run's loaders (see the module's docstring). Raises ConfigError (one line)
    where it cannot do the loader path's work: an aug option without a device version, a transform that does not
    start with a crop it knows, a torchvision that cannot decode JPEGs on `device`. On a CPU `device` the same
    path runs (torchvision's CPU decoder, in the training process), said in one warning line."""

    def __init__(self, cfg: Config, device: torch.device, rank: int = 0):
        self.aug, self.device, self.size, self.stats = cfg.aug, device, cfg.model.img_size, cfg.data.stats
        self.geometry = check_decode(cfg)
        self.eval_tf = build_transforms(cfg.aug, cfg.model.img_size, cfg.data.stats, None)[1]
        self.resize = self.eval_tf.resize  # the resize-bomb check's side, in every loader worker
        probe(device)
        if device.type != "cuda" and rank == 0:
            log.warning(
                "data.decode=gpu on %s: each batch is decoded in this process by torchvision's CPU decoder, "
                "one image after another, not in parallel by loader workers; without a GPU data.decode=cpu (or "
                "auto) is faster",
                device,
            )

    def raw(self, base: Any, bad_images: str = "skip") -> TransformedDataset:
        """A random-access split as a data set of (Encoded, label, unreadable) items (replacements as the loader
        path makes them)."""
        return TransformedDataset(RawImages(base, self.resize), as_is, bad_images)

    collate = staticmethod(collate)

    def stream(self, split: Any, **keys: Any) -> RawShardStream:
        """A split of shards (stream.ShardStream's arguments) read as (Encoded, label, problem) items."""
        return RawShardStream(split, resize=self.resize, **{**keys, "transform": as_is})

    def train(self, loader: Any, sampler: Any, unreadable: Any) -> DecodedTrain:
        """The training batches of `loader` (its batches: (EncodedBatch, labels)) decoded and augmented; `sampler`:
        the epoch's positions (EpochSampler or a stream's plan); `unreadable`: the split's policy."""
        return DecodedTrain(loader, sampler, self, unreadable)

    def val(self, loader: Any, unreadable: Any) -> DecodedEval:
        return DecodedEval(loader, self, unreadable)


def check_decode(cfg: RunConfig) -> Geometry | None:
    """With data.decode=gpu, the crop its device path does for the run's aug option (device_crops.Geometry); None
    otherwise. Raises ConfigError (one line) for an option it cannot do all of: one without a device version,
    or whose transform does not start with a crop it knows."""
    if cfg.data.decode != "gpu":
        return None
    why = device_augmentation(cfg.aug)
    if why is not None:
        raise ConfigError(
            f"data.decode=gpu does on the device the augmentation of every aug option that has a "
            f"device version; {why}; use data.decode=cpu"
        )
    return Geometry.of(cfg.aug.train_transform(cfg.model.img_size, cfg.data.stats, None), cfg.aug.name)


class RawShardStream(ShardStream):
    """A split of shards whose image members are handed over encoded (batched.encode), not decoded; `resize`:
    the resize-bomb check's side in a loader worker started by spawn (as RawImages)."""

    def __init__(self, split: Any, resize: int | None, **keys: Any):
        super().__init__(split, **keys)
        self.resize = resize

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        decode.check_resizes(self.resize)

    def _decode(self, data: bytes, name: str) -> Encoded:
        return encode(data, name, name)


def probe(device: torch.device) -> None:
    """ConfigError (one line) when torchvision cannot decode a JPEG on `device` (a build without nvJPEG)."""
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(buffer, format="JPEG")
    try:
        batched_decode([torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)], device)
    except RuntimeError as e:
        raise ConfigError(
            f"data.decode=gpu: torchvision {torchvision.__version__} cannot decode JPEGs on {device} "
            f"({str(e).strip().splitlines()[0][:200]}); install a torchvision built with nvJPEG (its "
            f"CUDA wheels are) or use data.decode=cpu"
        ) from None


def settle(unreadable: Any, split: str, keys: list, names: list[str]) -> None:
    """The split's unreadable-image policy for images that passed the worker's header check and that neither the
    batched decoder nor the CPU decoder can read (`keys`: a random-access split's indices, a stream's names)."""
    if isinstance(unreadable, UnreadableImages):
        unreadable.check(torch.tensor(keys))  # logs once, counts, or raises (val, bad_images=error, too many)
    elif unreadable is not None and split == "train":
        unreadable.check([f"{name} (neither the batched nor the CPU decoder reads it)" for name in names])
    else:
        raise DataError(
            f"{split} image {names[0]} cannot be read by the batched decoder nor by the CPU decoder; every "
            f"{split} image is evaluated, so fix or remove it (data.bad_images applies to training images)"
        )


class _Decoded:
    def __init__(self, loader: Any, decoding: DeviceDecoding, unreadable: Any, split: str):
        self.loader, self.decoding, self.unreadable, self.split = loader, decoding, unreadable, split
        self.device = decoding.device
        self.decoder = BatchDecoder(decoding.device, split, check=split == "train")

    def __len__(self) -> int:
        return len(self.loader)

    def decoded(self, batch: Any, labels: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The batch's images decoded on the device, and the labels on the device. An image neither decoder reads
        goes to the split's policy and, where it allows, is replaced by its batch's first readable image; a batch
        with none (a batch of one, or of damaged files only) by the next readable image of the split after the
        first one's index (`next_readable`), as the loader path replaces an unreadable image."""
        images = self.decoder(batch)
        lost = [k for k, image in enumerate(images) if image is None]
        if lost:
            settle(self.unreadable, self.split, [batch.keys[k] for k in lost], [batch.names[k] for k in lost])
            labels = labels.clone()
            good = next((k for k, image in enumerate(images) if image is not None), None)
            if good is None:
                images[lost[0]], labels[lost[0]] = self.next_readable(batch)
                good = lost.pop(0)
            for k in lost:
                images[k], labels[k] = images[good], labels[good]
        return images, labels.to(self.device, non_blocking=True)

    def next_readable(self, batch: Any) -> tuple[torch.Tensor, int]:
        """(image, label) of the first image after the batch's first (by index, wrapping) that both the worker's check
        and a decoder read; DataError for a stream (no index to go on from) or MAX_REPLACEMENTS unreadable in a row."""
        dataset, key = self.loader.dataset, batch.keys[0]
        if not isinstance(key, int) or not hasattr(dataset, "__getitem__"):
            raise DataError(
                f"no image of a {self.split} batch can be read (first: {batch.names[0]}); check that the "
                f"data is in place and readable"
            )
        for offset in range(1, MAX_REPLACEMENTS + 1):
            encoded, label, _ = dataset[(key + offset) % len(dataset)]
            image = self.decoder(collate([(encoded, label, -1)])[0])[0]
            if image is not None:
                return image, int(label)
        raise DataError(
            f"{MAX_REPLACEMENTS} unreadable {self.split} images in a row from {batch.names[0]}; check that "
            f"the data is in place and readable, then resume"
        )


@dataclass
class FileDraws:
    """What a global batch of image files drew (B positions; None: nothing of that kind): RandomResizedCrop's
    uniforms (device_crops.crop_uniforms), flips (B,), the policy's plan, random erasing's draws."""

    uniforms: tuple | None = None
    flips: torch.Tensor | None = None
    plan: Plan | None = None
    erasing: Erasing | None = None

    def part(self, rows: slice) -> FileDraws:
        """The draws of positions `rows` of the batch (a process's share)."""
        return FileDraws(
            None if self.uniforms is None else tuple(u[rows] for u in self.uniforms),
            None if self.flips is None else self.flips[rows],
            None if self.plan is None else plan_part(self.plan, rows),
            None if self.erasing is None else self.erasing.part(rows),
        )


class DecodedTrain(_Decoded):
    """Training batches of this process's share, decoded and augmented on the device (the module's docstring)."""

    def __init__(self, loader: Any, sampler: Any, decoding: DeviceDecoding, unreadable: Any):
        super().__init__(loader, decoding, unreadable, "train")
        self.sampler = sampler
        self.prepare = Prepare(decoding.size, decoding.stats, decoding.device)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        first = self.sampler.start // self.sampler.batch_size  # global batches already done this epoch
        for b, (batch, labels) in enumerate(self.loader):
            images, labels = self.decoded(batch, labels)
            yield self.augment(images, first + b), labels

    def draws(self, batch: int) -> FileDraws:
        """Everything global batch `batch` of this epoch draws, for all its positions, from its generator in this
        order: RandomResizedCrop's uniforms and the flips (where the option crops so), the option's plan (the
        policy of image files), random erasing (where aug.random_erasing > 0)."""
        d, n = self.decoding, self.sampler.batch_size
        g, draws = batch_generator(self.sampler.seed, self.sampler.epoch, batch, self.device), FileDraws()
        if d.geometry.random:
            draws.uniforms = crop_uniforms(n, g)
            draws.flips = torch.rand(n, generator=g, device=self.device) < d.geometry.hflip
        draws.plan = d.aug.device_plan(n, d.size, d.size, g, small_images=False)
        if d.aug.random_erasing > 0:
            draws.erasing = erasing_plan(n, d.size, d.aug.random_erasing, g)
        return draws

    def augment(self, images: list[torch.Tensor], batch: int) -> torch.Tensor:
        """(share, 3, S, S) normalised float32 of this process's decoded (3, H, W) uint8 images: the draws of
        global batch `batch`, this process's part of them (rank r takes positions r * share ...)."""
        rank = self.sampler.rank
        draws = self.draws(batch).part(slice(rank * len(images), (rank + 1) * len(images)))
        x = crop(images, self.decoding.geometry, draws.uniforms, draws.flips)  # (share, 3, S, S) uint8
        if draws.plan is not None:
            x = apply_plan(x, draws.plan)
        x = self.prepare.normalise(self.prepare.scale(x))
        return x if draws.erasing is None else erase(x, draws.erasing)


class DecodedEval(_Decoded):
    """Validation batches decoded on the device, each image through the one evaluation preprocessing."""

    def __init__(self, loader: Any, decoding: DeviceDecoding, unreadable: Any):
        super().__init__(loader, decoding, unreadable, "val")

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        transform = self.decoding.eval_tf
        for batch, labels in self.loader:
            images, labels = self.decoded(batch, labels)
            yield torch.stack([transform(image) for image in images]).as_subclass(torch.Tensor), labels
