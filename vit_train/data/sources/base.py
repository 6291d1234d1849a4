"""What a data set is to vit-train (`DataSource`), and the base of those read from image files
(`EncodedImages`). Each data set is one module in this folder: a subclass with its own keys (fields),
their checks, the input size it defaults the model to, its normalisation statistics and how its
splits are read. Setting its own `name` registers it as data=NAME (schema/typed.py `Option`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from vit_train.schema.sections import DataConfig
from vit_train.schema.typed import fraction, overridden, require

if TYPE_CHECKING:
    import torch

    from vit_train.data.loaders import Data
    from vit_train.schema.config import Config
    from vit_train.schema.sections import RunConfig

UNLABELLED_CLASS = "image"  # the one "class" of images read without labels (an objective that reads none)
IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))  # ImageNet's per-channel mean and std


@dataclass
class DataSource(DataConfig):
    """A data set: its keys, and what the run asks of it.

    Random-access data sets (all but shards) implement `splits`; `build` then makes this process's loaders
    (data/loaders.py). A stream overrides `build`. `stats`: the (mean, std) per channel, in [0, 1] units,
    the images are normalised with. `loading_keys`: the keys (of its own) that change how the images are
    read, not which images (vit-eval names no folder after them)."""

    stats: ClassVar[tuple] = ((0.0,) * 3, (1.0,) * 3)
    loading_keys: ClassVar[tuple[str, ...]] = (
        "batch_size",
        "eval_batch_size",
        "num_workers",
        "pipeline",
        "repeated_aug",
    )

    @classmethod
    def unimplemented(cls) -> list[str]:
        """`splits`, unless it defines neither it nor its own `build` (a stream's)."""
        return [] if overridden(cls, DataSource, "splits") or overridden(cls, DataSource, "build") else ["splits"]

    def splits(self, img_size: int, labels: bool = True) -> tuple[Any, Any, list[str], int | None]:
        """(train base, val base, class names, the images' native side or None for files of any size); a base
        yields (image, label) items. Without `labels` (an objective that reads none) labels may be absent."""
        raise NotImplementedError

    def checked_splits(self, img_size: int, labels: bool = True) -> tuple[Any, Any, list[str], int | None]:
        """`splits`, with what it returned checked against the contract above (a data set of the user's own may
        return something else): DataError, one line naming data=NAME, what came back and what is wanted."""
        found = self.splits(img_size, labels)
        check_splits(found, f"data={self.name}", labels)
        return found

    def build(self, cfg: Config, device: torch.device, rank: int = 0, world_size: int = 1, labels: bool = True) -> Data:
        """This process's loaders for the run `cfg` (its share of every global batch and of the val set)."""
        from vit_train.data.loaders import random_access_data

        assert cfg.model.img_size is not None  # Config.validate fills it from the data set
        return random_access_data(cfg, self.checked_splits(cfg.model.img_size, labels), device, rank, world_size)

    def eval_spec(self, img_size: int) -> dict[str, Any]:
        """The evaluation preprocessing (data/preprocess.py) for a model of input side `img_size`."""
        from vit_train.data.preprocess import spec

        return spec(img_size, not self.encoded, self.stats)

    def data_bound_advice(self, device: torch.device) -> str:
        """What the warning of a data-bound run (train/throughput.py) tells a user of this data set to do."""
        if self.pipeline != "loader" or device.type != "cuda":
            return "raise data.num_workers" + (
                ", or on a GPU use data.pipeline=device" if device.type != "cuda" else ""
            )
        return "use data.pipeline=device (the images augmented on the GPU), or raise data.num_workers"

    def location(self) -> str | None:
        """Where its images are read from (data.root), for vit-eval's record; None for generated images."""
        return None

    def all_loading_keys(self) -> set[str]:
        """`loading_keys` of this class and its bases, as dotted keys."""
        return {f"data.{key}" for cls in type(self).__mro__ for key in cls.__dict__.get("loading_keys", ())}

    def stream_layout(self, world_size: int) -> dict[str, Any] | None:
        """What the epoch's order depends on beyond the config (a stream's processes and workers), kept in the
        checkpoint; None for a random-access data set, whose order depends on the config alone."""
        return None

    def position_changes(self, saved: dict, layout: dict | None, world_size: int) -> list[str]:
        """What a resume in the middle of an epoch changed that reorders it, beyond the training set's size,
        data.repeated_aug and seed (train/resume.py): `saved` is the checkpoint's data section, `layout` its
        `stream_layout`. None for a random-access data set."""
        return []

    def read_folders(self) -> list[Path]:
        """The folders its images are read from, which vit-shards may not write into."""
        return []

    def check_shardable(self) -> None:
        """Refuse (ConfigError) writing shards from this data set (vit-shards)."""


@dataclass
class EncodedImages(DataSource):
    """Data sets of encoded image files of any size (JPEG, PNG, ...): trained with RandomResizedCrop at 224x224
    in 16-pixel patches by default, evaluated resized and centre-cropped, normalised with ImageNet's statistics;
    an unreadable image follows data.bad_images."""

    encoded: ClassVar[bool] = True
    input_size: ClassVar[tuple[int, int]] = (224, 16)
    stats: ClassVar[tuple] = IMAGENET_STATS
    loading_keys: ClassVar[tuple[str, ...]] = ("bad_images", "max_bad_fraction", "decode")
    root_hint: ClassVar[str] = "a folder of images; add data.root=/path/to/images"  # what data.root must be

    batch_size: int = 256
    num_workers: int | None = None  # null = min(8, CPU count)
    # image folders: holds train/ and val/; webdataset: holds index.json (and by default the shards);
    # hf: a save_to_disk folder or a folder of parquet files
    root: str | None = None
    bad_images: Literal["skip", "error"] = "skip"  # replace an unreadable image, or stop
    max_bad_fraction: float = 0.01  # skip: stop once more than this fraction of a split is unreadable
    # where JPEGs are decoded: cpu = in the loader workers; gpu = a batch at a time on the training device (nvJPEG),
    # then cropped and augmented there; auto = cpu until a measurement shows gpu faster (docs/data.md)
    decode: Literal["auto", "cpu", "gpu"] = "auto"

    def location(self) -> str | None:
        return self.root

    def build(self, cfg: Config, device: torch.device, rank: int = 0, world_size: int = 1, labels: bool = True) -> Data:
        """This process's loaders; with data.decode=gpu the images are decoded on `device` (device/files.py)."""
        from vit_train.data.device.files import device_decoding
        from vit_train.data.loaders import random_access_data

        decoding = device_decoding(cfg, device, rank)
        assert cfg.model.img_size is not None  # Config.validate fills it from the data set
        return random_access_data(
            cfg, self.checked_splits(cfg.model.img_size, labels), device, rank, world_size, decoding
        )

    def data_bound_advice(self, device: torch.device) -> str:
        """Image files: the loader workers decode them, or with data.decode=gpu the training process does."""
        if self.decode == "gpu" and device.type != "cuda":
            return (
                "data.decode=gpu on the CPU decodes in the training process itself: data.decode=cpu decodes in "
                "data.num_workers loader workers"
            )
        return (
            "raise data.num_workers"
            + (", or try data.decode=gpu (docs/data.md)" if self.decode != "gpu" else "")
            + ", or pre-resize the images (vit-shards short_side=N)"
        )

    def given_root(self) -> str:
        """data.root; ConfigError (one line) when it is not given (`check` refuses such a run before any work)."""
        require(bool(self.root), f"data={self.name} needs data.root, {self.root_hint}")
        assert self.root is not None  # require refused None
        return self.root

    def check(self, cfg: RunConfig) -> None:
        super().check(cfg)
        self.given_root()  # refuses a run without data.root
        fraction("data.max_bad_fraction", self.max_bad_fraction)
        if self.decode == "gpu":  # the aug option's transforms read (torchvision): the one check that imports torch
            from vit_train.data.device.files import check_decode

            check_decode(cfg)


SPLITS_CONTRACT = (
    "(train set, val set, class names, the images' native side or None), each set a Dataset of (image, label) "
    "items (docs/extending.md)"
)


def check_splits(found: Any, who: str, labels: bool = True) -> None:
    """Refuse (DataError, one line naming `who`) what a data set's `splits` returned when it is not
    (train set, val set, class names, native side or None): the sets with len() and [i], not empty, their first
    item (unless it is an unreadable image file) an (image, label) pair whose label (when `labels`) is an integer index into the class names; the class
    names a non-empty list of strings; the native side a positive int or None. Reads the first item of each set."""
    from vit_train.data.decoding.image import UnreadableImage
    from vit_train.errors import DataError

    def refuse(what: str) -> DataError:
        return DataError(f"{who}: splits() returned {what}; it must return {SPLITS_CONTRACT}")

    if not isinstance(found, (tuple, list)) or len(found) != 4:
        size = f" of {len(found)}" if isinstance(found, (tuple, list)) else ""
        raise refuse(f"a {type(found).__name__}{size}")
    train, val, names, native = found
    if isinstance(names, (str, bytes)) or not isinstance(names, (list, tuple)):
        example = f" (for {names} classes: [str(i) for i in range({names})])" if isinstance(names, int) else ""
        raise refuse(f"class names as a {type(names).__name__} ({names!r}){example}")
    if not names or not all(isinstance(name, str) for name in names):
        odd = next((n for n in names if not isinstance(n, str)), None)
        raise refuse("no class names" if not names else f"a class name that is a {type(odd).__name__} ({odd!r})")
    if native is not None and (isinstance(native, bool) or not isinstance(native, int) or native <= 0):
        raise refuse(f"{native!r} as the images' native side (pixels)")
    for split, data in (("train", train), ("val", val)):
        if not (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
            raise refuse(f"a {type(data).__name__} as the {split} set, which has no len() and [i]")
        if len(data) == 0:
            raise refuse(f"an empty {split} set")
        try:
            item = data[0]
        except UnreadableImage:  # an image file that cannot be read: data.bad_images decides, when it is loaded
            continue
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            shape = f" with keys {sorted(item)}" if isinstance(item, dict) else ""
            raise refuse(f"{split} items that are a {type(item).__name__}{shape}, not an (image, label) pair")
        label = item[1]
        if labels and not is_index(label, len(names)):
            raise refuse(f"{split}[0]'s label {label!r}, not an integer index into the {len(names)} class names")


def is_index(label: Any, classes: int) -> bool:
    """Whether `label` is an integer (a Python, NumPy or 0-d tensor int) in [0, classes)."""
    if isinstance(label, bool):
        return False
    try:
        import operator

        value = operator.index(label)  # int, numpy integers and integer 0-d tensors; not floats or strings
    except TypeError:
        return False
    return 0 <= value < classes
