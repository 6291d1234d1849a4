"""One writer per run directory: an exclusive lock held for the whole run, and the clean-up that the
lock makes safe (temporary files an earlier, killed writer left behind).

The lock is `flock` on `<run dir>/.lock` (Linux/macOS; on NFS the Linux client turns it into a
POSIX lock on the server). It dies with the process, whatever ends it (kill -9, a crash, the OOM
killer): there is never a stale lock to remove by hand. Forked children (DataLoader workers) drop
their copy at fork, so a worker that outlives its parent for a moment does not keep the run
locked. The file holds who locked it (host, pid, start time, command), to name the holder.

One owner takes the lock once and passes the `RunLock` down: the command line's Hydra callback for a
run (cli/train.py; cli/torchrun.py moves it to rank 0's shared directory), a sweep job for its job
directory (sweeps/job.py), and `train()` only when called without one (Python, notebooks). A second
`acquire` of a directory this process holds is refused like any other (flock is per open file).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import stat
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from vit_train.data.decoding.regular import not_regular
from vit_train.errors import UserError

log = logging.getLogger("vit_train")

LOCK_NAME = ".lock"
# The descriptors of the locks this process holds, only so that a forked child can close its copies
# (os.register_at_fork below): a child's copy of the open file would keep the flock alive after the
# parent lets go (and `release` closes only what is still open here).
_open_fds: set[int] = set()


class RunDirBusy(UserError):
    """Another process holds the run directory; nothing in it was touched."""


class RunFileNotRegular(RunDirBusy):
    """A file of the run directory (the lock, metrics.jsonl, results.json, train.log, refused.json, a
    TensorBoard event file) is a FIFO, socket, device, folder or link loop: opening it would block or
    fail, so the run refuses to start (a RunDirBusy: every caller already ends it in one line)."""


# The files of a run directory that vit-train (and vit-sweep-summary) open to read or append.
RUN_FILES = ("metrics.jsonl", "results.json", "train.log", "refused.json")


def special_run_file(run_dir: Path) -> str | None:
    """None when every file of `run_dir` that vit-train opens (RUN_FILES and tb/events.out.tfevents.*)
    is missing or a regular file; else one line naming the first that is not and what to do. Never opens
    a file, so never blocks."""
    run_dir = Path(run_dir)
    tb = run_dir / "tb"
    events = sorted(tb.glob("events.out.tfevents.*")) if tb.is_dir() else []
    for path in [*(run_dir / name for name in RUN_FILES), *events]:
        if not os.path.lexists(path):
            continue
        kind = not_regular(path)
        if kind is not None:
            return f"{path} is {kind}, not a regular file; move it out of the run directory, then resume"
    return None


class RunLock:
    """The exclusive lock on one run directory (`run_dir`, resolved); `release()` (or process exit) frees it."""

    def __init__(self, run_dir: Path, fd: int, before: tuple[bytes, int] | None = None, made_dir: bool = False):
        self.run_dir, self.fd = run_dir, fd
        self.before = before  # the lock file's bytes and mtime (ns) before this holder wrote its record
        self.made_dir = made_dir  # whether `acquire` made the directory

    def restore(self) -> None:
        """Put back the lock file as it was before `acquire` (a refused command changes nothing in the run
        directory, the holder record included): its bytes and mtime, or no file when there was none. Held still."""
        if self.fd not in _open_fds:
            return
        if self.before is None:
            (self.run_dir / LOCK_NAME).unlink(missing_ok=True)
            return
        text, mtime = self.before
        try:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, text, 0)
            os.utime(self.fd, ns=(mtime, mtime))
        except OSError:  # a full disk: the record is only a name for a second run's message
            pass

    def undo(self) -> None:
        """A command refused before it wrote anything: the lock file as it was (`restore`), the lock freed, and
        the directory removed when `acquire` made it and nothing else is in it."""
        self.restore()
        self.release()
        if self.made_dir:
            with contextlib.suppress(OSError):
                self.run_dir.rmdir()  # only when empty

    def release(self) -> None:
        """Free the lock (again, or in a forked child that closed its copy already: nothing)."""
        if self.fd in _open_fds:
            _open_fds.discard(self.fd)
            os.close(self.fd)  # closing the last descriptor of the open file releases the flock
        self.fd = -1

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def acquire(run_dir: Path) -> RunLock:
    """Lock `run_dir` (creating it) for this process; the caller owns the lock and passes it on.

    Raises RunDirBusy, naming the holder, when another process (or another `acquire` in this process)
    holds it. Once locked, removes the `*.tmp` files an earlier writer left (no one else can be
    writing them now).
    """
    run_dir = Path(run_dir).resolve()
    made_dir = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    lock_path = run_dir / LOCK_NAME
    existed = os.path.lexists(lock_path)
    kind = not_regular(lock_path) if existed else None
    if kind is not None:  # a FIFO would block the open; flock on it fails: never run without the lock
        raise RunFileNotRegular(
            f"{lock_path} is {kind}, not a regular file; move it out of the run directory, then resume"
        )
    # O_NONBLOCK: a FIFO put there since the check opens at once (and is refused below), never blocks
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NONBLOCK", 0), 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RunFileNotRegular(f"{lock_path} is not a regular file; move it out of the run directory, then resume")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _describe(os.read(fd, 4096))
        os.close(fd)
        raise RunDirBusy(
            f"{run_dir} is in use by another vit-train run ({holder}); wait for it to end, or give "
            f"this run its own directory (hydra.run.dir=...)"
        ) from None
    except RunFileNotRegular:
        os.close(fd)
        raise
    except OSError as e:
        os.close(fd)
        raise RunDirBusy(
            f"{lock_path} cannot be locked ({e.strerror}); give this run a directory on a "
            f"local file system (hydra.run.dir=...)"
        ) from None
    info = os.fstat(fd)
    before = (os.pread(fd, info.st_size, 0), info.st_mtime_ns) if existed else None
    os.ftruncate(fd, 0)
    program = Path(sys.argv[0]).name.replace("__main__.py", "vit-train")  # python -m vit_train
    try:  # who holds it, for a second run's message; the lock itself needs no bytes (a full disk)
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
    _open_fds.add(fd)
    lock = RunLock(run_dir, fd, before, made_dir)
    special = special_run_file(run_dir)
    if special:
        lock.release()
        raise RunFileNotRegular(special)
    remove_leftovers(run_dir)
    return lock


@contextmanager
def locked(run_dir: Path) -> Iterator[RunLock]:
    """Hold the lock on `run_dir` for the block, yielding it (to pass down); raises RunDirBusy. A block ended
    by a UserError (a refusal) leaves the lock file as it was (`RunLock.restore`)."""
    with acquire(run_dir) as lock:
        try:
            yield lock
        except UserError:
            lock.restore()
            raise


def _describe(text: bytes) -> str:
    try:
        info = json.loads(text)
        return f"pid {info['pid']} on {info['host']} since {info['since']}: {info['command']}"
    except (ValueError, KeyError, TypeError):
        return "a process whose details were not recorded yet"


def remove_leftovers(run_dir: Path) -> list[Path]:
    """Delete the `*.tmp` files of an interrupted write (checkpoints, metrics, results, event files); returns them."""
    found = [
        p
        for folder in (run_dir, run_dir / "checkpoints", run_dir / "tb")
        if folder.is_dir()
        for p in folder.glob("*.tmp")
    ]
    for path in found:
        path.unlink(missing_ok=True)
    if found:
        log.info(
            "removed %d temporary file(s) an interrupted run left: %s", len(found), ", ".join(p.name for p in found)
        )
    return found


def _drop_in_child() -> None:
    for fd in _open_fds:  # the parent keeps its lock; the child's copy must not extend it
        os.close(fd)
    _open_fds.clear()


os.register_at_fork(after_in_child=_drop_in_child)
