"""vit-shards: WebDataset tar shards and their index.json from any data set vit-train reads.

The format (docs/data.md, "vit-shards"): OUT/index.json and OUT/{split}-{i:06d}.tar, each tar holding
per sample "<key>.<jpg|png|webp>" (the encoded image) then "<key>.cls" (ASCII decimal class index),
keys f"{split}_{i:08d}" with i the sample's index in the source split. index.json is written last
(a temporary file renamed into place): a folder without it is never a whole set, so a writer killed
mid-way leaves nothing that reads as complete.
"""

from __future__ import annotations

import io
import logging
import multiprocessing
import os
import signal
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image, JpegImagePlugin
from torchvision.transforms import v2

from vit_train.config import Config
from vit_train.data.decoding.image import IMAGE_ERRORS, decode_with_format
from vit_train.data.decoding.regular import open_regular
from vit_train.data.loaders import worker_context
from vit_train.data.sources.hf import describe_error
from vit_train.errors import ConfigError, DataError, OutputError
from vit_train.tools import shard_out

log = logging.getLogger("vit_train")

FORMAT, VERSION = "vit-train webdataset", 1
INDEX = shard_out.INDEX
# image_format=source: these files are copied as they are. MPO: a JPEG with more pictures after it (phone cameras'
# stereo or depth frames), which Pillow reads as its first picture and a JPEG decoder as the JPEG it starts with
KEEP = {"JPEG": "jpg", "MPO": "jpg", "PNG": "png", "WEBP": "webp"}
ENCODE = {"png": ("PNG", {}), "jpg": ("JPEG", {"quality": 95, "subsampling": 0}), "webp": ("WEBP", {"lossless": True})}
IMAGE_FORMATS = ("source", *ENCODE)
MTIME = 0  # every member's time: the same input gives the same shard bytes
BLOCK = 512  # a tar header, and the unit a member's data is padded to


def shard_name(split: str, index: int) -> str:
    """The file name of shard `index` of `split`, e.g. train-000003.tar."""
    return f"{split}-{index:06d}.tar"


def sample_key(split: str, index: int) -> str:
    """The key of the sample at `index` of the source split, e.g. train_00000123 (no dots)."""
    return f"{split}_{index:08d}"


@dataclass
class Shard:
    """One tar being written; `size` counts its members' bytes (headers and padded data)."""

    path: Path
    tar: tarfile.TarFile
    samples: int = 0
    size: int = 0


