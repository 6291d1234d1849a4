"""A sweep's summary: a table of its jobs sorted by the objective (printed, and written as summary.csv
and summary.md) and TensorBoard HParams entries; `vit-sweep-summary` (`main`) makes it on demand.
No Hydra here: cli.py calls `summarize` from its callback at the end of a sweep.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import os
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import IO, Any

import yaml

from vit_train.data.decoding.regular import not_regular
from vit_train.errors import ConfigError, UserError, exit_with
from vit_train.outputs.places import place_error, print_output, write_atomic
from vit_train.schema.sections import results_directions
from vit_train.schema.typed import default_option, options
from vit_train.sweeps import job as job_files
from vit_train.sweeps.job import COMPLETED, job_overrides, objective_value


def read_results(job: Path) -> dict[str, Any] | None:
    """The job's results.json (None when missing or unreadable); one that is not a regular file (a FIFO
    would block the read forever) reads as status `unreadable`, naming what it is, never opened."""
    path = Path(job) / "results.json"
    kind = not_regular(path) if os.path.lexists(path) else None
    if kind is not None:
        return {
            "status": "unreadable",
            "error": f"{path} is {kind}, not a regular file; move it out of the job directory",
        }
    return job_files.read_results(job)


def read_refusal(job: Path) -> dict[str, Any] | None:
    """The job's refused.json, None when missing, unreadable or not a regular file (never opened then)."""
    path = Path(job) / "refused.json"
    if os.path.lexists(path) and not_regular(path) is not None:
        return None
    return job_files.read_refusal(job)


# the columns around the objectives' own (each objective's `summary_columns`); *_partial: scored on a share of the val set
FIRST, LAST = (
    ("job", "status", "objective"),
    ("epochs", "images_per_s", "wall_seconds", "best_partial", "val_partial", "overrides", "name", "tags"),
)


def objective_columns(found: list[dict[str, Any]]) -> dict[str, tuple[str, int]]:
    """{results key: (header, decimals)} of the numbers the jobs' objectives show (their `summary_columns`, in the
    order the objectives are registered); the default objective's when no job names one (none has run yet). A job
    of an earlier version, whose results.json names no objective, counts as the objective whose best score it holds."""
    names = {results.get("objective") or trained_by(results) for results in found}
    chosen = [cls for name, cls in options("objective").items() if name in names] or [default_option("objective")]
    return {key: header for cls in chosen for key, header in cls.summary_columns.items()}


def trained_by(results: dict[str, Any]) -> str | None:
    """The objective whose best score (best_<metric>) `results` holds, for a results.json that names none."""
    found = [name for name, cls in options("objective").items() if results.get(f"best_{cls.metric}") is not None]
    return found[0] if len(found) == 1 else None


