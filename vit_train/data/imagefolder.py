"""ImageNet-style folders: root/train/<class>/* and root/val/<class>/*, classes named by train/."""

from __future__ import annotations

from pathlib import Path

from PIL import Image
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS

from ..errors import DataError

# What Pillow raises for truncated, empty, foreign or oversized files. Its decompression-bomb guard
# (Image.MAX_IMAGE_PIXELS) stays on: an oversized image counts as unreadable.
IMAGE_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


class UnreadableImage(Exception):
    """An image file that Pillow cannot decode; the data set replaces it and reports its index."""

# ImageNet's per-channel mean and std, the usual choice for natural images.
STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


class _FixedClassFolder(ImageFolder):
    """An ImageFolder whose class list is given (the train split's), not read from its own folder."""

    def __init__(self, root: Path, classes: list[str], allow_empty: bool):
        self._given_classes = classes
        super().__init__(str(root), allow_empty=allow_empty)  # images are opened as RGB by the default loader

    def find_classes(self, directory: str) -> tuple[list[str], dict[str, int]]:
        return self._given_classes, {c: i for i, c in enumerate(self._given_classes)}

    def __getitem__(self, index: int):
        try:
            return super().__getitem__(index)
        except IMAGE_ERRORS as e:
            raise UnreadableImage(index) from e


def describe_unreadable(path: str) -> str:
    """Why Pillow cannot read `path`, in a few words."""
    try:
        with Image.open(path) as image:
            image.convert("RGB")
    except IMAGE_ERRORS as e:
        return f"{type(e).__name__}: {e}"
    return "it could not be read"


def load_image_folders(root: str | Path) -> tuple[ImageFolder, ImageFolder, list[str]]:
    """Train and val data sets yielding (PIL RGB image, label), and the class names."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(f"data.root {root} does not exist; point it at a folder holding train/ and val/")
    splits = {name: root / name for name in ("train", "val")}
    missing = [name + "/" for name, path in splits.items() if not path.is_dir()]
    if missing:
        raise DataError(f"data.root {root} has no {' or '.join(missing)}; the layout is "
                        f"root/train/<class>/*.jpg and root/val/<class>/*.jpg")
    classes = sorted(p.name for p in splits["train"].iterdir() if p.is_dir())
    if not classes:
        raise DataError(f"{splits['train']} has no class folders; put each class's images in train/<class>/")
    val_classes = {p.name for p in splits["val"].iterdir() if p.is_dir()}
    for folder, missing in ((splits["val"], set(classes) - val_classes), (splits["train"], val_classes - set(classes))):
        if missing:  # ImageFolder would silently give val a different label numbering
            raise DataError(f"{folder} lacks class folder(s) {', '.join(sorted(missing))} that the other split has; "
                            f"train/ and val/ need the same classes")
    try:
        train = _FixedClassFolder(splits["train"], classes, allow_empty=False)
    except FileNotFoundError:
        empty = [c for c in classes if not any(_is_image(p) for p in (splits["train"] / c).rglob("*"))]
        raise DataError(f"class folder(s) with no images in {splits['train']}: {', '.join(empty)} "
                        f"(image types: {' '.join(IMG_EXTENSIONS)}); add images or remove the folder") from None
    val = _FixedClassFolder(splits["val"], classes, allow_empty=True)
    if len(val) == 0:
        raise DataError(f"{splits['val']} holds no images; put validation images in val/<class>/")
    return train, val, classes


def _is_image(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in IMG_EXTENSIONS


UNLABELLED_CLASS = "image"  # the one "class" of a folder read without labels
HOLDOUT_EVERY = 20  # a folder without train/ and val/: every 20th image (sorted by path) is a val image


class UnlabelledImages:
    """Image files read without labels, each as (PIL RGB image, 0): for objectives that need none (mae)."""

    def __init__(self, paths: list[Path]):
        self.samples = [(str(p), 0) for p in paths]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        try:
            with Image.open(self.samples[index][0]) as image:
                return image.convert("RGB"), 0
        except IMAGE_ERRORS as e:
            raise UnreadableImage(index) from e


def load_unlabelled_folders(root: str | Path) -> tuple[UnlabelledImages, UnlabelledImages, list[str]]:
    """Train and val images for an objective without labels: every image under root/train and root/val
    at any depth (class folders are allowed and ignored), or, when root has no train/, every image under
    root with each HOLDOUT_EVERY-th (in path order) held out for val."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(f"data.root {root} does not exist; point it at a folder of images (or one holding train/ "
                        f"and val/)")
    if (root / "train").is_dir():
        train, val = _images_under(root / "train"), _images_under(root / "val") if (root / "val").is_dir() else []
        if not val:
            raise DataError(f"{root / 'val'} holds no images; put some validation images there (any layout), or "
                            f"give data.root a plain folder of images and every {HOLDOUT_EVERY}th is held out")
    else:
        everything = _images_under(root)
        train = [p for i, p in enumerate(everything) if i % HOLDOUT_EVERY != HOLDOUT_EVERY - 1]
        val = [p for i, p in enumerate(everything) if i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1]
        if not val:
            raise DataError(f"{root} holds {len(everything)} images (types: {' '.join(IMG_EXTENSIONS)}); it needs at "
                            f"least {HOLDOUT_EVERY}, one of which is held out for validation")
    if not train:
        raise DataError(f"no training images under {root} (types: {' '.join(IMG_EXTENSIONS)})")
    return UnlabelledImages(train), UnlabelledImages(val), [UNLABELLED_CLASS]


def _images_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if _is_image(p))
