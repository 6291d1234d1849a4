"""Checkpoint files on disk, read: the one `torch.load` (`read_archive`), a checkpoint verified and loaded
(`load_checkpoint`), a run's checkpoints newest first, and which one a path names (to resume: `find_resume_checkpoint`;
to use: `checkpoint_file`). Writing them is saving.py's.

A checkpoint is a plain dict of tensors and primitives, readable with `weights_only=True`: nothing
in it is a pickled object, so loading one cannot run code.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from vit_train import __version__
from vit_train.checkpoint.contents import FORMAT_VERSION, REQUIRED_KEYS, upgraded
from vit_train.checkpoint.integrity import archive_damage, load_failure
from vit_train.data.decoding.regular import not_regular
from vit_train.errors import CheckpointError

log = logging.getLogger("vit_train")


class NewerCheckpoint(CheckpointError):
    """A checkpoint of a format this version does not read (a newer vit-train's): never passed over for an older one."""


def read_archive(path: Path, mmap: bool = False) -> Any:
    """What a file torch.save wrote holds, on the CPU, with `weights_only=True` (nothing pickled is run): the one
    torch.load of vit-train. `mmap`: tensors mapped, not read (the zip format only). Raises torch's errors as
    they are; `load_checkpoint` and weights.py `read_weights` say them in words."""
    return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


def refuse_newer(ckpt: dict[str, Any], path: Path) -> None:
    """NewerCheckpoint (one line) when `ckpt` records a checkpoint format other than this version's (one written by
    a newer vit-train, whose keys may mean something else); checkpoints written before the format was kept pass."""
    saved = (ckpt.get("versions") or {}).get("format") if isinstance(ckpt.get("versions"), dict) else None
    if saved is None or str(saved) == str(FORMAT_VERSION):
        return
    by = (ckpt.get("versions") or {}).get("vit_train")
    raise NewerCheckpoint(
        f"{path} is a checkpoint of format {saved}{f' (written by vit-train {by})' if by else ''}, "
        f"which this vit-train ({__version__}) does not read: it reads format {FORMAT_VERSION}; "
        f"upgrade vit-train to use it (pip install -U vit-train)"
    )


def load_checkpoint(path: Path, mmap: bool = False) -> dict[str, Any]:
    """Verify (zip CRCs) and load a checkpoint on the CPU with `weights_only=True`, read as this version writes
    it (contents.py `upgraded`); any fault becomes a CheckpointError, a checkpoint of a format this version does
    not read a `NewerCheckpoint`."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    damage = archive_damage(path)
    if damage:
        raise CheckpointError(f"checkpoint {path} is damaged ({damage}); {_use_another(path)}")
    try:
        ckpt = read_archive(path, mmap)
    except Exception as e:  # truncated zip, a pickle with objects, not a torch file at all
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({load_failure(e)}); it is truncated, corrupt or "
            f"not a vit-train checkpoint: {_use_another(path)}"
        ) from None
    missing = [k for k in REQUIRED_KEYS if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise CheckpointError(f"{path} is not a vit-train checkpoint (it lacks {', '.join(missing)})")
    refuse_newer(ckpt, path)
    return upgraded(ckpt)


def _use_another(path: Path) -> str:
    """What to do about an unusable checkpoint: use another of its run's, named when there is one."""

    def same(other: Path) -> bool:  # best.pt and step_<N>.pt can be hard links to one file
        return os.path.samefile(other, path)

    others = (
        [p for p in run_checkpoints(path.parent.parent) if not same(p)] if path.parent.name == "checkpoints" else []
    )
    return f"use another one of the run (e.g. {others[0]})" if others else "use another checkpoint"


def run_checkpoints(run_dir: Path) -> list[Path]:
    """A run's checkpoints, newest first: last.pt, step_<N>.pt, best.pt (one path per file on disk)."""
    folder = run_dir / "checkpoints"
    seen, found = set(), []
    for path in [folder / "last.pt", *step_files(folder), folder / "best.pt"]:
        if path.is_file() and (key := (path.stat().st_dev, path.stat().st_ino)) not in seen:
            seen.add(key)
            found.append(path)
    return found


def step_files(folder: Path) -> list[Path]:
    """step_<N>.pt files, newest first."""
    return sorted(folder.glob("step_*.pt"), key=lambda p: int(p.stem.split("_")[1]), reverse=True)


def saved_step(path: Path) -> int | None:
    """The step a checkpoint file holds (its pickle only: tensors are mapped, not read); None when unreadable."""
    try:
        ckpt = read_archive(path, mmap=True)
        return int(ckpt["step"])
    except Exception:  # noqa: BLE001 - damaged, truncated, not a checkpoint: its step is unknown
        return None


def find_resume_checkpoint(resume: str | None, run_dir: Path, mmap: bool = False) -> tuple[Path, dict] | None:
    """The checkpoint to resume from, loaded: None (start fresh), `auto`, a run directory or a file.

    `auto` and a run directory take the newest readable checkpoint of the run, reporting (and
    passing over) unreadable ones; `auto` starts fresh when the run has none. A file is that file.
    """
    if resume is None:
        return None
    if resume == "auto":
        candidates = run_checkpoints(run_dir)
        if not candidates:
            return None
    else:
        path = Path(resume).expanduser()
        if path.is_file():
            return path, load_checkpoint(path, mmap)
        kind = not_regular(path)  # a FIFO, device or socket is never opened (a FIFO would block forever)
        if kind != "a folder":
            said = "does not exist" if kind in ("missing", "a broken link") else f"is {kind}, not a file or a folder"
            raise CheckpointError(f"resume path {path} {said}; give a run directory or a .pt checkpoint")
        candidates = run_checkpoints(path.parent if path.name == "checkpoints" else path)
        if not candidates:
            folder = path if path.name == "checkpoints" else path / "checkpoints"
            odd = [f"{p.name} is {kind}" for p in sorted(folder.glob("*.pt")) if (kind := not_regular(p)) != "missing"]
            raise CheckpointError(
                f"{path} holds no checkpoints{' (' + ', '.join(odd) + ')' if odd else ''}; give a run "
                f"directory that has some (in checkpoints/), or a .pt file"
            )
    failures = []
    for candidate in candidates:
        try:
            return candidate, load_checkpoint(candidate, mmap)
        except NewerCheckpoint:  # not damaged: a newer vit-train's, which an older step file must not replace
            raise
        except CheckpointError as e:
            log.warning("%s; trying the next newest", e)
            failures.append(candidate.name)
    raise CheckpointError(
        f"none of the checkpoints in {candidates[0].parent} can be read ({', '.join(failures)}); "
        f"start a new run in another directory"
    )


def checkpoint_file(path: str | Path) -> Path:
    """The checkpoint a path names: the file itself, or a run directory's (or its checkpoints/
    folder's) best.pt, else its newest readable checkpoint, as resume=PATH takes it."""
    path = Path(path).expanduser()
    if not path.is_dir():
        return path
    folder = path if path.name == "checkpoints" else path / "checkpoints"
    if (folder / "best.pt").is_file():
        return _newest_best(folder)
    return find_resume_checkpoint(str(path), path, mmap=True)[0]


def _newest_best(folder: Path) -> Path:
    """best.pt, or last.pt when a kill fell between last.pt's rename and best.pt's at a step that set a new
    best (last.pt names its own step as the best, best.pt holds an older one) and no resume has repaired it."""
    best, last = folder / "best.pt", folder / "last.pt"
    if not last.is_file() or os.path.samefile(best, last):
        return best
    try:
        head = upgraded(read_archive(last, mmap=True))
        newest = head.get("best_score") is not None and head.get("best_step") == head["step"]
    except Exception:  # noqa: BLE001 - an unreadable last.pt: best.pt is what there is
        return best
    if newest and saved_step(best) != head["step"]:
        log.info(
            "%s holds step %s, but the run's best is step %d in %s (a save interrupted before best.pt): using %s",
            best,
            saved_step(best),
            head["step"],
            last.name,
            last,
        )
        return last
    return best
