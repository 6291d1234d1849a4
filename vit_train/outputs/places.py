"""Where a command writes: its output places checked before the work, and files written so that a
reader never finds one half written, whatever stops the write (a full disk, a read-only or missing
folder, a kill, a power loss).

Every file a command leaves (results.json, metrics.json, an export, a figure, a sweep summary) is
written to `<name>.tmp` beside it, flushed and fsynced, renamed over `<name>` and the folder fsynced:
`<name>` is the old file or the complete new one, also after a power loss; a failed write removes
its temporary file. `place_error` turns the OSError of a write into one OutputError line naming the
file and what to do. No torch here: the command line uses it before the config is known to be valid.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from vit_train.errors import OutputError

FREE_SPACE = "free some space or give another place"


def fsync_dir(folder: Path) -> None:
    """Make the names in `folder` (a rename, a new file) durable; a file system that cannot fsync a
    folder (some network ones) is left to its own guarantees."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:  # EINVAL: not supported there; anything else (EIO) is a failed write
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """Flush `path`'s contents to the disk (before it is renamed into place)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """Yields the temporary path `<path>.tmp` to write `path`'s new contents to; when the block ends
    without an error the file is fsynced, renamed over `path` and the folder fsynced. Any error (or
    a KeyboardInterrupt) removes the temporary file and leaves `path` as it was, then is re-raised."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        yield tmp
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # the folder itself is gone or read-only: there is no temporary file to remove
            pass
        raise
    fsync_dir(path.parent)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write `data` (text as UTF-8, or bytes) to `path` through `atomic_file`: `path` is never half
    written, and once this returns it survives a power loss. Raises OSError (the temporary file removed)."""
    with atomic_file(path) as tmp, open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()


def place_error(
    error: BaseException, path: Path, advice: str = FREE_SPACE, otherwise: str = "give another place"
) -> OutputError:
    """One line for a failed write of `path`: what the system said in words (no space left on <mount>,
    a read-only file system, permission denied, <folder> is not a folder), then what to do: `advice`
    for a full disk or quota, `otherwise` for anything else."""
    path = Path(path)
    code = getattr(error, "errno", None)
    if code not in (errno.ENOSPC, errno.EDQUOT):
        advice = otherwise
    if code == errno.ENOTDIR:
        blocker = next((p for p in [path, *path.parents] if p.exists() and not p.is_dir()), path.parent)
        why = f"{blocker} is a file, not a folder"
    elif code == errno.EISDIR:
        why = f"{path} is a folder"
    elif code == errno.EROFS:
        why = "the file system there is read-only"
    elif code in (errno.EACCES, errno.EPERM):
        why = "permission denied"
    else:
        from vit_train.outputs.integrity import write_failure  # torch: only once a write has failed

        why = write_failure(error, path, 0, None)
    return OutputError(f"could not write {path}: {why}; {advice}")


def os_error_of(error: BaseException) -> OSError | None:
    """The OSError inside `error`: itself, or one a library reported as text ('... (os error 28)', as
    safetensors does); None when it is no failed system call."""
    if isinstance(error, OSError):
        return error
    found = re.search(r"os error (\d+)", str(error))
    return OSError(int(found.group(1)), os.strerror(int(found.group(1)))) if found else None


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
    ):
        if test(mode):
            return name
    return None if stat.S_ISREG(mode) else "not a regular file"


def check_output_file(path: Path, key: str) -> None:
    """Before any work: `path` (given as `key`=) can be written as a file. It may be absent or a
    regular file (replaced); its folder is made if missing. Raises OutputError (one line) when `path`
    is a folder, a FIFO, a socket or a device (writing it would replace it, or block forever), or its
    folder cannot be made or written (read-only, missing permission, a file on the way). Never blocks."""
    path = Path(path)
    try:
        kind = _kind(os.stat(path).st_mode)
    except FileNotFoundError:
        kind = None
    except OSError as e:  # ENOTDIR: a file on the way; ELOOP: a link loop
        raise place_error(e, path, otherwise=f"give another {key}=") from None
    if kind:
        raise OutputError(
            f"{key}={path} is {kind}, not a file to write; give a file name, e.g. "
            f"{key}={path.parent / ('model' + path.suffix) if path.suffix else path.parent / 'out'}"
        )
    check_output_folder(path.parent, key, of=path)


def check_output_folder(folder: Path, key: str, of: Path | None = None) -> None:
    """Before any work: files can be made in `folder`, or it can be made (its nearest existing folder
    is tried, with an empty file made and removed; nothing is left, so a command that fails later for
    another reason leaves no empty folder). Raises OutputError (one line naming `key`) when `folder`
    or a folder above it is a file or a FIFO, or cannot be written (read-only, missing permission, a
    full disk with no room for an empty file)."""
    folder = Path(folder).absolute()
    target = of or folder
    existing = folder
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise OutputError(
                f"{key}={target} cannot be written: {existing} is "
                f"{_kind(os.stat(existing).st_mode) or 'a file'}, not a folder; give another {key}="
            )
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".vit-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise place_error(e, target, f"{FREE_SPACE} ({key}=)", f"give another {key}=") from None


def print_output(text: str) -> None:
    """`text` and a newline to standard output, as a command's result. A closed pipe (`| head`) ends
    the command quietly with status 141, as SIGPIPE would. Any other failed write (a full disk,
    /dev/full, a quota) raises OutputError naming where the output went, after cutting a regular file
    back to its size before this write (a shorter list of predictions never looks complete); what
    was left unwritten is dropped, so the interpreter's exit does not fail on it again."""
    if sys.stdout is None:  # started with its standard output closed (>&-)
        raise OutputError("standard output is closed, so the results cannot be shown; send them to a file (> FILE)")
    try:
        sys.stdout.flush()  # what went before (held log lines) is not this output's
    except OSError:
        pass
    fd, start = _stdout_file()
    try:
        print(text, flush=True)
    except BrokenPipeError:
        _drop_stdout()
        raise SystemExit(141) from None
    except OSError as e:
        target = (
            os.readlink(f"/proc/self/fd/{fd}")
            if fd is not None and os.path.exists(f"/proc/self/fd/{fd}")
            else "standard output"
        )
        if start is not None:
            try:
                os.ftruncate(fd, start)
            except OSError:
                pass
        _drop_stdout()
        why = (
            place_error(e, Path(target))
            if start is not None
            else OutputError(f"could not write the output to {target}: {e.strerror or e}; send it elsewhere")
        )
        raise why from None


def _stdout_file() -> tuple[int | None, int | None]:
    """(standard output's descriptor, its size when it is a regular file, else None)."""
    try:
        fd = sys.stdout.fileno()
        info = os.fstat(fd)
    except (OSError, ValueError, AttributeError):  # a closed or in-memory stream (a test's capture)
        return None, None
    return fd, info.st_size if stat.S_ISREG(info.st_mode) else None


def _drop_stdout() -> None:
    """Standard output pointed at /dev/null: the unwritten rest of its buffer goes nowhere at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
