"""data.decode=gpu: loader workers hand over encoded images, the training process decodes a batch at a time.

In a loader worker, `encode` reads an image's header (decoding/jpeg_check.py): a JPEG the batched decoder takes is handed
over as its bytes; anything else (a fallback) is decoded there by the one CPU decoder (decoding/image.py) and handed
over as pixels. `collate` packs a batch into one buffer (one transfer between processes). In the training
process `BatchDecoder` decodes the batch's JPEGs in one call of torchvision.io.decode_jpeg on the training device
(nvJPEG on a GPU; libjpeg-turbo on the CPU, the library Pillow decodes with) and turns them upright as EXIF says;
an image the batched call refuses (it fails as a whole: each is then tried alone) is decoded on the CPU. What is
decoded where is counted by kind; the first fallback of a split is said in one log line.
"""

from __future__ import annotations

import logging
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from torchvision.io import ImageReadMode, decode_jpeg

from vit_train.data.decoding import image as decode
from vit_train.data.decoding.image import IMAGE_ERRORS, UnreadableImage
from vit_train.data.decoding.jpeg_check import BATCHED, DECODER_ERROR, KINDS, route
from vit_train.data.decoding.regular import open_regular

log = logging.getLogger("vit_train")

CHECK_MEAN_DIFF = 3.0  # first batch: an image whose batched decode is further than this (mean, levels) is named


@dataclass
class Encoded:
    """One image as a loader worker hands it over. `data`: (bytes,) uint8, the file for the batched decoder, or
    (3, H, W) uint8 pixels decoded on the CPU; `kind`: its place in jpeg_check.KINDS; `orientation`: the EXIF
    orientation to apply after a batched decode; `name`: the image in messages; `key`: what the split's
    unreadable-image policy knows it by (a data set's index, a stream's name)."""

    data: torch.Tensor
    kind: int
    orientation: int
    name: str
    key: Any


def encode(data: bytes, name: str, key: Any = None) -> Encoded:
    """An encoded image (file bytes, a dataset cell, a tar member) as a worker hands it over. Raises one of
    decode.IMAGE_ERRORS where the CPU decoder cannot read it (from its header, or decoding a fallback)."""
    where = route(data, name)
    if where.batched:
        return Encoded(torch.frombuffer(bytearray(data), dtype=torch.uint8), where.kind, where.orientation, name, key)
    pixels = np.asarray(decode.decode_rgb(data, name))  # (H, W, 3): the one CPU decoder
    return Encoded(torch.from_numpy(pixels.copy()).permute(2, 0, 1), where.kind, 1, name, key)


class RawImages:
    """A random-access split (an image folder's, a Hugging Face dataset's: items (PIL image, label), `samples[i]`
    (name, label)) read as (Encoded, label) items; an image that cannot be read raises UnreadableImage(index),
    as the split itself does. `resize`: the evaluation's shorter side, which a loader worker started by spawn
    needs for the resize-bomb check (decode.check_resizes) as the CPU path's unpickled transform sets it."""

    def __init__(self, base: Any, resize: int | None):
        self.base, self.resize, self.samples = base, resize, base.samples
        self.unreadable_hint = getattr(base, "unreadable_hint", "a whole class folder gone or damaged?")

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        decode.check_resizes(self.resize)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> tuple[Encoded, int]:
        name, label = self.samples[index]
        try:
            if hasattr(self.base, "encoded"):  # a dataset cell (data=hf)
                data = self.base.encoded(index)
            else:
                with open_regular(name) as f:  # a FIFO is never waited on
                    data = f.read()
            return encode(data, str(name), index), int(label)
        except IMAGE_ERRORS as e:
            raise UnreadableImage(index) from e

    def describe_unreadable(self, index: int) -> str:
        describe = getattr(self.base, "describe_unreadable", None)
        return describe(index) if describe else decode.describe_unreadable(self.samples[index][0])


def as_is(item: Any) -> Any:
    """The per-sample "transform" of encoded items: none (the device does it)."""
    return item


