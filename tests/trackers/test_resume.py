"""A tracker run across a kill -9 and a resume, at the Tracker level: each step once in the tracker, none
missing, read back by the tracker's own library.

The first attempt runs in a process of its own that SIGKILLs itself (no close, no clean-up; W&B's core process
dies with it). The second continues the same tracker id, asks `held()`, and sends what the caller sends on a
resume: every row of the run it does not hold, in order (metrics.jsonl's rows up to the checkpoint, then the
rows the resumed loop logs).
"""

from __future__ import annotations

import pytest
from helpers.trackers import attempt, make_start, make_tracker, rows, wandb_rows

mlflow = pytest.importorskip("mlflow")
wandb = pytest.importorskip("wandb")




def read_back(tracker: str, run_dir, store: str, tracker_id: str) -> list[tuple[str, int]]:
    """Every (split, step) the tracker run holds, once per time it holds it."""
    if tracker == "wandb":
        return [(split, step) for split, step, _ in wandb_rows(run_dir / "wandb", tracker_id)]
    client = mlflow.MlflowClient(tracking_uri=store)
    return [(key.split("/")[0], m.step) for key in client.get_run(tracker_id).data.metrics
            for m in client.get_metric_history(tracker_id, key) if key.endswith(("/loss", "/top1"))]


# (tracker, steps the killed attempt logs, its checkpoint's step, the resumed run's last step). W&B writes its file
# in 32 KiB blocks and loses the last one at a kill: 400 steps (about 140 KiB) make blocks that reach the disk
# before it, so the resume starts from a file that holds a part.
CASES = [("mlflow", 7, 4, 10), ("wandb", 7, 4, 10), ("wandb", 400, 230, 420)]


@pytest.mark.parametrize(("tracker", "killed_at", "checkpoint", "last"), CASES)
def test_kill_then_resume_holds_each_step_once(tmp_path, mlflow_store, tracker, killed_at, checkpoint, last):
    run_dir, store = tmp_path / "run", mlflow_store
    settings = {"tracking_uri": store} if tracker == "mlflow" else {}
    code, out = attempt({"tracker": tracker, "settings": settings, "run_dir": str(run_dir), "first": 1,
                         "last": killed_at, "end": "kill"})
    assert code == -9, out
    tracker_id = out["id"]
    sent = [(split, step) for split, step, _ in rows(1, killed_at)]

    resumed = make_tracker(tracker, **settings)
    assert resumed.start(make_start(run_dir, tracker_id=tracker_id)) == tracker_id
    held = resumed.held()
    if tracker == "wandb":  # vit-train's reader of the killed attempt's file agrees with W&B's own
        assert held == {(split, step) for split, step, _ in wandb_rows(run_dir / "wandb", tracker_id)}
    # what the killed attempt left is a prefix of what it sent: all of it in MLflow (each call is written before it
    # returns); in W&B the blocks written before the kill, the last one lost
    assert held == set(sent[: len(held)])
    if tracker == "mlflow":
        assert held == set(sent)
    elif killed_at == 7:
        assert held == set()  # one block, never written: the resume must send these rows again
    else:
        assert held < set(sent)  # the blocks the core process had filled, never its last

    everything = rows(1, checkpoint) + rows(checkpoint + 1, last)  # metrics.jsonl's rows, then the resumed loop's
    for split, step, values in everything:
        if (split, step) not in held:
            resumed.log(split, step, values)
    resumed.close("completed")

    assert sorted(read_back(tracker, run_dir, store, tracker_id)) == sorted(
        (split, step) for split, step, _ in rows(1, last))


@pytest.mark.slow  # three attempts and W&B's reader on three files: about 13 s
def test_a_second_kill_and_resume_still_holds_each_step_once(tmp_path):
    """W&B: three attempts' files for one id, the middle one killed too."""
    run_dir = tmp_path / "run"
    _, out = attempt({"tracker": "wandb", "run_dir": str(run_dir), "first": 1, "last": 3, "end": "close"})
    tracker_id = out["id"]
    code, _ = attempt({"tracker": "wandb", "run_dir": str(run_dir), "tracker_id": tracker_id, "first": 1, "last": 6,
                       "end": "kill"})
    assert code == -9
    code, _ = attempt({"tracker": "wandb", "run_dir": str(run_dir), "tracker_id": tracker_id, "first": 1, "last": 9,
                       "end": "close"})
    assert code == 0
    assert [(s, step) for s, step, _ in wandb_rows(run_dir / "wandb", tracker_id)] == [
        (split, step) for split, step, _ in rows(1, 9)]
    assert wandb_rows(run_dir / "wandb", tracker_id) == rows(1, 9)