def override_value(text: str) -> Any:
    """The value of one override's text (after its `=`) as Hydra reads it, as far as comparing and
    showing it needs: a quoted string without its quotes, Hydra's escapes undone (`a\\ b` is `a b`,
    as a job's .hydra/overrides.yaml records `'name=a b'`), int, float, bool and null as such, a list
    or dict as its text without spaces around its separators."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1].replace("\\" + text[0], text[0])
    if text[:1] in "[{":  # Hydra escapes an element's inner spaces and drops those around separators
        return re.sub(r"\s*([,:\[\]{}])\s*", r"\1", text.replace("\\ ", " "))
    text = re.sub(r"\\(.)", r"\1", text)
    if text.lower() in ("true", "false", "null"):
        return {"true": True, "false": False, "null": None}[text.lower()]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def split_override(override: str) -> tuple[str, Any]:
    """(key, value) of one recorded override, e.g. `("optim.lr", 0.001)` for `optim.lr=0.001`."""
    key, _, text = override.partition("=")
    return key.strip().removeprefix("++"), override_value(text)


def command_overrides(sweep_dir: Path) -> list[str] | None:
    """The sweep command's own overrides (multirun.yaml's hydra.overrides.task: a swept key holds all
    its values, `optim.lr=1e-3,5e-4`); None without a readable multirun.yaml."""
    try:
        record = yaml.safe_load((sweep_dir / "multirun.yaml").read_text()) or {}
        task = (record.get("hydra") or {})["overrides"]["task"]
    except (OSError, yaml.YAMLError, AttributeError, KeyError, TypeError):
        return None
    return [str(o) for o in task] if isinstance(task, list) else None


def swept_keys(jobs: list[list[str]], command: list[str] | None) -> set[str]:
    """The override keys the sweep varied: those whose value differs between jobs (or that some job
    lacks), and with the sweep's `command` also those that it does not fix to the job's value (an
    Optuna parameter, a grid of one job). Values are compared parsed, never split on spaces."""
    parsed = [dict(split_override(o) for o in job) for job in jobs]
    keys = {key for job in parsed for key in job}
    swept = {key for key in keys if len({repr(job[key]) if key in job else "absent" for job in parsed}) > 1}
    if command is not None:
        fixed = dict(split_override(o) for o in command)
        swept |= {key for job in parsed for key, value in job.items() if key not in fixed or fixed[key] != value}
    elif len(jobs) == 1:
        swept = keys
    return swept


def short_override(override: str) -> str:
    """An override as the Markdown table shows it: a float to 4 significant digits (an Optuna trial's
    `optim.lr=0.0012345678901234567` is `optim.lr=0.001235`), `|` escaped for the table."""
    key, value = split_override(override)
    override = override.removeprefix("++")  # how earlier versions recorded a sweep's option keys
    if isinstance(value, float) and "'" not in override and '"' not in override:
        override = f"{key}={value:.4g}"
    return override.replace("|", "\\|")


def summarize(
    sweep_dir: Path, objective: str = "best_top1", direction: str = "maximize", out: IO | None = sys.stdout
) -> list[dict[str, Any]]:
    """One row per job, best first (failed jobs last); writes summary.csv and summary.md in
    `sweep_dir`, prints the Markdown table to `out`, and writes TensorBoard HParams per job."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise UserError(
            f"sweep directory {sweep_dir} " + ("is not a folder" if sweep_dir.exists() else "does not exist")
        )
    jobs = sorted(
        (d for d in sweep_dir.iterdir() if (d / ".hydra" / "overrides.yaml").is_file()),
        key=lambda d: (not d.name.isdigit(), int(d.name) if d.name.isdigit() else 0, d.name),
    )
    if not jobs:
        raise UserError(f"{sweep_dir} holds no sweep jobs (folders with .hydra/overrides.yaml)")
    overrides = {job: job_overrides(job) for job in jobs}
    swept = swept_keys(list(overrides.values()), command_overrides(sweep_dir))
    found = {job: read_results(job) or {"status": "unfinished"} for job in jobs}
    unknown = sorted(
        {r["objective"] for r in found.values() if r.get("objective") not in (None, *options("objective"))}
    )
    if unknown:  # its columns and direction would be guesses: say so, change nothing
        raise ConfigError(
            f"jobs of {sweep_dir} were trained with objective={unknown[0]}, which is not registered here; "
            f"install the package that has it (docs/extending.md), then run vit-sweep-summary again"
        )
    trained = sorted({r["objective"] for r in found.values() if r.get("objective") in options("objective")})
    if trained and not any(objective in options("objective")[name].results for name in trained):
        reported = [key for name in trained for key in options("objective")[name].results]
        raise ConfigError(
            f"the jobs of {sweep_dir} ({', '.join(f'objective={n}' for n in trained)}) report "
            f"{', '.join(reported)} in results.json, not {objective}: give --objective {reported[0]}"
        )
    own = objective_columns(list(found.values()))
    rows, shown = [], {}
    for job, results in found.items():
        rows.append(
            {
                "job": job.name,
                "status": results.get("status"),
                "objective": objective_value(results, objective),
                **{k: results.get(k) for k in [*own, *LAST[:-3]]},
                "overrides": shlex.join(overrides[job]),
                "name": results.get("name", ""),
                "tags": " ".join(results.get("tags") or []),
            }
        )
        shown[job.name] = " ".join(short_override(o) for o in overrides[job] if split_override(o)[0] in swept)
    sign = -1 if direction == "maximize" else 1
    rows.sort(
        key=lambda r: (math.isnan(r["objective"]), sign * r["objective"] if not math.isnan(r["objective"]) else 0)
    )
    table = _markdown(rows, objective, shown, own) + _refusals(jobs)
    for name, text in (("summary.csv", _csv(rows, [*FIRST, *own, *LAST])), ("summary.md", table)):
        try:  # each the earlier summary's or the complete new one, never half written (a full disk, read-only)
            write_atomic(sweep_dir / name, text)
        except OSError as e:
            raise place_error(
                e,
                sweep_dir / name,
                "free some space, then run vit-sweep-summary again",
                "make the sweep directory writable, then run vit-sweep-summary again",
            ) from None
    if out is not None:
        print(f"sweep {sweep_dir}: {len(rows)} jobs, sorted by {objective} ({direction})\n{table}", file=out)
    _write_hparams(sweep_dir, jobs)
    return rows


