"""logger=mlflow with the real library: what the run holds, read back with MLflow's own client."""

from __future__ import annotations

import json

import pytest
from helpers.trackers import make_start, make_tracker, rows

from vit_train.trackers.base import flatten
from vit_train.trackers.mlflow import PARENT_TAG, max_param_length, param_text

mlflow = pytest.importorskip("mlflow")


@pytest.fixture
def store(mlflow_store):
    return mlflow_store


def read(store: str, run_id: str):
    return mlflow.MlflowClient(tracking_uri=store).get_run(run_id)


def history(store: str, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in mlflow.MlflowClient(tracking_uri=store).get_metric_history(run_id, key))


def test_every_metric_per_step_equals_the_rows_logged(tmp_path, store):
    tracker = make_tracker("mlflow", tracking_uri=store)
    run_id = tracker.start(make_start(tmp_path))
    logged = rows(1, 9)
    for split, step, values in logged:
        tracker.log(split, step, values)
    tracker.close("completed")
    keys = {f"{split}/{name}" for split, _, values in logged for name in values}
    assert set(read(store, run_id).data.metrics) == keys
    for key in keys:
        split, name = key.split("/")
        assert history(store, run_id, key) == [(step, v[name]) for s, step, v in logged if s == split]
    assert tracker.held() == {(split, step) for split, step, _ in logged}


@pytest.mark.slow  # MLflow makes a new store's tables: 5 to 15 s on 2 busy cores
def test_the_default_store_is_a_sqlite_file_in_the_run_dir(tmp_path):
    tracker = make_tracker("mlflow")
    run_id = tracker.start(make_start(tmp_path))
    tracker.log("train", 1, {"loss": 0.5})
    tracker.close("completed")
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert history(store, run_id, "train/loss") == [(1, 0.5)]
    assert mlflow.MlflowClient(tracking_uri=store).get_experiment(read(store, run_id).info.experiment_id).name == (
        "vit-train")


