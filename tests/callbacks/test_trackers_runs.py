"""The real trackers (W&B offline, MLflow's local store) through whole runs: a run stopped by kill -9 or SIGTERM
and resumed leaves each tracker with every metrics.jsonl row once (none missing, none twice) in one tracker run,
read back with each tracker's own reader (MLflow's client; W&B's run files, parsed with wandb's protobuf records);
the tracker run's id is the one the checkpoint kept. W&B's core process writes its file in 32 KiB blocks, so a kill
loses its last rows: the resumed run sends them again from metrics.jsonl (callbacks/trackers.py `replay`)."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
import torch

from helpers.configs import tiny_config
from helpers.files import TIMING_TAGS
from helpers.kill_resume import stop_at
from vit_train.train.trainer import train

pytest.importorskip("wandb")
pytest.importorskip("mlflow")

# 16 steps (2 epochs of 8), every step logged, checkpoints at 3, 6, 8 (eval), 9, 12, 15, 16 (eval)
SECTIONS = {"trainer": {"log_every": 1, "ckpt_every": 3, "keep_last": 2}, "logger": ["tensorboard", "wandb", "mlflow"],
            "name": "tracked", "tags": ["e2e"]}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    for key in [k for k in os.environ if k.startswith(("WANDB_", "MLFLOW_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("WANDB_SILENT", "true")


def jsonl_points(run_dir: Path) -> dict[tuple[str, int], float | None]:
    """{("split/name", step): value} of every metrics.jsonl row."""
    points = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        split, step = row.pop("split"), row.pop("step")
        points.update({(f"{split}/{k}", step): v for k, v in row.items()})
    return points


def mlflow_points(run_dir: Path) -> tuple[Counter, dict, list]:
    """The MLflow store's points as a count per (key, step) and their values, and its runs (id, status)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    count, values = Counter(), {}
    for run in runs:
        for key in run.data.metrics:
            for m in client.get_metric_history(run.info.run_id, key):
                count[key, m.step] += 1
                values[key, m.step] = m.value
    return count, values, [(r.info.run_id, r.info.status) for r in runs]


def wandb_points(run_dir: Path) -> tuple[Counter, dict, set]:
    """The W&B run files' points (every attempt's), counted per (key, step), and the run ids the files are for."""
    from vit_train.trackers.wandb_files import history

    count, values, ids = Counter(), {}, set()
    for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        ids.add(path.stem.removeprefix("run-"))
        for step, items in history(path):
            for key, value in items.items():
                count[key, step] += 1
                values[key, step] = value
    return count, values, ids


def assert_each_point_once(run_dir: Path) -> None:
    want = jsonl_points(run_dir)
    kept = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["callbacks"]
    summary = {k: v for k, v in json.loads((run_dir / "results.json").read_text()).items()}
    count, values, runs = mlflow_points(run_dir)
    results_keys = {(k, s) for k, s in count if not k.startswith(("train/", "val/", "val_ema/", "compile/"))}
    rows = {k: c for k, c in count.items() if k not in results_keys}
    assert rows == {k: 1 for k in want}, "MLflow: each metrics.jsonl point once"
    # the values: a row an earlier attempt sent and the tracker kept is the resumed run's too (exact resume), but
    # for the timings (images/s, data wait), which are the attempt's own
    same = {k: v for k, v in want.items() if v is not None and k[0] not in TIMING_TAGS}
    assert {k: values[k] for k in same} == pytest.approx(same)
    assert [r for r in runs] == [(kept["logger.mlflow"]["tracker_id"], "FINISHED")]
    count, values, ids = wandb_points(run_dir)
    assert dict(count) == {k: 1 for k in want}, "W&B: each metrics.jsonl point once, over every attempt's file"
    assert {k: values[k] for k in same} == pytest.approx(same)
    assert ids == {kept["logger.wandb"]["tracker_id"]}
    assert summary["status"] == "completed"


def test_a_run_logs_each_row_once_to_each_tracker(tmp_path):
    train(tiny_config(**SECTIONS), tmp_path)
    assert_each_point_once(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("signal", ["KILL", "TERM"])
def test_a_stopped_run_resumed_leaves_each_tracker_each_row_once(tmp_path, signal):
    done = stop_at(tmp_path, SECTIONS, "row", 7, signal)  # after step 7's row: last.pt holds step 6 (KILL), 7 (TERM)
    assert done.returncode != 0 and "ended without the fault" not in done.stdout, done.stderr[-2000:]
    train(tiny_config(**SECTIONS, resume="auto"), tmp_path)
    assert_each_point_once(tmp_path)
