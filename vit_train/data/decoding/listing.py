"""Which files of a folder are images to read: regular files only, each folder once.

Every reader of image folders (imagefolder_files.py's labelled and unlabelled sets, vit-predict's folders)
lists through `list_images`, so one rule holds everywhere:

- An image is a regular file (after following a link to it) whose name has an image extension.
  A FIFO, socket or device named `x.png` is skipped: opening a FIFO blocks until a writer comes,
  so a loader worker (or vit-predict) would wait forever. A broken link is skipped too.
- Links to folders are followed, but every folder is read once per listing: a link back to a
  folder above it (`ln -s .. train/red/loop`), a link to the listed folder or one of its parents,
  or a second link to a folder already read is skipped, so no image is listed twice and a loop
  never makes the walk endless.
- Names starting with '.' are skipped at every depth ('.ipynb_checkpoints/', macOS's '._x.jpg').
- A folder named like an image (`x.png/`) is a folder, never an image.

What was skipped (other than hidden names) is returned, for one warning line per listing (`say_skipped`).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("vit_train")
SHOWN = 3  # skipped entries named in the warning line; the rest are counted


def path_is_image(path: str | Path) -> bool:
    """Whether the name has an image extension (torchvision's IMG_EXTENSIONS, any case); says nothing of what the file
    is. torchvision is imported here, not at the top: the regular-file checks of this room (regular.py) serve the
    config's own modules, which import no torch."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    return str(path).lower().endswith(IMG_EXTENSIONS)


def file_kind(mode: int) -> str:
    """What a non-regular file is, in a few words (from its st_mode)."""
    kinds = (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a folder"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def list_images(folder: str | Path, recursive: bool = True) -> tuple[list[str], list[str]]:
    """(image files under `folder`, what was skipped), by the module's rule.

    Files are paths joined onto `folder` as given, in torchvision's ImageFolder order: sorted by
    (folder path, file name). Skipped entries are paths relative to `folder` with the reason, e.g.
    `red/x.png (a FIFO)`. `recursive` False reads only `folder` itself. A folder that cannot be
    listed (permissions) is skipped and named; `folder` itself must be listable (OSError otherwise).
    """
    top = str(folder)
    seen = {_identity(p) for p in [Path(top), *Path(top).resolve().parents]}  # the folder and those above it
    found: list[tuple[str, str]] = []
    skipped: list[str] = []
    pending = [top]
    while pending:
        directory = pending.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as e:
            if directory == top:
                raise
            skipped.append(f"{os.path.relpath(directory, top)}/ ({e.strerror or e})")
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            where = os.path.relpath(entry.path, top)
            try:
                info = os.stat(entry.path)  # follows links: what reading it would open
            except OSError as e:  # a broken link, a link loop (ELOOP), a file gone meanwhile
                if path_is_image(entry.name) or entry.is_symlink():
                    skipped.append(f"{where} ({_unstatable(entry, e)})")
                continue
            if stat.S_ISDIR(info.st_mode):
                if not recursive:
                    continue
                if (info.st_dev, info.st_ino) in seen:
                    skipped.append(f"{where}/ (a link to a folder read already or above it)")
                    continue
                seen.add((info.st_dev, info.st_ino))
                pending.append(entry.path)
            elif path_is_image(entry.name):
                if stat.S_ISREG(info.st_mode):
                    found.append((directory, entry.name))
                else:
                    skipped.append(f"{where} ({file_kind(info.st_mode)})")
    return [os.path.join(d, name) for d, name in sorted(found)], sorted(skipped)


def say_skipped(folder: str | Path, skipped: list[str]) -> None:
    """One warning line naming what `list_images` skipped in `folder` (nothing when nothing was)."""
    if skipped:
        more = f" and {len(skipped) - SHOWN} more" if len(skipped) > SHOWN else ""
        log.warning(
            "%s: skipped %d entr%s that cannot be read as image files: %s%s (only regular files are read; "
            "folders once)",
            folder,
            len(skipped),
            "y" if len(skipped) == 1 else "ies",
            ", ".join(skipped[:SHOWN]),
            more,
        )


def _unstatable(entry: os.DirEntry, error: OSError) -> str:
    if entry.is_symlink():
        return "a link loop" if error.errno == errno.ELOOP else "a broken link"
    return error.strerror or str(error)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino
