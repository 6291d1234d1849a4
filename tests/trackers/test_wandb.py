"""logger=wandb with the real library, offline: what the run's files hold, read back from W&B's own run files
(wandb's protobuf records; vit_train/trackers/wandb_files.py) without a server."""

from __future__ import annotations

import pytest
from helpers.trackers import make_start, make_tracker, rows, wandb_items, wandb_records, wandb_rows

from vit_train.trackers import wandb as wandb_tracker
from vit_train.trackers.base import flatten

pytest.importorskip("wandb")




def test_every_row_is_read_back_equal(tmp_path):
    tracker = make_tracker("wandb")
    tracker_id = tracker.start(make_start(tmp_path))
    logged = rows(1, 12)
    for split, step, values in logged:
        tracker.log(split, step, values)
    tracker.close("completed")
    assert wandb_rows(tmp_path / "wandb", tracker_id) == logged
    # the run's folder holds W&B's files: one attempt, offline
    assert [p.name for p in (tmp_path / "wandb").glob(f"offline-run-*-{tracker_id}")] != []


def test_config_holds_the_flat_params_name_tags_group_and_trial(tmp_path):
    """Lightning #20571: an offline run synced without its config."""
    config = {"optim": {"lr": 0.001, "betas": [0.9, 0.999]}, "model": {"depth": 2}, "name": "deit-s",
              "tags": ["ablation"]}
    start = make_start(tmp_path, params=flatten(config), name="deit-s", tags=["ablation"], group="sweep-1",
                       trial=3, run_id="r-42")
    tracker = make_tracker("wandb", job_type="sweep-job")
    tracker_id = tracker.start(start)
    tracker.close("completed")
    folder = tmp_path / "wandb"
    held = {k: v for k, v in wandb_items(folder, tracker_id, "config").items() if not k.startswith("_")}
    assert held == {**flatten(config), "vit_train.run_id": "r-42", "vit_train.group": "sweep-1",
                    "vit_train.trial": 3, "vit_train.job_type": "sweep-job"}
    (record,) = wandb_records(folder, tracker_id, "run")
    run = record["run"]
    assert (run["display_name"], run["tags"], run["run_group"], run["job_type"]) == ("deit-s", ["ablation"],
                                                                                     "sweep-1", "sweep-job")


def test_tags_wandb_would_refuse_are_cut_and_kept_whole_in_the_config(tmp_path):
    """wandb refuses a run with a tag over 64 characters or an empty one ("Tags must be between 1 and 64")."""
    long = "a" * 70
    tracker = make_tracker("wandb")
    tracker_id = tracker.start(make_start(tmp_path, tags=[long, "", "ok"]))
    tracker.close("completed")
    (record,) = wandb_records(tmp_path / "wandb", tracker_id, "run")
    assert record["run"]["tags"] == ["a" * 64, "ok"]
    assert wandb_items(tmp_path / "wandb", tracker_id, "config")["tags"] == [long, "", "ok"]


def test_an_unnamed_run_takes_its_folders_name(tmp_path):
    run_dir = tmp_path / "14-05-12"
    tracker = make_tracker("wandb")
    tracker_id = tracker.start(make_start(run_dir))
    tracker.close("completed")
    assert wandb_records(run_dir / "wandb", tracker_id, "run")[0]["run"]["display_name"] == "14-05-12"


def test_summary_holds_results_scalars_offline(tmp_path):
    """lightning-hydra-template #290: offline, the best score was nowhere but the .wandb file's summary."""
    tracker = make_tracker("wandb")
    tracker_id = tracker.start(make_start(tmp_path))
    for split, step, values in rows(1, 3):
        tracker.log(split, step, values)
    tracker.summary({"status": "completed", "best_top1": 0.875, "best_step": 2, "tags": ["x"], "error": None})
    tracker.close("completed")
    summary = wandb_items(tmp_path / "wandb", tracker_id, "summary")
    assert {k: summary[k] for k in ("status", "best_top1", "best_step")} == {
        "status": "completed", "best_top1": 0.875, "best_step": 2}
    assert "tags" not in summary and "error" not in summary


@pytest.mark.parametrize(("status", "exit_code"), [("completed", 0), ("stopped_early", 0), ("interrupted", 1),
                                                   ("failed", 1), ("diverged", 1)])
def test_close_ends_the_run_with_its_status(tmp_path, status, exit_code):
    tracker = make_tracker("wandb")
    tracker_id = tracker.start(make_start(tmp_path))
    tracker.log("train", 1, {"loss": 1.0})
    tracker.close(status)
    assert [r["exit"].get("exit_code", 0) for r in wandb_records(tmp_path / "wandb", tracker_id, "exit")] == [
        exit_code]


def test_a_step_below_the_last_is_refused_not_dropped(tmp_path):
    """W&B drops a row whose step is below the run's with a warning only: the tracker raises instead."""
    tracker = make_tracker("wandb")
    tracker_id = tracker.start(make_start(tmp_path))
    tracker.log("train", 5, {"loss": 1.0})
    tracker.log("val", 5, {"top1": 0.5})  # the same step: taken
    with pytest.raises(ValueError, match="W&B takes steps in order: train row at step 4 after step 5"):
        tracker.log("train", 4, {"loss": 1.0})
    tracker.close("completed")
    assert wandb_rows(tmp_path / "wandb", tracker_id) == [("train", 5, {"loss": 1.0}), ("val", 5, {"top1": 0.5})]


def test_a_resumed_attempt_takes_the_last_held_step_and_refuses_below_it(tmp_path):
    first = make_tracker("wandb")
    tracker_id = first.start(make_start(tmp_path))
    first.log("train", 7, {"loss": 1.0})
    first.close("interrupted")
    second = make_tracker("wandb")
    assert second.start(make_start(tmp_path, tracker_id=tracker_id)) == tracker_id
    assert second.held() == {("train", 7)}
    with pytest.raises(ValueError, match="at step 6 after step 7"):
        second.log("train", 6, {"loss": 1.0})
    second.log("val", 7, {"top1": 0.5})  # the stopped attempt's last step, a split it had not sent
    second.close("completed")
    assert wandb_rows(tmp_path / "wandb", tracker_id) == [("train", 7, {"loss": 1.0}), ("val", 7, {"top1": 0.5})]


@pytest.mark.parametrize(("setting", "env", "mode"), [(None, None, "offline"), (None, "online", "online"),
                                                      (None, "disabled", "disabled"), ("offline", "online", "offline")])
def test_mode_is_offline_unless_the_environment_or_the_setting_says(monkeypatch, setting, env, mode):
    if env:
        monkeypatch.setenv("WANDB_MODE", env)
    assert wandb_tracker.WandbTracker(wandb_tracker.Settings(mode=setting)).mode == mode


def test_settings_dir_holds_the_files_instead_of_the_run_dir(tmp_path):
    tracker = make_tracker("wandb", dir=str(tmp_path / "elsewhere"))
    tracker_id = tracker.start(make_start(tmp_path / "run"))
    tracker.log("train", 1, {"loss": 1.0})
    tracker.close("completed")
    assert wandb_rows(tmp_path / "elsewhere" / "wandb", tracker_id) == [("train", 1, {"loss": 1.0})]
    assert not (tmp_path / "run" / "wandb").exists()
