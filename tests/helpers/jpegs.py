"""Image files for data.decode=gpu's tests, one per kind the batched decoder takes or leaves to the CPU decoder,
from what went wrong for users of GPU decoding (vision#5103 and DALI#211, #842, #2660, #2798, sglang#33464,
#35101): `photo` (a noisy picture that compresses like a photograph), `jpeg` (bytes of a JPEG with options),
`KINDS` and `write_kinds` (one file of each kind, all named .jpg), `write_jpeg_folder` (a small image folder of
JPEGs of different sizes)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image


def photo(height: int, width: int, seed: int = 0) -> np.ndarray:
    """(height, width, 3) uint8: a colour ramp, blocks and noise (JPEG blocks of every kind: flat, edges, texture)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    image = np.stack([255 * x / max(width - 1, 1), 255 * y / max(height - 1, 1), 128 + 60 * np.sin(x / 3.0)], -1)
    for _ in range(4):
        top, left = rng.integers(0, max(height - 8, 1)), rng.integers(0, max(width - 8, 1))
        image[top:top + height // 4, left:left + width // 4] = rng.integers(0, 256, 3)
    return np.clip(image + rng.normal(0, 18, image.shape), 0, 255).astype(np.uint8)


def jpeg(rgb: np.ndarray, mode: str = "RGB", **options) -> bytes:
    """`rgb` saved as a JPEG in Pillow `mode` (RGB, L, CMYK) with Pillow's save `options` (quality, subsampling,
    progressive, exif, keep_rgb...)."""
    out = io.BytesIO()
    Image.fromarray(rgb).convert(mode).save(out, format="JPEG", **options)
    return out.getvalue()


def encoded(rgb: np.ndarray, form: str) -> bytes:
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, format=form)
    return out.getvalue()


def exif(orientation: int) -> bytes:
    tags = Image.Exif()
    tags[0x0112] = orientation
    return tags.tobytes()


# name: (bytes of a file named <name>.jpg, the jpeg_check.KINDS entry it is routed as; None: unreadable)
def kinds(seed: int = 0) -> dict[str, tuple[bytes, str | None]]:
    rgb = photo(37, 53, seed)
    whole = jpeg(rgb, quality=90)
    return {
        "baseline_420": (whole, "JPEG"),
        "baseline_444": (jpeg(rgb, quality=95, subsampling=0), "JPEG"),
        "baseline_422": (jpeg(rgb, subsampling=1), "JPEG"),
        "progressive": (jpeg(rgb, progressive=True), "progressive JPEG"),
        "grayscale": (jpeg(rgb, "L"), "JPEG"),  # sglang#35101: 1 channel unless RGB is asked
        "exif_rotated": (jpeg(rgb, exif=exif(6)), "JPEG"),  # sglang#33464, DALI#2660: the decoder ignores EXIF
        "cmyk": (jpeg(rgb, "CMYK"), "CMYK/YCCK JPEG"),  # DALI#2798, ImageNet's ~22 CMYK files
        "rgb_coded": (jpeg(rgb, keep_rgb=True), "RGB-coded JPEG"),
        "png_named_jpg": (encoded(rgb, "PNG"), "PNG"),  # DALI#842: ImageNet's PNG under a .JPEG name
        "webp_named_jpg": (encoded(rgb, "WEBP"), "WebP"),
        "gif_named_jpg": (encoded(rgb, "GIF"), "GIF"),
        "truncated": (whole[:len(whole) * 2 // 3], None),  # the CPU decoder refuses it: data.bad_images
        "zero_bytes": (b"", None),
    }


KINDS = list(kinds())


def write_kinds(folder: Path, seed: int = 0) -> dict[str, tuple[Path, str | None]]:
    """Each of `kinds` as folder/<name>.jpg; returns {name: (path, its kind or None)}."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, (data, kind) in kinds(seed).items():
        (folder / f"{name}.jpg").write_bytes(data)
        out[name] = (folder / f"{name}.jpg", kind)
    return out


def write_jpeg_folder(root: Path, per_class: dict[str, int] | None = None, classes=("red", "green", "blue"),
                      seed: int = 0) -> Path:
    """root/<split>/<class>/<i>.jpg: per split and class `per_class[split]` JPEGs (default 16 train, 4 val) of
    sizes from 18x26 to 40x31, each class a colour cast over `photo`'s pattern (learnable). Returns root."""
    per_class = per_class or {"train": 16, "val": 4}
    rng = np.random.default_rng(seed)
    cast = {"red": (90, -40, -40), "green": (-40, 90, -40), "blue": (-40, -40, 90)}
    for split, count in per_class.items():
        for c, cls in enumerate(classes):
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                h, w = int(rng.integers(18, 41)), int(rng.integers(18, 41))
                rgb = np.clip(photo(h, w, seed=1000 * c + i + 100 * (split == "val")).astype(int)
                              + cast.get(cls, (0, 0, 0)), 0, 255).astype(np.uint8)
                (root / split / cls / f"{i}.jpg").write_bytes(jpeg(rgb, quality=90))
    return root
