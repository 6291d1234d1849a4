"""The fault table's kills (tests/faults/fault_table.py runs them): kill -9 at chosen moments
(tests/helpers/killer.py), before each file-system call (tests/helpers/fs_killer.py: of the saves, or
of any file of the run directory, in a whole run and in a resume), and a sweep job killed then the
sweep re-run (tests/helpers/sweep_runs.py); each judged by tests/helpers/files.py's oracle against an
uninterrupted reference. Also the table's shared pieces: SECTIONS, `killer`, `resumed`, `same`, `row`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]  # tests/: `helpers` as a package, as pytest finds it
sys.path.insert(0, str(TESTS))
from helpers.configs import tiny_config  # noqa: E402
from helpers.files import assert_every_file_as_the_reference, assert_same_sweep  # noqa: E402
from helpers.fs_killer import arm as arm_fs  # noqa: E402
from helpers.killer import arm  # noqa: E402
from helpers.sweep_runs import run_sweep_job, sweep  # noqa: E402

from vit_train.train.trainer import train  # noqa: E402

# seed 1, evaluations at 4, 8, 12, 16: new bests at 4 and 12 (the final evaluation is not better, so the
# save at 16 rotates step 12's own file away and best.pt alone keeps its weights)
SECTIONS = {"trainer": {"log_every": 1, "ckpt_every": 3, "keep_last": 2, "eval_every": 4}, "seed": 1}
SAVES = 8  # checkpoint writes in the reference run
KILLS = ([("row", n) for n in range(1, 17)] + [("val_row", n) for n in range(1, 5)]
         + [(fault, n) for fault in ("mid_write", "tmp_done", "renamed") for n in range(1, SAVES + 1)] + [("results", 1)])
TWICE = [(("row", 2), ("mid_write", 1)), (("mid_write", 3), ("row", 4)), (("tmp_done", 2), ("renamed", 3))]


def killer(run_dir: Path, fault: str, n: int, resume: str | None = None, stop: bool = False) -> int:
    """A child process (forked: no second start-up of Python and torch) that trains in `run_dir` and is
    killed by SIGKILL, or paused by SIGSTOP, at the n-th `fault` (tests/helpers/killer.py); its pid."""
    pid = os.fork()
    if pid == 0:
        status = 0
        try:
            arm(fault, n, signal.SIGSTOP if stop else signal.SIGKILL)
            train(tiny_config(**SECTIONS, resume=resume), run_dir)
        except BaseException:  # noqa: BLE001 - reported by the parent as "not killed"
            traceback.print_exc()
            status = 1
        os._exit(status)
    return pid


def killed(run_dir: Path, fault: str, n: int, resume: str | None = None) -> None:
    _, status = os.waitpid(killer(run_dir, fault, n, resume), 0)
    if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
        raise AssertionError(f"not killed at {fault} {n}: wait status {status}")


def same(run_dir: Path, reference: Path, oracle=assert_every_file_as_the_reference) -> str | None:
    """None when every file of the run (or sweep) is the reference's, else the first difference."""
    try:
        oracle(run_dir, reference)
    except AssertionError as e:
        return str(e).splitlines()[0][:200] or "differs"
    return None


def resumed(run_dir: Path, reference: Path) -> str | None:
    try:
        train(tiny_config(**SECTIONS, resume="auto"), run_dir)
    except Exception as e:  # noqa: BLE001 - any failure to resume is a fault not survived
        return f"resume failed: {type(e).__name__}: {e}"[:200]
    return same(run_dir, reference)


def row(fault: str, outcomes: list[str | None], evidence: str) -> dict:
    failures = [o for o in outcomes if o]
    return {"fault": fault, "tried": len(outcomes), "survived": len(outcomes) - len(failures),
            "evidence": evidence + (f"; FAILED: {failures[0]}" if failures else "")}


def kill_rows(work: Path, reference: Path) -> list[dict]:
    outcomes = []
    for k, (fault, n) in enumerate(KILLS):
        run_dir = work / f"kill_{k}"
        killed(run_dir, fault, n)
        outcomes.append(resumed(run_dir, reference))
    twice = []
    for k, ((fault_a, n_a), (fault_b, n_b)) in enumerate(TWICE):
        run_dir = work / f"twice_{k}"
        killed(run_dir, fault_a, n_a)
        killed(run_dir, fault_b, n_b, resume="auto")
        twice.append(resumed(run_dir, reference))
    return [row("kill -9 at one moment: after each of the 16 train rows, after each of the 4 val rows, in the middle "
                f"of each of the {SAVES} checkpoint writes, with each temporary file complete but not renamed, right "
                "after each rename, before results.json", outcomes,
                "`resume=auto`: every file as the reference's (last.pt, best.pt, step files, results.json, "
                "metrics.jsonl, every TensorBoard tag, train.log's closing line), no *.tmp"),
            row("kill -9 twice (the resumed run killed again: " + ", ".join(f"{a[0]} {a[1]} then {b[0]} {b[1]}"
                                                                         for a, b in TWICE) + ")", twice,
                "after the second `resume=auto` every file as the reference's")]