class EncodedBatch(NamedTuple):
    """A batch of B encoded images in one buffer: image k's data is `data[ends[k - 1]:ends[k]]`, bytes or
    (3, H, W) pixels flattened (`shapes[k]` = (H, W); (0, 0) for bytes)."""

    data: torch.Tensor  # (total,) uint8
    ends: torch.Tensor  # (B,) int64
    shapes: torch.Tensor  # (B, 2) int64
    kinds: torch.Tensor  # (B,) int64, places in KINDS
    orientations: torch.Tensor  # (B,) int64
    names: list[str]
    keys: list[Any]

    def image(self, k: int) -> torch.Tensor:
        start = int(self.ends[k - 1]) if k else 0
        data = self.data[start : int(self.ends[k])]
        h, w = self.shapes[k].tolist()
        return data.view(3, h, w) if h else data


def collate(items: list[tuple[Encoded, int, Any]]) -> tuple[EncodedBatch, torch.Tensor, Any]:
    """(EncodedBatch, labels (B,) int64, the third items: a tensor of ints (unreadable indices), else a list)."""
    encoded = [item[0] for item in items]
    third = [item[2] for item in items]
    batch = EncodedBatch(
        torch.cat([e.data.reshape(-1) for e in encoded]),
        torch.tensor([e.data.numel() for e in encoded]).cumsum(0),
        torch.tensor([list(e.data.shape[1:]) if e.data.ndim == 3 else [0, 0] for e in encoded]),
        torch.tensor([e.kind for e in encoded]),
        torch.tensor([e.orientation for e in encoded]),
        [e.name for e in encoded],
        [e.key for e in encoded],
    )
    labels = torch.tensor([item[1] for item in items], dtype=torch.int64)
    return batch, labels, torch.tensor(third) if all(isinstance(t, int) for t in third) else third


def upright(image: torch.Tensor, orientation: int) -> torch.Tensor:
    """A (C, H, W) image turned as EXIF `orientation` says, as Pillow's ImageOps.exif_transpose turns it."""
    if orientation == 2:
        return image.flip(-1)
    if orientation == 3:
        return image.flip(-2, -1)
    if orientation == 4:
        return image.flip(-2)
    if orientation == 5:
        return image.transpose(-2, -1)
    if orientation == 6:
        return torch.rot90(image, -1, (-2, -1))
    if orientation == 7:
        return image.transpose(-2, -1).flip(-2, -1)
    if orientation == 8:
        return torch.rot90(image, 1, (-2, -1))
    return image


