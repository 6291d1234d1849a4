"""callbacks=[early_stopping]: its decisions (exact, by hand; cases from other trainers' reports: Lightning #1463
and #9297, transformers #28544, keras #23559, ultralytics #8991), a run it ends (results.json stopped_early with its
reason, the checkpoint of the deciding evaluation, the log line), its counter across a SIGTERM or a kill -9 and a
resume (every file as the uninterrupted run's), a resumed run that had already stopped, and a sweep counting it."""

from __future__ import annotations

import json
import math

import pytest
import torch

from helpers.configs import tiny_config
from helpers.files import assert_every_file_as_the_reference, logged
from helpers.kill_resume import stopped_at_a_row
from vit_train.callbacks.early_stopping import EarlyStopping
from vit_train.errors import ConfigError
from vit_train.train.trainer import train


def fed(stopper: EarlyStopping, values: list[float]) -> list[str | None]:
    """should_stop() after each evaluation of `values` (steps 1, 2, ...)."""
    said = []
    for step, value in enumerate(values, 1):
        stopper.on_eval_end(step, {"val/top1": value, "val/loss": 0.0})
        said.append(stopper.should_stop())
    return said


@pytest.mark.parametrize(
    "mode, patience, min_delta, values, stops_at",
    [
        ("max", 2, 0.0, [1, 2, 2, 2], 4),  # equal is no improvement (Lightning: strictly better)
        ("max", 2, 0.0, [1, 2, 3, 4, 5], None),
        ("max", 2, 0.5, [1, 1.4, 1.5, 2], 3),  # 1.4 and 1.5 are within min_delta of 1; 2 comes too late
        ("max", 2, 0.5, [1, 1.6, 1.7, 2.2], None),  # 1.6 > 1 + 0.5; 2.2 > 1.6 + 0.5
        ("min", 2, 0.0, [5, 4, 4.5, 3], None),
        ("min", 1, 0.0, [5, 4, 4], 3),
        ("min", 3, 0.1, [5, 4.95, 4.92, 4.91], 4),
        ("max", 2, 0.0, [math.nan, math.nan], 2),  # never finite: no improvement, stops
        ("max", 2, 0.0, [1, math.nan, math.inf, 5], 3),  # inf is not finite either
        ("max", 1, 0.5, [1, 1.5], 2),  # a change of exactly min_delta is no improvement (Lightning #9297)
        ("max", 2, 0.0, [1, 1, 2, 2, 3], None),  # an improvement resets the count (keras #23559)
    ],
)
def test_patience_min_delta_and_mode_decide_as_counted_by_hand(mode, patience, min_delta, values, stops_at):
    said = fed(EarlyStopping("val/top1", mode, patience, min_delta), values)
    first = next((i + 1 for i, reason in enumerate(said) if reason), None)
    assert first == stops_at, said


@pytest.mark.parametrize("mode, target, values, stops_at", [
    ("max", 3.0, [1, 2, 3, 4], 3), ("max", 3.0, [1, 2, 2.99], None), ("min", 0.5, [1, 0.6, 0.5], 3),
])
def test_a_target_stops_once_reached(mode, target, values, stops_at):
    said = fed(EarlyStopping("val/top1", mode, None, 0.0, target), values)
    first = next((i + 1 for i, reason in enumerate(said) if reason), None)
    assert first == stops_at, said
    if stops_at:
        assert said[stops_at - 1] == (f"val/top1 reached the target {target:g} ({values[stops_at - 1]:g} at step "
                                      f"{stops_at}; callbacks.early_stopping.target)")


def test_its_state_restored_decides_as_the_uninterrupted_one():
    whole, first = EarlyStopping("val/top1", "max", 3), EarlyStopping("val/top1", "max", 3)
    values = [5, 4, 6, 6, 5.5, 6]
    assert fed(whole, values)[-1] is not None
    fed(first, values[:4])
    second = EarlyStopping("val/top1", "max", 3)
    second.load_state_dict(first.state_dict())
    assert [second.on_eval_end(i, {"val/top1": v}) or second.should_stop() for i, v in enumerate(values[4:], 5)] \
        == [None, whole.should_stop()]
    assert second.state_dict() == whole.state_dict()


def test_the_restored_count_survives_the_start_of_the_resumed_attempt(tmp_path):
    """Lightning #1463: the count loaded from the checkpoint was reset by on_train_start, and `best` never saved."""
    from vit_train.callbacks.base import RunInfo

    first = EarlyStopping("val/top1", "max", 3)
    fed(first, [5, 4, 4])
    second = EarlyStopping("val/top1", "max", 3)
    second.load_state_dict(first.state_dict())
    second.on_train_start(RunInfo(tmp_path, {}, "", [], "id", 3, 10, True))
    assert second.state_dict() == first.state_dict() and (second.best, second.wait) == (5, 2)


def test_a_changed_monitor_on_resume_counts_afresh_and_says_so(caplog):
    old = EarlyStopping("val/top1", "max", 2)
    fed(old, [5, 4])
    new = EarlyStopping("val/loss", "min", 2)
    new.load_state_dict(old.state_dict())
    assert new.state_dict()["wait"] == 0 and new.state_dict()["best"] is None
    assert "counts afresh from this step" in caplog.text and "monitor=val/top1 mode=max" in caplog.text


