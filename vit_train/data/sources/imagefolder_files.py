"""data=imagefolder's files (imagefolder.py is the option): ImageNet-style folders, root/train/<class>/* and
root/val/<class>/*, classes named by train/, read as torchvision ImageFolders; without labels, any folder of images."""

from __future__ import annotations

import logging
import unicodedata
from pathlib import Path

from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS

from vit_train.data.decoding.image import IMAGE_ERRORS, UnreadableImage, open_rgb
from vit_train.data.decoding.listing import list_images, path_is_image, say_skipped
from vit_train.data.sources.base import UNLABELLED_CLASS
from vit_train.errors import DataError

log = logging.getLogger("vit_train")


class _FixedClassFolder(ImageFolder):
    """An ImageFolder whose classes are given (the train split's, NFC-normalised) and mapped onto this
    split's own folder names; its files are listed by decoding/listing.py (regular files only, each folder
    once, names starting with '.' skipped at every depth)."""

    def __init__(self, root: Path, classes: list[str], folders: dict[str, str], allow_empty: bool):
        self._given = classes, {folder: classes.index(name) for name, folder in folders.items()}
        super().__init__(str(root), loader=open_rgb, is_valid_file=path_is_image, allow_empty=allow_empty)

    def find_classes(self, directory: str) -> tuple[list[str], dict[str, int]]:
        return self._given

    def make_dataset(
        self,
        directory: str,
        class_to_idx: dict[str, int],
        extensions=None,
        is_valid_file=None,
        allow_empty: bool = False,
    ) -> list[tuple[str, int]]:
        """(path, class index) of every image of every class folder, in torchvision's order; raises
        FileNotFoundError (as torchvision does) when a class folder has none and not `allow_empty`."""
        samples, empty, skipped = [], [], []
        for folder in sorted(class_to_idx):
            files, passed = list_images(Path(directory) / folder)
            samples += [(path, class_to_idx[folder]) for path in files]
            skipped += [f"{folder}/{entry}" for entry in passed]
            if not files:
                empty.append(self._given[0][class_to_idx[folder]])  # the class's (NFC) name
        say_skipped(directory, skipped)
        if empty and not allow_empty:
            raise FileNotFoundError(", ".join(empty))
        return samples

    def __getitem__(self, index: int):
        try:
            return super().__getitem__(index)
        except IMAGE_ERRORS as e:
            raise UnreadableImage(index) from e


def class_folders(split: Path) -> dict[str, str]:
    """{NFC-normalised class name: folder name on disk} of a split's visible sub-folders.

    Names are compared after Unicode NFC normalisation: a folder copied from macOS (NFD names) matches
    its twin that looks the same. Two folders with the same normalised name are refused, and so are
    class folders that are links to the split or a folder above it (every other class's images would
    get this label) or two names of one folder (each image would get both labels).
    """
    folders: dict[str, str] = {}
    above = {_identity(p) for p in [split, *split.resolve().parents]}
    seen: dict[tuple[int, int], str] = {}
    for entry in sorted(split.iterdir()):
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        name, identity = unicodedata.normalize("NFC", entry.name), _identity(entry)
        if name in folders:
            raise DataError(
                f"{split} has two class folders named {name!r} (one with decomposed accents); "
                f"merge them into one folder"
            )
        if identity in above:
            raise DataError(
                f"the class folder {entry} is a link to {split} or a folder above it, so every other "
                f"class's images would be read as {entry.name!r}; remove the link"
            )
        if identity in seen:
            raise DataError(
                f"the class folders {seen[identity]!r} and {entry.name!r} of {split} are one folder "
                f"(a link), so each image would have two labels; remove the link or copy the images"
            )
        folders[name], seen[identity] = entry.name, entry.name
    return folders


