"""The one image decoder: a file becomes an 8-bit RGB picture, the same way in every path.

The training loader, vit-eval (and its figures) and vit-predict all read files through `open_rgb`,
so one picture gives one tensor whatever the file's mode:

- 1, L, P, RGB, CMYK, YCbCr, LAB, HSV: Pillow's conversion to RGB.
- LA, RGBA, P with transparency (PA): the colour channels; the alpha channel is dropped, not
  composited over a background. This is what torchvision's `default_loader` and timm's loader do
  (`convert("RGB")`), so pictures look to the model as they do to models pre-trained with them.
  Transparent pixels show the colour the file stores under them, which no viewer shows: the first
  such image a process decodes is named in one log line with that colour (`say_transparency`).
- I;16, I;16B, I;16L, I;16N (16-bit greyscale PNG/TIFF): scaled to 8 bits as round(v / 257), not
  clipped (Pillow's own conversion clips every value above 255 to white).
- I (32-bit integers): 8-bit values when the largest value is <= 255, else 16-bit values as above
  (values above 65535 count as 65535).
- F (32-bit floats): values in [0, 1] when the largest value is <= 1, else in [0, 255] when it is
  <= 255, else 16-bit values; scaled to [0, 255] and rounded.
- EXIF orientation (phone photos) is applied: the picture is turned as an image viewer shows it.
  Pillow, torchvision's `default_loader` and timm do not apply it; a folder of phone photos taken
  in portrait would otherwise train on pictures lying on their side.
- The first frame of a multi-frame file (GIF, TIFF pages). Colour profiles (ICC) are not applied.

The pixel limit (Image.MAX_IMAGE_PIXELS) bounds the resize that follows decoding too: once this process's
preprocessing is built (preprocess.py, `check_resizes`), an image whose resize to the model's input
(shorter side to N pixels: an extreme aspect ratio, e.g. 20000x3) would exceed it raises ResizeBombError,
an image bomb like the others, before its pixels are decoded.
"""

from __future__ import annotations

import io
import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps

from vit_train.data.decoding.regular import open_regular

ORIENTATION = 0x0112  # the EXIF tag; 1 = upright
SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N")
# What Pillow raises for truncated, empty, foreign or oversized files. Its decompression-bomb guard
# (Image.MAX_IMAGE_PIXELS) stays on and is made strict (see open_rgb): an oversized image counts as unreadable.
IMAGE_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)
TRANSPARENT_MODES = ("LA", "RGBA", "PA")


class ResizeBombError(Image.DecompressionBombError):
    """An image within the pixel limit whose resize to the model's input would not be (`check_resizes`)."""


class UnreadableImage(Exception):
    """An image that Pillow cannot decode; the data set replaces it and reports its index."""


def describe_unreadable(path: str) -> str:
    """Why Pillow cannot read `path`, in a few words."""
    try:
        open_rgb(path)
    except IMAGE_ERRORS as e:
        return f"{type(e).__name__}: {e}"
    return "it could not be read"


log = logging.getLogger("vit_train")
_said_transparency = False  # this process has named an image with transparency (one line per process)
_resize_side: int | None = None  # the shorter side this process's preprocessing resizes images to (check_resizes)


def check_resizes(side: int | None) -> None:
    """From now on in this process, `open_rgb` and `decode_rgb` refuse an image whose shorter side resized to
    `side` pixels (torchvision's Resize(side)) would make more than Image.MAX_IMAGE_PIXELS pixels: ResizeBombError,
    raised before decoding, so the image goes to the unreadable-image policy like any image bomb. None: no
    check. preprocess.py calls it wherever its transforms are built or unpickled (a spawned loader worker)."""
    global _resize_side
    _resize_side = side


def resized_size(width: int, height: int, side: int) -> tuple[int, int]:
    """(width, height) of a width x height image once its shorter side is resized to `side`, as torchvision's
    Resize(side) computes it."""
    if width <= height:
        return side, int(side * height / width)
    return int(side * width / height), side


def _check_resize(width: int, height: int) -> None:
    """ResizeBombError when resizing a width x height image to `_resize_side` would exceed the pixel limit."""
    limit = Image.MAX_IMAGE_PIXELS
    if _resize_side is None or limit is None or not width or not height:
        return
    new_width, new_height = resized_size(width, height, _resize_side)
    if new_width * new_height > limit:
        raise ResizeBombError(
            f"{width}x{height} pixels, resized to the model's input (shorter side {_resize_side}), "
            f"would be {new_width}x{new_height} = {new_width * new_height} pixels, over the limit of "
            f"{limit} (an image bomb); crop it to a less extreme aspect ratio, or remove it"
        )


def open_rgb(path: str | Path) -> Image.Image:
    """The file at `path` as an 8-bit RGB Pillow image (see the module's docstring for each mode).

    An image over Image.MAX_IMAGE_PIXELS (89.5 M pixels by default), which Pillow would decode after
    a warning up to twice that, raises Image.DecompressionBombError like a larger one (a small file
    can claim a huge size and exhaust memory in every loader worker). Only a regular file is read: a
    FIFO, device, socket or folder raises data/decoding/regular.py's NotRegularFile (an OSError) without
    blocking. Raises one of IMAGE_ERRORS for a missing or unreadable file (FileNotFoundError first).
    """
    with open_regular(Path(path).expanduser()) as file:
        return _decode(file, path, resized=True)[0]


