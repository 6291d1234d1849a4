"""The run directory torchrun's processes share: rank 0's (Hydra's timestamp can differ between
processes started a second apart), found again after an elastic restart."""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

from vit_train.config import Config
from vit_train.outputs import rundir
from vit_train.runtime import distributed

log = logging.getLogger("vit_train")
RUN_ID_MARKER = ".torchrun_run_id"  # which torchrun chose the directory: its restarts resume there


def shared_run_dir(config: Config, run_dir: Path, lock: rundir.RunLock | None) -> tuple[Path, rundir.RunLock | None]:
    """Join the process group and use rank 0's run directory (Hydra's timestamp can differ between
    processes started a second apart); an elastic restart (torchrun --max-restarts) resumes: sets
    `config.resume` to auto. Returns the directory and its lock: rank 0 holds it for all processes,
    moving `lock` (the one it took on `run_dir`) there when the directory changes; other ranks None."""
    ctx = distributed.setup(config.trainer.device)
    run_id, restart = os.environ.get("TORCHELASTIC_RUN_ID", ""), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    chosen = run_dir
    if ctx.is_main and restart and run_id:  # the directory the first attempt of this torchrun chose
        for marker in run_dir.parent.parent.glob(f"*/*/{RUN_ID_MARKER}"):
            if marker.read_text() == run_id:
                chosen = marker.parent
    shared = Path(distributed.broadcast(str(chosen)))
    if lock is not None and lock.run_dir != shared.resolve():
        lock.release()
        lock = None
    if shared != run_dir and run_dir.is_dir() and unused(run_dir):
        shutil.rmtree(run_dir, ignore_errors=True)  # the directory Hydra made for this process (or all), unused
    if ctx.is_main and lock is None:
        lock = rundir.acquire(shared)  # rank 0 holds the lock for every process
    if ctx.is_main and run_id:
        shared.mkdir(parents=True, exist_ok=True)
        (shared / RUN_ID_MARKER).write_text(run_id)
    if restart and config.resume is None:
        config.resume = "auto"
        if ctx.is_main:
            log.info("restart %d of the process group: resuming in %s", restart, shared)
    return shared, lock


def unused(run_dir: Path) -> bool:
    """Whether `run_dir` holds nothing but Hydra's record, the lock and torchrun's marker: no run has written
    into it."""
    return {p.name for p in run_dir.iterdir()} <= {".hydra", rundir.LOCK_NAME, RUN_ID_MARKER}


def remove_unused(run_dir: Path) -> None:
    """Remove the directory of a run refused before it started. Under torchrun every process refuses the
    same config at once: rank 0 removes the directory when no run has written into it (`unused`); another
    rank, whose Hydra may have made the directory again after that, removes it only when empty. Nothing
    is raised when another process got there first."""
    try:
        if os.environ.get("RANK", "0") == "0":
            if unused(run_dir):
                shutil.rmtree(run_dir, ignore_errors=True)
                if re.fullmatch(r"\d{4}-\d{2}-\d{2}", run_dir.parent.name):  # Hydra's day folder, left empty
                    run_dir.parent.rmdir()
        else:
            run_dir.rmdir()
    except OSError:  # gone already, or (another rank) rank 0's record still in it: rank 0 removes it
        pass