@dataclass
class SplitWriter:
    """Writes one split's shards: a new shard once `shard_size` samples are in the current one, or before
    a sample that would take it past `maxsize` bytes (a shard holds at least one sample)."""

    out: Path
    split: str
    shard_size: int
    maxsize: int | None
    shards: list[dict] = field(default_factory=list)
    current: Shard | None = None

    def add(self, key: str, ext: str, image: bytes, label: int) -> None:
        members = [(f"{key}.{ext}", image), (f"{key}.cls", str(label).encode("ascii"))]
        size = sum(BLOCK + -(-len(data) // BLOCK) * BLOCK for _, data in members)
        c = self.current
        if c is not None and (c.samples >= self.shard_size or (self.maxsize and c.size + size > self.maxsize)):
            self.close()
        if self.current is None:
            path = self.out / shard_name(self.split, len(self.shards))
            self.current = Shard(path, tarfile.open(path, "w", format=tarfile.GNU_FORMAT))
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode, info.uname, info.gname = len(data), MTIME, 0o444, "bigdata", "bigdata"
            self.current.tar.addfile(info, io.BytesIO(data))
        self.current.samples += 1
        self.current.size += size

    def close(self) -> None:
        """Finish the current shard (flushed to disk) and record it."""
        c, self.current = self.current, None
        if c is None:
            return
        c.tar.close()
        with open(c.path, "rb+") as f:
            os.fsync(f.fileno())
        self.shards.append({"name": c.path.name, "samples": c.samples, "bytes": c.path.stat().st_size})

    def abandon(self) -> None:
        """After a failure: close and remove every shard this writer wrote, the one being written included (no
        index lists them: left, they would only make a re-run refuse the folder)."""
        c, self.current = self.current, None
        if c is not None:
            try:
                c.tar.close()
            except OSError:
                pass
            c.path.unlink(missing_ok=True)
        for shard in self.shards:
            (self.out / shard["name"]).unlink(missing_ok=True)


def encoded(
    base: Any, index: int, image_format: str, short_side: int | None = None
) -> tuple[str, bytes, tuple[int, int]]:
    """(extension, encoded bytes, (H, W)) of sample `index` of a base data set (an image folder, a
    Hugging Face split, images in memory), decoded as training decodes it. With image_format=source, a
    JPEG/PNG/WebP file or cell keeps its bytes (they decode to the same pixels); anything else is
    written as PNG (lossless). `short_side`: an image whose shorter side is longer is resized to that side
    first (`pre_resize`) and re-encoded (image_format=source: a JPEG as a JPEG encoded as the source was,
    `jpeg_settings`; a lossless WebP as lossless, a lossy one as lossy at no more bytes per pixel, `webp_like`;
    anything else as PNG). Raises one of IMAGE_ERRORS when the image cannot be read."""
    data = _source_bytes(base, index)
    source_format = None
    if data is None:  # an image in memory (CIFAR, shapes): (3, H, W) uint8
        rgb = Image.fromarray(base[index][0].permute(1, 2, 0).numpy())
    else:
        rgb, source_format = decode_with_format(data, _describe(base, index))  # training's checks and pixel limit
    options = None
    if short_side is not None and min(rgb.size) > short_side:
        rgb = pre_resize(rgb, short_side)
        if image_format == "source":
            image_format = KEEP.get(source_format, "png")
            options = jpeg_settings(data) if image_format == "jpg" else None
            if image_format == "webp" and webp_is_lossy(data):
                return "webp", webp_like(rgb, data), (rgb.height, rgb.width)
    elif image_format == "source":
        kept = KEEP.get(source_format)
        if kept:
            return kept, data, (rgb.height, rgb.width)
    ext = "png" if image_format == "source" else image_format
    fmt, default = ENCODE[ext]
    options = options or default
    buffer = io.BytesIO()
    rgb.save(buffer, format=fmt, **options)
    return ext, buffer.getvalue(), (rgb.height, rgb.width)


def jpeg_settings(data: bytes) -> dict | None:
    """Pillow's save options that encode as the JPEG `data` was encoded: its quantization tables (its quality)
    and chroma subsampling, so a resized copy costs what its pixels cost to store and decode (quality 95 without
    subsampling, `ENCODE`, makes a 341x256 copy of a quality-90 4:2:0 photo larger than the 500x375 original and
    as slow to decode). None where the file has no such pair (grayscale, CMYK: one table, or four channels)."""
    with Image.open(io.BytesIO(data)) as source:
        tables, sampling = getattr(source, "quantization", None), JpegImagePlugin.get_sampling(source)
    if not tables or len(tables) < 2 or sampling == -1:
        return None
    return {"qtables": [tables[0], tables[1]], "subsampling": sampling}


def webp_is_lossy(data: bytes) -> bool:
    """Whether the WebP `data` holds a lossy (VP8) picture rather than a lossless (VP8L) one: the first of those
    two chunks of its RIFF container (WebP container specification; an extended file starts with VP8X)."""
    at = 12
    while at + 8 <= len(data):
        kind, size = data[at : at + 4], int.from_bytes(data[at + 4 : at + 8], "little")
        if kind in (b"VP8 ", b"VP8L"):
            return kind == b"VP8 "
        at += 8 + size + (size & 1)  # chunks are padded to an even size
    return False


WEBP_QUALITIES = (95, 90, 85, 80, 75, 70, 65, 60, 55, 50)


def webp_like(rgb: Image.Image, data: bytes) -> bytes:
    """`rgb` as a lossy WebP that costs at most what the lossy WebP `data` cost per pixel: the highest quality of
    WEBP_QUALITIES that does (else the lowest). A WebP keeps no record of its quality, so it is found by encoding;
    re-encoded losslessly, a resized lossy photo came out 2-3x larger than its source."""
    with Image.open(io.BytesIO(data)) as source:
        budget = len(data) / (source.width * source.height)  # bytes per pixel
    pixels, encoded = rgb.width * rgb.height, b""
    for quality in WEBP_QUALITIES:
        buffer = io.BytesIO()
        rgb.save(buffer, format="WEBP", quality=quality)
        encoded = buffer.getvalue()
        if len(encoded) <= budget * pixels:
            break
    return encoded


def pre_resize(rgb: Image.Image, short_side: int) -> Image.Image:
    """`rgb` with its shorter side resized to `short_side` pixels, the aspect ratio kept: evaluation's own resize
    (data/preprocess.py: torchvision's Resize of a PIL image, bilinear with antialiasing), so shards written at
    the evaluation's resize side and stored losslessly evaluate to the same pixels as the source files."""
    return v2.functional.resize(rgb, short_side, antialias=True)


def encoded_all(base: Any, image_format: str, workers: int = 0, short_side: int | None = None) -> Iterator[tuple | str]:
    """For each sample of `base` in order: (extension, bytes, (H, W), label), or a few words saying why its
    image cannot be read; read and encoded by `workers` processes (0: this one), in order whatever their number."""
    if workers <= 0:
        yield from (_encode_one(base, i, image_format, short_side) for i in range(len(base)))
        return
    # forked workers inherit the data set (CIFAR's arrays, a folder's listing) instead of receiving a pickle
    with multiprocessing.get_context(worker_context()).Pool(
        workers, _set_worker, (base, image_format, short_side)
    ) as pool:
        yield from pool.imap(_encode_in_worker, range(len(base)), chunksize=16)


_worker: tuple = ()  # a pool worker's (base, image_format, short_side)


def _set_worker(base: Any, image_format: str, short_side: int | None) -> None:
    global _worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    _worker = (base, image_format, short_side)


def _encode_in_worker(index: int) -> tuple | str:
    base, image_format, short_side = _worker
    return _encode_one(base, index, image_format, short_side)


def _encode_one(base: Any, index: int, image_format: str, short_side: int | None = None) -> tuple | str:
    try:
        ext, data, size = encoded(base, index, image_format, short_side)
    except IMAGE_ERRORS as e:
        return describe_error(e)
    label = base.samples[index][1] if hasattr(base, "samples") else base[index][1]
    return ext, data, size, int(label)


def _source_bytes(base: Any, index: int) -> bytes | None:
    """The encoded image of a Hugging Face row or an image file; None for an image held in memory."""
    if hasattr(base, "encoded"):  # a Hugging Face split (data/hf.py)
        return base.encoded(index)
    samples = getattr(base, "samples", None)
    if samples is not None:  # files (an image folder)
        with open_regular(Path(samples[index][0]).expanduser()) as f:  # a FIFO: NotRegularFile, never a wait
            return f.read()  # FileNotFoundError, NotRegularFile: unreadable, as in training
    return None


def _describe(base: Any, index: int) -> str:
    samples = getattr(base, "samples", None)
    return samples[index][0] if samples is not None else f"image {index}"


def write_shards(
    cfg: Config,
    out: str | Path,
    splits: list[str],
    shard_size: int = 1000,
    maxsize: int | None = None,
    image_format: str = "source",
    overwrite: bool = False,
    progress: bool = True,
    workers: int = 0,
    short_side: int | None = None,
) -> dict:
    """Write `cfg.data`'s `splits` (train, val) as shards into `out` and index.json last; returns the index.
    `workers` processes read and encode the images (0: this process); the shards are the same for any number.
    `short_side`: images whose shorter side is longer are stored resized to it (pre-resized shards, as FFCV's and
    DeiT's data pipelines store ImageNet: fewer pixels to decode per epoch), recorded per split in the index.

    Unreadable source images follow data.bad_images: skip leaves them out (one warning lists them),
    error stops at the first (DataError). An `out` whose index lacks every split asked for gets them added
    (same classes), its index rewritten last; `overwrite` writes the new set beside the earlier one and
    swaps it in once whole (shard_out.py). Raises ConfigError for bad arguments, an `out` inside the source,
    or one that already holds the splits (unless `overwrite`); OutputError when `out` cannot be written
    (a full disk: no index lists a half-written split, an earlier set is kept whole).
    """
    from vit_train.runtime.progress import progress_items

    if image_format not in IMAGE_FORMATS:
        raise ConfigError(f"image_format must be one of {', '.join(IMAGE_FORMATS)}; got {image_format!r}")
    if short_side is not None and (isinstance(short_side, bool) or not isinstance(short_side, int) or short_side < 1):
        raise ConfigError(
            f"short_side must be a number of pixels >= 1 (the stored images' shorter side at most), "
            f"or null to store them at their size; got {short_side!r}"
        )
    if shard_size < 1 or (maxsize is not None and maxsize < 1):
        raise ConfigError(f"shard_size and maxsize must be >= 1; got shard_size={shard_size}, maxsize={maxsize}")
    unknown = [s for s in splits if s not in ("train", "val")]
    if unknown or not splits:
        raise ConfigError(f"splits must be train, val or train,val; got {','.join(splits) or 'nothing'}")
    cfg.data.check_shardable()  # shards already
    out = Path(out).expanduser()
    shard_out.refuse_inside_source(cfg, out)  # before the data set is read: a mistake is said at once
    target = shard_out.refuse_used(out, splits, overwrite)
    train, val, names, _ = cfg.data.checked_splits(cfg.model.img_size)
    shard_out.prepare(target, list(names))  # after: a data set that cannot be read leaves no folder behind
    writers: list[SplitWriter] = []  # every split's, so that a failure in val removes train's shards too
    bases = {"train": train, "val": val}
    index: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "classes": list(names),
        "image_size": None,
        "source": {"data": cfg.data.name, "root": cfg.data.location(), "image_format": image_format},
        "splits": {},
    }
    sizes: set[tuple[int, int]] = set()
    for split in splits:
        base, writer, skipped = bases[split], SplitWriter(target.folder, split, shard_size, maxsize), []
        writers.append(writer)
        stream = iter(())
        try:
            stream = encoded_all(base, image_format, workers, short_side)
            items = progress_items(stream, len(base), f"vit-shards {split}", progress)  # a bar, or lines in a log
            for i, item in enumerate(items):
                if isinstance(item, str):  # why it cannot be read
                    if cfg.data.bad_images == "error" or split == "val":
                        raise DataError(
                            f"{_describe(base, i)} cannot be read ({item}); fix or remove it, or set "
                            f"data.bad_images=skip to leave unreadable training images out"
                        )
                    skipped.append(_describe(base, i))
                    continue
                ext, data, size, label = item
                sizes.add(size)
                writer.add(sample_key(split, i), ext, data, label)
            writer.close()
        except OSError as e:
            shard_out.abandon(target, writers)
            raise OutputError(
                f"cannot write the shards into {out} ({e.strerror or e}); free space or choose "
                f"another out= ({shard_out.failure_note(target)})"
            ) from None
        except BaseException:
            shard_out.abandon(target, writers)
            raise
        finally:
            stream.close()  # its worker processes end now, not when the generator is collected
        if skipped:
            log.warning(
                "%d unreadable %s image(s) left out (data.bad_images=skip): %s", len(skipped), split, ", ".join(skipped)
            )
        index["splits"][split] = {
            "samples": sum(s["samples"] for s in writer.shards),
            "short_side": short_side,
            "shards": writer.shards,
        }
    index["image_size"] = list(sizes.pop()) if len(sizes) == 1 else None
    index = shard_out.merged(target, index)
    try:
        shard_out.finish(target, index)
    except OutputError as e:
        if target.folder != target.out:  # the staged set: finish said what is kept
            raise
        shard_out.abandon(target, writers)  # an index that cannot be written: no shards without one either
        raise OutputError(f"{str(e).split(' (the shards')[0]} ({shard_out.failure_note(target)})") from None
    return index
