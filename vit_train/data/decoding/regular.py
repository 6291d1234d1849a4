"""Files a user names are read only when they are regular files (issue 23).

Opening a FIFO blocks until a writer comes (forever, for a training run); a device such as
/dev/zero or /dev/urandom never ends; a socket cannot be opened; a folder named like a file or a
symlink loop fails later with a confusing message. Every door that reads a file the user names
(`ckpt=`, `resume=`, `model.pretrained=`, `distill.teacher=`, image files, CIFAR batches) asks
`not_regular` first and says what the path is in one line; image files are opened by
`open_regular`, which checks the file it opened (no window between the check and the open).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from vit_train.data.decoding.listing import file_kind

try:
    import fcntl
except ImportError:  # Windows: no FIFOs to block on, and no O_NONBLOCK to clear
    fcntl = None


KINDS = ("a FIFO", "a socket", "a character device", "a block device", "a folder", "not a regular file")


class NotRegularFile(OSError):
    """A path that names something other than a regular file (an OSError: image readers treat it as an
    unreadable image)."""


def not_regular(path: str | Path) -> str | None:
    """None when `path` (links followed) is a regular file; else what it is, in a few words: "missing",
    "a broken link", "a link loop", "a FIFO", "a socket", "a character device", "a block device",
    "a folder", or "unreadable (<reason>)". Never opens the path, so never blocks."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a link loop"
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return "a broken link" if os.path.islink(path) else "missing"
        return f"unreadable ({e.strerror})"
    return None if stat.S_ISREG(mode) else file_kind(mode)


def open_regular(path: str | Path) -> BinaryIO:
    """`path` opened for binary reading, when it is a regular file (links followed).

    The open itself cannot block (O_NONBLOCK: a FIFO without a writer opens at once) and the check is
    made on the file opened (fstat), so a file swapped for a FIFO after a listing is refused too.
    Raises FileNotFoundError for a missing file, NotRegularFile (an OSError) naming what else it is,
    or the OSError of the open (a link loop: ELOOP, no permission: EACCES).
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError:  # a socket cannot be opened (ENXIO): say what it is, as for the others
        kind = not_regular(path)
        if kind in KINDS:
            raise NotRegularFile(f"{path} is {kind}, not a regular file") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(f"{path} is {file_kind(mode)}, not a regular file")
        if fcntl is not None:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)  # plain reads from here
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
