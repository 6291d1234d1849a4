"""An "ugly" image folder, as users' own folders are: hidden entries, every image mode, odd names.

`write_ugly_folder(root)` writes root/train/<class>/ and root/val/<class>/ and returns what a
correct reader must see: the classes, and for every image file its expected 8-bit RGB pixels.
`write_every_mode(folder, picture)` writes one picture in every Pillow mode a user may bring.
Used through the `ugly_folder` fixture in conftest.py; tests import it too (`from helpers.ugly_folder import ...`).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

SIDE = 16  # pixels; every picture is SIDE x SIDE
EXIF_ROTATE_90_CW = 6  # EXIF orientation: the viewer turns the stored pixels 90 degrees clockwise

# Class folder names users have: spaces, '=', '#', ',', brackets, non-ASCII (NFC in train/, NFD in val/).
CLASSES = ["café", "cat", "photo #1, [x]=y", "Ünïcødé 日本"]


@dataclass
class UglyFolder:
    root: Path
    classes: list[str]  # the class names a reader must find (NFC), sorted
    expected: dict[Path, np.ndarray] = field(default_factory=dict)  # image file -> (H, W, 3) uint8 it must decode to
    hidden: list[Path] = field(default_factory=list)  # entries that are neither classes nor images


def picture(seed: int) -> np.ndarray:
    """A (SIDE, SIDE, 3) uint8 picture: coloured blocks over a ramp, distinct per seed and not symmetric."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 255, SIDE, dtype=np.float64)
    image = np.stack([np.add.outer(ramp, ramp) / 2, np.tile(ramp, (SIDE, 1)), np.tile(ramp[:, None], (1, SIDE))], -1)
    for _ in range(3):
        y, x = rng.integers(0, SIDE - 4, size=2)
        image[y:y + 4, x:x + 4] = rng.integers(0, 256, size=3)
    return np.rint(image).astype(np.uint8)


def _grey(rgb: np.ndarray) -> np.ndarray:
    return np.asarray(Image.fromarray(rgb).convert("L"))


def _rgb_of(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB"))


def write_every_mode(folder: Path, rgb: np.ndarray, stem: str = "img") -> dict[Path, np.ndarray]:
    """`rgb` saved in modes 1, L, LA, P, P with transparency, RGB, RGBA, CMYK, YCbCr, I;16 (PNG),
    I;16B, I, F (TIFF), plus an EXIF-rotated copy; returns {file: the (H, W, 3) uint8 it must decode to}.

    The expected pixels are the picture as that mode can hold it (grey modes: its grey version;
    16-bit: round(v / 257) of the stored values; alpha dropped; EXIF orientation applied).
    """
    folder.mkdir(parents=True, exist_ok=True)
    base, grey = Image.fromarray(rgb), _grey(rgb)
    out: dict[Path, np.ndarray] = {}

    def save(name: str, image: Image.Image, expected: np.ndarray, **kwargs) -> None:
        path = folder / f"{stem}_{name}"
        image.save(path, **kwargs)
        out[path] = expected

    save("rgb.png", base, rgb)
    save("upper.PNG", base, rgb)  # an upper-case extension is still an image
    binary = base.convert("1")
    save("mode1.png", binary, _rgb_of(binary))
    save("L.png", base.convert("L"), np.repeat(grey[..., None], 3, -1))
    alpha = Image.fromarray(np.linspace(0, 255, rgb.size // 3, dtype=np.uint8).reshape(rgb.shape[:2]))
    la = base.convert("L")
    la.putalpha(alpha)
    save("LA.png", la, np.repeat(grey[..., None], 3, -1))
    palette = base.quantize(64)
    save("P.png", palette, _rgb_of(palette))
    transparent = palette.copy()
    transparent.info["transparency"] = 0  # palette entry 0 is transparent
    save("P_transparent.png", transparent, _rgb_of(palette), transparency=0)
    rgba = base.copy()
    rgba.putalpha(alpha)
    save("RGBA.png", rgba, rgb)
    save("CMYK.tif", base.convert("CMYK"), rgb)
    ycbcr = base.convert("YCbCr")
    save("YCbCr.tif", ycbcr, _rgb_of(ycbcr))
    values16 = grey.astype(np.uint16) * 257 + np.random.default_rng(1).integers(-128, 129, grey.shape).clip(
        -grey.astype(int) * 257, 65535 - grey.astype(int) * 257).astype(np.int32)
    values16 = values16.astype(np.uint16)
    expected16 = np.repeat(np.rint(values16 / 257).astype(np.uint8)[..., None], 3, -1)
    save("I16.png", Image.fromarray(values16), expected16)
    save("I16B.tif", Image.frombytes("I;16B", values16.shape[::-1], values16.astype(">u2").tobytes()), expected16)
    save("I32.tif", Image.fromarray(values16.astype(np.int32)), expected16)
    save("I32_8bit.tif", Image.fromarray(grey.astype(np.int32)), np.repeat(grey[..., None], 3, -1))
    save("F_unit.tif", Image.fromarray(grey.astype(np.float32) / 255), np.repeat(grey[..., None], 3, -1))
    save("F_255.tif", Image.fromarray(grey.astype(np.float32)), np.repeat(grey[..., None], 3, -1))
    # EXIF orientation 6: the stored pixels are the picture turned 90 degrees counter-clockwise
    exif = Image.Exif()
    exif[0x0112] = EXIF_ROTATE_90_CW
    save("exif_rotated.png", Image.fromarray(np.rot90(rgb, 1).copy()), rgb, exif=exif.tobytes())
    return out


def write_ugly_folder(root: Path, modes: bool = True) -> UglyFolder:
    """root/train and root/val with CLASSES (val/ with NFD names), one picture per class in every
    mode (or one PNG each when `modes` is False), and hidden entries in both splits."""
    ugly = UglyFolder(root, sorted(CLASSES))
    for split in ("train", "val"):
        for index, name in enumerate(sorted(CLASSES)):
            folder_name = unicodedata.normalize("NFD" if split == "val" else "NFC", name)
            folder = root / split / folder_name
            rgb = picture(100 * index + (split == "val"))
            if modes:
                ugly.expected.update(write_every_mode(folder, rgb))
            else:
                folder.mkdir(parents=True)
                Image.fromarray(rgb).save(folder / "img.png")
                ugly.expected[folder / "img.png"] = rgb
            # hidden entries inside a class folder: a notebook checkpoint, a macOS companion file
            # (AppleDouble, named like an image), a hidden folder holding a real image, and .DS_Store
            (folder / ".ipynb_checkpoints").mkdir()
            Image.fromarray(rgb).save(folder / ".ipynb_checkpoints" / "img_rgb-checkpoint.png")
            (folder / "._img_rgb.png").write_bytes(b"\x00\x05\x16\x07" + bytes(80))
            (folder / ".DS_Store").write_bytes(bytes(64))
            (folder / "notes.txt").write_text("not an image")
            ugly.hidden += [folder / ".ipynb_checkpoints", folder / "._img_rgb.png", folder / ".DS_Store"]
        # hidden entries beside the class folders: a notebook checkpoint folder (one PNG in train/,
        # empty in val/), .DS_Store, a macOS companion of a class folder
        hidden = root / split / ".ipynb_checkpoints"
        hidden.mkdir()
        if split == "train":
            Image.fromarray(picture(7)).save(hidden / "stray-checkpoint.png")
        (root / split / ".DS_Store").write_bytes(bytes(64))
        (root / split / "._cat").write_bytes(bytes(64))
        ugly.hidden += [hidden, root / split / ".DS_Store", root / split / "._cat"]
    return ugly