@pytest.mark.parametrize("keys, line", [
    ({"patience": 0}, "callbacks.early_stopping.patience must be > 0, got 0"),
    ({"min_delta": -1}, "callbacks.early_stopping.min_delta must be >= 0, got -1.0"),
    ({"patience": None}, "callbacks.early_stopping with patience=null and target=null never stops the run: give "
                         "callbacks.early_stopping.patience=N or callbacks.early_stopping.target=VALUE"),
    ({"monitor": "train/loss"}, "callbacks.early_stopping.monitor must be a metric of the evaluation, val/NAME or "
                                "val_ema/NAME (e.g. val/top1); got 'train/loss'"),
    ({"monitor": "val/loss"}, "callbacks.early_stopping.monitor=val/loss is not the objective's metric (val/top1), "
                              "so its direction is not known: add callbacks.early_stopping.mode=max (higher is "
                              "better) or callbacks.early_stopping.mode=min"),
    ({"monitor": "val_ema/top1"}, "callbacks.early_stopping.monitor=val_ema/top1 needs an EMA: set trainer.ema_decay "
                                  "(e.g. 0.9998) or monitor val/top1"),
    ({"mode": "up"}, "callbacks.early_stopping.mode must be one of auto, max, min; got 'up'"),
    ({"patiense": 3}, "unknown config key 'callbacks.early_stopping.patiense'; did you mean "
                      "'callbacks.early_stopping.patience'? (keys of 'callbacks.early_stopping': monitor, mode, "
                      "patience, min_delta, target)"),
])
def test_its_keys_are_checked_in_one_line(keys, line):
    with pytest.raises(ConfigError) as e:
        tiny_config(callbacks={"early_stopping": keys})
    assert str(e.value) == line


def test_the_default_monitor_is_the_objectives_metric_in_its_direction():
    classify = tiny_config(callbacks=["early_stopping"]).callbacks["early_stopping"].build(tiny_config())
    assert (classify.monitor, classify.mode) == ("val/top1", "max")
    mae = tiny_config(objective={"name": "mae"}, callbacks=["early_stopping"])
    stopper = mae.callbacks["early_stopping"].build(mae)
    assert (stopper.monitor, stopper.mode) == ("val/loss", "min")


# 32 steps (4 epochs of 8), evaluated every 2 steps; min_delta 1000: only the first evaluation improves, so the run
# stops at the 5th (step 10), patience 4 counted over steps 4, 6, 8, 10.
SECTIONS = {"trainer": {"eval_every": 2, "epochs": 4},
            "callbacks": {"early_stopping": {"patience": 4, "min_delta": 1000.0}}}
REASON = "val/top1 did not improve by more than 1000 for 4 evaluations (best {best:g} at step 2; " \
         "callbacks.early_stopping.patience=4)"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("stopped")
    train(tiny_config(**SECTIONS), run_dir)
    return run_dir


def test_the_run_ends_after_the_deciding_evaluation_with_its_checkpoint(reference):
    results = json.loads((reference / "results.json").read_text())
    best = logged(reference, "val")[0]["top1"]
    assert results["status"] == "stopped_early" and results["steps"] == 10
    assert results["stop_reason"] == REASON.format(best=best)
    assert [r["step"] for r in logged(reference, "val")] == [2, 4, 6, 8, 10]
    assert max(r["step"] for r in logged(reference, "train")) == 10
    last = torch.load(reference / "checkpoints" / "last.pt", weights_only=True)
    assert last["step"] == 10
    assert last["callbacks"]["callbacks.early_stopping"] == {
        "monitor": "val/top1", "mode": "max", "best": best, "best_step": 2, "wait": 4,
        "last": logged(reference, "val")[-1]["top1"], "last_step": 10}
    assert f"stopped early at step 10: {REASON.format(best=best)}" in (reference / "train.log").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("signal", ["TERM", "KILL"])
def test_stopped_mid_patience_then_resumed_it_stops_at_the_same_step_with_the_same_files(tmp_path, reference,
                                                                                          signal):
    stopped_at_a_row(tmp_path, SECTIONS, 3, signal)  # after the train row of step 6: 2 evaluations without a gain
    saved = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert saved["step"] < 10 and saved["callbacks"]["callbacks.early_stopping"]["wait"] >= 1
    train(tiny_config(**SECTIONS, resume="auto"), tmp_path)
    assert_every_file_as_the_reference(tmp_path, reference, status="stopped_early")


def test_a_resumed_run_that_had_stopped_early_says_so_and_trains_nothing(tmp_path, reference, caplog):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir)
    rows = (run_dir / "metrics.jsonl").read_text()
    results = train(tiny_config(**SECTIONS, resume="auto"), run_dir)
    assert results["status"] == "stopped_early" and results["steps"] == 10
    assert results["stop_reason"] == json.loads((reference / "results.json").read_text())["stop_reason"]
    assert (run_dir / "metrics.jsonl").read_text() == rows
    assert "the run already stopped early at step 10" in caplog.text
    assert "raise callbacks.early_stopping.patience" in caplog.text


