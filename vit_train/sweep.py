"""Sweeps: a job's record and objective, sharing GPUs among parallel jobs, and a sweep's summary.

A sweep directory (hydra.sweep.dir) holds one run directory per job (`0/`, `1/`, ...), each with
the usual layout and `.hydra/overrides.yaml`. `summarize` turns them into a table sorted by the
objective (printed, and written as summary.csv and summary.md) and TensorBoard HParams entries.
`run_job` runs one job. No Hydra here: cli.py calls these from its entry point and callback, and
`vit-sweep-summary` calls `main`.
"""

from __future__ import annotations

import argparse
import csv
import fcntl
import io
import json
import logging
import math
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import IO, Any, Callable

import yaml

from .config import Config
from .errors import RunStopped, UserError, exit_with
from .rundir import RunDirBusy, locked

log = logging.getLogger("vit_train")

COLUMNS = ("job", "status", "objective", "best_top1", "final_top1", "epochs", "images_per_s", "wall_seconds",
           "overrides")


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


def finished_job(run_dir: Path, overrides: list[str]) -> dict[str, Any] | None:
    """The job's results if it already completed with these overrides (a re-run sweep skips it)."""
    results = read_results(run_dir)
    if results and results.get("status") == "completed" and job_overrides(run_dir) == list(overrides):
        return results
    return None


def check_same_job(run_dir: Path, overrides: list[str]) -> None:
    """An unfinished job resumes only if it is the same job: the sweep must not be another grid."""
    before = job_overrides(run_dir)
    if before and before != list(overrides):
        raise UserError(f"{run_dir} holds a job of another sweep ({' '.join(before)}), not {' '.join(overrides)}; "
                        f"re-run a sweep with the same command, or choose a new hydra.sweep.dir")


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
    the same hydra.sweep.dir skips completed jobs and resumes the others. A job directory that another
    process holds (rundir.py) is left untouched, not even given a results.json, and the job counts as failed.
    """
    try:
        with locked(run_dir):  # before reading anything there: another process may be writing it
            return _run_job(compose, run_dir, overrides, job, objective)
    except RunDirBusy as e:
        log.error("job %d (%s) failed: %s", job, " ".join(overrides), e)
        return math.nan


def _run_job(compose: Callable[[], tuple[Config, list[str], Any]], run_dir: Path, overrides: list[str], job: int,
             objective: str) -> float:
    try:
        done = finished_job(run_dir, overrides)
        if done is not None:
            log.info("job %d (%s) already completed in %s; skipped", job, " ".join(overrides), run_dir)
            return objective_value(done, objective)
        config, _, resume_from = compose()
        from .checkpoint import run_checkpoints

        if run_checkpoints(run_dir):
            check_same_job(run_dir, overrides)
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
        from .trainer import train

        try:
            results = train(config, run_dir, overrides, resume_from)
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
        from .metrics import write_results

        record, before = failure_record(text, run_dir), read_results(run_dir) or {}
        if before.get("status") == "failed":  # the trainer's record of this failure: keep its numbers
            record = {**record, **before, "error": record["error"]}
        run_dir.mkdir(parents=True, exist_ok=True)
        write_results(run_dir, record)
    return math.nan


def _number(text: str) -> Any:
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (int, float, bool, str)) else str(value)


def summarize(sweep_dir: Path, objective: str = "best_top1", direction: str = "maximize",
              out: IO | None = sys.stdout) -> list[dict[str, Any]]:
    """One row per job, best first (failed jobs last); writes summary.csv and summary.md in
    `sweep_dir`, prints the Markdown table to `out`, and writes TensorBoard HParams per job."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise UserError(f"sweep directory {sweep_dir} does not exist")
    jobs = sorted((d for d in sweep_dir.iterdir() if (d / ".hydra" / "overrides.yaml").is_file()),
                  key=lambda d: (not d.name.isdigit(), int(d.name) if d.name.isdigit() else 0, d.name))
    if not jobs:
        raise UserError(f"{sweep_dir} holds no sweep jobs (folders with .hydra/overrides.yaml)")
    overrides = {job: job_overrides(job) for job in jobs}
    rows = []
    for job in jobs:
        results = read_results(job) or {"status": "unfinished"}
        rows.append({"job": job.name, "status": results.get("status"), "objective": objective_value(results, objective),
                     **{k: results.get(k) for k in COLUMNS[3:-1]}, "overrides": " ".join(overrides[job])})
    sign = -1 if direction == "maximize" else 1
    rows.sort(key=lambda r: (math.isnan(r["objective"]), sign * r["objective"] if not math.isnan(r["objective"]) else 0))
    _write_csv(sweep_dir / "summary.csv", rows)
    shared = set.intersection(*(set(o) for o in overrides.values()))  # the command's fixed part
    table = _markdown(rows, objective, shared)
    (sweep_dir / "summary.md").write_text(table)
    if out is not None:
        print(f"sweep {sweep_dir}: {len(rows)} jobs, sorted by {objective} ({direction})\n{table}", file=out)
    _write_hparams(sweep_dir, jobs)
    return rows