def decode_rgb(data: bytes, name: str) -> Image.Image:
    """Encoded image bytes (a tar member of a WebDataset shard, a Hugging Face image cell) as an 8-bit
    RGB Pillow image, decoded exactly as `open_rgb` decodes a file holding them; `name` names the
    image in log lines and errors (e.g. "train-000003.tar:000123.jpg"). Raises one of IMAGE_ERRORS
    when unreadable, its message naming `name` where Pillow would name the file."""
    return _decode(_NamedBytes(data, name), name, resized=True)[0]


def decode_with_format(data: bytes, name: str) -> tuple[Image.Image, str | None]:
    """(`decode_rgb(data, name)`, Pillow's name of the bytes' format: "JPEG", "PNG", "WEBP", ... or None),
    with decode_rgb's checks (the strict pixel limit) and errors but the resize's (`check_resizes`): for callers
    that store the image unresized, keeping the bytes as they are when their format is one they accept (vit-shards
    image_format=source); the run that reads it checks its resize."""
    return _decode(_NamedBytes(data, name), name, resized=False)


class _NamedBytes(io.BytesIO):
    """Bytes read as a file whose repr is `name`: Pillow's messages ("cannot identify image file %r")
    name the image, not "<_io.BytesIO object at 0x...>"."""

    def __init__(self, data: bytes, name: str):
        super().__init__(data)
        self.image_name = str(name)

    def __repr__(self) -> str:
        return repr(self.image_name)


@contextmanager
def opened(source, resized: bool = True) -> Iterator[Image.Image]:
    """`source` (a path, a file or `_NamedBytes`) opened by Pillow, its header read and no pixel decoded, with the
    checks of every decode here: the strict pixel limit (an image bomb raises Image.DecompressionBombError) and,
    when it will be `resized` to the model's input, the resize's (`check_resizes`: ResizeBombError). Pillow's
    warnings about a file's metadata are silenced (they would print from every loader worker). Raises one of
    IMAGE_ERRORS for a file Pillow cannot identify."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module="PIL")
        try:
            with Image.open(source) as image:
                if resized:
                    _check_resize(*image.size)  # from the header, before the pixels are decoded
                yield image
        except Image.DecompressionBombWarning as e:
            raise Image.DecompressionBombError(f"{e} (vit-train refuses images over this limit)") from None


def header(data: bytes, name: str):
    """`opened` for encoded bytes (`decode_rgb`'s input), its messages naming `name`."""
    return opened(_NamedBytes(data, name))


def _decode(source, name, resized: bool) -> tuple[Image.Image, str | None]:
    """`resized`: the image will be resized to the model's input (`check_resizes`)."""
    with opened(source, resized) as image:
        image.load()
        if not _said_transparency and has_transparency(image):
            say_transparency(name, image)
        return to_rgb(image), image.format


def to_rgb(image: Image.Image) -> Image.Image:
    """`image`, of any mode, upright and as 8-bit RGB."""
    if image.getexif().get(ORIENTATION, 1) != 1:
        image = ImageOps.exif_transpose(image)
    if image.mode in SIXTEEN_BIT or image.mode in ("I", "F"):
        image = Image.fromarray(_to_uint8(np.asarray(image), image.mode), mode="L")
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")  # Pillow warns when a palette with transparency goes straight to RGB
    return image if image.mode == "RGB" else image.convert("RGB")


def has_transparency(image: Image.Image) -> bool:
    """Whether `image` has an alpha channel or a transparent palette entry (what `to_rgb` drops)."""
    return image.mode in TRANSPARENT_MODES or (image.mode in ("P", "L", "RGB") and "transparency" in image.info)


def say_transparency(path: str | Path, image: Image.Image) -> None:
    """One log line, once per process: `path` has transparency, which is dropped, and the mean colour
    stored under its fully transparent pixels, which the model sees there instead of a background."""
    global _said_transparency
    _said_transparency = True
    rgba = np.asarray(image.convert("RGBA"))  # (H, W, 4)
    hidden = rgba[rgba[..., 3] == 0][:, :3]  # (pixels, 3)
    under = (
        f"{100 * len(hidden) / (rgba.shape[0] * rgba.shape[1]):.0f}% of it is fully transparent and holds "
        f"RGB {tuple(int(v) for v in np.rint(hidden.mean(axis=0)))} on average"
        if len(hidden)
        else "it has no fully transparent pixel"
    )
    log.info(
        "transparency: %s (mode %s) is read without its alpha channel, as torchvision and timm read it: the "
        "model sees the colours stored under transparent pixels (%s), not a background; composite such images "
        "over the background you mean before training or predicting (docs/data.md). Said once per process",
        path,
        image.mode,
        under,
    )


def _to_uint8(values: np.ndarray, mode: str) -> np.ndarray:
    values = values.astype(np.float64)
    top = values.max(initial=0.0)
    if mode == "F" and top <= 1.0:
        values = values * 255.0
    elif mode in SIXTEEN_BIT or top > 255.0:
        values = values.clip(0, 65535) / 257.0
    return np.rint(values.clip(0, 255)).astype(np.uint8)


def read_uint8(path: str | Path) -> torch.Tensor:
    """The file at `path` as a (3, H, W) uint8 tensor, decoded by `open_rgb`."""
    rgb = np.asarray(open_rgb(path))  # (H, W, 3)
    return torch.from_numpy(rgb.copy()).permute(2, 0, 1)
