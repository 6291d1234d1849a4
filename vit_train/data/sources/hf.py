"""Hugging Face datasets on local disk (data=hf): a `save_to_disk` folder or a folder of parquet files.

Each split is a map-style base data set like an image folder's: items (PIL RGB image, label), the
image decoded from its encoded bytes by decoding/image.py (the same decoder, the same unreadable-image policy),
so the EpochSampler gives it the same order, resume and world-size independence as image folders.
Nothing is downloaded: the `datasets` library runs offline, and parquet files are converted to Arrow
in a temporary folder owned by the process (hf_files.process_copy_folder: one a process, shared by a sweep's
jobs), not in ~/.cache: removed when
the process ends, or by the next data=hf run when the process was killed.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vit_train.data.decoding.regular import open_regular
from vit_train.data.sources.base import UNLABELLED_CLASS, EncodedImages
from vit_train.data.sources.hf_files import (
    check_regular,
    load_from_disk,
    parquet_files,
    process_copy_folder,
    reclaim_copies,
)
from vit_train.errors import DataError
from vit_train.extras import require

if TYPE_CHECKING:
    import torch

log = logging.getLogger("vit_train")

VAL_SPLITS = ("validation", "val", "test")  # data.val_split=null: the first of these the dataset has


@dataclass
class HuggingFace(EncodedImages):
    """data=hf: a Hugging Face dataset on local disk, with an image column (data.image_key) and a label column
    (data.label_key; a ClassLabel names the classes). Needs the data extra: pip install 'vit-train[data]'."""

    root_hint = (
        "a Hugging Face dataset on disk (a save_to_disk folder or a folder of parquet files); add "
        "data.root=/path/to/dataset"
    )

    name: str = "hf"
    image_key: str = "image"  # the image column
    label_key: str = "label"  # the label column (a ClassLabel gives the class names)
    train_split: str = "train"  # the training split
    val_split: str | None = None  # the validation split; null = validation, else val, else test

    def splits(self, img_size: int, labels: bool = True) -> tuple:
        return (
            *load_hf_splits(
                self.given_root(), self.image_key, self.label_key, self.train_split, self.val_split, labels
            ),
            None,
        )

    def read_folders(self) -> list[Path]:
        return [Path(os.path.realpath(Path(self.given_root()).expanduser()))]


class HFImages:
    """One split of a Hugging Face dataset as (PIL RGB image, label) items; `samples[i]` is
    (a description of item i for messages, its label), as an image folder's (path, label)."""

    unreadable_hint = "image files that path cells name, relative to data.root, missing? a damaged dataset?"

    def __init__(self, dataset: Any, image_key: str, labels: torch.Tensor, where: str, root: Path):
        self.dataset, self.image_key, self.labels, self.where, self.root = dataset, image_key, labels, where, root
        self.samples = _Samples(self)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        from vit_train.data.decoding.image import IMAGE_ERRORS, UnreadableImage

        try:
            return self.image(index), int(self.labels[index])
        except IMAGE_ERRORS as e:
            raise UnreadableImage(index) from e

    def image(self, index: int):
        """Item `index`'s image (PIL RGB); raises one of IMAGE_ERRORS when it cannot be read."""
        from vit_train.data.decoding.image import decode_rgb

        return decode_rgb(self.encoded(index), f"{self.where}[{index}]")

    def encoded(self, index: int) -> bytes:
        """Item `index`'s encoded image: the cell's bytes, or the file its path names (relative to data.root);
        raises OSError when there is neither (an empty cell, a missing file)."""
        cell = self.dataset[index][self.image_key]
        if isinstance(cell, str):  # a column of file paths
            return _read(self.root / cell)
        if cell is None:
            raise OSError(f"{self.where}[{index}] has no image (an empty cell)")
        if cell.get("bytes") is not None:
            return cell["bytes"]
        if cell.get("path"):
            return _read(self.root / cell["path"])
        raise OSError(f"{self.where}[{index}] has neither image bytes nor a path")

    def describe_unreadable(self, index: int) -> str:
        """Why item `index`'s image cannot be read, in a few words."""
        from vit_train.data.decoding.image import IMAGE_ERRORS

        try:
            self.image(index)
        except IMAGE_ERRORS as e:
            return describe_error(e)
        return "it could not be read"


