"""The adapter that runs a tracker as a callback (vit_train/callbacks/trackers.py), with a fake tracker that records
every call: what it is started with (the flattened config, name, tags, run id, its own id on resume, a sweep's
group and job), every metrics.jsonl row once across a kill and a resume (rows it holds are not sent again), the
summary and status at the end; a tracker that raises is one warning and is dropped, the run completes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from helpers.configs import tiny_config
from helpers.registry import registry_kept
from vit_train.callbacks.base import LoggerConfig
from vit_train.callbacks.trackers import TrackerCallback, TrackerStart, flatten
from vit_train.errors import RunStopped
from vit_train.train.trainer import train

CALLS: list[tuple[str, Any]] = []  # every call of every FakeTracker, in order
STORE: dict[str, list[tuple[str, int]]] = {}  # tracker id -> the rows it holds (its own store, across processes)


class FakeTracker:
    name = "fake"

    def __init__(self, fail_at_log: int | None = None, stop_at_log: int | None = None, refuse: tuple[int, ...] = ()):
        self.fail_at_log, self.stop_at_log, self.logs, self.id = fail_at_log, stop_at_log, 0, ""
        self.refuse = refuse

    def start(self, start: TrackerStart) -> str:
        CALLS.append(("start", start))
        if self.fail_at_log == 0:  # its library missing: the line the tracker module raises
            from vit_train.errors import ConfigError

            raise ConfigError("logger=fake needs the fake package: pip install 'vit-train[fake]'")
        self.id = start.tracker_id or f"fake-{len(STORE)}"
        STORE.setdefault(self.id, [])
        return self.id

    def held(self) -> set[tuple[str, int]]:
        CALLS.append(("held", None))
        return set(STORE[self.id])

    def log(self, split: str, step: int, values: dict[str, float]) -> None:
        self.logs += 1
        if self.logs == self.fail_at_log:
            raise OSError(28, "No space left on device")
        if self.logs in self.refuse:  # a row it cannot take (as W&B a step below one it holds)
            from vit_train.trackers.base import RowRefused

            raise RowRefused(f"{split} row at step {step} refused")
        CALLS.append(("log", (split, step, dict(values))))
        STORE[self.id].append((split, step))
        if self.logs == self.stop_at_log:
            raise KeyboardInterrupt  # the process is stopped here, after the tracker got the row

    def summary(self, results: dict[str, Any]) -> None:
        CALLS.append(("summary", results))

    def close(self, status: str) -> None:
        CALLS.append(("close", status))


TRACKER: dict[str, FakeTracker] = {}


@dataclass
class FakeLogger(LoggerConfig):
    name = "fake"

    def build(self, cfg: Any) -> TrackerCallback:
        return TrackerCallback(TRACKER["next"])



def _unregistered() -> None:
    """The class registered itself when this module was imported (collected); only the tests' fixture registers it,
    so that no other test module sees it."""
    from vit_train.schema import typed

    typed.REGISTRY["logger"].pop("fake", None)


_unregistered()


@pytest.fixture(autouse=True)
def fake_option():
    CALLS.clear()
    STORE.clear()
    with registry_kept():
        import importlib

        from vit_train.schema import typed

        typed.REGISTRY["logger"]["fake"] = FakeLogger
        yield
    importlib.invalidate_caches()


def rows(run_dir) -> list[tuple[str, int, dict]]:
    plain = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r.pop("split"), r.pop("step"), r) for r in plain]


def logged_rows() -> list[tuple[str, int, dict]]:
    return [args for call, args in CALLS if call == "log"]


SECTIONS = {"trainer": {"max_steps": 6, "eval_every": 3, "log_every": 1}, "logger": ["tensorboard", "fake"],
            "name": "tiny", "tags": ["a", "b"]}


def same_rows(tracked, written) -> bool:
    """The tracker's rows are metrics.jsonl's (NaN there null), in order."""
    return [(s, t, {k: v for k, v in val.items()}) for s, t, val in tracked] == written


def test_the_tracker_gets_the_config_every_row_once_and_the_summary(tmp_path):
    TRACKER["next"] = FakeTracker()
    results = train(tiny_config(**SECTIONS), tmp_path)
    start = CALLS[0][1]
    assert CALLS[0][0] == "start" and CALLS[1] == ("held", None)
    assert start.params == flatten(tiny_config(**SECTIONS).to_dict()) and start.params["optim.lr"] == 1e-3
    assert (start.name, start.tags, start.run_id, start.tracker_id, start.group, start.trial, start.run_dir) == \
        ("tiny", ["a", "b"], results["run_id"], None, None, None, tmp_path)
    assert same_rows(logged_rows(), rows(tmp_path)) and len(logged_rows()) == 6 + 2
    assert CALLS[-2] == ("summary", json.loads((tmp_path / "results.json").read_text()))
    assert CALLS[-1] == ("close", "completed")


def test_a_tracker_that_raises_on_its_third_row_is_one_warning_and_the_run_completes(tmp_path, caplog):
    TRACKER["next"] = FakeTracker(fail_at_log=3)
    results = train(tiny_config(**SECTIONS), tmp_path)
    assert results["status"] == "completed"
    assert [(s, t) for s, t, _ in logged_rows()] == [("train", 1), ("train", 2)]
    assert [c for c, _ in CALLS[-2:]] == ["log", "log"]  # neither summary nor close: it was dropped
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and r.filename == "trackers.py"]
    assert warnings == ["logger=fake stopped working (log: OSError: [Errno 28] No space left on device): it gets "
                        "nothing more from this run; metrics.jsonl and results.json hold every number"]
    assert [(s, t) for s, t, _ in rows(tmp_path)] == [("train", 1), ("train", 2), ("train", 3), ("val", 3),
                                                     ("train", 4), ("train", 5), ("train", 6), ("val", 6)]


def test_a_resumed_run_continues_the_trackers_run_and_sends_no_row_twice(tmp_path):
    # the first attempt is stopped after the tracker got the row of step 5; last.pt holds step 3 (its evaluation)
    TRACKER["next"] = FakeTracker(stop_at_log=6)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_config(**SECTIONS), tmp_path)
    first_id = CALLS[0][1].tracker_id or next(iter(STORE))
    assert [(s, t) for s, t, _ in logged_rows()] == [("train", 1), ("train", 2), ("train", 3), ("val", 3),
                                                    ("train", 4), ("train", 5)]
    CALLS.clear()
    TRACKER["next"] = FakeTracker()
    train(tiny_config(**SECTIONS, resume="auto"), tmp_path)
    start = CALLS[0][1]
    assert start.tracker_id == first_id  # continued, not a second tracker run
    assert [(s, t) for s, t, _ in logged_rows()] == [("train", 6), ("val", 6)]  # 4 and 5 it holds already
    assert STORE[first_id] == [(s, t) for s, t, _ in rows(tmp_path)]  # every row once, in order
    assert CALLS[-1] == ("close", "completed")


def test_a_sweep_job_gives_its_group_and_number(tmp_path):
    TRACKER["next"] = FakeTracker()
    train(tiny_config(**{**SECTIONS, "trainer": {"max_steps": 1}}), tmp_path / "sweep7" / "3",
          sweep_job=("sweep7", 3))
    assert (CALLS[0][1].group, CALLS[0][1].trial) == ("sweep7", 3)


def test_the_status_it_closes_with_is_the_runs(tmp_path, monkeypatch):
    import os
    import signal

    from vit_train.models.vit import VisionTransformer

    forward, calls = VisionTransformer.forward, []

    def signalling_forward(self, x):
        if self.training:
            calls.append(1)
            if len(calls) == 2:
                os.kill(os.getpid(), signal.SIGTERM)
        return forward(self, x)

    monkeypatch.setattr(VisionTransformer, "forward", signalling_forward)
    TRACKER["next"] = FakeTracker()
    with pytest.raises(RunStopped):
        train(tiny_config(**SECTIONS), tmp_path)
    assert CALLS[-1] == ("close", "interrupted")
    assert CALLS[-2][1]["status"] == "interrupted"


def test_a_tracker_whose_library_is_missing_is_one_warning_and_the_run_completes(tmp_path, caplog):
    TRACKER["next"] = FakeTracker(fail_at_log=0)
    results = train(tiny_config(**SECTIONS), tmp_path)
    assert results["status"] == "completed" and [c for c, _ in CALLS] == ["start"]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and r.filename == "trackers.py"]
    assert warnings == ["logger=fake is left out of this run: logger=fake needs the fake package: pip install "
                        "'vit-train[fake]'; metrics.jsonl and results.json hold every number"]
    assert len(rows(tmp_path)) == 8


def test_rows_a_tracker_refuses_are_one_warning_and_it_takes_the_rest(tmp_path, caplog):
    """W&B refuses a step below one it holds (RowRefused): that row is left out, not the tracker for the run."""
    TRACKER["next"] = FakeTracker(refuse=(2, 5))
    results = train(tiny_config(**SECTIONS), tmp_path)
    assert results["status"] == "completed"
    assert [(s, t) for s, t, _ in logged_rows()] == [("train", 1), ("train", 3), ("val", 3), ("train", 5),
                                                    ("train", 6), ("val", 6)]
    assert CALLS[-1] == ("close", "completed")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and r.filename == "trackers.py"]
    assert warnings == ["logger=fake left out a row (train row at step 2 refused) and leaves out any other it cannot "
                        "take; metrics.jsonl holds them all"]