def test_the_environments_tracking_uri_is_taken_when_the_setting_is_empty(tmp_path, store, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    tracker = make_tracker("mlflow")
    run_id = tracker.start(make_start(tmp_path))
    tracker.close("completed")
    assert read(store, run_id).info.status == "FINISHED"
    assert not (tmp_path / "mlflow.db").exists()


def test_params_equal_the_flat_config_in_batches(tmp_path, store):
    """Over 100 params (MLflow's most per call), of every scalar kind."""
    config = {"optim": {"lr": 0.001, "betas": [0.9, 0.999], "clip_grad": None}, "trainer": {"compile": False},
              "model": {f"k{i}": i for i in range(150)}, "name": "deit-s"}
    params = flatten(config)
    tracker = make_tracker("mlflow", tracking_uri=store)
    run_id = tracker.start(make_start(tmp_path, params=params))
    tracker.close("completed")
    held = read(store, run_id).data.params
    assert held == {key: param_text(value) for key, value in params.items()}
    assert {k: (v if isinstance(params[k], str) else json.loads(v)) for k, v in held.items()} == params


def test_a_long_param_is_cut_with_a_note_and_the_rest_logged(tmp_path, store):
    """mlflow #10512, Lightning #5892: one value over MLflow's limit lost every param and metric after it."""
    limit = max_param_length()
    long = "x" * (limit + 500)
    tracker = make_tracker("mlflow", tracking_uri=store)
    run_id = tracker.start(make_start(tmp_path, params={"data.classes": long, "optim.lr": 0.001}))
    tracker.log("train", 1, {"loss": 0.5})
    tracker.close("completed")
    run = read(store, run_id)
    note = f"... [truncated: {limit + 500} characters]"
    assert run.data.params == {"data.classes": "x" * (limit - len(note)) + note, "optim.lr": "0.001"}
    assert len(run.data.params["data.classes"]) == limit
    assert run.data.tags["vit_train.truncated_params"] == "data.classes"
    assert history(store, run_id, "train/loss") == [(1, 0.5)]


def test_tags_name_run_id_and_trial(tmp_path, store):
    tracker = make_tracker("mlflow", tracking_uri=store)
    run_id = tracker.start(make_start(tmp_path, name="deit-s", tags=["ablation", "no-ema"], run_id="r-42", trial=7))
    tracker.close("completed")
    tags = read(store, run_id).data.tags
    assert {k: tags[k] for k in ("mlflow.runName", "vit_train.run_id", "vit_train.tags", "vit_train.trial")} == {
        "mlflow.runName": "deit-s", "vit_train.run_id": "r-42", "vit_train.tags": '["ablation", "no-ema"]',
        "vit_train.trial": "7"}
    assert "mlflow.parentRunId" not in tags and "vit_train.group" not in tags


def test_a_sweeps_jobs_nest_under_one_parent_run(tmp_path, store):
    experiment = "sweep-test"
    ids = []
    for job in range(3):
        tracker = make_tracker("mlflow", tracking_uri=store, experiment_name=experiment)
        ids.append(tracker.start(make_start(tmp_path / str(job), group="multirun-14-05-12", trial=job)))
        tracker.log("val", 1, {"top1": job / 8})
        tracker.close("completed")
    client = mlflow.MlflowClient(tracking_uri=store)
    exp = client.get_experiment_by_name(experiment).experiment_id
    (parent,) = client.search_runs([exp], f"tags.`{PARENT_TAG}` = 'multirun-14-05-12'")
    assert parent.info.run_name == "multirun-14-05-12" and parent.data.metrics == {}
    tags = [read(store, i).data.tags for i in ids]
    assert [t["mlflow.parentRunId"] for t in tags] == [parent.info.run_id] * 3
    assert [(t["vit_train.group"], t["vit_train.trial"]) for t in tags] == [("multirun-14-05-12", str(j)) for j in
                                                                            range(3)]


def test_summary_logs_results_numbers_as_metrics_and_words_as_tags(tmp_path, store):
    tracker = make_tracker("mlflow", tracking_uri=store)
    run_id = tracker.start(make_start(tmp_path))
    tracker.log("val", 40, {"top1": 0.875})
    tracker.summary({"status": "stopped_early", "stop_reason": "val/top1 did not improve", "best_top1": 0.875,
                     "steps": 40, "val_partial": False, "tags": ["a"], "error": None})
    tracker.close("stopped_early")
    run = read(store, run_id)
    assert run.data.metrics == {"val/top1": 0.875, "best_top1": 0.875, "steps": 40.0}
    assert history(store, run_id, "best_top1") == [(40, 0.875)]
    assert {k: v for k, v in run.data.tags.items() if k.startswith("results.")} == {
        "results.status": "stopped_early", "results.stop_reason": "val/top1 did not improve",
        "results.val_partial": "False"}
    assert tracker.held() == {("val", 40)}  # results' metrics are no rows


@pytest.mark.parametrize(("status", "mlflow_status"), [("completed", "FINISHED"), ("stopped_early", "FINISHED"),
                                                       ("interrupted", "KILLED"), ("failed", "FAILED"),
                                                       ("diverged", "FAILED")])
def test_close_ends_the_run_with_mlflows_status(tmp_path, store, status, mlflow_status):
    tracker = make_tracker("mlflow", tracking_uri=store)
    run_id = tracker.start(make_start(tmp_path))
    assert read(store, run_id).info.status == "RUNNING"
    tracker.close(status)
    assert read(store, run_id).info.status == mlflow_status


def test_resume_continues_the_run_running_again_with_its_params_kept(tmp_path, store):
    """mlflow #3228 (a resumed run's state not set), #4248 (params are immutable: a resume that changes one)."""
    first = make_tracker("mlflow", tracking_uri=store)
    run_id = first.start(make_start(tmp_path, params={"optim.lr": 0.001, "trainer.epochs": 10}))
    first.log("train", 1, {"loss": 0.5})
    first.close("interrupted")
    assert read(store, run_id).info.status == "KILLED"
    second = make_tracker("mlflow", tracking_uri=store)
    params = {"optim.lr": 0.001, "trainer.epochs": 20, "trainer.max_steps": None}
    assert second.start(make_start(tmp_path, params=params, tracker_id=run_id)) == run_id
    run = read(store, run_id)
    assert run.info.status == "RUNNING"
    assert run.data.params == {"optim.lr": "0.001", "trainer.epochs": "10", "trainer.max_steps": "null"}
    assert run.data.tags["vit_train.params_changed"] == "trainer.epochs"
    assert second.held() == {("train", 1)}
    second.log("train", 2, {"loss": 0.25})
    second.close("completed")
    assert history(store, run_id, "train/loss") == [(1, 0.5), (2, 0.25)]
    assert read(store, run_id).info.status == "FINISHED"


def test_the_experiment_it_makes_is_a_model_training_one_and_one_it_finds_is_left_as_it_is(tmp_path, store):
    """MLflow 3's UI opens an experiment without a kind in its GenAI view (traces, prompts), not its runs and charts."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store)
    client.create_experiment("theirs", tags={"mlflow.experimentKind": "genai_development"})
    for experiment in ("vit-train", "theirs"):
        make_tracker("mlflow", tracking_uri=store, experiment_name=experiment).start(make_start(tmp_path))
    kinds = {e: client.get_experiment_by_name(e).tags.get("mlflow.experimentKind") for e in ("vit-train", "theirs")}
    assert kinds == {"vit-train": "custom_model_development", "theirs": "genai_development"}
