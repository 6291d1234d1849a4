"""Checkpoint files on disk, written: atomically (a temporary file in the same folder, fsynced, verified, renamed:
the one `torch.save`), their other names (step_<N>.pt, best.pt: links made after last.pt's rename), the rotation,
completing a save a kill cut short, and whether the disk can hold a run's checkpoints.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from vit_train.checkpoint.files import read_archive, saved_step, step_files
from vit_train.checkpoint.integrity import archive_damage, checkpoint_size
from vit_train.errors import CheckpointError
from vit_train.outputs.integrity import mount_point, write_failure

log = logging.getLogger("vit_train")


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
        read_archive(tmp, mmap=True)  # verify: a complete, loadable archive
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, (OSError, RuntimeError)):
            kept = earlier_checkpoint(path)
            needed = max(checkpoint_size(state) + 4096, path.stat().st_size if path.exists() else 0)
            raise CheckpointError(f"could not write {path}: {write_failure(e, path, needed)}; {kept}") from None
        raise
    _fsync_dir(path.parent)


def earlier_checkpoint(path: Path) -> str:
    """What a failed write left at `path`, in words: intact only when it is there and sound."""
    if not path.exists():
        return "there is no earlier checkpoint"
    damage = archive_damage(path)
    if damage:
        return (
            f"the earlier checkpoint there is damaged too ({damage}); resume=auto passes over it to an older sound one"
        )
    return "the previous checkpoint there is intact"


def short_of_space(
    folder: Path, model: torch.nn.Module, moments: int, ema: torch.nn.Module | None, keep_last: int
) -> str | None:
    """A warning when `folder`'s disk cannot hold the run's checkpoints, else None (checked at the start,
    not after the first epoch's work). A checkpoint holds the model, `moments` optimiser tensors per
    trainable parameter (AdamW 2, SGD 1) and the EMA; the run keeps `keep_last` versions (at least
    last.pt), best.pt can be one more, and a new one is written beside them all."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = moments * checkpoint_size(params) + (
        checkpoint_size([torch.zeros(())] * len(params)) if moments > 1 else 0
    )
    size = (
        checkpoint_size(model.state_dict()) + optimizer + (checkpoint_size(ema.state_dict()) if ema else 0) + 16 * 1024
    )  # AdamW's step counts; RNG states and the rest (measured: 11 kB)
    versions, free = max(keep_last, 1) + 2, shutil.disk_usage(folder).free
    if free >= versions * size:
        return None
    return (
        f"{mount_point(folder)} has {free / 2**20:.1f} MB free, but the checkpoints need about "
        f"{versions * size / 2**20:.1f} MB ({versions} of {size / 2**20:.1f} MB: {max(keep_last, 1)} kept, best.pt "
        f"and a new one written beside them); {'not even the first will fit' if free < size else 'the run will stop at a later one'}: "
        f"free some space, or lower trainer.keep_last"
    )


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
            log.warning(
                "best.pt holds step %s, not step %d where the run's best score is: relinked to %s",
                holds,
                best_step,
                source.name,
            )
            copy_checkpoint(source, best)
        elif holds is not None:
            log.warning(
                "best.pt holds step %d, not step %d where the run's best score is, whose weights no file keeps "
                "(the run was resumed from an older checkpoint); best.pt is replaced at the next new best",
                holds,
                best_step,
            )
    is_best = best_step == step and not (best.is_file() and os.path.samefile(best, current)) and holds != step
    if is_best:
        log.warning(
            "best.pt holds step %s, not step %d where the run's best score is (a save interrupted between "
            "last.pt and best.pt): relinked to %s",
            holds,
            step,
            current.name,
        )
    # a step file and the rotation only for last.pt, the one a save names: resuming an older file (a fallback
    # past a damaged last.pt, or an explicit rewind) adds no step file and removes none
    complete_save(folder, current, step, keep_last if current.name == "last.pt" else 1, is_best)


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
        raise CheckpointError(
            f"could not write {dst}: {write_failure(e, dst, src.stat().st_size)}; {src} is intact"
        ) from None
    _fsync_dir(dst.parent)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
