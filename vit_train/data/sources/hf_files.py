"""The files of a Hugging Face dataset on local disk (data=hf): a save_to_disk folder opened with every
file it names checked to be a regular file and its errors turned into one line, the Hub's parquet
layouts (train-*.parquet, data/train-*.parquet, train/*.parquet) found, one layout a split, and the
folders that hold a run's Arrow copy of parquet files.

The copy lives in `<temp dir>/vit-train-hf-XXXXXXXX` (tempfile's: $TMPDIR, else /tmp). Its owner holds an
flock on the folder's `owner.lock` for its whole life, so a kill -9, a crash or the OOM killer frees the
lock with the process and a reused pid never passes for the owner; the file also names the owner (host,
pid, start time, command) for people. A normal exit removes the folder (atexit); the next data=hf run
removes the folders whose lock is free (`reclaim_copies`), never one whose owner still runs.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import os
import shutil
import socket
import stat
import sys
import tempfile
import time
from pathlib import Path

from vit_train.data.decoding.regular import not_regular, open_regular
from vit_train.errors import DataError

log = logging.getLogger("vit_train")

COPY_PREFIX = "vit-train-hf-"  # <temp dir>/vit-train-hf-XXXXXXXX: one run's Arrow copy of parquet files
OWNER_LOCK = "owner.lock"  # in the copy's folder: flocked by its owner while it lives, its record for people
_NEW_LOCK = "owner.lock.new"  # the lock file before it is locked: a reclaimer never sees an unlocked owner.lock
# A folder with no owner.lock (an older vit-train's copy, or one killed before it locked) is removed only
# when nothing in it changed for this long and no process here has a file in it open or mapped.
UNOWNED_GRACE_S = 3600
# The lock descriptors of this process's copies, so that a forked child (a DataLoader worker) closes its
# copies: the copy belongs to the process that made it, not to a worker that outlives it for a moment.
_held: set[int] = set()


# What load_from_disk raises for a malformed folder: a missing or cut-short file (OSError, pyarrow's
# ArrowInvalid, a ValueError), a state.json that is not JSON (JSONDecodeError, a ValueError) or lacks its
# keys (KeyError, TypeError), a split with no Arrow file (IndexError).
SAVED_ERRORS = (OSError, ValueError, KeyError, IndexError, TypeError)


def load_from_disk(datasets, path: Path):
    """`datasets.load_from_disk(path)` (a Dataset or DatasetDict) after checking its files; raises DataError
    (one line naming the folder) for an empty split, a FIFO or other non-regular file, or a malformed folder."""
    empty = empty_split(path)
    if empty is not None:
        raise DataError(
            f"split folder {empty} of the save_to_disk folder {path} holds no Arrow file (an empty "
            f"split); save the split with its rows, or remove it and choose another data.val_split"
        )
    check_saved(path)
    try:
        return datasets.load_from_disk(str(path))
    except SAVED_ERRORS as e:
        raise DataError(
            f"{path} is not a readable save_to_disk folder ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); save it again or point data.root at "
            f"another"
        ) from None


def empty_split(path: Path) -> Path | None:
    """The split folder (`path` itself or one of a DatasetDict's) whose state.json lists no Arrow file, if any."""
    for state in [path / "state.json", *sorted(path.glob("*/state.json"))]:
        try:
            with open_regular(state) as f:
                files = json.load(f).get("_data_files")
        except (OSError, ValueError, AttributeError):
            continue  # missing, or malformed: load_from_disk says what is wrong with it
        if files == []:
            return state.parent
    return None


def check_regular(path: Path, what: str) -> None:
    """DataError (one line) when `path`, which `datasets` or pyarrow would open, is a FIFO, socket, device,
    folder or link loop: opening a FIFO blocks until a writer comes, a device never ends."""
    kind = not_regular(path)
    if kind is not None and kind != "missing":
        raise DataError(
            f"{path} is {kind}, not {what} (a regular file); replace it with the file it stands for or remove it"
        )


def check_saved(path: Path) -> None:
    """Every file load_from_disk opens in the save_to_disk folder `path` (dataset_dict.json, each split's
    state.json, dataset_info.json and Arrow files) is a regular file or missing (then `datasets` says so)."""
    if os.path.lexists(path / "dataset_dict.json"):
        check_regular(path / "dataset_dict.json", "a save_to_disk index")
        try:
            with open_regular(path / "dataset_dict.json") as f:
                splits = json.load(f).get("splits", [])
        except (OSError, ValueError, AttributeError):
            return  # load_from_disk says what is wrong with it
        for split in splits if isinstance(splits, list) else []:
            if isinstance(split, str) and (path / split).is_dir():
                check_saved(path / split)
        return
    for name in ("state.json", "dataset_info.json"):
        check_regular(path / name, "a save_to_disk file")
    try:
        with open_regular(path / "state.json") as f:
            files = json.load(f).get("_data_files", [])
    except (OSError, ValueError, AttributeError):
        return
    for entry in files if isinstance(files, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("filename"), str):
            check_regular(path / entry["filename"], "a save_to_disk Arrow file")


def parquet_files(root: Path) -> dict[str, list[Path]]:
    """{split: its parquet files}: SPLIT-*.parquet or SPLIT/*.parquet in `root` or `root/data`.
    Raises DataError when a split's files are in two of these layouts (a copy would read every row twice)."""
    found: dict[str, dict[str, list[Path]]] = {}  # split: {layout: files}
    for folder in (root, root / "data"):
        if not folder.is_dir():
            continue
        for f in sorted(folder.glob("*.parquet")):
            split = f.name.split("-")[0].split(".")[0]
            found.setdefault(split, {}).setdefault(f"{folder}/{split}*.parquet", []).append(f)
        for sub in sorted(p for p in folder.iterdir() if p.is_dir() and p.name != "data"):
            if parts := sorted(sub.glob("*.parquet")):
                found.setdefault(sub.name, {})[f"{sub}/*.parquet"] = parts
    for split, layouts in found.items():
        if len(layouts) > 1:
            raise DataError(
                f"split {split!r} of {root} has parquet files in two layouts ({' and '.join(layouts)}), "
                f"so every row would be read twice; keep one layout and move the other out of data.root"
            )
    return {split: files for split, layouts in found.items() for files in layouts.values()}


_process_copy: tuple[int, Path] | None = None  # (pid, folder): this process's copy folder, once made


def process_copy_folder() -> Path:
    """This process's one copy folder (`make_copy_folder`, made on first use, again in a forked child): the
    jobs of a sweep run one after another in one process and share it, and `datasets`' cache in it converts
    each set of parquet files once (keyed by their paths and modification times), not once a job."""
    global _process_copy
    if (
        _process_copy is None
        or _process_copy[0] != os.getpid()
        or not _process_copy[1].is_dir()
        or _process_copy[1].parent != Path(tempfile.gettempdir())
    ):  # $TMPDIR changed: a copy there
        _process_copy = (os.getpid(), make_copy_folder())
    return _process_copy[1]


def make_copy_folder() -> Path:
    """A new, empty-but-for-its-lock folder for this process's Arrow copy of parquet files, in the temp dir
    (`COPY_PREFIX`), owned by this process: removed when it exits normally, and by the next data=hf run
    (`reclaim_copies`) when it was killed, since the lock dies with the process."""
    folder = Path(tempfile.mkdtemp(prefix=COPY_PREFIX))
    fd = os.open(folder / _NEW_LOCK, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # no flock on this file system: no owner.lock (an unlocked one would look dead), kept as unowned
        os.close(fd)
        (folder / _NEW_LOCK).unlink(missing_ok=True)
        fd = -1
    else:
        argv0 = Path(sys.argv[0])
        program = "vit-train" if argv0.parent.name == "vit_train" and argv0.name == "__main__.py" else argv0.name
        try:  # who owns it, for people; the lock itself needs no bytes (a full disk)
            os.pwrite(
                fd,
                json.dumps(
                    {
                        "host": socket.gethostname(),
                        "pid": os.getpid(),
                        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                        "command": " ".join([program, *sys.argv[1:]])[:500],
                    }
                ).encode(),
                0,
            )
        except OSError:
            pass
        os.rename(folder / _NEW_LOCK, folder / OWNER_LOCK)  # visible only once locked
        _held.add(fd)
    atexit.register(_remove_own, folder, fd, os.getpid())
    return folder


def _remove_own(folder: Path, fd: int, owner: int) -> None:
    """At exit: remove this process's copy (still locked, so no reclaimer is in it), then free its lock."""
    if os.getpid() != owner:  # a forked child that runs atexit: the copy is its parent's
        return
    shutil.rmtree(folder, ignore_errors=True)
    if fd in _held:
        _held.discard(fd)
        os.close(fd)


def reclaim_copies() -> list[tuple[Path, int]]:
    """Remove the Arrow copies in the temp dir that no running process owns (runs killed before their
    exit could remove them) and say so in one info line naming each and its size; returns [(folder, bytes)].

    A folder with an owner.lock is removed when its lock is free (its owner is gone: the lock is held for
    the owner's life, whatever its pid became since). One without (an older vit-train's copy) is removed
    only when it is clearly one: named so, this user's, holding only what `datasets`' parquet loader
    writes, unchanged for UNOWNED_GRACE_S and no file of it open or mapped by a process here (/proc);
    where /proc cannot say, it is kept. Folders of other users and anything else are never touched."""
    try:
        candidates = sorted(Path(tempfile.gettempdir()).glob(COPY_PREFIX + "*"))
    except OSError:
        return []
    freed, unowned = [], []
    for folder in candidates:
        try:
            info = os.lstat(folder)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            continue
        if os.path.lexists(folder / OWNER_LOCK):
            size = _reclaim_owned(folder)
            if size is not None:
                freed.append((folder, size))
        elif _looks_like_copy(folder) and time.time() - _newest_change(folder) > UNOWNED_GRACE_S:
            unowned.append(folder)
    in_use = _in_use(unowned) if unowned else set()
    for folder in unowned:
        if in_use is not None and folder not in in_use:
            size = _tree_size(folder)
            shutil.rmtree(folder, ignore_errors=True)
            if not os.path.lexists(folder):
                freed.append((folder, size))
    if freed:
        log.info(
            "data=hf: removed %s left by %s, %s freed: %s",
            "1 Arrow copy" if len(freed) == 1 else f"{len(freed)} Arrow copies",
            "a killed data=hf run" if len(freed) == 1 else "killed data=hf runs",
            size_text(sum(size for _, size in freed)),
            ", ".join(f"{folder} ({size_text(size)})" for folder, size in freed),
        )
    return freed


def _reclaim_owned(folder: Path) -> int | None:
    """Remove `folder` if its owner.lock can be locked (its owner is gone), holding the lock meanwhile so
    that a second reclaimer waits; its size in bytes, or None when it was kept (owner alive, or unknown)."""
    path = folder / OWNER_LOCK
    try:  # O_RDWR: NFS turns flock into a POSIX write lock; O_NONBLOCK: a FIFO put there never blocks
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.stat(path, follow_symlinks=False).st_ino != info.st_ino:
            return None  # another reclaimer removed it while this one waited for the lock
        size = _tree_size(folder)
        shutil.rmtree(folder, ignore_errors=True)
        return None if os.path.lexists(folder) else size
    except OSError:  # held (its owner runs), or no flock here, or gone meanwhile: kept
        return None
    finally:
        os.close(fd)


def _looks_like_copy(folder: Path) -> bool:
    """Whether `folder` holds only what make_copy_folder and datasets' parquet loader put there: a `parquet`
    folder, datasets' `*.lock` files, an owner.lock not yet in place."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return False
    for entry in entries:
        if entry.name == "parquet" and entry.is_dir(follow_symlinks=False):
            continue
        if entry.name.endswith(".lock") or entry.name == _NEW_LOCK:
            if entry.is_file(follow_symlinks=False):
                continue
        return False
    return True


def _newest_change(folder: Path) -> float:
    """The latest mtime of `folder` and everything in it (links not followed); now, when it is gone."""
    try:
        newest = os.lstat(folder).st_mtime
    except OSError:
        return time.time()
    for parent, dirs, files in os.walk(folder):
        for name in dirs + files:
            try:
                newest = max(newest, os.lstat(os.path.join(parent, name)).st_mtime)
            except OSError:
                pass
    return newest


def _tree_size(folder: Path) -> int:
    """The bytes of the regular files under `folder` (links not followed)."""
    total = 0
    for parent, _, files in os.walk(folder):
        for name in files:
            try:
                info = os.lstat(os.path.join(parent, name))
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                total += info.st_size
    return total


def _in_use(folders: list[Path]) -> set[Path] | None:
    """The folders among `folders` in which a process this user can see has a file open or memory-mapped
    (an older vit-train's run reading its copy; Arrow files are mapped), from /proc; None without /proc."""
    if not os.path.isdir("/proc/self/fd"):
        return None
    prefixes = {os.path.realpath(folder) + os.sep: folder for folder in folders}
    used: set[Path] = set()

    def note(path: str) -> None:
        for prefix, folder in prefixes.items():
            if path.startswith(prefix):
                used.add(folder)

    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    note(os.readlink(f"/proc/{pid}/fd/{fd}"))
                except OSError:
                    pass
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    fields = line.split(None, 5)
                    if len(fields) == 6:
                        note(fields[5].rstrip("\n"))
        except OSError:  # gone, or another user's
            continue
    return used


def size_text(size: int) -> str:
    """`size` bytes in a few characters: 512 bytes, 36 KB, 12.3 MB, 4.2 GB (powers of 1024)."""
    if size < 2**10:
        return f"{size} bytes"
    if size < 2**20:
        return f"{size / 2**10:.0f} KB"
    if size < 2**30:
        return f"{size / 2**20:.1f} MB"
    return f"{size / 2**30:.1f} GB"


def _drop_in_child() -> None:
    for fd in _held:  # the parent keeps its copy's lock; the child's descriptor must not extend it
        os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_drop_in_child)
