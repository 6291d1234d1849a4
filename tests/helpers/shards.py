"""Small WebDataset shards written directly in vit-train's shard format (docs/data.md, 'WebDataset shards'),
without vit-shards: 8x8 PNGs whose top-left pixel names the sample (R, G = its index in the split, B = the
split: 0 train, 1 val), so a test can tell which sample a loader gave from the pixels alone."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

SPLIT_CODE = {"train": 0, "val": 1}


def png(index: int, split: str, size: int = 8) -> bytes:
    """An 8x8 PNG: every pixel (index % 256, index // 256, split code)."""
    pixels = np.zeros((size, size, 3), np.uint8)
    pixels[..., 0], pixels[..., 1], pixels[..., 2] = index % 256, index // 256, SPLIT_CODE[split]
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def sample_id(image) -> int:
    """The split index an image (PIL, or (3, H, W) uint8 / float tensor of the raw pixels) was written with."""
    pixels = np.asarray(image)
    if pixels.ndim == 3 and pixels.shape[0] == 3:
        pixels = pixels.transpose(1, 2, 0)
    return int(round(float(pixels[0, 0, 0]))) + 256 * int(round(float(pixels[0, 0, 1])))


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_shards(root: Path, train: list[int], val: list[int], classes: int = 3, label=None,
                 members=None) -> dict:
    """Shards of `train` / `val` sample counts each, and index.json, in `root`; sample i of a split has class
    `label(split, i)` (default i % classes). `members(split, i, key)` may give a sample's (name, bytes) list
    instead of the default [key.png, key.cls]. Returns the index."""
    root.mkdir(parents=True, exist_ok=True)
    label = label or (lambda split, i: i % classes)
    splits = {}
    for split, counts in (("train", train), ("val", val)):
        shards, i = [], 0
        for n, count in enumerate(counts):
            name = f"{split}-{n:06d}.tar"
            with tarfile.open(root / name, "w") as tar:
                for _ in range(count):
                    key = f"{split}_{i:08d}"
                    items = members(split, i, key) if members else None
                    for member, data in items or [(f"{key}.png", png(i, split)),
                                                  (f"{key}.cls", str(label(split, i)).encode())]:
                        add(tar, member, data)
                    i += 1
            shards.append({"name": name, "samples": count, "bytes": (root / name).stat().st_size})
        splits[split] = {"samples": sum(counts), "shards": shards}
    index = {"format": "vit-train webdataset", "version": 1, "classes": [f"c{k}" for k in range(classes)],
             "image_size": [8, 8], "source": {"data": "test"}, "splits": splits}
    (root / "index.json").write_text(json.dumps(index))
    return index
