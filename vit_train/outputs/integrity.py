"""Is a file what was written? Checks of saved files and plain words for why a read or write failed.

- `archive_damage`: every file torch.save writes (since PyTorch 1.6) is a zip archive that stores
  a CRC-32 of each record; torch.load does not check them, so bit rot loads silently. We check them
  all (zipfile.testzip; about 1 GB/s) before a checkpoint or weights file is used.
- `tensor_digest`: a SHA-256 over named tensors, which vit-train stores in the metadata of the
  safetensors files it writes (that format has no checksum of its own) and checks on load.
- `write_failure`: a failed write in plain words; "no space left on <fs> (N MB free, ... needs about
  M MB)" when the disk is full, whatever form the error took (torch's stream writer reports it as
  "unexpected pos ...").
- `load_failure`: why torch.load refused a file; for a pickled object, which one, and that it was
  never run.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any

import torch

MB = 2**20


def archive_damage(path: Path) -> str | None:
    """None if `path` is a sound zip archive (or not a zip at all), else what is wrong, in a few words."""
    try:
        if not zipfile.is_zipfile(path):
            with open(path, "rb") as f:  # a zip's first record, without the directory a whole zip ends with
                if f.read(4) == b"PK\x03\x04":
                    return "it is cut short: a zip archive (PyTorch's format) without the directory it ends with"
            return None  # the legacy (pre-1.6) torch format or another file type: torch.load judges it
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError, NotImplementedError) as e:
        return f"its zip structure is damaged: {e}"
    if bad is not None:
        return f"the CRC-32 of its record {bad} does not match: bytes changed after it was written (bit rot, a bad copy)"
    return None


LEGACY_MAGIC = b"\x80\x02\x8a\x0a"  # torch.save's pre-1.6 format opens with its magic number, pickled (protocol 2)


def legacy_damage(path: Path, error: BaseException) -> str | None:
    """What is wrong with a file of torch.save's legacy (pre-1.6, non-zip) format that torch.load failed on
    with a reader's error (it ends early or does not parse), in a few words; None for another file or error
    (a refused pickled object, a file of another kind: `load_failure` says those)."""
    if _GLOBAL.search(str(error)) or not isinstance(error, (EOFError, OSError, IndexError, ValueError, KeyError,
                                                            RuntimeError, struct.error)):
        return None
    try:
        with open(path, "rb") as f:
            legacy = f.read(len(LEGACY_MAGIC)) == LEGACY_MAGIC
    except OSError:
        return None
    return f"a legacy-format PyTorch file whose records end early or do not parse ({load_failure(error)})" \
        if legacy else None


def tensor_digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 (hex) over the names, dtypes, shapes and bytes of `tensors`, in sorted name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def checkpoint_size(state: Any) -> int:
    """About the bytes torch.save writes for a nested state (dicts, lists, tuples of tensors): the
    tensors' bytes plus ~384 bytes of zip records, alignment and pickle per tensor (measured)."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size() + 384
    if isinstance(state, dict):
        return sum(checkpoint_size(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(checkpoint_size(v) for v in state)
    return 0


def mount_point(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def write_failure(error: BaseException, path: Path, needed: int, what: str | None = "the checkpoint") -> str:
    """Why writing `path` (about `needed` bytes: `what`, or None to leave the size out) failed: the disk
    being full (or the user's quota) is named as such."""
    folder = path.parent if path.parent.exists() else Path(path.anchor or ".")
    free = shutil.disk_usage(folder).free
    full = isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)
    if full or free < needed:
        size = f", {what} needs about {needed / MB:.1f} MB" if what else ""
        quota = isinstance(error, OSError) and error.errno == errno.EDQUOT
        return (f"{'your disk quota is used up' if quota else 'no space left'} on {mount_point(folder)} "
                f"({free / MB:.1f} MB free{size})")
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__


_GLOBAL = re.compile(r"unsupported GLOBAL:? (?:GLOBAL )?([\w.]+)", re.IGNORECASE)  # torch 2.4 to 2.14 wordings


def load_failure(error: BaseException) -> str:
    """torch.load's error in a few words; never its advice to load with weights_only=False."""
    text = str(error)
    unsafe = _GLOBAL.search(text)
    if unsafe:
        return f"it holds a pickled object, {unsafe.group(1)}, which was refused and never run"
    if re.search(r"unsupported operand \d+|invalid load key", text, re.IGNORECASE):  # its first byte is no pickle's
        return "it is not a PyTorch file (no checkpoint or saved tensors in it)"
    if isinstance(error, EOFError) or re.search(r"ran out of input|unexpected eof", text, re.IGNORECASE):
        return "it is empty or cut short"
    if isinstance(error, OSError) and error.errno == 22:  # the legacy format's reader seeking past the file's end
        return "it is cut short or damaged: its contents point past its end"
    if "weights only load failed" in text.lower():
        return "it holds pickled data that a weights-only load refuses; it was never run"
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    sentence = first.split(". ")[0]  # torch's messages go on with advice; a cut mid-sentence reads wrong
    return sentence if len(sentence) <= 200 else sentence[:200].rsplit(" ", 1)[0] + " ..."
