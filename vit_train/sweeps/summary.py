"""A sweep's summary: a table of its jobs sorted by the objective (printed, and written as summary.csv
and summary.md) and TensorBoard HParams entries; `vit-sweep-summary` (`main`) makes it on demand.
No Hydra here: cli.py calls `summarize` from its callback at the end of a sweep.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import shutil
import sys
import typing
from pathlib import Path
from typing import IO, Any

import yaml

from vit_train.config.schema import SweepConfig
from vit_train.errors import UserError, exit_with
from vit_train.sweeps.job import job_overrides, objective_value, read_results

COLUMNS = ("job", "status", "objective", "best_top1", "final_top1", "epochs", "images_per_s", "wall_seconds",
           "overrides")


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


OBJECTIVES = typing.get_args(typing.get_type_hints(SweepConfig)["objective"])  # sweep.objective's values


def sweep_objective(sweep_dir: Path) -> tuple[str, str] | None:
    """(sweep.objective, sweep.direction) the sweep ran with, from Hydra's multirun.yaml; None without one."""
    path = sweep_dir / "multirun.yaml"
    if not path.is_file():
        return None
    try:
        sweep = (yaml.safe_load(path.read_text()) or {}).get("sweep") or {}
    except (yaml.YAMLError, AttributeError):  # not Hydra's record of a sweep
        return None
    objective, direction = sweep.get("objective"), sweep.get("direction")
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
