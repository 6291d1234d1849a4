"""CIFAR-10/100 from the standard python-format batches, read straight into uint8 tensors.

Any folder in the standard layout works (`<root>/cifar-10-batches-py/data_batch_1` ...); when it is
absent and downloading is allowed, the official archive is fetched and its MD5 checked first.
The batches are pickles, so they are read with an unpickler that admits only numpy arrays.
"""

from __future__ import annotations

import os
import pickle
import urllib.error
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vit_train.data.decoding.regular import NotRegularFile, not_regular, open_regular
from vit_train.data.sources.base import DataSource
from vit_train.errors import DataError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class CifarFormat:
    title: str
    url: str
    md5: str
    folder: str  # folder the archive unpacks to
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    meta_file: str
    label_key: str
    names_key: str

    @property
    def files(self) -> tuple[str, ...]:
        return (*self.train_files, *self.test_files, self.meta_file)


FORMATS = {
    "cifar10": CifarFormat(
        "CIFAR-10",
        "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        "c58f30108f718f92721af3b95e74349a",
        "cifar-10-batches-py",
        tuple(f"data_batch_{i}" for i in range(1, 6)),
        ("test_batch",),
        "batches.meta",
        "labels",
        "label_names",
    ),
    "cifar100": CifarFormat(
        "CIFAR-100",
        "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
        "eb9058c3a382ffc7106e4002c42a8d85",
        "cifar-100-python",
        ("train",),
        ("test",),
        "meta",
        "fine_labels",
        "fine_label_names",
    ),
}

# (mean, std) of the training images, per channel, in [0, 1] units.
STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


@dataclass
class Cifar10(DataSource):
    """data=cifar10: the python-format batches under data.root, downloaded (MD5-checked) when absent; 32x32
    images in 4-pixel patches by default."""

    stats = STATS["cifar10"]
    loading_keys = ("download",)

    name: str = "cifar10"
    num_workers: int | None = 4
    root: str | None = "data"  # folder holding (or to receive) the batches, relative to where you run; null = data
    download: bool = True  # download (checksum-verified) when the files are absent

    def location(self) -> str | None:
        return self.root

    def splits(self, img_size: int, labels: bool = True) -> tuple:
        from vit_train.data.datasets import TensorImages

        (train_x, train_y), (val_x, val_y), names = load_cifar(self.name, self.root or "data", self.download)
        return TensorImages(train_x, train_y), TensorImages(val_x, val_y), names, 32


@dataclass
class Cifar100(Cifar10):
    """data=cifar100: as data=cifar10, with CIFAR-100's batches and 100 fine labels."""

    stats = STATS["cifar100"]

    name: str = "cifar100"


class _ArrayUnpickler(pickle.Unpickler):
    """Admits the numpy globals an array needs and nothing else, so a batch file cannot run code."""

    ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a CIFAR batch")
        return super().find_class(module, name)


def _read(path: Path) -> dict:
    try:
        with open_regular(path) as f:
            entry = _ArrayUnpickler(f, encoding="latin1").load()
    except NotRegularFile as e:  # replaced since find_folder looked
        raise DataError(f"{e}; put the CIFAR batch file there") from None
    except OSError as e:  # no permission, a link loop
        raise DataError(
            f"{path} cannot be read ({e.strerror or e}); make it readable, or delete the folder to download it again"
        ) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
        raise DataError(f"{path} is not a readable CIFAR batch ({e}); delete the folder to download it again") from None
    if not isinstance(entry, dict):
        raise DataError(f"{path} is not a CIFAR batch (expected a dict, found {type(entry).__name__})")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in entry.items()}


