"""A sweep re-run never overwrites a finished job's record (issue 23): the same grid in another order
finds each job where it ran; another grid is refused beside the record (refused.json), not over it."""

import csv
import json
import math
from pathlib import Path

import pytest

from helpers.configs import TINY
from helpers.runs import vit_sweep_summary, vit_train
from vit_train.sweeps.job import REFUSAL, run_job

SHORT = [*TINY, "trainer.epochs=1"]  # 4 steps per job


def every_file(job: Path) -> dict[str, bytes]:
    """Every file a user reads in a job directory (records, checkpoints, logs, TensorBoard), by path."""
    skip = ("tb/hparams", ".lock", REFUSAL)  # the summary rewrites HParams on every sweep; the lock is the sweep's
    return {str(p.relative_to(job)): p.read_bytes() for p in sorted(job.rglob("*"))
            if p.is_file() and not any(s in str(p.relative_to(job)) for s in skip)}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A finished 2-job sweep (lr 1e-3 in 0/, 5e-4 in 1/) and a copy of every file of its jobs."""
    tmp = tmp_path_factory.mktemp("rerun")
    sweep_dir = tmp / "sweep"
    first = vit_train("-m", *SHORT, "optim.lr=1e-3,5e-4", f"hydra.sweep.dir={sweep_dir}", cwd=tmp)
    assert first.returncode == 0, first.stderr
    return sweep_dir, {job: every_file(sweep_dir / job) for job in "01"}


def summary_objectives(sweep_dir: Path) -> dict[str, float]:
    with open(sweep_dir / "summary.csv") as f:
        return {row["job"]: float(row["objective"]) for row in csv.DictReader(f)}


@pytest.mark.slow  # ~15 s on 2 cores (a sweep in a subprocess); job_home is unit-tested below
def test_the_same_grid_in_another_order_skips_every_job_where_it_ran(sweep, tmp_path):
    sweep_dir, before = sweep
    objectives = summary_objectives(sweep_dir)
    again = vit_train("-m", *SHORT, "optim.lr=5e-4,1e-3", f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("already completed") == 2 and "refused" not in again.stdout + again.stderr
    assert f"is the job of {sweep_dir / '1'}" in again.stdout  # job 0 (5e-4) ran in 1/
    for job in "01":
        assert every_file(sweep_dir / job) == before[job]  # not a byte changed, train.log included
        assert not (sweep_dir / job / REFUSAL).exists()
    assert summary_objectives(sweep_dir) == objectives


@pytest.mark.slow  # ~40 s on 2 cores (three sweeps); the fast suite: the unit tests below, test_sweep.py's
def test_another_grid_is_refused_beside_the_finished_record_never_over_it(sweep, tmp_path):
    sweep_dir, before = sweep
    other = vit_train("-m", *SHORT, "optim.lr=2e-4,1e-3", f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path)
    assert other.returncode == 1
    for job in "01":
        assert every_file(sweep_dir / job) == before[job]  # both finished jobs as they were
    refusal = json.loads((sweep_dir / "0" / REFUSAL).read_text())
    assert refusal["status"] == "refused" and "holds a job of another sweep" in refusal["error"]
    assert "optim.lr=0.0002" in refusal["overrides"] and "optim.lr=0.001" in refusal["holds"]
    assert not (sweep_dir / "1" / REFUSAL).exists()  # job 1 (1e-3) was found finished in 0/
    assert other.stderr.strip().splitlines()[-1].startswith(
        "vit-train: 1 job of the latest sweep refused (the table shows the jobs their directories already hold; "
        "refused.json beside them says why): job 0 refused (")
    rows = list(csv.DictReader((sweep_dir / "summary.csv").open()))
    assert sorted(r["status"] for r in rows) == ["completed", "completed"]  # what the directories hold
    assert "Job 0 of the latest sweep" in (sweep_dir / "summary.md").read_text()
    summary = vit_sweep_summary(str(sweep_dir))
    assert summary.returncode == 1 and "job 0 refused" in summary.stderr
    back = vit_train("-m", *SHORT, "optim.lr=1e-3,5e-4", f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path)
    assert back.returncode == 0, back.stderr  # the first command again: every job finished, the refusal gone
    assert not (sweep_dir / "0" / REFUSAL).exists()
    for job in "01":
        assert every_file(sweep_dir / job) == before[job]


def write_job(job: Path, overrides: list[str], results: dict) -> bytes:
    (job / ".hydra").mkdir(parents=True)
    if overrides:
        (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (job / "results.json").write_text(json.dumps(results))
    return (job / "results.json").read_bytes()


def never_composed():
    raise AssertionError("a refused job must not be composed")


def test_a_finished_record_of_another_job_is_kept_without_checkpoints(tmp_path):
    job = tmp_path / "0"
    record = write_job(job, ["optim.lr=0.001"], {"status": "completed", "best_top1": 50.0})
    assert math.isnan(run_job(never_composed, job, ["optim.lr=0.0002"], 0, "best_top1"))
    assert (job / "results.json").read_bytes() == record
    assert json.loads((job / REFUSAL).read_text())["holds"] == ["optim.lr=0.001"]


def test_a_failure_in_a_directory_with_a_finished_record_goes_beside_it(tmp_path):
    job = tmp_path / "0"  # Hydra rewrote nothing it could compare (no overrides.yaml), yet a run finished here
    record = write_job(job, [], {"status": "completed", "best_top1": 50.0})

    def fails():
        raise RuntimeError("the job broke")

    assert math.isnan(run_job(fails, job, ["optim.lr=0.0002"], 0, "best_top1"))
    assert (job / "results.json").read_bytes() == record
    assert "RuntimeError: the job broke" in json.loads((job / REFUSAL).read_text())["error"]


def test_a_finished_job_listed_with_its_keys_in_another_order_is_the_same_job(tmp_path):
    job = tmp_path / "0"
    write_job(job, ["optim.lr=0.001", "model.patch_size=4"], {"status": "completed", "best_top1": 50.0})
    assert run_job(never_composed, job, ["model.patch_size=4", "optim.lr=0.001"], 0, "best_top1") == 50.0
    assert not (job / REFUSAL).exists()


def test_a_job_of_the_same_grid_in_another_order_is_found_in_its_sibling(tmp_path):
    first = write_job(tmp_path / "0", ["optim.lr=0.001"], {"status": "completed", "best_top1": 50.0})
    second = write_job(tmp_path / "1", ["optim.lr=0.0005"], {"status": "completed", "best_top1": 40.0})
    assert run_job(never_composed, tmp_path / "0", ["optim.lr=0.0005"], 0, "best_top1") == 40.0
    assert run_job(never_composed, tmp_path / "1", ["optim.lr=0.001"], 1, "best_top1") == 50.0
    assert [(tmp_path / j / "results.json").read_bytes() for j in "01"] == [first, second]
    assert not list(tmp_path.glob(f"*/{REFUSAL}"))


def test_hydra_keeps_the_record_of_a_finished_job_whose_checkpoints_were_deleted(tmp_path):
    from vit_train.cli.train import record_subdir

    assert record_subdir(None, str(tmp_path)) == ".hydra"  # a new job directory gets Hydra's record
    (tmp_path / "results.json").write_text('{"status": "completed"}')
    assert record_subdir(None, str(tmp_path)) is None  # else a later sweep's overrides.yaml would replace it


def test_the_summary_of_a_refusal_names_its_row_and_one_instruction(tmp_path):
    """Another grid into a sweep directory of finished jobs: the line under the table names the row that
    shows the directory's job and what it holds; the closing line counts the refusal as a refusal (the
    rows say completed), and its only advice is a sweep directory of its own (re-running refuses again)."""
    from vit_train.sweeps.summary import incomplete_jobs, summarize

    write_job(tmp_path / "0", ["model.depth=2", "optim.lr=0.001"], {"status": "completed", "best_top1": 50.0})
    write_job(tmp_path / "1", ["model.depth=2", "optim.lr=0.0005"], {"status": "completed", "best_top1": 40.0})
    assert math.isnan(run_job(never_composed, tmp_path / "0", ["model.depth=2", "optim.lr=0.0002"], 0, "best_top1"))
    rows = summarize(tmp_path, out=None)
    assert [r["status"] for r in rows] == ["completed", "completed"]
    assert (tmp_path / "summary.md").read_text().endswith(
        "\nJob 0 of the latest sweep (model.depth=2 optim.lr=0.0002) was refused: the row of job 0 above is the job "
        "that directory already held (optim.lr=0.001).\n")
    line = incomplete_jobs(tmp_path, rows)
    assert line == (
        "1 job of the latest sweep refused (the table shows the jobs their directories already hold; refused.json "
        f"beside them says why): job 0 refused ({tmp_path / '0'} holds a job of another sweep (optim.lr=0.001), not "
        "optim.lr=0.0002; run this grid with a hydra.sweep.dir of its own (this one keeps that sweep's jobs))")
    assert "re-run" not in line and "did not complete" not in line


# ------------------------------------------- the same grid re-run in another order after a kill (issue 23)

KILL_BASE = {"trainer": {"log_every": 1, "ckpt_every": 3, "keep_last": 2, "eval_every": 4}, "seed": 1}
GRID3 = [["optim.lr=0.001"], ["optim.lr=0.0005"], ["optim.lr=0.0002"]]


def write_command(sweep_dir: Path, grid: list[list[str]]) -> None:
    """multirun.yaml as Hydra writes it before the first job: the command's swept values, in its order."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    values = ",".join(o[0].partition("=")[2] for o in grid)
    (sweep_dir / "multirun.yaml").write_text(f"hydra:\n  overrides:\n    task:\n    - optim.lr={values}\n")


