"""Sweeps: a job's record and objective, sharing GPUs among parallel jobs (the summary of a sweep is
summary.py; each job's console lines are tagged in console.py).

A sweep directory (hydra.sweep.dir) holds one run directory per job (`0/`, `1/`, ...), each with
the usual layout and `.hydra/overrides.yaml`. `run_job` runs one job. No Hydra here: cli.py calls
these from its entry point.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import yaml

from vit_train.config import Config
from vit_train.errors import RunStopped, UserError
from vit_train.outputs.rundir import RunDirBusy, RunLock, locked
from vit_train.sweeps.console import tagged_console
from vit_train.sweeps.grid import command_grid, in_grid

log = logging.getLogger("vit_train")


COMPLETED = ("completed", "stopped_early")  # a job's results.json status that counts as done (a re-run skips it)


def read_results(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / "results.json").read_text())
    except (OSError, ValueError):
        return None


def job_overrides(run_dir: Path) -> list[str]:
    try:
        return list(yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text()) or [])
    except (OSError, yaml.YAMLError):
        return []


def objective_value(results: dict[str, Any] | None, objective: str) -> float:
    """The job's objective, NaN when it has none (failed, or never evaluated): sweepers read NaN as a failed trial. A
    job that early stopping ended (`stopped_early`) completed: its best score counts."""
    value = (results or {}).get(objective) if (results or {}).get("status") in COMPLETED else None
    return float("nan") if value is None else float(value)


def failure_record(error: str, run_dir: Path) -> dict[str, Any]:
    """results.json of a job that failed: status and the error's last lines."""
    return {"status": "failed", "error": "\n".join(error.strip().splitlines()[-20:]), "run_dir": str(run_dir)}


def same_job(recorded: list[str], overrides: list[str]) -> bool:
    """Whether a job directory's recorded overrides are this job's: the same overrides in any order
    (a re-run that lists the swept keys in another order is the same grid)."""
    return sorted(map(plain_override, recorded)) == sorted(map(plain_override, overrides))


def plain_override(override: str) -> str:
    """An override as written, without the `++` earlier versions recorded for a sweep's option keys (a job
    directory of theirs): `++data.root=/x` and `data.root=/x` set the same key."""
    return override.removeprefix("++")


def finished_job(run_dir: Path, overrides: list[str]) -> dict[str, Any] | None:
    """The job's results if it already completed with these overrides (a re-run sweep skips it)."""
    results = read_results(run_dir)
    if results and results.get("status") in COMPLETED and same_job(job_overrides(run_dir), overrides):
        return results
    return None


REFUSAL = "refused.json"  # beside a job directory's record: a job of a later sweep that was refused there


def _has_work(run_dir: Path) -> bool:
    """Whether `run_dir` holds a run (a results.json or a checkpoints folder), not only Hydra's record."""
    return (run_dir / "results.json").is_file() or (run_dir / "checkpoints").is_dir()


def _jobs(sweep_dir: Path) -> list[Path]:
    """The sweep directory's numbered job directories, in number order."""
    return sorted((d for d in sweep_dir.iterdir() if d.name.isdigit() and d.is_dir()), key=lambda d: int(d.name))


def _free_directory(sweep_dir: Path, overrides: list[str]) -> Path:
    """A new job directory (the next unused number) taken for this job, with its `.hydra/overrides.yaml`."""
    number = max((int(d.name) for d in _jobs(sweep_dir)), default=-1) + 1
    while True:
        home = sweep_dir / str(number)
        try:
            home.mkdir()
            break
        except FileExistsError:  # a parallel job took it first
            number += 1
    (home / ".hydra").mkdir()
    (home / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(list(overrides)))
    return home


