"""Special files named like regular ones (FIFO, socket, character device, link loop, folder), and the guards
that keep a test of them from hanging: `within` (a call under a deadline) and `release` / the `fifos`
fixture (a writer for each FIFO, so a read a failing test left blocked ends)."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import tempfile
import threading
from pathlib import Path

import pytest

DEADLINE = 20  # seconds; each call under test takes well under a second unless it blocks
KINDS = ["a FIFO", "a socket", "a character device", "a link loop", "a folder"]


def make_special(path: Path, kind: str) -> None:
    """`path` (absent; its folder made if needed) made into a special file of `kind` (one of KINDS)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "a FIFO":
        os.mkfifo(path)
    elif kind == "a socket":
        make_socket(path)
    elif kind == "a character device":
        path.symlink_to("/dev/zero")  # endless: a read never ends
    elif kind == "a link loop":
        path.symlink_to(path)
    else:
        path.mkdir()


def make_socket(path: Path) -> None:
    """A socket file at `path`, its listener closed (the file stays). An AF_UNIX address holds at most 107 bytes,
    which a test's tmp_path can pass (pytest-xdist adds popen-gwN/): it is bound in a short temporary folder and
    renamed into place (bound in place where the rename crosses file systems)."""
    short = tempfile.mkdtemp(prefix="sock")
    try:
        listener = socket.socket(socket.AF_UNIX)
        try:
            listener.bind(os.path.join(short, "s"))
        finally:
            listener.close()
        try:
            os.rename(os.path.join(short, "s"), path)
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
            listener = socket.socket(socket.AF_UNIX)
            listener.bind(str(path))
            listener.close()
    finally:
        shutil.rmtree(short, ignore_errors=True)


def release(fifo: Path) -> None:
    """Open `fifo` for writing and close it: a read blocked on it (a failing test's thread) ends."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # no reader waiting (ENXIO): nothing blocked
        pass


@pytest.fixture
def fifos(tmp_path):
    """Yields; at teardown every FIFO under tmp_path gets a writer (`release`)."""
    yield
    for path in tmp_path.rglob("*"):
        if path.is_fifo():
            release(path)


def within(deadline: float, call, *args):
    """call(*args)'s result or exception, or a failure if it has not returned within `deadline` s."""
    outcome = {}

    def run():
        try:
            outcome["value"] = call(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(deadline)
    assert not thread.is_alive(), f"{getattr(call, '__name__', call)}{args} blocked for {deadline} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
