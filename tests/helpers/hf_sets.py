"""Small data=hf sets written with `datasets` (the `data` extra), nothing downloaded."""

from __future__ import annotations

import io
from pathlib import Path


def png(i: int, side: int = 12) -> bytes:
    """A side x side PNG whose colour follows i."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (side, side), (40 * (i % 3), 7 * i % 255, 90)).save(out, "PNG")
    return out.getvalue()


def hf_parquet(root: Path, train: int = 24, val: int = 8, image=png) -> Path:
    """A data=hf set of parquet files as the Hub lays them out (root/data/SPLIT-00000.parquet): `train` and
    `val` images of 3 classes (a ClassLabel column), image i's bytes `image(i)`; returns root."""
    import datasets

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b", "c"])})
    (root / "data").mkdir(parents=True, exist_ok=True)
    for name, n in (("train", train), ("validation", val)):
        rows = {"image": [{"bytes": image(i), "path": None} for i in range(n)], "label": [i % 3 for i in range(n)]}
        datasets.Dataset.from_dict(rows, features=features).to_parquet(str(root / "data" / f"{name}-00000.parquet"))
    return root