def find_folder(name: str, root: Path, download: bool) -> Path:
    """The folder holding the batches: root/<folder>, or root itself; downloads when allowed."""
    fmt = FORMATS[name]
    for folder in (root / fmt.folder, root):
        if folder.is_dir() and any(os.path.lexists(folder / f) for f in fmt.files):
            kinds = {f: not_regular(folder / f) for f in fmt.files}  # never opened unless regular: a FIFO blocks
            special = [f"{f} is {kind}" for f, kind in kinds.items() if kind not in (None, "missing")]
            if special:
                raise DataError(
                    f"{fmt.title} folder {folder}: {', '.join(special)}, not a regular file; put the "
                    f"batch files there (delete the folder and rerun with data.download=true to fetch them)"
                )
            missing = [f for f, kind in kinds.items() if kind == "missing"]
            if missing:
                raise DataError(
                    f"{fmt.title} folder {folder} is missing {', '.join(missing)}; delete it and rerun "
                    f"with data.download=true to fetch a complete copy"
                )
            return folder
    if not download:
        raise DataError(
            f"no {fmt.title} batches under {root} (expected {root / fmt.folder}); set data.root to the "
            f"folder that holds {fmt.folder}/, or data.download=true to download it"
        )
    _download(fmt, root)
    return root / fmt.folder


def _download(fmt: CifarFormat, root: Path) -> None:
    """The archive under `root`, fetched and MD5-checked, then unpacked. An archive already there (put by hand, or
    a whole earlier download) is unpacked if its MD5 is the official one, and otherwise refused, never deleted:
    only a file this call downloaded is removed after a failure."""
    from torchvision.datasets.utils import check_integrity, download_and_extract_archive, extract_archive

    archive = root / Path(fmt.url).name
    if os.path.lexists(archive):
        kind = not_regular(archive)
        if kind is not None:
            raise DataError(
                f"{archive} is {kind if kind != 'missing' else 'a broken link'}, not the {fmt.title} "
                f"archive; move it away to download the archive, or put the archive there"
            )
        if not check_integrity(str(archive), fmt.md5):
            raise DataError(
                f"{archive} is not the {fmt.title} archive (its MD5 is not {fmt.md5}: incomplete, or "
                f"another file); replace it with a complete copy, or move it away to download one"
            )
        extract_archive(str(archive), str(root))
        return
    try:
        download_and_extract_archive(fmt.url, download_root=str(root), md5=fmt.md5)
    except RuntimeError as e:  # torchvision's checksum failure
        archive.unlink(missing_ok=True)
        raise DataError(
            f"the download of {fmt.url} failed its MD5 check ({e}); it was deleted, rerun to try again"
        ) from None
    except (urllib.error.URLError, OSError) as e:
        archive.unlink(missing_ok=True)
        raise DataError(
            f"could not download {fmt.url} ({e}); download and unpack it under {root} by hand, "
            f"or point data.root at a folder that holds {fmt.folder}/"
        ) from None


def load_cifar(name: str, root: str | Path, download: bool = True):
    """Train and test images (N, 3, 32, 32) uint8 with int64 labels, and the class names."""
    import numpy as np
    import torch

    fmt = FORMATS[name]
    folder = find_folder(name, Path(root).expanduser(), download)

    def load(files: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        batches = [_read(folder / f) for f in files]
        try:
            images = np.concatenate([np.asarray(b["data"], dtype=np.uint8).reshape(-1, 3, 32, 32) for b in batches])
            labels = np.concatenate([np.asarray(b[fmt.label_key], dtype=np.int64) for b in batches])
        except (KeyError, ValueError) as e:
            raise DataError(
                f"{fmt.title} batches in {folder} are malformed ({e}); delete the folder to download it again"
            ) from None
        if len(images) != len(labels):
            raise DataError(f"{fmt.title} batches in {folder} hold {len(images)} images but {len(labels)} labels")
        return torch.from_numpy(images), torch.from_numpy(labels)

    meta = _read(folder / fmt.meta_file)
    class_names = [n.decode() if isinstance(n, bytes) else str(n) for n in meta.get(fmt.names_key, [])]
    train, test = load(fmt.train_files), load(fmt.test_files)
    top = int(max(train[1].max(), test[1].max()))
    if top >= len(class_names):
        raise DataError(f"{fmt.title} labels go up to {top} but {fmt.meta_file} names {len(class_names)} classes")
    return train, test, class_names