def test_a_raised_patience_on_resume_trains_on(tmp_path, reference):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir)
    more = {**SECTIONS, "callbacks": {"early_stopping": {"patience": 6, "min_delta": 1000.0}}}
    results = train(tiny_config(**more, resume="auto"), run_dir)
    assert results["status"] == "stopped_early" and results["steps"] == 14
    assert [r["step"] for r in logged(run_dir, "val")] == [2, 4, 6, 8, 10, 12, 14]


def test_a_target_reached_at_the_last_step_is_a_completed_run(tmp_path):
    sections = {"trainer": {"max_steps": 4, "eval_every": 4}, "callbacks": {"early_stopping": {"target": 0.0}}}
    results = train(tiny_config(**sections), tmp_path)
    assert results["status"] == "completed" and results["stop_reason"] is None and results["steps"] == 4


def test_a_target_stops_the_run_at_the_first_evaluation_that_reaches_it(tmp_path):
    sections = {"trainer": {"eval_every": 2}, "callbacks": {"early_stopping": {"target": 0.0, "patience": None}}}
    results = train(tiny_config(**sections), tmp_path)
    top1 = logged(tmp_path, "val")[0]["top1"]
    assert results["status"] == "stopped_early" and results["steps"] == 2
    assert results["stop_reason"] == f"val/top1 reached the target 0 ({top1:g} at step 2; " \
                                     f"callbacks.early_stopping.target)"


def test_sweeps_count_a_stopped_early_job_as_completed_with_its_best_score(tmp_path):
    from vit_train.sweeps.job import finished_job, objective_value
    from vit_train.sweeps.summary import incomplete_jobs

    results = {"status": "stopped_early", "best_top1": 61.5}
    assert objective_value(results, "best_top1") == 61.5
    assert math.isnan(objective_value({"status": "failed", "best_top1": 61.5}, "best_top1"))
    (tmp_path / "0" / ".hydra").mkdir(parents=True)
    (tmp_path / "0" / ".hydra" / "overrides.yaml").write_text("- optim.lr=0.1\n")
    (tmp_path / "0" / "results.json").write_text(json.dumps(results))
    assert finished_job(tmp_path / "0", ["optim.lr=0.1"]) == results  # a re-run sweep skips it
    assert incomplete_jobs(tmp_path, [{"job": "0", "status": "stopped_early"}]) is None


@pytest.mark.slow  # torchrun, two processes
def test_two_processes_stop_at_the_same_step_on_rank_0s_decision(tmp_path):
    """Callbacks run in rank 0; its decision reaches the other process (one collective per evaluation): both end
    after the same evaluation, exit 0, and rank 0 writes results.json with the reason."""
    from helpers.runs import torchrun
    from helpers.two_processes import TINY as TWO

    two = torchrun(*TWO, "trainer.epochs=4", "trainer.eval_every=2", "hydra.run.dir=run", "callbacks=[early_stopping]",
                   "callbacks.early_stopping.patience=2", "callbacks.early_stopping.min_delta=1000", cwd=tmp_path)
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["status"] == "stopped_early" and results["steps"] == 6
    assert results["stop_reason"].startswith("val/top1 did not improve by more than 1000 for 2 evaluations")
    assert (two.stdout + two.stderr).count("stopped early at step 6:") == 1  # said once, by rank 0
    assert torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)["step"] == 6


@pytest.mark.slow  # a sweep of two jobs through the command line
def test_a_sweep_counts_its_stopped_early_jobs_as_completed_with_their_best_scores(tmp_path):
    from helpers.configs import TINY
    from helpers.files import summary_tables
    from helpers.runs import vit_train

    done = vit_train("-m", *TINY, "trainer.epochs=2", "trainer.eval_every=2", "callbacks=[early_stopping]",
                     "callbacks.early_stopping.min_delta=1000", "callbacks.early_stopping.patience=1,2",
                     f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]  # no job "did not complete"
    rows, _ = summary_tables(tmp_path / "sweep")
    results = {row["job"]: json.loads((tmp_path / "sweep" / row["job"] / "results.json").read_text()) for row in rows}
    assert sorted((r["status"], r["steps"]) for r in results.values()) == [("stopped_early", 4), ("stopped_early", 6)]
    for row in rows:
        assert row["status"] == "stopped_early"
        assert float(row["objective"]) == results[row["job"]]["best_top1"]


def test_the_epochs_progress_line_counts_the_deciding_step_before_the_closing_line(tmp_path, capsys):
    """The bar of the epoch a stop ends in was closed after the closing line, one step short ("1/8 steps")."""
    train(tiny_config(**{**SECTIONS, "trainer": {**SECTIONS["trainer"], "progress": True}}), tmp_path)
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if line.startswith("epoch 2/")]
    assert lines and lines[-1].startswith("epoch 2/4: 2/8 steps (25%)"), lines
