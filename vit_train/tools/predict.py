"""vit-predict: the top-k classes of image files, with the checkpoint's preprocessing and class names.

`images` entries are files, folders (their image files, not their sub-folders') or glob patterns
(`photos/*.jpg`, `photos/**/*.png` for a whole tree); see `image_files`.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

import torch
from PIL import Image
from torchvision.datasets.folder import IMG_EXTENSIONS

from vit_train.data.decoding.image import IMAGE_ERRORS, ResizeBombError, open_rgb
from vit_train.data.decoding.listing import file_kind, list_images, path_is_image, say_skipped
from vit_train.data.preprocess import eval_transform
from vit_train.errors import ConfigError, DataError
from vit_train.tools.inference import Trained

BATCH = 64  # images per forward pass: a folder of thousands is not one batch
GLOB_CHARACTERS = "*?["


def read_image(path: str | Path) -> Image.Image:
    """`path` as an RGB image, decoded as the training loader decodes it (data/decoding/image.py); one whose resize
    to the model's input would exceed the pixel limit is refused (ResizeBombError: the transform is built first)."""
    try:
        return open_rgb(path)
    except FileNotFoundError:
        raise DataError(f"image {path} does not exist") from None
    except IMAGE_ERRORS as e:
        why = str(e) if isinstance(e, ResizeBombError) else str(e)[:200]  # its own words: sizes and what to do
        raise DataError(f"{path} cannot be read as an image ({type(e).__name__}: {why})") from None


def image_files(entries: list[str]) -> list[str]:
    """The image files `entries` name, in order: a file as given; a folder's image files (by extension,
    names starting with '.' skipped), sorted by name, without its sub-folders'; a glob pattern's
    matching image files, sorted (`**` spans folders: `photos/**/*.jpg`; `photos/*` skips notes.txt
    and sub-folders). An entry that exists is taken literally, so a file named `photo [1].png` is
    not read as a pattern.

    Raises DataError (one line) for a pattern that matches no image file and a folder without image
    files (a missing file is said when it is read: `read_image`).
    """
    files: list[str] = []
    for entry in entries:
        path = Path(entry).expanduser()
        if path.is_dir():
            files += _folder_images(path, entry)
        elif path.exists() or not any(c in entry for c in GLOB_CHARACTERS):
            _refuse_special(path, entry)
            files.append(entry)  # read_image says it if it does not exist
        else:
            found = _pattern_images(path)
            if not found:
                raise DataError(
                    f"images: the pattern {entry!r} matches no image file (image types: {' '.join(IMG_EXTENSIONS)})"
                )
            files += found
    return files


def _refuse_special(path: Path, entry: str) -> None:
    """A named file that exists but is not a regular file (a FIFO would block the read forever): one line."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # missing or a broken link: read_image says so
    if not stat.S_ISREG(mode):
        raise DataError(
            f"images: {entry} is {file_kind(mode)}, not a regular file; give image files, folders or patterns"
        )


def _pattern_images(pattern: Path) -> list[str]:
    """The regular image files a glob pattern matches, sorted, as glob.glob spells them; names starting
    with '.' are skipped at every depth below the pattern's fixed part, and `**` does not follow links to
    folders (a link loop would repeat every file, or never end)."""
    parts = pattern.parts
    fixed = next(i for i, part in enumerate(parts) if any(c in part for c in GLOB_CHARACTERS))
    base = Path(*parts[:fixed]) if fixed else Path()
    found = []
    for match in base.glob(str(Path(*parts[fixed:]))):
        if any(part.startswith(".") for part in match.relative_to(base).parts) or not path_is_image(match.name):
            continue
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.stat(match).st_mode):
                found.append(str(match))
    return sorted(found)


def _folder_images(folder: Path, entry: str | None = None) -> list[str]:
    """The image files directly in `folder`, sorted (regular files only: data/decoding/listing.py); with `entry`
    (a folder named as such), none is an error."""
    found, skipped = list_images(folder, recursive=False)
    say_skipped(folder, skipped)
    if not found and entry is not None:
        raise DataError(
            f"images: the folder {entry} holds no image files (image types: {' '.join(IMG_EXTENSIONS)}; "
            f"sub-folders are not read: for a whole tree give a pattern, e.g. "
            f"'images=[\"{Path(entry) / '**' / '*.png'}\"]')"
        )
    return found


@torch.no_grad()
def predict(trained: Trained, images: list[str], top_k: int = 5) -> list[dict]:
    """For each image file `images` name (files, folders, glob patterns: `image_files`), the `top_k` classes of
    the `trained` model with their probabilities, most likely first: [{"file", "top": [{"class", "probability"}]}].
    Raises ConfigError (no images given, an MAE checkpoint), DataError (a missing or unreadable file)."""
    trained.cfg.objective.refuse_prediction("predicts no classes")
    if not images:
        raise ConfigError(
            "no images given: images=[a.jpg,b.png], a folder or a pattern such as 'images=[\"photos/*.jpg\"]'"
        )
    files = image_files([str(f) for f in images])
    transform = eval_transform(trained.preprocess)
    names, results = trained.class_names, []
    for start in range(0, len(files), BATCH):
        chunk = files[start : start + BATCH]
        probs = (
            trained.model(torch.stack([transform(read_image(f)) for f in chunk])).float().softmax(dim=1)
        )  # (B, classes)
        top = probs.topk(min(top_k, probs.shape[1]), dim=1)
        results += [
            {
                "file": f,
                "top": [
                    {"class": names[i], "probability": p}
                    for p, i in zip(values.tolist(), indices.tolist(), strict=True)
                ],
            }
            for f, values, indices in zip(chunk, top.values, top.indices, strict=True)
        ]
    return results