def describe_error(error: Exception) -> str:
    """ "Type: message" of an image error (decoding/image.py's messages name the image, never a BytesIO object)."""
    return f"{type(error).__name__}: {error}"


class _Samples:
    def __init__(self, images: HFImages):
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[str, int]:
        return f"{self.images.where}[{index}]", int(self.images.labels[index])


def load_hf_splits(
    root: str | Path, image_key: str, label_key: str, train_split: str, val_split: str | None, labels: bool = True
) -> tuple[HFImages, HFImages, list[str]]:
    """Train and val splits of the dataset at `root` and the class names (label i is names[i]).

    `root`: a save_to_disk folder (a DatasetDict, or a folder of per-split Dataset folders) or a folder
    of parquet files named as the Hub lays them out (train-*.parquet, data/train-*.parquet,
    train/*.parquet). Class names come from a ClassLabel label column, else "0".."K-1" for integer
    labels 0..K-1. Without `labels` the label column may be absent and every item is class 0.
    Raises DataError naming what is missing (a split, a column) or inconsistent (the classes).
    """
    require("datasets", "data=hf", error=DataError, needs="the datasets package")
    reclaim_copies()  # the Arrow copies that killed runs left in the temp dir (one line when there were some)
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(
            f"data.root {root} does not exist; point it at a save_to_disk folder or a folder of parquet files"
        )
    splits = _open(root)
    val_split = val_split or next((s for s in VAL_SPLITS if s in splits), None)
    for key, name in (("train_split", train_split), ("val_split", val_split)):
        if name not in splits:
            raise DataError(
                f"{root} has no split {name!r} (data.{key}); its splits: {', '.join(sorted(splits)) or 'none'}"
                + ("" if name else f" (data.val_split=null looks for {', '.join(VAL_SPLITS)})")
            )
    assert val_split is not None  # None is no split: refused above
    train, val = splits[train_split], splits[val_split]
    for name, ds in ((train_split, train), (val_split, val)):
        if len(ds) == 0:
            raise DataError(
                f"split {name!r} of {root} is empty (no rows); give a split with images or choose "
                f"another with data.{'train' if name == train_split else 'val'}_split"
            )
    wanted = {"image_key": image_key, **({"label_key": label_key} if labels else {})}
    for name, ds in ((train_split, train), (val_split, val)):
        for key, column in wanted.items():
            if column not in ds.column_names:
                raise DataError(
                    f"split {name!r} of {root} has no column {column!r} (data.{key}); its columns: "
                    f"{', '.join(ds.column_names)}"
                )
    names = _class_names(train, val, label_key, train_split, val_split, root) if labels else [UNLABELLED_CLASS]
    made = [
        _images(ds, image_key, label_key if labels else None, len(names), f"{root} {split}", root)
        for ds, split in ((train, train_split), (val, val_split))
    ]
    return made[0], made[1], names