def _identity(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_dev, info.st_ino


def load_image_folders(root: str | Path) -> tuple[ImageFolder, ImageFolder, list[str]]:
    """Train and val data sets yielding (PIL RGB image, label), and the class names."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(f"data.root {root} does not exist; point it at a folder holding train/ and val/")
    splits = {name: root / name for name in ("train", "val")}
    missing = [name + "/" for name, path in splits.items() if not path.is_dir()]
    if missing:
        raise DataError(
            f"data.root {root} has no {' or '.join(missing)}; the layout is "
            f"root/train/<class>/*.jpg and root/val/<class>/*.jpg"
        )
    train_folders, val_folders = class_folders(splits["train"]), class_folders(splits["val"])
    classes = sorted(train_folders)
    if not classes:
        raise DataError(f"{splits['train']} has no class folders; put each class's images in train/<class>/")
    lacking, extra = sorted(set(classes) - set(val_folders)), sorted(set(val_folders) - set(classes))
    if lacking or extra:  # ImageFolder would silently give val a different label numbering
        both = [
            f"val/ lacks {', '.join(map(repr, lacking))}" if lacking else "",
            f"val/ has {', '.join(map(repr, extra))} that train/ lacks" if extra else "",
        ]
        raise DataError(
            f"the class folders of {splits['train']} and {splits['val']} differ: "
            f"{'; '.join(b for b in both if b)}; train/ and val/ need the same classes"
        )
    try:
        train = _FixedClassFolder(splits["train"], classes, train_folders, allow_empty=False)
    except FileNotFoundError as e:
        raise DataError(
            f"class folder(s) with no images in {splits['train']}: {e.args[0]} "
            f"(image types: {' '.join(IMG_EXTENSIONS)}; names starting with '.' are skipped, and "
            f"files that are not regular files); add images or remove the folder"
        ) from None
    val = _FixedClassFolder(splits["val"], classes, val_folders, allow_empty=True)
    if len(val) == 0:
        raise DataError(f"{splits['val']} holds no images; put validation images in val/<class>/")
    unseen = sorted(set(classes) - {classes[target] for _, target in val.samples})
    if unseen:  # allowed (a rare class may have no val image yet), but its accuracy cannot be measured
        log.warning(
            "val class folder(s) with no images in %s: %s; the val top-1 leaves these classes out",
            splits["val"],
            ", ".join(unseen),
        )
    return train, val, classes


HOLDOUT_EVERY = 20  # a folder without train/ and val/: every 20th image (sorted by path) is a val image


class UnlabelledImages:
    """Image files read without labels, each as (PIL RGB image, 0): for objectives that need none (mae)."""

    def __init__(self, paths: list[Path]):
        self.samples = [(str(p), 0) for p in paths]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        try:
            return open_rgb(self.samples[index][0]), 0
        except IMAGE_ERRORS as e:
            raise UnreadableImage(index) from e


def load_unlabelled_folders(root: str | Path) -> tuple[UnlabelledImages, UnlabelledImages, list[str]]:
    """Train and val images for an objective without labels: every image under root/train and root/val
    at any depth (class folders are allowed and ignored), or, when root has no train/, every image under
    root with each HOLDOUT_EVERY-th (in path order) held out for val."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(
            f"data.root {root} does not exist; point it at a folder of images (or one holding train/ and val/)"
        )
    if (root / "train").is_dir():
        train, val = _images_under(root / "train"), _images_under(root / "val") if (root / "val").is_dir() else []
        if not val:
            raise DataError(
                f"{root / 'val'} holds no images; put some validation images there (any layout), or "
                f"give data.root a plain folder of images and every {HOLDOUT_EVERY}th is held out"
            )
    else:
        everything = _images_under(root)
        train = [p for i, p in enumerate(everything) if i % HOLDOUT_EVERY != HOLDOUT_EVERY - 1]
        val = [p for i, p in enumerate(everything) if i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1]
        if not val:
            raise DataError(
                f"{root} holds {len(everything)} images (types: {' '.join(IMG_EXTENSIONS)}); it needs at "
                f"least {HOLDOUT_EVERY}, one of which is held out for validation"
            )
    if not train:
        raise DataError(f"no training images under {root} (types: {' '.join(IMG_EXTENSIONS)})")
    return UnlabelledImages(train), UnlabelledImages(val), [UNLABELLED_CLASS]


def _images_under(folder: Path) -> list[Path]:
    files, skipped = list_images(folder)
    say_skipped(folder, skipped)
    return sorted(Path(p) for p in files)