@pytest.fixture(scope="module")
def reference3(tmp_path_factory):
    from helpers.sweep_runs import sweep as run_sweep

    sweep_dir = tmp_path_factory.mktemp("reference3")
    write_command(sweep_dir, GRID3)
    run_sweep(sweep_dir, GRID3, KILL_BASE)
    return sweep_dir


def test_a_sweep_killed_in_its_second_job_then_re_run_reversed_runs_every_point_once(tmp_path, reference3):
    """Job 0 finished in 0/, job 1 killed (SIGKILL, a forked child) after its 2nd checkpoint in 1/, job 2
    never started; the same grid re-run reversed: the last point, held nowhere and given 0/ (which holds the
    first), takes the free directory 2/ instead of being refused; the middle one resumes in 1/, the first
    is skipped in 0/. Every job's files, no refused.json, and the summary as the uninterrupted sweep's;
    and a second re-run changes nothing."""
    import os
    import signal

    from helpers.files import assert_same_sweep
    from helpers.killer import arm
    from helpers.sweep_runs import run_sweep_job, sweep as run_sweep

    write_command(tmp_path, GRID3)
    run_sweep_job(tmp_path, 0, GRID3[0], KILL_BASE)
    pid = os.fork()
    if pid == 0:
        arm("renamed", 2)
        run_sweep_job(tmp_path, 1, GRID3[1], KILL_BASE)
        os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    assert not (tmp_path / "1" / "results.json").exists() and not (tmp_path / "2").exists()
    write_command(tmp_path, GRID3[::-1])
    values = run_sweep(tmp_path, GRID3[::-1], KILL_BASE)
    assert not any(math.isnan(v) for v in values), values
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["0", "1", "2"]
    assert_same_sweep(tmp_path, reference3)
    before = {job: every_file(tmp_path / job) for job in "012"}
    assert run_sweep(tmp_path, GRID3[::-1], KILL_BASE) == values
    assert {job: every_file(tmp_path / job) for job in "012"} == before


