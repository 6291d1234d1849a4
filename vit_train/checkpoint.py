"""Checkpoints: atomic save, safe load, finding the one to resume, and the compatibility check.

A checkpoint is a plain dict of tensors and primitives, readable with `weights_only=True`: nothing
in it is a pickled object, so loading one cannot run code.
"""

from __future__ import annotations

import os
import platform
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torchvision

from . import __version__
from .errors import CheckpointError

FORMAT_VERSION = 1
REQUIRED_KEYS = ("model", "optimizer", "scheduler", "epoch", "step", "batch_in_epoch", "config", "class_names")
# Config keys that fix the model's shape or the meaning of its outputs: a resumed run may not change them.
STRUCTURE_KEYS = ("model.img_size", "model.patch_size", "model.embed_dim", "model.depth", "model.num_heads",
                  "model.mlp_ratio", "model.qkv_bias", "model.pool", "model.pos_embed", "data.name")


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Write to a temporary file in the same folder, fsync it, then rename it over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def copy_checkpoint(src: Path, dst: Path) -> None:
    """Atomically make `dst` a copy of `src` (a hard link where the file system allows)."""
    tmp = dst.with_name(dst.name + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)  # `src` is only ever replaced by rename, so the link keeps this version
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
    _fsync_dir(dst.parent)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_checkpoint(path: Path, mmap: bool = False) -> dict[str, Any]:
    """Load a checkpoint on the CPU with `weights_only=True`; any fault becomes a CheckpointError."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # truncated zip, a pickle with objects, not a torch file at all
        raise CheckpointError(f"checkpoint {path} cannot be read ({_load_failure(e)}); it is truncated, corrupt or "
                              f"not a vit-train checkpoint: resume from another one (e.g. checkpoints/best.pt)") from None
    missing = [k for k in REQUIRED_KEYS if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise CheckpointError(f"{path} is not a vit-train checkpoint (it lacks {', '.join(missing)})")
    return ckpt


def _load_failure(error: Exception) -> str:
    """torch.load's error in a few words."""
    text = str(error)
    unsafe = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    if unsafe:
        return f"it holds a pickled object, {unsafe.group(1)}, which is never loaded"
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return first[:200]


def resolve_checkpoint(resume: str | None, run_dir: Path) -> Path | None:
    """The checkpoint to resume from: None (start fresh), `auto` (run_dir's last.pt if any), or a path."""
    if resume is None:
        return None
    if resume == "auto":
        last = run_dir / "checkpoints" / "last.pt"
        return last if last.is_file() else None
    path = Path(resume).expanduser()
    if path.is_file():
        return path
    if not path.exists():
        raise CheckpointError(f"resume path {path} does not exist; give a run directory or a .pt checkpoint")
    for candidate in (path / "checkpoints" / "last.pt", path / "last.pt"):
        if candidate.is_file():
            return candidate
    raise CheckpointError(f"{path} holds no checkpoints/last.pt; give a run directory that has one, or a .pt file")


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for k, v in d.items():
        if isinstance(v, dict):
            flat.update(_flatten(v, f"{prefix}{k}."))
        else:
            flat[f"{prefix}{k}"] = v
    return flat


def config_changes(saved: dict, current: dict) -> list[tuple[str, Any, Any]]:
    """(key, saved value, current value) for every key that differs, `resume` aside."""
    old, new = _flatten(saved), _flatten(current)
    keys = sorted(set(old) | set(new))
    return [(k, old.get(k), new.get(k)) for k in keys if k != "resume" and old.get(k) != new.get(k)]


def check_compatible(ckpt: dict, current: dict, class_names: list[str] | None = None) -> list[str]:
    """Refuse a config that changes the model's shape or classes; return the other changes, as text."""
    changes = config_changes(ckpt["config"], current)
    refused = [f"{k}: {a!r} -> {b!r}" for k, a, b in changes if k in STRUCTURE_KEYS]
    if class_names is not None and list(class_names) != list(ckpt["class_names"]):
        refused.append(f"classes: {len(ckpt['class_names'])} saved, {len(class_names)} in the data now")
    if refused:
        raise CheckpointError("the checkpoint does not fit this config (" + "; ".join(refused) + "); resume with the "
                              "run's own settings, or start a new run (model.pretrained will load weights)")
    return [f"{k}: {a!r} -> {b!r}" for k, a, b in changes if k not in STRUCTURE_KEYS]


def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng(state: dict[str, Any]) -> None:
    """Restore every RNG; a failure is an error, since the run would silently diverge."""
    try:
        random.setstate(state["python"])
        name, keys, *rest = state["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
        torch.set_rng_state(state["torch"])
        if state["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"the checkpoint's RNG states cannot be restored ({e}); the resumed run would not "
                              f"match the original") from None


def versions() -> dict[str, str]:
    return {"vit_train": __version__, "torch": str(torch.__version__), "torchvision": str(torchvision.__version__),
            "python": platform.python_version(), "format": str(FORMAT_VERSION)}