def incomplete_jobs(sweep_dir: Path, rows: list[dict[str, Any]]) -> str | None:
    """One line naming each job that did not complete, with its status and reason; None if all did."""
    names = []
    for row in rows:
        if row["status"] == "completed":
            continue
        reason = ((read_results(Path(sweep_dir) / row["job"]) or {}).get("error") or "").strip().splitlines()
        names.append(f"job {row['job']} {row['status']}" + (f" ({reason[-1]})" if reason else ""))
    if not names:
        return None
    return (f"{len(names)} of {len(rows)} jobs did not complete: {'; '.join(names)}; see their results.json and "
            f"train.log, then re-run the same command with hydra.sweep.dir={sweep_dir} to retry them")


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    path.write_text(buffer.getvalue())


def _markdown(rows: list[dict[str, Any]], objective: str, shared: set[str]) -> str:
    """The table, with only the overrides that differ between jobs (summary.csv has them all)."""
    def cell(value: Any, digits: int = 2) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "-"
        return f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    lines = [f"| job | status | {objective} | best top-1 | final top-1 | epochs | images/s | wall s | overrides |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['job']} | {r['status']} | {cell(r['objective'], 4)} | {cell(r['best_top1'])} | "
                     f"{cell(r['final_top1'])} | {cell(r['epochs'])} | {cell(r['images_per_s'], 0)} | "
                     f"{cell(r['wall_seconds'], 0)} | {' '.join(o for o in r['overrides'].split() if o not in shared)} |")
    return "\n".join(lines) + "\n"


def _write_hparams(sweep_dir: Path, jobs: list[Path]) -> None:
    """Each job's overrides as hyperparameters and its results as metrics, in <job>/tb/hparams, so
    `tensorboard --logdir <sweep dir>` compares the jobs in the HParams tab."""
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams

    for job in jobs:
        results = read_results(job)
        if not results or not (job / "tb").is_dir():
            continue
        params = {}
        for override in job_overrides(job):
            key, _, value = override.partition("=")
            params[key.lstrip("+~")] = _number(value)
        metrics = {f"hparams/{k}": float(results[k]) for k in ("best_top1", "final_top1", "final_loss", "best_loss", "images_per_s")
                   if isinstance(results.get(k), (int, float))}
        shutil.rmtree(job / "tb" / "hparams", ignore_errors=True)  # written anew on each summary
        with SummaryWriter(str(job / "tb" / "hparams")) as writer:  # what add_hparams does, in a fixed folder
            for summary in hparams(params or {"job": job.name}, metrics):
                writer.file_writer.add_summary(summary)
            for name, value in metrics.items():
                writer.add_scalar(name, value)


OBJECTIVES = ("best_top1", "final_top1", "final_top5", "final_loss", "final_ema_top1", "best_loss")  # sweep.objective's


def sweep_objective(sweep_dir: Path) -> tuple[str, str] | None:
    """(sweep.objective, sweep.direction) the sweep ran with, from Hydra's multirun.yaml; None without one."""
    path = sweep_dir / "multirun.yaml"
    if not path.is_file():
        return None
    from omegaconf import OmegaConf

    saved = OmegaConf.load(path)
    objective, direction = OmegaConf.select(saved, "sweep.objective"), OmegaConf.select(saved, "sweep.direction")
    return (str(objective), str(direction or "maximize")) if objective in OBJECTIVES else None


def main(argv: list[str] | None = None) -> None:
    """vit-sweep-summary DIR [--objective KEY] [--direction maximize|minimize]"""
    parser = argparse.ArgumentParser(prog="vit-sweep-summary", description="Summarise a sweep directory: a table "
                                     "sorted by the objective, summary.csv, summary.md and TensorBoard HParams.")
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--objective", default=None, choices=list(OBJECTIVES),
                        help="default: the sweep's own sweep.objective (its multirun.yaml), else best_top1")
    parser.add_argument("--direction", default=None, choices=["maximize", "minimize"],
                        help="default: the sweep's own sweep.direction when the objective is its own, else "
                             "minimize for a loss and maximize otherwise")
    args = parser.parse_args(argv)
    own = sweep_objective(args.sweep_dir)
    objective = args.objective or (own[0] if own else "best_top1")
    direction = args.direction or (own[1] if own and own[0] == objective else
                                   "minimize" if objective.endswith("_loss") else "maximize")
    try:
        rows = summarize(args.sweep_dir, objective, direction)
    except UserError as e:
        exit_with("vit-sweep-summary", e)
    incomplete = incomplete_jobs(args.sweep_dir, rows)
    if incomplete:
        print(f"vit-sweep-summary: {incomplete}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
