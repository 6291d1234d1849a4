"""Image data written for a test: image folders (root/{train,val}/<class>/), loose images, and a tiny
CIFAR-10 in its python layout. Pictures other than these tests' own: ugly_folder.py."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image


def write_image(path: Path, mode: str, size: tuple[int, int]) -> None:
    """One black image of Pillow `mode` and (width, height) `size` at `path` (its folders made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size).save(path)


def write_image_folder(root: Path, counts: dict[str, int], classes=("a", "b"),
                       pixels: Callable[[str, int], tuple | np.ndarray] | None = None, size: tuple[int, int] = (20, 20),
                       name: str = "{i}.png") -> Path:
    """root/<split>/<class>/<name> for each split of `counts` (split -> images a class) and each class, in
    that order. `pixels(class, i)` gives an RGB colour (an image of `size`, width x height) or a (H, W, 3)
    uint8 array; black without it. `name` is formatted with i. Returns `root`."""
    for split, count in counts.items():
        for cls in classes:
            (root / split / cls).mkdir(parents=True)
            for i in range(count):
                fill = (0, 0, 0) if pixels is None else pixels(cls, i)
                image = Image.fromarray(fill) if isinstance(fill, np.ndarray) else Image.new("RGB", size, fill)
                image.save(root / split / cls / name.format(i=i))
    return root


def write_noisy_colours(root: Path, name: str = "{i}.png") -> Path:
    """3 classes of solid colours with noise (red, green, blue), 16 train and 4 val images a class at
    20x20 (seeded: the same files every call), named `name` (its extension picks the format); returns `root`."""
    rng = np.random.default_rng(0)
    colours = {"red": (200, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 200)}

    def noisy(cls: str, i: int) -> np.ndarray:
        return np.clip(np.array(colours[cls]) + rng.normal(0, 40, (20, 20, 3)), 0, 255).astype(np.uint8)

    return write_image_folder(root, {"train": 16, "val": 4}, tuple(colours), noisy, name=name)


def write_images(folder: Path, count: int, start: int = 0) -> None:
    """`count` 12x10 RGB images folder/img<NNN>.png, numbered from `start`, each its own shade of red."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(start, start + count):
        Image.new("RGB", (12, 10), (i * 7 % 256, 0, 0)).save(folder / f"img{i:03d}.png")


def write_cifar10(root: Path, per_batch: int = 4, seed: int = 0) -> dict:
    """A tiny CIFAR-10 in the python format under root/cifar-10-batches-py (`per_batch` random images in
    each of the 5 train batches and the test batch); returns what was written: batch name -> (data
    (per_batch, 3072) uint8, labels)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    written = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, per_batch).tolist()
        with open(folder / name, "wb") as f:
            pickle.dump({"batch_label": name, "labels": labels, "data": data, "filenames": []}, f)
        written[name] = (data, labels)
    names = [f"class{i}" for i in range(10)]
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": names, "num_vis": 3072}, f)
    return written