def test_a_job_held_by_a_sibling_leaves_the_directory_hydra_just_made_for_it(tmp_path):
    """Hydra made 2/ and recorded the job there (nothing else); the job's run is in 0/: it is skipped there,
    and 2/ (only Hydra's record) is removed, so the summary lists the job once."""
    write_job(tmp_path / "0", ["optim.lr=0.001"], {"status": "completed", "best_top1": 50.0})
    (tmp_path / "2" / ".hydra").mkdir(parents=True)
    (tmp_path / "2" / ".hydra" / "overrides.yaml").write_text("- optim.lr=0.001\n")
    assert run_job(never_composed, tmp_path / "2", ["optim.lr=0.001"], 2, "best_top1") == 50.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0"]


def test_another_grid_is_still_refused_when_the_directory_holds_a_job_outside_it(tmp_path):
    """multirun.yaml names this sweep's grid: a directory holding a job that is no point of it (another
    grid's) refuses as before, no new directory."""
    write_command(tmp_path, [["optim.lr=0.0002"], ["optim.lr=0.001"]])
    write_job(tmp_path / "0", ["optim.lr=0.001"], {"status": "completed", "best_top1": 50.0})
    write_job(tmp_path / "1", ["optim.lr=0.0005"], {"status": "completed", "best_top1": 40.0})
    assert math.isnan(run_job(never_composed, tmp_path / "0", ["optim.lr=0.0002"], 0, "best_top1"))
    assert (tmp_path / "0" / REFUSAL).exists() and not (tmp_path / "2").exists()


def test_the_grid_of_the_command_splits_only_top_level_commas():
    from vit_train.sweeps.grid import in_grid, split_values

    assert split_values("1e-3,'a,b',[1,2],{x: 1, y: 2}") == ["1e-3", "'a,b'", "[1,2]", "{x: 1, y: 2}"]
    grid = {"optim.lr": {1e-3, 5e-4}, "seed": {1.0}}
    assert in_grid(["optim.lr=0.001", "seed=1"], grid) and not in_grid(["optim.lr=0.0002", "seed=1"], grid)
    assert not in_grid(["optim.lr=0.001"], grid)  # a key of the command missing: another grid's job
    assert in_grid(["trainer.progress=False"], {"trainer.progress": {"false"}})  # Hydra's record of `=false`
