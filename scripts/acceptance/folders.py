"""Data sets the feeding parts write on the machine they run on (nothing is downloaded there):
a CIFAR-10-format folder of `shapes` images and an image folder of generated JPEGs."""

from __future__ import annotations

import pickle
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from vit_train.data.sources.shapes import CLASS_NAMES, generate_shapes

CHUNK = 10_000  # images generated at once (bounded memory: ~0.15 GB per chunk at 32x32)


def _shapes(count: int, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(count, 3, size, size) uint8 images and int64 labels, generated CHUNK at a time."""
    images, labels = [], []
    for i, start in enumerate(range(0, count, CHUNK)):
        x, y = generate_shapes(min(CHUNK, count - start), size, seed=seed * 1000 + i)
        images.append(x.numpy())
        labels.append(y.numpy())
    return np.concatenate(images), np.concatenate(labels)


def write_cifar_folder(root: Path, train: int, test: int) -> tuple[Path, float]:
    """`root`/cifar-10-batches-py/ as CIFAR-10's python-format batches (five training batches, a
    test batch, batches.meta), holding `shapes` images at 32x32 (10 classes). Returns (root,
    seconds spent; 0 when a complete folder was already there)."""
    folder = root / "cifar-10-batches-py"
    done = folder / ".complete"
    if done.exists():
        return root, 0.0
    start = time.time()
    folder.mkdir(parents=True, exist_ok=True)
    x, y = _shapes(train, 32, seed=1)
    for i, part in enumerate(np.array_split(np.arange(train), 5), start=1):
        _dump(folder / f"data_batch_{i}", {"data": x[part].reshape(len(part), -1), "labels": y[part].tolist()})
    x, y = _shapes(test, 32, seed=2)
    _dump(folder / "test_batch", {"data": x.reshape(len(x), -1), "labels": y.tolist()})
    _dump(folder / "batches.meta", {"label_names": list(CLASS_NAMES), "num_vis": 3072})
    done.touch()
    return root, time.time() - start


def _dump(path: Path, entry: dict) -> None:
    with open(path, "wb") as f:
        pickle.dump(entry, f, protocol=2)  # as the original CIFAR files (Python 2 pickles)


def write_jpeg_folder(root: Path, count: int, size: tuple[int, int], workers: int) -> tuple[Path, float]:
    """`root`/train/<class>/*.jpg (`count` images of `size` = (width, height), quality 90) and a
    small val/ (2% of count, at least one per class): `shapes` drawn at 64x64 and resized, so the
    files decode like photographs of that size. Returns (root, seconds spent; 0 when already there)."""
    done = root / ".complete"
    if done.exists():
        return root, 0.0
    start = time.time()
    jobs = []
    for split, n, seed in (("train", count, 3), ("val", max(len(CLASS_NAMES), count // 50), 4)):
        for name in CLASS_NAMES:
            (root / split / name).mkdir(parents=True, exist_ok=True)
        images, labels = _shapes(n, 64, seed)  # here: torch's threads in forked workers can hang
        images = images.transpose(0, 2, 3, 1)  # (n, 64, 64, 3) for PIL
        step = max(1, -(-n // max(workers, 1)))
        jobs += [(root / split, first, images[first:first + step], labels[first:first + step], size)
                 for first in range(0, n, step)]
    with ProcessPoolExecutor(max(workers, 1)) as pool:
        list(pool.map(_write_jpegs, jobs))
    done.touch()
    return root, time.time() - start


def _write_jpegs(job: tuple) -> None:
    """Resize and encode one worker's share (PIL only: no torch in the workers)."""
    from PIL import Image

    folder, first, images, labels, size = job
    for i, (image, label) in enumerate(zip(images, labels.tolist())):
        picture = Image.fromarray(image).resize(size, Image.Resampling.BICUBIC)
        picture.save(folder / CLASS_NAMES[label] / f"{first + i:06d}.jpg", quality=90)