def _open(root: Path) -> dict[str, Any]:
    """{split name: Dataset} of the dataset at `root`."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # read before `datasets` is imported: no network
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()
    if os.path.lexists(root / "dataset_dict.json") or os.path.lexists(root / "state.json"):
        loaded = load_from_disk(datasets, root)
        if isinstance(loaded, datasets.Dataset):
            raise DataError(
                f"{root} holds one Dataset with no splits; save a DatasetDict (e.g. "
                f"DatasetDict(train=..., validation=...).save_to_disk(...)) or give a folder of per-split "
                f"Dataset folders"
            )
        return dict(loaded)
    folders = {p.name: p for p in sorted(root.iterdir()) if os.path.lexists(p / "state.json")}
    if folders:
        return {name: load_from_disk(datasets, path) for name, path in folders.items()}
    files = parquet_files(root)
    if not files:
        raise DataError(
            f"{root} is neither a save_to_disk folder (dataset_dict.json) nor a folder of parquet "
            f"files (train-*.parquet, data/train-*.parquet); point data.root at one"
        )
    for split_files in files.values():
        for f in split_files:
            check_regular(f, "a parquet file")
    cache = process_copy_folder()  # removed at exit; a killed run's by the next data=hf run
    try:
        loaded = datasets.load_dataset(
            "parquet", data_files={k: [str(f) for f in v] for k, v in files.items()}, cache_dir=str(cache)
        )
    except Exception as e:  # pyarrow's and datasets' many errors for a damaged file
        raise DataError(
            f"the parquet files of {root} cannot be read ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); check or rewrite them"
        ) from None
    return dict(loaded)


def _read(path: Path) -> bytes:
    """The bytes of an image file a path cell names; only a regular file is opened (a FIFO would block):
    NotRegularFile or another OSError, an unreadable image, otherwise."""
    with open_regular(path) as f:
        return f.read()


def _class_names(train, val, label_key: str, train_split: str, val_split: str, root: Path) -> list[str]:
    from datasets import ClassLabel

    features = [ds.features[label_key] for ds in (train, val)]
    if all(isinstance(f, ClassLabel) for f in features) and features[0].names != features[1].names:
        raise DataError(
            f"the label column {label_key!r} of {root} names other classes in split {val_split!r} "
            f"than in {train_split!r} ({_short(features[1].names)} vs {_short(features[0].names)}); "
            f"both splits need one ClassLabel"
        )
    named = [f for f in features if isinstance(f, ClassLabel)]
    for f, split in zip(features, (train_split, val_split), strict=True):
        dtype = getattr(f, "dtype", "")
        if isinstance(f, ClassLabel) or dtype.startswith("int") or dtype.startswith("uint"):
            continue
        kind = "strings (class names?)" if dtype in ("string", "large_string") else f"{f}"
        how = (
            (
                f"the other split has a ClassLabel ({_short(named[0].names)}): cast this one to it, "
                f"ds.cast_column({label_key!r}, ClassLabel(names=[...]))"
            )
            if named
            else (
                f"cast it with ds.cast_column({label_key!r}, ClassLabel(names=[...])) (the same names in every "
                f"split) or to integers 0..K-1, or set data.label_key"
            )
        )
        raise DataError(
            f"the label column {label_key!r} of split {split!r} of {root} holds {kind}, not class indices; {how}"
        )
    if named:  # one split's integers are read with the other's names (their range is checked)
        return list(named[0].names)
    count = (
        int(
            max(
                _column(train, label_key, f"{root} {train_split}").max(),
                _column(val, label_key, f"{root} {val_split}").max(),
            )
        )
        + 1
    )
    log.info(
        "data=hf: the label column %r has no class names (no ClassLabel): classes are named 0..%d", label_key, count - 1
    )
    return [str(i) for i in range(count)]


def _short(names: list[str]) -> str:
    return ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")


def _column(ds, key: str, where: str) -> torch.Tensor:
    """Column `key` of `ds` (integers) as an int64 tensor, read through Arrow (no Python objects per row).
    Raises DataError naming the first row of `where` (e.g. "ROOT train") whose cell is empty (None)."""
    import numpy as np
    import pyarrow.compute as pc
    import torch

    column = ds.with_format("arrow", columns=[key])[:].column(key)
    if column.null_count:
        row = pc.index(pc.is_null(column), True).as_py()
        raise DataError(
            f"{where} row {row} has no label (an empty cell in column {key!r}; {column.null_count} "
            f"such rows); fill in or drop those rows (ds.filter), or set data.label_key"
        )
    return torch.from_numpy(np.array(column.to_numpy(), dtype=np.int64).reshape(-1))


def _images(ds, image_key: str, label_key: str | None, classes: int, where: str, root: Path) -> HFImages:
    import torch
    from datasets import Image

    labels = _column(ds, label_key, where) if label_key else torch.zeros(len(ds), dtype=torch.int64)
    bad = ((labels < 0) | (labels >= classes)).nonzero().flatten()
    if len(bad):
        raise DataError(
            f"{where} row {int(bad[0])} has label {int(labels[bad[0]])}, outside 0..{classes - 1} "
            f"({len(bad)} such rows; an unlabelled split has -1); use a labelled split"
        )
    ds = ds.select_columns([image_key])
    if isinstance(ds.features[image_key], Image):
        ds = ds.cast_column(image_key, Image(decode=False))  # the bytes, decoded by decoding/image.py
    elif getattr(ds.features[image_key], "dtype", "") not in ("string", "large_string"):
        raise DataError(
            f"the image column {image_key!r} of {where} holds {ds.features[image_key]}, not images or "
            f"file paths; set data.image_key to the image column"
        )
    return HFImages(ds, image_key, labels, where, root)
