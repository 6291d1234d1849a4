"""Plain words for a failed write, and a digest of saved tensors (torch's archives are checked by
vit_train/checkpoint/integrity.py).

- `write_failure`: a failed write in plain words; "no space left on <fs> (N MB free, ... needs about
  M MB)" when the disk is full, whatever form the error took (torch's stream writer reports it as
  "unexpected pos ...").
- `mount_point`: the file system a path is on, as the line names it.
- `tensor_digest`: a SHA-256 over named tensors.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from pathlib import Path

import torch

MB = 2**20


def tensor_digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 (hex) over the names, dtypes, shapes and bytes of `tensors`, in sorted name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


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
        return (
            f"{'your disk quota is used up' if quota else 'no space left'} on {mount_point(folder)} "
            f"({free / MB:.1f} MB free{size})"
        )
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