def job_home(run_dir: Path, overrides: list[str]) -> Path:
    """Where this job's work is, for the same grid re-run in any order, also after a kill.

    `run_dir` (Hydra's directory for it) if it holds this job's run; else a sibling job directory that
    holds this job's run (the grid in another order; a `run_dir` Hydra just made, holding nothing but
    its `.hydra/` record, is removed again); else `run_dir` if it holds no other job's run; else, when
    every job of the sweep directory is a point of this sweep's grid (multirun.yaml: the same grid,
    interrupted), a new directory with the next unused number; else `run_dir` (another grid: refused).
    """
    recorded = job_overrides(run_dir)
    ours = bool(recorded) and same_job(recorded, overrides)
    if (ours and _has_work(run_dir)) or not run_dir.parent.is_dir():
        return run_dir
    siblings = [d for d in _jobs(run_dir.parent) if d != run_dir and same_job(job_overrides(d), overrides)]
    held = [d for d in siblings if _has_work(d)]
    if held:
        if ours:  # Hydra's record of a job that runs elsewhere
            with contextlib.suppress(OSError):
                _remove_hydra_record(run_dir)
        return held[0]
    if recorded and not ours and siblings:
        return siblings[0]
    if not recorded or ours or not _has_work(run_dir):
        return run_dir
    grid = command_grid(run_dir.parent)
    if grid is not None and all(in_grid(job_overrides(d), grid) for d in _jobs(run_dir.parent) if _has_work(d)):
        return _free_directory(run_dir.parent, overrides)
    return run_dir


def _remove_hydra_record(run_dir: Path) -> None:
    """Remove `run_dir` if it holds only Hydra's `.hydra/` record (and a lock file): nothing of a run."""
    if any(p.name not in (".hydra", ".lock") for p in run_dir.iterdir()):
        return
    for part in sorted(run_dir.rglob("*"), key=lambda p: -len(p.parts)):
        part.rmdir() if part.is_dir() else part.unlink()
    run_dir.rmdir()


def holds_other_job(run_dir: Path, overrides: list[str]) -> str | None:
    """Why `run_dir` cannot take this job (it holds another sweep's run: a record or checkpoints), or None."""
    from vit_train.checkpoint import run_checkpoints

    before = job_overrides(run_dir)
    if not before or same_job(before, overrides):
        return None
    if read_results(run_dir) is None and not run_checkpoints(run_dir):
        return None  # nothing of the other job's is there to lose
    theirs, ours = [o for o in before if o not in overrides], [o for o in overrides if o not in before]
    return (
        f"{run_dir} holds a job of another sweep ({' '.join(theirs)}), not {' '.join(ours)}; "
        f"run this grid with a hydra.sweep.dir of its own (this one keeps that sweep's jobs)"
    )


def check_same_job(run_dir: Path, overrides: list[str]) -> None:
    """An unfinished job resumes only if it is the same job: the sweep must not be another grid."""
    reason = holds_other_job(run_dir, overrides)
    if reason:
        raise UserError(reason)


def record_refusal(run_dir: Path, overrides: list[str], reason: str) -> None:
    """`run_dir`/refused.json: this job was refused there. The directory's own record (results.json,
    checkpoints) is left as it was; the summary and the exit status name the refusal."""
    from vit_train.outputs.metrics import write_atomic

    record = {"status": "refused", "error": reason, "overrides": list(overrides), "holds": job_overrides(run_dir)}
    try:
        write_atomic(run_dir / REFUSAL, json.dumps(record, indent=2) + "\n")
    except OSError as e:  # the log line has said it; the directory's own record stays as it was
        log.error("could not write %s: %s", run_dir / REFUSAL, e)


