"""A command run on a real small or read-only place: a tmpfs mounted in a private mount namespace
(`unshare -m`, or `unshare -rm` as a normal user), then what the command left there.

    python tests/helpers/places.py REPORT MOUNT SIZE_KB READ_ONLY BEFORE COMMAND

runs the shell line BEFORE (filling the place, copying a run into it) with the tmpfs writable, then
remounts it read-only when READ_ONLY is 1, runs COMMAND (a shell line; $PLACE is the mount) with a
timeout, and writes REPORT (JSON): rc, stdout, stderr, and every entry left under the mount
(relative path -> sha256 of a file's bytes, or "folder", "fifo", "other").
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path


def mount_namespace() -> list[str] | None:
    """`unshare` arguments for a private mount namespace where this user may mount a tmpfs; None if none."""
    if not shutil.which("unshare"):
        return None
    for args in (["unshare", "-m"], ["unshare", "-rm"]):  # root; an unprivileged user namespace
        if subprocess.run([*args, "mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", "/mnt"], capture_output=True).returncode == 0:
            return args
    return None


def on_place(tmp_path: Path, command: str, size_kb: int = 1024, read_only: bool = False, before: str = "",
             timeout: int = 120) -> dict:
    """`command` (a shell line, $PLACE the tmpfs) run as the module docstring says; returns the report,
    with "left" the entries under the place and "tmp" those whose name says temporary."""
    unshare = mount_namespace()
    mount, report = tmp_path / "place", tmp_path / "report.json"
    mount.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    subprocess.run([*unshare, sys.executable, __file__, str(report), str(mount), str(size_kb), str(int(read_only)),
                    before, command, str(timeout)], env=env, check=True, timeout=timeout + 60)
    done = json.loads(report.read_text())
    done["tmp"] = sorted(p for p in done["left"] if ".tmp" in Path(p).name)
    return done


def _listing(root: Path) -> dict[str, str]:
    left = {}
    for path in sorted(root.rglob("*")):
        mode = path.lstat().st_mode
        left[str(path.relative_to(root))] = (hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(mode) else
                                             "folder" if stat.S_ISDIR(mode) else "fifo" if stat.S_ISFIFO(mode)
                                             else "other")
    return left


if __name__ == "__main__":
    report, mount, size_kb, read_only, before, command, timeout = sys.argv[1:8]
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", mount], check=True)
    env = {**os.environ, "PLACE": mount}
    if before:
        subprocess.run(["bash", "-c", before], env=env, check=True)
    if read_only == "1":
        subprocess.run(["mount", "-o", "remount,ro", mount], check=True)
    try:
        done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=int(timeout))
        result = {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
    except subprocess.TimeoutExpired as e:
        result = {"rc": "timeout", "stdout": str(e.stdout), "stderr": str(e.stderr)}
    Path(report).write_text(json.dumps({**result, "left": _listing(Path(mount))}))