def batched_decode(data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """torchvision.io.decode_jpeg of a list of (bytes,) uint8 CPU tensors on `device`, as (3, H, W) uint8 RGB
    (grey JPEGs too). Raises RuntimeError when any of them cannot be decoded (the call fails as a whole).

    On CUDA the call runs under a stream of its own: nvJPEG writes its outputs from its own stream without
    waiting for the caller's (torchcodec#1634 fixed that in its copy of this decoder), so outputs allocated
    from the training stream's pool could be blocks that kernels still queued there (the previous step's) read
    or write. Allocated from a side stream's pool, they never are; the training stream then waits for the side
    stream, and each output is marked as used by it (record_stream), so its block is reused only after."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torchvision 0.29 points to torchcodec
        if device.type != "cuda":
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
        current, side = torch.cuda.current_stream(device), _side_stream(device)
        with torch.cuda.stream(side):
            images = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
        current.wait_stream(side)
        for image in images:
            image.record_stream(current)
        return images


_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SIDE_STREAMS:
        _SIDE_STREAMS[index] = torch.cuda.Stream(device=index)
    return _SIDE_STREAMS[index]


class BatchDecoder:
    """Decodes EncodedBatches of one split on `device`; `counts`: images by kind (KINDS' names) this epoch.
    `check`: the first batch's JPEGs are decoded by the CPU decoder too and an image further than CHECK_MEAN_DIFF
    (mean absolute difference, levels) is named in one warning line (a decoder that wrote wrong pixels)."""

    def __init__(self, device: torch.device, split: str, check: bool = False):
        self.device, self.split, self.check = device, split, check
        self.counts: Counter = Counter()
        self.total: Counter = Counter()
        self.said = False
        self.first_difference: float | None = None  # the first batch's largest difference (levels), when checked

    def __call__(self, batch: EncodedBatch) -> list[torch.Tensor | None]:
        """The batch's images on the device, each (3, H, W) uint8 RGB upright; None where neither decoder can
        read an image (a stream that passed the header check and that the CPU decoder refuses too)."""
        kinds = batch.kinds.tolist()
        images: list[torch.Tensor | None] = [None] * len(kinds)
        jpegs = [k for k, kind in enumerate(kinds) if kind < len(BATCHED)]
        for k in range(len(kinds)):
            if kinds[k] >= len(BATCHED):  # decoded by the worker
                images[k] = batch.image(k).to(self.device, non_blocking=True)
        decoded = self._decode([batch.image(k) for k in jpegs]) if jpegs else []
        for k, image in zip(jpegs, decoded, strict=True):
            if image is not None:
                images[k] = upright(image, int(batch.orientations[k]))
            else:  # the CPU decoder's, upright already; None when it cannot read it either
                kinds[k] = KINDS.index(DECODER_ERROR)
                images[k] = self._cpu(batch.image(k), batch.names[k])
        self._count(kinds, batch.names)
        if self.check:
            self.check = False
            self._compare(batch, jpegs, images)
        return images

    def _decode(self, data: list[torch.Tensor]) -> list[torch.Tensor | None]:
        try:
            return batched_decode(data, self.device)
        except RuntimeError:  # one bad stream fails the whole call (DALI#211): each alone, to find it
            out = []
            for one in data:
                try:
                    out.append(batched_decode([one], self.device)[0])
                except RuntimeError:
                    out.append(None)
            return out

    def _cpu(self, data: torch.Tensor, name: str) -> torch.Tensor | None:
        """The CPU decoder's pixels of JPEG bytes (EXIF applied: returned for orientation 1), or None."""
        try:
            pixels = np.asarray(decode.decode_rgb(data.numpy().tobytes(), name))
        except IMAGE_ERRORS:
            return None
        return torch.from_numpy(pixels.copy()).permute(2, 0, 1).to(self.device)

    def _count(self, kinds: list[int], names: list[str]) -> None:
        for kind in kinds:
            self.counts[KINDS[kind]] += 1
        fallbacks = [(KINDS[kind], name) for kind, name in zip(kinds, names, strict=True) if kind >= len(BATCHED)]
        if fallbacks and not self.said:
            self.said = True
            log.info(
                "data.decode=gpu: some %s images are decoded by the CPU decoder, not by the batched decoder on "
                "%s, which cannot decode them or not as the CPU decoder does; first %s (%s); counted by kind at "
                "each epoch's end. Said once",
                self.split,
                self.device,
                fallbacks[0][1],
                fallbacks[0][0],
            )

    def report(self, epoch: int) -> None:
        """One log line with the epoch's fallbacks by kind (none: no line), then the counts start again."""
        fallbacks = {k: n for k, n in self.counts.items() if k not in BATCHED}
        if fallbacks:
            log.info(
                "epoch %d: %d %s images decoded by the CPU decoder, not the batched decoder on %s "
                "(data.decode=gpu): %s",
                epoch,
                sum(fallbacks.values()),
                self.split,
                self.device,
                ", ".join(f"{n} {kind}" for kind, n in sorted(fallbacks.items(), key=lambda x: -x[1])),
            )
        self.total.update(self.counts)
        self.counts.clear()

    def _compare(self, batch: EncodedBatch, jpegs: list[int], images: list) -> None:
        worst = (0.0, "")
        for k in jpegs:
            expected = self._cpu(batch.image(k), batch.names[k])
            if expected is None or images[k] is None or expected.shape != images[k].shape:
                continue
            difference = (images[k].int() - expected.int()).abs().float().mean().item()
            worst = max(worst, (difference, batch.names[k]))
        self.first_difference = worst[0]
        if worst[0] > CHECK_MEAN_DIFF:
            log.warning(
                "data.decode=gpu: the batched decoder's pixels of %s differ from the CPU decoder's by %.1f "
                "levels on average (more than %.0f: wrong pixels, not rounding); use data.decode=cpu, and "
                "report the file",
                worst[1],
                worst[0],
                CHECK_MEAN_DIFF,
            )