def read_refusal(run_dir: Path) -> dict[str, Any] | None:
    """The refusal recorded beside `run_dir`'s record by the latest sweep that ran a job there, or None."""
    try:
        record = json.loads((run_dir / REFUSAL).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def claim_device(sweep_dir: Path, count: int, job: int, poll_seconds: float = 0.5) -> tuple[int, IO]:
    """A GPU index in [0, count) that no other job of this sweep holds, and its lock (keep it open).

    Parallel jobs (e.g. hydra/launcher=parallel) each take the first free GPU; with more jobs than
    GPUs a job waits until any of them is free (a lock file per GPU in the sweep directory, taken
    with flock, so a job that dies frees its GPU).
    """
    sweep_dir.mkdir(parents=True, exist_ok=True)
    waited = False
    while True:
        for index in range(count):
            lock = open(sweep_dir / f".device_{index}.lock", "w")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return index, lock
            except BlockingIOError:
                lock.close()
        if not waited:
            logging.getLogger("vit_train").info("job %d waits for one of the sweep's %d device slots", job, count)
            waited = True
        time.sleep(poll_seconds)


def run_job(
    compose: Callable[[], tuple[Config, list[str], Any]], run_dir: Path, overrides: list[str], job: int, objective: str
) -> float:
    """One job of a sweep: its objective, or NaN after recording why it failed (the sweep goes on).

    `compose` gives the job's typed config (called only for a job that still has work to do). A job
    that already completed in this sweep directory is skipped, and an unfinished one resumes. A stop
    signal still stops the whole sweep (after the job's checkpoint): re-running the same command with
    the same hydra.sweep.dir skips completed jobs and resumes the others, wherever in the sweep
    directory they are (`job_home`: the same grid in another order, also after a kill: a job held nowhere
    whose directory holds another job of this grid takes a new directory). A job whose directory holds another
    sweep's job is refused in refused.json beside that job's record, which stays as it was (the summary
    and the exit status say so). A job directory that another
    process holds (rundir.py) is left untouched, not even given a results.json, and the job counts as failed.
    Every line the job prints starts with `[job N] ` (console.py).
    """
    with tagged_console(job):
        with contextlib.suppress(OSError):  # a refusal by an earlier sweep: this job decides anew
            (run_dir / REFUSAL).unlink(missing_ok=True)
        home = job_home(run_dir, overrides)
        if home != run_dir and not _has_work(home):
            log.info(
                "job %d (%s) runs in %s (%s holds another job of this grid)", job, " ".join(overrides), home, run_dir
            )
        elif home != run_dir:
            log.info(
                "job %d (%s) is the job of %s (the same grid in another order); it continues there",
                job,
                " ".join(overrides),
                home,
            )
        try:
            with locked(home) as lock:  # before reading anything there: another process may be writing it
                return _run_job(compose, home, overrides, job, objective, lock)
        except RunDirBusy as e:
            log.error("job %d (%s) failed: %s", job, " ".join(overrides), e)
            return math.nan


def _run_job(
    compose: Callable[[], tuple[Config, list[str], Any]],
    run_dir: Path,
    overrides: list[str],
    job: int,
    objective: str,
    run_lock: RunLock,
) -> float:
    try:
        done = finished_job(run_dir, overrides)
        if done is not None:
            log.info("job %d (%s) already completed in %s; skipped", job, " ".join(overrides), run_dir)
            return objective_value(done, objective)
        refused = holds_other_job(run_dir, overrides)
        if refused:  # said beside the other job's record, never over it
            log.error("job %d (%s) refused: %s", job, " ".join(overrides), refused)
            record_refusal(run_dir, overrides, refused)
            return math.nan
        config, _, resume_from = compose()
        from vit_train.checkpoint import run_checkpoints

        if run_checkpoints(run_dir):
            config.resume = "auto"  # an unfinished job of this sweep continues from its checkpoint
        lock = None
        if config.sweep.devices:
            index, lock = claim_device(run_dir.parent, config.sweep.devices, job)
            import torch

            if torch.cuda.is_available():
                torch.cuda.set_device(index)
                log.info("job %d runs on GPU %d (of %d shared by this sweep)", job, index, config.sweep.devices)
            else:
                log.info(
                    "job %d holds slot %d of %d (no GPU visible: the slots only limit concurrency)",
                    job,
                    index,
                    config.sweep.devices,
                )
        from vit_train.train.trainer import train

        try:
            results = train(
                config, run_dir, overrides, resume_from, lock=run_lock, sweep_job=(run_dir.parent.name, job)
            )
        finally:
            if lock is not None:
                lock.close()
        return objective_value(results, objective)
    except RunStopped as e:
        if e.exit_code != 3:  # a stop signal ends the sweep; a diverged job is recorded and the sweep goes on
            print(f"vit-train: {e}", file=sys.stderr)
            sys.exit(e.exit_code)
        log.error("job %d (%s) diverged: %s", job, " ".join(overrides), e)
    except KeyboardInterrupt:
        print("vit-train: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - any failure of one job is recorded; the sweep goes on
        text = str(e) if isinstance(e, UserError) else traceback.format_exc()
        log.error("job %d (%s) failed: %s", job, " ".join(overrides), text.strip().splitlines()[-1])
        from vit_train.outputs.metrics import write_results

        record, before = failure_record(text, run_dir), read_results(run_dir) or {}
        if before.get("status") == "completed":  # another job's finished record: the failure goes beside it
            record_refusal(run_dir, overrides, record["error"])
            return math.nan
        if before.get("status") == "failed":  # the trainer's record of this failure: keep its numbers
            record = {**record, **before, "error": record["error"]}
        run_dir.mkdir(parents=True, exist_ok=True)
        write_results(run_dir, record)
    return math.nan