def incomplete_jobs(sweep_dir: Path, rows: list[dict[str, Any]]) -> str | None:
    """One line naming each job that did not complete (a row whose status is not completed: re-running the
    same command retries it) and each job of the latest sweep refused in a directory holding another sweep's
    job (refused.json; the row shows the job the directory holds: a new hydra.sweep.dir runs it), with its
    reason; None if there are none."""
    failed, refused = [], []
    for row in rows:
        if row["status"] in COMPLETED:  # stopped_early: early stopping ended it, with its best score
            continue
        reason = ((read_results(Path(sweep_dir) / row["job"]) or {}).get("error") or "").strip().splitlines()
        failed.append(f"job {row['job']} {row['status']}" + (f" ({reason[-1]})" if reason else ""))
    for row in rows:
        refusal = read_refusal(Path(sweep_dir) / row["job"])
        if refusal:  # beside a record of another sweep's job, which the row shows
            reason = str(refusal.get("error") or "").strip().splitlines()
            refused.append(f"job {row['job']} refused" + (f" ({reason[-1]})" if reason else ""))
    parts = []
    if failed:
        parts.append(
            f"{len(failed)} of {len(rows)} jobs did not complete: {'; '.join(failed)}; see their "
            f"results.json and train.log, then re-run the same command with hydra.sweep.dir={sweep_dir} "
            f"to retry them"
        )
    if refused:
        jobs = "1 job" if len(refused) == 1 else f"{len(refused)} jobs"
        parts.append(
            f"{jobs} of the latest sweep refused (the table shows the jobs their directories already "
            f"hold; refused.json beside them says why): {'; '.join(refused)}"
        )
    return "; and ".join(parts) or None


def _refusals(jobs: list[Path]) -> str:
    """Lines under the table for jobs of the latest sweep refused in a directory that holds another job,
    each naming the row that shows that job."""
    lines = []
    for job in jobs:
        refusal = read_refusal(job)
        if refusal:
            ours, holds = list(refusal.get("overrides") or []), list(refusal.get("holds") or [])
            theirs = " ".join(o for o in holds if o not in ours) or " ".join(holds)
            lines.append(
                f"\nJob {job.name} of the latest sweep ({' '.join(ours)}) was refused: the row of job "
                f"{job.name} above is the job that directory already held ({theirs}).\n"
            )
    return "".join(lines)


