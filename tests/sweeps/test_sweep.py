"""Sweeps through the real command line: grid, failed jobs, re-runs, Optuna, parallel jobs, summary."""

import csv
import importlib.util
import json
import sys
import threading

import pytest
import yaml

from helpers.configs import TINY
from helpers.files import read_results
from helpers.runs import vit_sweep_summary, vit_train
from vit_train.cli.compose import read
from vit_train.errors import ConfigError
from vit_train.sweeps.job import claim_device

SHORT = [*TINY, "trainer.epochs=1"]  # 4 steps per job


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """A 2x2 grid in one sweep directory: (sweep dir, the finished command)."""
    tmp = tmp_path_factory.mktemp("grid")
    sweep_dir = tmp / "sweep"
    args = ["-m", *SHORT, "optim.lr=1e-3,5e-4", "model.patch_size=4,8", f"hydra.sweep.dir={sweep_dir}"]
    return sweep_dir, args, vit_train(*args, cwd=tmp)


def test_a_grid_runs_every_job_in_its_own_directory_and_summarises_them(grid):
    sweep_dir, _, done = grid
    assert done.returncode == 0, done.stderr
    jobs = sorted(p.name for p in sweep_dir.iterdir() if p.is_dir())
    assert jobs == ["0", "1", "2", "3"]
    swept = []
    for job in jobs:
        overrides = yaml.safe_load((sweep_dir / job / ".hydra" / "overrides.yaml").read_text())
        swept.append(tuple(o for o in overrides if o.startswith(("optim.lr", "model.patch_size"))))
        assert read_results(sweep_dir / job)["status"] == "completed"
        assert (sweep_dir / job / "checkpoints" / "best.pt").is_file()
        assert list((sweep_dir / job / "tb" / "hparams").glob("events.out.tfevents.*"))  # HParams tab
    assert sorted(swept) == sorted((f"optim.lr={lr}", f"model.patch_size={p}") for lr in ("0.001", "0.0005")
                                   for p in (4, 8))
    rows = list(csv.DictReader((sweep_dir / "summary.csv").open()))
    assert sorted(r["job"] for r in rows) == jobs
    for row in rows:
        assert float(row["best_top1"]) == read_results(sweep_dir / row["job"])["best_top1"]
        assert float(row["objective"]) == float(row["best_top1"])  # sweep.objective=best_top1 by default
    objectives = [float(r["objective"]) for r in rows]
    assert objectives == sorted(objectives, reverse=True)  # best first
    table = (sweep_dir / "summary.md").read_text()
    assert table.count("| completed |") == 4 and "model.patch_size=8" in table and "data.val_size" not in table
    assert table in done.stdout


