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
from pathlib import Path
from typing import IO, Any, Callable

import yaml

from vit_train.config.schema import Config
from vit_train.errors import RunStopped, UserError
from vit_train.outputs.rundir import RunDirBusy, RunLock, locked
from vit_train.sweeps.console import tagged_console

log = logging.getLogger("vit_train")


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
    """The job's objective, NaN when it has none (failed, or never evaluated): sweepers read NaN as a failed trial."""
    value = (results or {}).get(objective) if (results or {}).get("status") == "completed" else None
    return float("nan") if value is None else float(value)


def failure_record(error: str, run_dir: Path) -> dict[str, Any]:
    """results.json of a job that failed: status and the error's last lines."""
    return {"status": "failed", "error": "\n".join(error.strip().splitlines()[-20:]), "best_top1": None,
            "final_top1": None, "run_dir": str(run_dir)}


def same_job(recorded: list[str], overrides: list[str]) -> bool:
    """Whether a job directory's recorded overrides are this job's: the same overrides in any order
    (a re-run that lists the swept keys in another order is the same grid)."""
    return sorted(recorded) == sorted(overrides)


def finished_job(run_dir: Path, overrides: list[str]) -> dict[str, Any] | None:
    """The job's results if it already completed with these overrides (a re-run sweep skips it)."""
    results = read_results(run_dir)
    if results and results.get("status") == "completed" and same_job(job_overrides(run_dir), overrides):
        return results
    return None


REFUSAL = "refused.json"  # beside a job directory's record: a job of a later sweep that was refused there


def job_home(run_dir: Path, overrides: list[str]) -> Path:
    """Where this job's work is: `run_dir` (Hydra's directory for it), unless that holds another job
    and a sibling job directory of the sweep holds this one (the same grid re-run in another order)."""
    recorded = job_overrides(run_dir)
    if not recorded or same_job(recorded, overrides) or not run_dir.parent.is_dir():
        return run_dir
    for sibling in sorted(run_dir.parent.iterdir()):
        if sibling != run_dir and sibling.name.isdigit() and same_job(job_overrides(sibling), overrides):
            return sibling
    return run_dir


def holds_other_job(run_dir: Path, overrides: list[str]) -> str | None:
    """Why `run_dir` cannot take this job (it holds another sweep's run: a record or checkpoints), or None."""
    from vit_train.outputs.checkpoint import run_checkpoints

    before = job_overrides(run_dir)
    if not before or same_job(before, overrides):
        return None
    if read_results(run_dir) is None and not run_checkpoints(run_dir):
        return None  # nothing of the other job's is there to lose
    theirs, ours = [o for o in before if o not in overrides], [o for o in overrides if o not in before]
    return (f"{run_dir} holds a job of another sweep ({' '.join(theirs)}), not {' '.join(ours)}; "
            f"run this grid with a hydra.sweep.dir of its own (this one keeps that sweep's jobs)")


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


def run_job(compose: Callable[[], tuple[Config, list[str], Any]], run_dir: Path, overrides: list[str], job: int,
            objective: str) -> float:
    """One job of a sweep: its objective, or NaN after recording why it failed (the sweep goes on).

    `compose` gives the job's typed config (called only for a job that still has work to do). A job
    that already completed in this sweep directory is skipped, and an unfinished one resumes. A stop
    signal still stops the whole sweep (after the job's checkpoint): re-running the same command with
    the same hydra.sweep.dir skips completed jobs and resumes the others, wherever in the sweep
    directory they are (`job_home`: the same grid in another order). A job whose directory holds another
    sweep's job is refused in refused.json beside that job's record, which stays as it was (the summary
    and the exit status say so). A job directory that another
    process holds (rundir.py) is left untouched, not even given a results.json, and the job counts as failed.
    Every line the job prints starts with `[job N] ` (console.py).
    """
    with tagged_console(job):
        with contextlib.suppress(OSError):  # a refusal by an earlier sweep: this job decides anew
            (run_dir / REFUSAL).unlink(missing_ok=True)
        home = job_home(run_dir, overrides)
        if home != run_dir:
            log.info("job %d (%s) is the job of %s (the same grid in another order); it continues there", job,
                     " ".join(overrides), home)
        try:
            with locked(home) as lock:  # before reading anything there: another process may be writing it
                return _run_job(compose, home, overrides, job, objective, lock)
        except RunDirBusy as e:
            log.error("job %d (%s) failed: %s", job, " ".join(overrides), e)
            return math.nan


def _run_job(compose: Callable[[], tuple[Config, list[str], Any]], run_dir: Path, overrides: list[str], job: int,
             objective: str, run_lock: RunLock) -> float:
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
        from vit_train.outputs.checkpoint import run_checkpoints

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
                log.info("job %d holds slot %d of %d (no GPU visible: the slots only limit concurrency)", job, index,
                         config.sweep.devices)
        from vit_train.train.trainer import train

        try:
            results = train(config, run_dir, overrides, resume_from, lock=run_lock)
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
