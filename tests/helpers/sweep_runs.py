"""A sweep run in this process as `vit-train -m` runs it, without Hydra: each job's directory `<sweep>/<i>`
gets `.hydra/overrides.yaml` (unless it already holds a record: Hydra keeps that of a directory holding
a run), then `sweeps.job.run_job` with the job's tiny config, then the summary (summary.csv, summary.md).
Used by test_faults.py and tests/faults/fault_table.py to kill a sweep job and re-run the sweep.

    sweep(sweep_dir, [["optim.lr=0.001"], ["optim.lr=0.0005"]], base={"trainer": {...}, "seed": 1})
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from helpers.configs import tiny_config


def job_config(base: dict, overrides: list[str]):
    """The tiny config of `base` (tiny_config's sections) with the job's `key.sub=value` overrides."""
    sections = copy.deepcopy(base)
    for override in overrides:
        key, _, text = override.partition("=")
        *parents, leaf = key.split(".")
        place = sections
        for name in parents:
            place = place.setdefault(name, {})
        place[leaf] = yaml.safe_load(text)
    return tiny_config(**sections)


def run_sweep_job(sweep_dir: Path, index: int, overrides: list[str], base: dict, objective: str = "best_top1") -> float:
    """Job `index` of a sweep in `sweep_dir`: its record written as Hydra does, then run_job; its `objective`
    (sweep.objective: a results.json key)."""
    from vit_train.sweeps.job import run_job

    run_dir = Path(sweep_dir) / str(index)
    record = run_dir / ".hydra" / "overrides.yaml"
    if not record.exists():
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(yaml.safe_dump(list(overrides)))
    return run_job(lambda: (job_config(base, overrides), list(overrides), None), run_dir, list(overrides), index,
                   objective)


def sweep(sweep_dir: Path, grid: list[list[str]], base: dict, objective: str = "best_top1",
          direction: str = "maximize") -> list[float]:
    """Every job of `grid` in order, then the summary sorted by `objective` in `direction`; the jobs' objectives."""
    from vit_train.sweeps.summary import summarize

    values = [run_sweep_job(sweep_dir, i, overrides, base, objective) for i, overrides in enumerate(grid)]
    summarize(Path(sweep_dir), objective, direction, out=None)
    return values