def test_rerunning_the_sweep_skips_finished_jobs_and_resumes_unfinished_ones(grid, tmp_path):
    sweep_dir, args, first = grid
    assert first.returncode == 0, first.stderr
    before = {job: read_results(sweep_dir / job) for job in "0123"}
    (sweep_dir / "2" / "results.json").unlink()  # job 2 "did not finish": it has checkpoints but no results
    again = vit_train(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("already completed") == 3
    assert "resumed from" in again.stdout  # job 2, from its own checkpoint
    for job in "013":
        assert read_results(sweep_dir / job) == before[job]  # untouched
    assert read_results(sweep_dir / "2")["best_top1"] == before["2"]["best_top1"]


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_a_failing_job_is_recorded_the_others_finish_and_the_exit_status_says_so(tmp_path):
    sweep_dir = tmp_path / "sweep"
    done = vit_train("-m", *SHORT, "model.patch_size=4,5,8", f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path)
    assert done.returncode == 1
    failed = read_results(sweep_dir / "1")
    assert failed["status"] == "failed" and "must be divisible by model.patch_size (5)" in failed["error"]
    assert [read_results(sweep_dir / j)["status"] for j in "02"] == ["completed", "completed"]
    named = ("1 of 3 jobs did not complete: job 1 failed (model.img_size (16) must be divisible by "
             "model.patch_size (5))")
    assert f"vit-train: {named}" in done.stderr
    summary = vit_sweep_summary(str(sweep_dir))
    assert summary.returncode == 1 and "| 1 | failed |" in summary.stdout
    assert summary.stderr.count("\n") == 1 and summary.stderr.startswith(f"vit-sweep-summary: {named}; see ")


MAE_SHORT = [*SHORT, "objective=mae", "objective.decoder_dim=16", "objective.decoder_depth=1", "objective.decoder_heads=2",
             "objective.mask_ratio=0.5,0.75"]


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_a_masked_autoencoder_sweep_minimises_its_reconstruction_loss(tmp_path):
    sweep_dir = tmp_path / "sweep"
    refused = vit_train("-m", *MAE_SHORT, f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path)  # objective best_top1
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "add sweep.objective=best_loss sweep.direction=minimize" in refused.stderr
    assert not (sweep_dir / "0").exists()
    done = vit_train("-m", *MAE_SHORT, "sweep.objective=best_loss", "sweep.direction=minimize",
                     f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    losses = sorted(read_results(sweep_dir / job)["best_loss"] for job in "01")
    with open(sweep_dir / "summary.csv") as f:
        assert [float(row["objective"]) for row in csv.DictReader(f)] == losses  # lowest first
    (sweep_dir / "summary.csv").unlink()
    again = vit_sweep_summary(str(sweep_dir))  # no --objective: the sweep's own, best_loss
    assert again.returncode == 0 and "sorted by best_loss (minimize)" in again.stdout, again.stdout + again.stderr
    with open(sweep_dir / "summary.csv") as f:
        assert [float(row["objective"]) for row in csv.DictReader(f)] == losses


SLOW = pytest.mark.slow  # one fast case of each kind (the recipe's, the sweep's): to keep `pytest` near 5 minutes


@pytest.mark.parametrize("args, said", [
    pytest.param(["objective=mae"], "would be empty for every job: add sweep.objective=best_loss "
                 "sweep.direction=minimize", id="mae"),
    pytest.param(["experiment=cifar10_mae_pretrain"], "would be empty for every job: add sweep.objective=best_loss",
                 id="mae-recipe", marks=SLOW),
    pytest.param(["objective=classify,mae"], "not best_top1, so sweep.objective=best_top1 would be empty for them: "
                 "sweep one objective at a time (objective=classify and objective=mae score different numbers)",
                 id="classify-and-mae"),
    pytest.param(["objective=mae,classify", "sweep.objective=best_loss", "sweep.direction=minimize"],
                 "objective=classify jobs report best_top1, ", id="mae-and-classify-by-loss", marks=SLOW),
    pytest.param(["objective=classify,mae", "sweep.objective=final_loss"],  # both report one: cross-entropy, pixels
                 "objective=classify and objective=mae jobs score different numbers, so sweep.objective=final_loss "
                 "would rank", id="unlike-losses", marks=SLOW),
    pytest.param(["objective=mae,mae", "seed=0,1"], "would be empty for every job: add sweep.objective=best_loss",
                 id="mae-twice", marks=SLOW),
    pytest.param(["experiment=quickstart,cifar10_mae_pretrain", "sweep.objective=best_loss"],
                 "objective=classify jobs report", id="swept-recipes", marks=SLOW),
])
def test_a_sweep_whose_jobs_would_not_report_its_objective_is_refused_before_any_job(tmp_path, args, said):
    """`-m objective=classify,mae` ran both jobs and left the MAE job's score empty; a refused sweep leaves no
    directory behind."""
    sweep_dir = tmp_path / "sweep"
    refused = vit_train("-m", *args, "trainer.max_steps=1", f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert said in refused.stderr and "Traceback" not in refused.stdout + refused.stderr
    assert not sweep_dir.exists()


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_a_sweep_directory_of_another_grid_is_not_resumed_into(grid, tmp_path):
    sweep_dir, _, first = grid
    assert first.returncode == 0
    other = vit_train("-m", *SHORT, "optim.lr=2e-3", "model.patch_size=8", f"hydra.sweep.dir={sweep_dir}",
                      cwd=tmp_path)
    assert other.returncode == 1
    # issue 23: said beside the finished job's record (refused.json), which stays as it was
    assert "holds a job of another sweep" in json.loads((sweep_dir / "0" / "refused.json").read_text())["error"]
    assert read_results(sweep_dir / "0")["status"] == "completed"


@pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_optuna_sweeper") is None,
                    reason="the [sweep] extra is not installed")
@pytest.mark.slow  # ~8 s on 2 cores; a sweep in a subprocess
def test_optuna_search_runs_its_trials(tmp_path):
    sweep_dir = tmp_path / "optuna"
    done = vit_train("hparams_search=optuna", "hydra.sweeper.n_trials=3", *SHORT, f"hydra.sweep.dir={sweep_dir}",
                     cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    trials = [read_results(sweep_dir / j) for j in "012"]
    assert all(t["status"] == "completed" for t in trials)
    lrs = {yaml.safe_load((sweep_dir / j / ".hydra" / "overrides.yaml").read_text())[0] for j in "012"}
    assert len(lrs) == 3 and all(lr.startswith("optim.lr=") for lr in lrs)  # three different points
    assert f"Best value: {max(t['best_top1'] for t in trials)}" in done.stdout + done.stderr


@pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_optuna_sweeper") is None,
                    reason="the [sweep] extra is not installed")
@pytest.mark.slow  # ~15 s on 2 cores; a sweep in a subprocess
def test_an_optuna_search_goes_on_past_failed_trials_and_its_lines_are_plain(tmp_path):
    """Every trial fails (a batch larger than the data set): each is given the worst value, so the study runs all
    its trials (a NaN made Optuna raise: the sweep ended in a traceback at the first); the summary lists them
    failed, exit 1 in one line. The search space is given as the key itself, as docs/sweeps.md shows; Optuna's
    lines come through Hydra's log without colour codes, and its storage layer says nothing."""
    sweep_dir = tmp_path / "optuna"
    done = vit_train("hparams_search=optuna", "hydra.sweeper.n_trials=2", *SHORT, "data.batch_size=4096",
                     "optim.lr=tag(log, interval(3e-4, 3e-3))", f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in out, out
    assert [read_results(sweep_dir / j)["status"] for j in "01"] == ["failed", "failed"]
    assert done.stderr.splitlines()[-1].startswith("vit-train: 2 of 2 jobs did not complete: job 0 failed")
    assert "\x1b[" not in out and "setup plugin" not in out, out
    assert "[HYDRA] A new study created in memory with name: vit-train" in out
    lrs = [yaml.safe_load((sweep_dir / j / ".hydra" / "overrides.yaml").read_text())[0] for j in "01"]
    assert all(3e-4 <= float(lr.split("=")[1]) <= 3e-3 for lr in lrs), lrs  # the command line's range


def test_a_search_space_under_hydra_sweeper_params_is_one_line_naming_the_spelling_that_works():
    with pytest.raises(ConfigError, match=r"^hydra\.sweeper\.params\.optim\.lr=tag\(log, interval\(3e-4, 3e-3\)\): "
                                          r"Hydra cannot sweep over its own config, .* give the search space as the "
                                          r"key itself: 'optim\.lr=tag\(log, interval\(3e-4, 3e-3\)\)'"):
        read(["hparams_search=optuna", "hydra.sweeper.params.optim.lr=tag(log, interval(3e-4, 3e-3))"])


@pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is None,
                    reason="the [sweep] extra is not installed")
@pytest.mark.slow  # ~9 s on 2 cores; slots also unit-tested here
def test_parallel_jobs_pass_over_a_held_slot_and_share_the_free_one(tmp_path):
    """Slot 0 is held here for the whole sweep, so both parallel jobs must take slot 1, one after the
    other whichever order they start in (which of two runs first is the scheduler's business)."""
    sweep_dir = tmp_path / "parallel"
    _, held = claim_device(sweep_dir, 2, job=99)
    try:
        done = vit_train("-m", "hydra/launcher=parallel", "hydra.launcher.n_jobs=2", "sweep.devices=2", *SHORT,
                         "optim.lr=1e-3,5e-4", f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path)
    finally:
        held.close()
    assert done.returncode == 0, done.stderr
    assert [read_results(sweep_dir / j)["status"] for j in "01"] == ["completed", "completed"]
    lines = (done.stdout + done.stderr).splitlines()
    assert sorted(line.split("holds slot ")[1][:6] for line in lines if "holds slot" in line) == ["1 of 2"] * 2


def test_device_slots_are_exclusive_while_held(tmp_path):
    first, lock0 = claim_device(tmp_path, 2, job=0)
    second, lock1 = claim_device(tmp_path, 2, job=1)
    assert (first, second) == (0, 1)
    lock0.close()
    third, lock2 = claim_device(tmp_path, 2, job=2)
    assert third == 0
    lock1.close()
    fourth, lock3 = claim_device(tmp_path, 2, job=3)  # both were busy a moment ago; 1 is free now
    assert fourth == 1
    lock2.close()
    lock3.close()


def test_a_job_waits_for_whichever_slot_frees_first(tmp_path):
    """With every slot held, a job waits, and takes the first one released (not a fixed one)."""
    _, lock0 = claim_device(tmp_path, 2, job=0)
    _, lock1 = claim_device(tmp_path, 2, job=1)
    got = []
    waiter = threading.Thread(target=lambda: got.append(claim_device(tmp_path, 2, job=2, poll_seconds=0.01)))
    waiter.start()
    lock1.close()  # job 2 % 2 == 0, but slot 1 frees first
    waiter.join(timeout=60)
    assert got and got[0][0] == 1
    got[0][1].close()
    lock0.close()


@pytest.mark.parametrize("arg, extra", [("hparams_search=optuna", "sweep"), ("hydra/launcher=parallel", "sweep"),
                                        ("hydra/launcher=slurm", "slurm")])
def test_no_hydra_plugin_at_all_is_one_line_too(monkeypatch, arg, extra):
    """Without any Hydra plugin the hydra_plugins package itself is missing, and find_spec of a
    module in it raises ModuleNotFoundError instead of returning None."""
    for name in [n for n in sys.modules if n.startswith("hydra_plugins.")]:  # imported by earlier tests
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "hydra_plugins", None)
    with pytest.raises(ModuleNotFoundError):
        importlib.util.find_spec("hydra_plugins.hydra_optuna_sweeper")
    with pytest.raises(ConfigError, match=rf"{arg} needs a Hydra plugin .* pip install 'vit-train\[{extra}\]'"):
        read(["-m", arg])


def test_a_missing_plugin_names_the_extra(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"pip install 'vit-train\[sweep\]'"):
        read(["hparams_search=optuna"])
    with pytest.raises(ConfigError, match=r"pip install 'vit-train\[slurm\]'"):
        read(["-m", "hydra/launcher=slurm"])
