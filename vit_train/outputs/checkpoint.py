"""Checkpoint files: atomic save, safe load, finding the one to resume, keep_last. What a checkpoint
holds is train/state.py's, which config changes a resumed run may make train/resume.py's.

A checkpoint is a plain dict of tensors and primitives, readable with `weights_only=True`: nothing
in it is a pickled object, so loading one cannot run code.
"""

from __future__ import annotations

import logging
import os
import platform
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torchvision

from vit_train import __version__
from vit_train.data.decoding.regular import not_regular
from vit_train.errors import CheckpointError
from vit_train.outputs.identity import class_difference
from vit_train.outputs.integrity import archive_damage, checkpoint_size, load_failure, mount_point, tensor_digest, write_failure

log = logging.getLogger("vit_train")

FORMAT_VERSION = 1
REQUIRED_KEYS = ("model", "optimizer", "scheduler", "epoch", "step", "batch_in_epoch", "config", "class_names")


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Write to a temporary file in the same folder, fsync and verify it, then rename it over `path`.

    A failed write (disk full, a crash) leaves the previous `path` untouched and no temporary file;
    the CheckpointError says why, naming a full disk as such.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        damage = archive_damage(tmp)
        if damage:
            raise OSError(f"the written file does not read back: {damage}")
        torch.load(tmp, map_location="cpu", weights_only=True, mmap=True)  # verify: a complete, loadable archive
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, (OSError, RuntimeError)):
            kept = earlier_checkpoint(path)
            needed = max(checkpoint_size(state) + 4096, path.stat().st_size if path.exists() else 0)
            raise CheckpointError(f"could not write {path}: {write_failure(e, path, needed)}; "
                                  f"{kept}") from None
        raise
    _fsync_dir(path.parent)


def earlier_checkpoint(path: Path) -> str:
    """What a failed write left at `path`, in words: intact only when it is there and sound."""
    if not path.exists():
        return "there is no earlier checkpoint"
    damage = archive_damage(path)
    if damage:
        return f"the earlier checkpoint there is damaged too ({damage}); resume=auto passes over it to an older sound one"
    return "the previous checkpoint there is intact"


def short_of_space(folder: Path, model: torch.nn.Module, moments: int, ema: torch.nn.Module | None,
                   keep_last: int) -> str | None:
    """A warning when `folder`'s disk cannot hold the run's checkpoints, else None (checked at the start,
    not after the first epoch's work). A checkpoint holds the model, `moments` optimiser tensors per
    trainable parameter (AdamW 2, SGD 1) and the EMA; the run keeps `keep_last` versions (at least
    last.pt), best.pt can be one more, and a new one is written beside them all."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = moments * checkpoint_size(params) + (checkpoint_size([torch.zeros(())] * len(params)) if moments > 1 else 0)
    size = (checkpoint_size(model.state_dict()) + optimizer + (checkpoint_size(ema.state_dict()) if ema else 0)
            + 16 * 1024)  # AdamW's step counts; RNG states and the rest (measured: 11 kB)
    versions, free = max(keep_last, 1) + 2, shutil.disk_usage(folder).free
    if free >= versions * size:
        return None
    return (f"{mount_point(folder)} has {free / 2**20:.1f} MB free, but the checkpoints need about "
            f"{versions * size / 2**20:.1f} MB ({versions} of {size / 2**20:.1f} MB: {max(keep_last, 1)} kept, best.pt "
            f"and a new one written beside them); {'not even the first will fit' if free < size else 'the run will stop at a later one'}: "
            f"free some space, or lower trainer.keep_last")


def save_run_checkpoint(state: dict[str, Any], folder: Path, keep_last: int, best: bool) -> None:
    """last.pt, plus step_<N>.pt for the `keep_last` newest saves when keep_last > 1, plus best.pt.

    last.pt's rename is the save's commit point: its names (step_<N>.pt, best.pt) are hard links to it
    (copies where links are not supported) made after it, and the oldest step files are removed last,
    once every new name is in place. A kill between two of these leaves last.pt complete and agreeing
    with its own best step; the resume completes the save (`repair_run_checkpoints`), so no prefix of
    the sequence loses or mislabels the best weights.
    """
    last = folder / "last.pt"
    save_checkpoint(state, last)
    complete_save(folder, last, state["step"], keep_last, best)


def complete_save(folder: Path, current: Path, step: int, keep_last: int, best: bool) -> None:
    """Give the checkpoint `current` (of step `step`) its other names: step_<N>.pt when keep_last > 1
    and best.pt when `best`; then remove the step files past the `keep_last` newest. Each name already
    on `current` is left as it is, so completing a save twice does nothing the second time."""
    def named(path: Path) -> bool:
        return path.exists() and os.path.samefile(path, current)

    if keep_last > 1 and not named(folder / f"step_{step:08d}.pt"):
        copy_checkpoint(current, folder / f"step_{step:08d}.pt")
    if best and not named(folder / "best.pt"):
        copy_checkpoint(current, folder / "best.pt")
    if keep_last > 1:
        for old in step_files(folder)[keep_last:]:
            if not named(old):  # never the checkpoint a resume just took (resume=<an older step file>)
                old.unlink()


def repair_run_checkpoints(folder: Path, current: Path, step: int, best_step: int | None, keep_last: int) -> None:
    """Complete a save that a kill interrupted, before a resumed run goes on from `current` (a checkpoint of
    its own run directory, of step `step`, whose best score came from `best_step`; None before any
    evaluation): its step file, best.pt holding `best_step`, the rotation. best.pt is relinked when it holds
    another step and the weights of `best_step` are kept (in `current` or a step file); otherwise a warning
    says what best.pt holds. Raises CheckpointError when a link cannot be written."""
    best = folder / "best.pt"
    holds = saved_step(best) if best.is_file() else None
    if best_step is not None and best_step != step and holds != best_step:
        source = folder / f"step_{best_step:08d}.pt"
        if source.is_file() and saved_step(source) == best_step:
            log.warning("best.pt holds step %s, not step %d where the run's best score is: relinked to %s",
                        holds, best_step, source.name)
            copy_checkpoint(source, best)
        elif holds is not None:
            log.warning("best.pt holds step %d, not step %d where the run's best score is, whose weights no file keeps "
                        "(the run was resumed from an older checkpoint); best.pt is replaced at the next new best",
                        holds, best_step)
    is_best = best_step == step and not (best.is_file() and os.path.samefile(best, current)) and holds != step
    if is_best:
        log.warning("best.pt holds step %s, not step %d where the run's best score is (a save interrupted between "
                    "last.pt and best.pt): relinked to %s", holds, step, current.name)
    # a step file and the rotation only for last.pt, the one a save names: resuming an older file (a fallback
    # past a damaged last.pt, or an explicit rewind) adds no step file and removes none
    complete_save(folder, current, step, keep_last if current.name == "last.pt" else 1, is_best)


def saved_step(path: Path) -> int | None:
    """The step a checkpoint file holds (its pickle only: tensors are mapped, not read); None when unreadable."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return int(ckpt["step"])
    except Exception:  # noqa: BLE001 - damaged, truncated, not a checkpoint: its step is unknown
        return None


