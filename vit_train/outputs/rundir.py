"""One writer per run directory: an exclusive lock held for the whole run, and the clean-up that the
lock makes safe (temporary files an earlier, killed writer left behind).

The lock is `flock` on `<run dir>/.lock` (Linux/macOS; on NFS the Linux client turns it into a
POSIX lock on the server). It dies with the process, whatever ends it (kill -9, a crash, the OOM
killer): there is never a stale lock to remove by hand. Forked children (DataLoader workers) drop
their copy at fork, so a worker that outlives its parent for a moment does not keep the run
locked. The file holds who locked it (host, pid, start time, command), to name the holder.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from vit_train.errors import UserError

log = logging.getLogger("vit_train")

LOCK_NAME = ".lock"
_held: dict[Path, "RunLock"] = {}  # run directories this process holds, by resolved path


class RunDirBusy(UserError):
    """Another process holds the run directory; nothing in it was touched."""


class RunLock:
    """The exclusive lock on one run directory; `release()` (or process exit) frees it."""

    def __init__(self, run_dir: Path, fd: int):
        self.run_dir, self.fd = run_dir, fd

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the last descriptor of the open file releases the flock
            self.fd = -1
        _held.pop(self.run_dir, None)


def acquire(run_dir: Path) -> RunLock | None:
    """Lock `run_dir` (creating it) for this process; returns None if this process already holds it.

    Raises RunDirBusy, naming the holder, when another process (or another open of the lock in this
    process) holds it. Once locked, removes the `*.tmp` files an earlier writer left (no one else can
    be writing them now).
    """
    run_dir = Path(run_dir).resolve()
    if run_dir in _held:
        return None
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _describe(os.read(fd, 4096))
        os.close(fd)
        raise RunDirBusy(f"{run_dir} is in use by another vit-train run ({holder}); wait for it to end, or give "
                         f"this run its own directory (hydra.run.dir=...)") from None
    os.ftruncate(fd, 0)
    program = Path(sys.argv[0]).name.replace("__main__.py", "vit-train")  # python -m vit_train
    try:  # who holds it, for a second run's message; the lock itself needs no bytes (a full disk)
        os.pwrite(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime(
            "%Y-%m-%d %H:%M:%S"), "command": " ".join([program, *sys.argv[1:]])[:500]}).encode(), 0)
    except OSError:
        pass
    lock = _held[run_dir] = RunLock(run_dir, fd)
    remove_leftovers(run_dir)
    return lock


@contextmanager
def locked(run_dir: Path, enabled: bool = True) -> Iterator[None]:
    """Hold the lock on `run_dir` for the block (unless not `enabled`, or this process holds it already:
    then whoever took it releases it). Raises RunDirBusy."""
    lock = acquire(run_dir) if enabled else None
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def release(run_dir: Path) -> None:
    lock = _held.get(Path(run_dir).resolve())
    if lock is not None:
        lock.release()


def _describe(text: bytes) -> str:
    try:
        info = json.loads(text)
        return f"pid {info['pid']} on {info['host']} since {info['since']}: {info['command']}"
    except (ValueError, KeyError, TypeError):
        return "a process whose details were not recorded yet"


def remove_leftovers(run_dir: Path) -> list[Path]:
    """Delete the `*.tmp` files of an interrupted write (checkpoints, metrics, results, event files); returns them."""
    found = [p for folder in (run_dir, run_dir / "checkpoints", run_dir / "tb") if folder.is_dir()
             for p in folder.glob("*.tmp")]
    for path in found:
        path.unlink(missing_ok=True)
    if found:
        log.info("removed %d temporary file(s) an interrupted run left: %s", len(found),
                 ", ".join(p.name for p in found))
    return found


def _drop_in_child() -> None:
    for lock in list(_held.values()):  # the parent keeps its lock; the child's copy must not extend it
        os.close(lock.fd)
    _held.clear()


os.register_at_fork(after_in_child=_drop_in_child)