def _csv(rows: list[dict[str, Any]], columns: list[str]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _markdown(
    rows: list[dict[str, Any]], objective: str, shown: dict[str, str], columns: dict[str, tuple[str, int]]
) -> str:
    """The table, with only the swept overrides of each job (`shown`, by job; summary.csv has them
    all) and the objectives' own `columns` {results key: (header, decimals)}; a best_* number is marked when
    the best score was a partial validation's, a final_* one when the last evaluation was. The sweep's
    objective is marked in its column when it is one of those, else it gets a column of its own."""

    def cell(value: Any, digits: int = 2) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "-"
        return f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    own = objective not in columns  # a number the table does not show otherwise: a column of its own
    heads = [
        "job",
        "status",
        *([objective] if own else []),
        *(f"{name} (objective)" if key == objective else name for key, (name, _) in columns.items()),
        "epochs",
        "images/s",
        "wall s",
        "overrides",
    ]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in rows:
        best, last = ("*" if r.get("best_partial") else ""), ("*" if r.get("val_partial") else "")
        cells = [
            r["job"],
            r["status"],
            *([cell(r["objective"], 4) + (best or last)] if own else []),
            *(
                cell(r[key], digits) + (best if key.startswith("best") else last)
                for key, (_, digits) in columns.items()
            ),
            cell(r["epochs"]),
            cell(r["images_per_s"], 0),
            cell(r["wall_seconds"], 0),
            shown[r["job"]],
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    if any(r.get("best_partial") or r.get("val_partial") for r in rows):
        lines.append(
            "\n\\* on a partial validation (trainer.limit_val_batches): a share of the val set, not its "
            "top-1; rank jobs on full validations"
        )
    return "\n".join(lines) + "\n"


def _write_hparams(sweep_dir: Path, jobs: list[Path]) -> None:
    """Each job's overrides as hyperparameters and its results as metrics, in <job>/tb/hparams, so
    `tensorboard --logdir <sweep dir>` compares the jobs in the HParams tab."""
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams

    from vit_train.outputs.metrics import quiet_event_writer_errors

    for job in jobs:
        results = read_results(job)
        if not results or not (job / "tb").is_dir():
            continue
        params = {}
        for override in job_overrides(job):
            key, value = split_override(override)
            params[key.lstrip("+~")] = value if isinstance(value, (int, float, bool, str)) else str(value)
        metrics = {
            f"hparams/{k}": float(results[k])
            for k in (*results_directions(), "images_per_s")
            if isinstance(results.get(k), (int, float))
        }
        shutil.rmtree(job / "tb" / "hparams", ignore_errors=True)  # written anew on each summary
        quiet_event_writer_errors()  # a full disk: raised below in one line, not printed by the writer's thread
        try:
            with SummaryWriter(str(job / "tb" / "hparams")) as writer:  # what add_hparams does, in a fixed folder
                for summary in hparams(params or {"job": job.name}, metrics):
                    writer.file_writer.add_summary(summary)
                for name, value in metrics.items():
                    writer.add_scalar(name, value)
        except OSError as e:
            raise place_error(
                e,
                job / "tb" / "hparams",
                "free some space, then run vit-sweep-summary again (summary.csv and summary.md are written)",
                "make it writable, then run vit-sweep-summary again (summary.csv and summary.md are written)",
            ) from None


OBJECTIVES = tuple(results_directions())  # sweep.objective's values: every objective's numbers in results.json


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
    return (str(objective), str(direction or "maximize")) if isinstance(objective, str) and objective else None


def main(argv: list[str] | None = None) -> None:
    """vit-sweep-summary DIR [--objective KEY] [--direction maximize|minimize]"""
    parser = argparse.ArgumentParser(
        prog="vit-sweep-summary",
        description="Summarise a sweep directory: a table "
        "sorted by the objective, summary.csv, summary.md and TensorBoard HParams.",
    )
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument(
        "--objective",
        default=None,
        choices=list(OBJECTIVES),
        help="default: the sweep's own sweep.objective (its multirun.yaml), else best_top1",
    )
    parser.add_argument(
        "--direction",
        default=None,
        choices=["maximize", "minimize"],
        help="default: the sweep's own sweep.direction when the objective is its own, else "
        "minimize for a loss and maximize otherwise",
    )
    args = parser.parse_args(argv)
    own = sweep_objective(args.sweep_dir)
    if own and own[0] not in OBJECTIVES and not args.objective:  # a plugin's number, its package not installed here
        exit_with(
            "vit-sweep-summary",
            ConfigError(
                f"{args.sweep_dir} was swept by sweep.objective={own[0]}, which no objective here reports (the package "
                f"of its objective is not installed?); install it, or give --objective KEY"
            ),
        )
    objective = args.objective or (own[0] if own else "best_top1")
    direction = args.direction or (own[1] if own and own[0] == objective else results_directions()[objective])
    shown = io.StringIO()
    try:
        rows = summarize(args.sweep_dir, objective, direction, out=shown)
        print_output(shown.getvalue().rstrip("\n"))  # stdout on a full disk: one line, as for the files
    except UserError as e:
        exit_with("vit-sweep-summary", e)
    incomplete = incomplete_jobs(args.sweep_dir, rows)
    if incomplete:
        print(f"vit-sweep-summary: {incomplete}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