def step_files(folder: Path) -> list[Path]:
    """step_<N>.pt files, newest first."""
    return sorted(folder.glob("step_*.pt"), key=lambda p: int(p.stem.split("_")[1]), reverse=True)


def copy_checkpoint(src: Path, dst: Path) -> None:
    """Atomically make `dst` a copy of `src` (a hard link where the file system allows)."""
    tmp = dst.with_name(dst.name + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        try:
            os.link(src, tmp)  # `src` is only ever replaced by rename, so the link keeps this version
        except OSError:
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(f"could not write {dst}: {write_failure(e, dst, src.stat().st_size)}; {src} is "
                              f"intact") from None
    _fsync_dir(dst.parent)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_checkpoint(path: Path, mmap: bool = False) -> dict[str, Any]:
    """Verify (zip CRCs) and load a checkpoint on the CPU with `weights_only=True`; any fault becomes a
    CheckpointError."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    damage = archive_damage(path)
    if damage:
        raise CheckpointError(f"checkpoint {path} is damaged ({damage}); {_use_another(path)}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # truncated zip, a pickle with objects, not a torch file at all
        raise CheckpointError(f"checkpoint {path} cannot be read ({load_failure(e)}); it is truncated, corrupt or "
                              f"not a vit-train checkpoint: {_use_another(path)}") from None
    missing = [k for k in REQUIRED_KEYS if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise CheckpointError(f"{path} is not a vit-train checkpoint (it lacks {', '.join(missing)})")
    return ckpt


def _use_another(path: Path) -> str:
    """What to do about an unusable checkpoint: use another of its run's, named when there is one."""
    def same(other: Path) -> bool:  # best.pt and step_<N>.pt can be hard links to one file
        return os.path.samefile(other, path)

    others = [p for p in run_checkpoints(path.parent.parent) if not same(p)] if path.parent.name == "checkpoints" else []
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
            raise CheckpointError(f"{path} holds no checkpoints{' (' + ', '.join(odd) + ')' if odd else ''}; give a run "
                                  f"directory that has some (in checkpoints/), or a .pt file")
    failures = []
    for candidate in candidates:
        try:
            return candidate, load_checkpoint(candidate, mmap)
        except CheckpointError as e:
            log.warning("%s; trying the next newest", e)
            failures.append(candidate.name)
    raise CheckpointError(f"none of the checkpoints in {candidates[0].parent} can be read ({', '.join(failures)}); "
                          f"start a new run in another directory")


def check_classes(ckpt: dict, class_names: list[str]) -> None:
    """Refuse data whose classes differ from the checkpoint's (known only once the data is loaded; a resumed
    run and vit-eval's report both check): CheckpointError, one line."""
    difference = class_difference(list(ckpt["class_names"]), list(class_names), "saved", "in the data now")
    if difference is not None:
        raise CheckpointError(f"the checkpoint does not fit this data (classes: {len(ckpt['class_names'])} saved, "
                              f"{len(class_names)} in the data now: {difference.split(' (')[0]}); use "
                              f"the data it was trained on, or start a new run from its weights "
                              f"(model.pretrained=<the checkpoint> model.reset_head=true)")


def versions() -> dict[str, str]:
    return {"vit_train": __version__, "torch": str(torch.__version__), "torchvision": str(torchvision.__version__),
            "python": platform.python_version(), "format": str(FORMAT_VERSION)}


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
        head = torch.load(last, map_location="cpu", weights_only=True, mmap=True)
        newest = head.get("best_score") is not None and head.get("best_step") == head["step"]
    except Exception:  # noqa: BLE001 - an unreadable last.pt: best.pt is what there is
        return best
    if newest and saved_step(best) != head["step"]:
        log.info("%s holds step %s, but the run's best is step %d in %s (a save interrupted before best.pt): using %s",
                 best, saved_step(best), head["step"], last.name, last)
        return last
    return best
