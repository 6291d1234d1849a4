"""A special file (FIFO, socket, folder, link loop) among a run directory's own files is refused in one
line, never opened (issue 23): opening a FIFO metrics.jsonl, results.json, train.log or TensorBoard event
file blocked `resume=auto` forever, a FIFO .lock made flock fail and Hydra turned that into a warning
(the run went on unlocked), and a FIFO results.json hung vit-sweep-summary. Calls that could block run
under a deadline, and every FIFO gets a writer at teardown, so a regression fails, not hangs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.configs import TINY
from helpers.special_files import DEADLINE, fifos, make_special, within  # noqa: F401 (fifos: a fixture)
from vit_train.outputs import rundir
from vit_train.sweeps.summary import incomplete_jobs, summarize

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs and sockets are POSIX")

KINDS = ["a FIFO", "a socket", "a folder", "a link loop"]
NAMES = ["metrics.jsonl", "results.json", "train.log", "refused.json", "tb/events.out.tfevents.1.host.1.0"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kind", KINDS)
def test_acquire_refuses_a_special_run_file_and_frees_the_lock(tmp_path, fifos, name, kind):
    run = tmp_path / "run"
    make_special(run / name, kind)
    with pytest.raises(rundir.RunFileNotRegular) as e:
        within(DEADLINE, rundir.acquire, run)
    assert str(e.value) == (f"{run.resolve() / name} is {kind}, not a regular file; move it out of the run "
                            f"directory, then resume")
    assert isinstance(e.value, rundir.RunDirBusy)  # every caller ends it in one line
    (run / name).rmdir() if kind == "a folder" else (run / name).unlink()
    within(DEADLINE, rundir.acquire, run).release()  # the refusal let the lock go


@pytest.mark.parametrize("kind", KINDS)
def test_acquire_refuses_a_special_lock_file(tmp_path, fifos, kind):
    run = tmp_path / "run"
    run.mkdir()
    make_special(run / ".lock", kind)
    with pytest.raises(rundir.RunFileNotRegular, match=rf"\.lock is {kind}, not a regular file; move it out"):
        within(DEADLINE, rundir.acquire, run)


def test_regular_run_files_are_accepted(tmp_path):
    run = tmp_path / "run"
    for name in NAMES:
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text("{}\n")
    within(DEADLINE, rundir.acquire, run).release()


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """python -m vit_train ARGS, killed after 120 s (a blocked open fails the test, not hangs it)."""
    return subprocess.run([sys.executable, "-m", "vit_train", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.mark.parametrize("name", [  # one fast, the others slow: to keep `pytest` near 5 minutes
    "metrics.jsonl", pytest.param(".lock", marks=pytest.mark.slow), pytest.param("train.log", marks=pytest.mark.slow)])
def test_vit_train_resume_with_a_fifo_run_file_exits_2_in_one_line(tmp_path, fifos, name):
    run = tmp_path / "run"
    run.mkdir()
    (run / "keep.txt").write_text("kept")
    make_special(run / name, "a FIFO")
    done = run_cli(*TINY, "resume=auto", f"hydra.run.dir={run}", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [f"vit-train: error: {run.resolve() / name} is a FIFO, not a regular file; move it out of the "
                     f"run directory, then resume"], done.stderr
    assert "Traceback" not in done.stdout + done.stderr and "UserWarning" not in done.stdout + done.stderr
    assert (run / name).is_fifo() and (run / "keep.txt").read_text() == "kept"  # nothing lost


def make_job(sweep: Path, index: int, results: dict | None) -> Path:
    job = sweep / str(index)
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"seed={index}"]))
    if results is not None:
        (job / "results.json").write_text(json.dumps(results))
    return job


@pytest.mark.parametrize("kind", KINDS)
def test_sweep_summary_reports_a_special_results_json_as_unreadable(tmp_path, fifos, kind):
    sweep = tmp_path / "sweep"
    make_job(sweep, 0, {"status": "completed", "best_top1": 50.0, "final_top1": 49.0})
    job = make_job(sweep, 1, None)
    make_special(job / "results.json", kind)
    make_special(job / "refused.json", "a FIFO")
    rows = within(DEADLINE, summarize, sweep, "best_top1", "maximize", None)
    assert [(row["job"], row["status"]) for row in rows] == [("0", "completed"), ("1", "unreadable")]
    line = within(DEADLINE, incomplete_jobs, sweep, rows)
    assert line.startswith(f"1 of 2 jobs did not complete: job 1 unreadable ({job / 'results.json'} is {kind}, "
                           f"not a regular file; move it out of the job directory)")
    assert "refused" not in line  # a special refused.json is no refusal, and is never opened