def fs_killed(run_dir: Path, n: int, listing: list | None = None, everything: bool = False,
              resume: str | None = None) -> bool:
    """A forked child trains in `run_dir` and is SIGKILLed before its n-th file-system call on checkpoints/
    or results.json (everything=True: on any file of run_dir) (n = 0: never; the calls are appended to
    `listing`); whether it was killed."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        calls: list = []
        try:
            arm_fs(run_dir, n, calls, everything)
            train(tiny_config(**SECTIONS, resume=resume), run_dir)
            os.write(write, json.dumps(calls).encode())
        except BaseException:  # noqa: BLE001 - reported by the parent as "not killed"
            traceback.print_exc()
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    if listing is not None and data:
        listing += json.loads(data)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def fs_kills(work: Path, reference: Path, name: str, everything: bool = False, killed_at_row: int | None = None):
    """Kills before each file-system call (of the saves, or of everything) of a run, or of its resume after a
    kill at `killed_at_row`, each then resumed; (the calls listed, outcomes, how many runs made fewer calls)."""
    def prepare(run_dir: Path) -> str | None:
        if killed_at_row:
            killed(run_dir, "row", killed_at_row)
        return "auto" if killed_at_row else None

    calls: list = []
    probe = work / f"{name}_calls"
    if fs_killed(probe, 0, calls, everything, prepare(probe)) or not calls:
        return calls, ["could not list the calls"], 0
    outcomes, fewer = [], 0
    for n in range(1, len(calls) + 1):
        run_dir = work / f"{name}_{n}"
        if not fs_killed(run_dir, n, None, everything, prepare(run_dir)):
            fewer += 1  # the TensorBoard writer's thread opens its file a varying number of times
            continue
        outcome = resumed(run_dir, reference)
        outcomes.append(outcome and f"call {n} {' '.join(calls[n - 1][:2])}: {outcome}")
    return calls, outcomes, fewer


def call_kinds(calls: list) -> str:
    kinds: dict[str, int] = {}
    for kind, *_ in calls:
        kinds[kind.replace("os.", "")] = kinds.get(kind.replace("os.", ""), 0) + 1
    return ", ".join(f"{v} {k}" for k, v in kinds.items())


def fs_rows(work: Path, reference: Path) -> list[dict]:
    """A kill before each file-system call (open for writing, fsync, rename, link, unlink) of every save
    of the run and of results.json; before each call on any file of the run directory, in a whole run
    and in a resume (after a kill at row 13: it cuts metrics.jsonl back, rewrites the event file); each
    then `resume=auto`."""
    calls, outcomes, _ = fs_kills(work, reference, "fs")
    table = [row(f"kill -9 before each file-system call of the run's {SAVES} checkpoint saves and results.json, "
                 f"{len(calls)} calls ({call_kinds(calls)})", outcomes,
                 "`resume=auto`: every file as the reference's; best.pt names the step results.json names")]
    for name, killed_at_row, what in (("fs_all", None, "a whole run"),
                                      ("fs_resume", 13, "a resume (the first attempt killed after row 13)")):
        calls, outcomes, fewer = fs_kills(work, reference, name, everything=True, killed_at_row=killed_at_row)
        table.append(row(f"kill -9 before each file-system call on any file of the run directory in {what}: "
                         f"{len(calls)} calls ({call_kinds(calls)}; metrics.jsonl, tb/, train.log, the lock, "
                         f"checkpoints/, results.json)", outcomes,
                         "`resume=auto`: every file as the reference's" + (
                             f"; {fewer} runs ended before their n-th call (the TensorBoard writer's thread opens "
                             f"its file a varying number of times): not counted" if fewer else "")))
    return table


SWEEP_GRID = [["optim.lr=0.001"], ["optim.lr=0.0005"]]
SWEEP_KILLS = [("row", 5), ("val_row", 2), ("mid_write", 4), ("tmp_done", 6), ("renamed", 6), ("results", 1)]


def sweep_rows(work: Path) -> list[dict]:
    """A sweep of 2 jobs (tests/helpers/sweep_runs.py: run_job and the summary, as `vit-train -m` runs them)
    whose second job is killed at each moment, then re-run with the grid in the same and the reverse order."""
    reference = work / "sweep_reference"
    sweep(reference, SWEEP_GRID, SECTIONS)
    outcomes = []
    for k, (fault, n) in enumerate(SWEEP_KILLS):
        for order in (1, -1):
            sweep_dir = work / f"sweep_{k}_{order}"
            run_sweep_job(sweep_dir, 0, SWEEP_GRID[0], SECTIONS)
            pid = os.fork()
            if pid == 0:
                status = 1
                try:
                    arm(fault, n)
                    run_sweep_job(sweep_dir, 1, SWEEP_GRID[1], SECTIONS)
                except BaseException:  # noqa: BLE001 - reported by the parent as "not killed"
                    traceback.print_exc()
                os._exit(status)
            _, status = os.waitpid(pid, 0)
            if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
                outcomes.append(f"job 1 not killed at {fault} {n}")
                continue
            try:
                sweep(sweep_dir, SWEEP_GRID[::order], SECTIONS)
            except Exception as e:  # noqa: BLE001 - a re-run that fails is a fault not survived
                outcomes.append(f"re-run failed: {type(e).__name__}: {e}"[:200])
                continue
            outcome = same(sweep_dir, reference, assert_same_sweep)
            outcomes.append(outcome and f"{fault} {n} ({'reversed' if order < 0 else 'same order'}): {outcome}")
    return [row("a sweep job killed (kill -9 at " + ", ".join(f"{f} {n}" for f, n in SWEEP_KILLS) + "), then the "
                "sweep re-run with its grid in the same and in the reverse order", outcomes,
                "every job's files as the uninterrupted sweep's, no refused.json, summary.csv and summary.md the "
                "same but for timing columns")]
