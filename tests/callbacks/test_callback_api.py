"""The callback API (vit_train/callbacks/base.py) as a user's callback sees it: each hook when it is due, with the
run's values (on_metrics: exactly metrics.jsonl's rows, once); its state in every checkpoint under its name and
back on resume (a checkpoint without it: the fresh state); a callback that raises fails the run (as Lightning's);
logger=[] writes no tb/ folder."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from helpers.configs import tiny_config
from helpers.files import TIMING_ROW
from helpers.registry import registry_kept
from vit_train.callbacks.base import Callback, CallbackConfig, RunInfo
from vit_train.errors import ConfigError, RunStopped
from vit_train.train.trainer import train

SEEN: list[tuple] = []


class Recorder(Callback):
    def __init__(self, fail_at: str | None):
        self.fail_at, self.evals = fail_at, 0

    def _seen(self, *what):
        SEEN.append(what)
        if what[0] == self.fail_at:
            raise ValueError(f"my callback broke in {what[0]}")

    def on_train_start(self, info: RunInfo) -> None:
        self._seen("start", info.step, info.resumed, info.total_steps, info.objective_metric)

    def on_step_end(self, step: int) -> None:
        self._seen("step", step)

    def on_metrics(self, split, step, values) -> None:
        self._seen("row", split, step, values)

    def on_eval_end(self, step, metrics) -> None:
        self.evals += 1
        self._seen("eval", step, sorted(metrics))

    def on_checkpoint(self, step, path, best) -> None:
        self._seen("checkpoint", step, path.name, best)

    def on_train_end(self, results, status) -> None:
        self._seen("end", status, results["status"])

    def state_dict(self) -> dict[str, Any]:
        return {"evals": self.evals}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._seen("load", dict(state))
        self.evals = state["evals"]


@dataclass
class RecorderConfig(CallbackConfig):
    name = "recorder"

    fail_at: str = ""  # the hook that raises; "" = none

    def build(self, cfg: Any) -> Callback:
        return Recorder(self.fail_at or None)



def _unregistered() -> None:
    """The class registered itself when this module was imported (collected); only the tests' fixture registers it,
    so that no other test module sees it."""
    from vit_train.schema import typed

    typed.REGISTRY["callbacks"].pop("recorder", None)


_unregistered()


@pytest.fixture(autouse=True)
def recorder_option():
    SEEN.clear()
    with registry_kept():
        from vit_train.schema import typed

        typed.REGISTRY["callbacks"]["recorder"] = RecorderConfig
        yield


SECTIONS = {"trainer": {"max_steps": 4, "eval_every": 2, "log_every": 1}, "callbacks": ["recorder"]}


def written_rows(run_dir) -> list[tuple]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [("row", r.pop("split"), r.pop("step"), r) for r in rows]


def test_each_hook_in_its_order_with_the_runs_values(tmp_path):
    results = train(tiny_config(**SECTIONS), tmp_path)
    assert [s for s in SEEN if s[0] == "row"] == written_rows(tmp_path)  # NaN-free run: values equal
    assert [s for s in SEEN if s[0] != "row"] == [
        ("start", 0, False, 4, "top1"),
        ("step", 1), ("step", 2), ("eval", 2, ["val/loss", "val/top1", "val/top5"]), ("checkpoint", 2, "last.pt", True),
        ("step", 3), ("step", 4), ("eval", 4, ["val/loss", "val/top1", "val/top5"]),
        ("checkpoint", 4, "last.pt", results["best_step"] == 4),
        ("end", "completed", "completed"),
    ]
    assert torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)["callbacks"] == \
        {"callbacks.recorder": {"evals": 2}}


def test_its_state_comes_back_on_resume_and_a_checkpoint_without_it_leaves_it_fresh(tmp_path, monkeypatch):
    from vit_train.models.vit import VisionTransformer

    forward, calls = VisionTransformer.forward, []

    def signalling_forward(self, x):
        if self.training:
            calls.append(1)
            if len(calls) == 3:
                os.kill(os.getpid(), signal.SIGTERM)
        return forward(self, x)

    monkeypatch.setattr(VisionTransformer, "forward", signalling_forward)
    with pytest.raises(RunStopped):
        train(tiny_config(**SECTIONS), tmp_path / "a")
    monkeypatch.undo()
    assert SEEN[-1] == ("end", "interrupted", "interrupted")
    SEEN.clear()
    train(tiny_config(**SECTIONS, resume="auto"), tmp_path / "a")
    assert SEEN[0] == ("load", {"evals": 1}) and SEEN[1][:3] == ("start", 3, True)
    assert torch.load(tmp_path / "a" / "checkpoints" / "last.pt", weights_only=True)["callbacks"] == \
        {"callbacks.recorder": {"evals": 2}}

    train(tiny_config(trainer={"max_steps": 2, "eval_every": 2}), tmp_path / "b")  # chosen only on resume
    SEEN.clear()
    train(tiny_config(**SECTIONS, resume="auto"), tmp_path / "b")
    assert not [s for s in SEEN if s[0] == "load"]


@pytest.mark.parametrize("hook", ["start", "step", "row", "eval", "checkpoint"])
def test_a_callback_that_raises_fails_the_run_with_its_reason(tmp_path, hook):
    with pytest.raises(ValueError, match=f"my callback broke in {hook}"):
        train(tiny_config(**{**SECTIONS, "callbacks": {"recorder": {"fail_at": hook}}}), tmp_path)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["status"] == "failed" and results["error"] == f"ValueError: my callback broke in {hook}"


def test_logger_empty_writes_no_tensorboard_folder_and_the_same_rows(tmp_path):
    train(tiny_config(trainer={"max_steps": 2}, logger=[]), tmp_path / "none")
    train(tiny_config(trainer={"max_steps": 2}), tmp_path / "tb")
    assert not (tmp_path / "none" / "tb").exists() and list((tmp_path / "tb" / "tb").glob("events.out.tfevents.*"))
    strip = lambda rows: [{k: v for k, v in r[3].items() if k not in TIMING_ROW} for r in rows]  # noqa: E731
    assert strip(written_rows(tmp_path / "none")) == strip(written_rows(tmp_path / "tb"))


def test_figures_without_tensorboard_are_refused():
    with pytest.raises(ConfigError, match=r"^trainer.viz_every draws its figures in TensorBoard, which logger= leaves "
                                          r"out: add tensorboard to the list \(logger=\[tensorboard,...\]\) or set "
                                          r"trainer.viz_every=null$"):
        tiny_config(trainer={"viz_every": 1}, logger=[])


@pytest.mark.parametrize("state, line", [
    ({"best": __import__("numpy").float64(1.5)},
     "callbacks.recorder's state_dict()['best'] is a numpy.float64, which a checkpoint cannot hold: return plain "
     "numbers, strings, lists and dicts (e.g. float(x)) or tensors"),
    ({1: 2}, "callbacks.recorder's state_dict() has the key 1, not a string: a checkpoint keeps string keys"),
])
def test_a_state_a_checkpoint_cannot_hold_is_one_line_and_the_earlier_checkpoint_stays(tmp_path, monkeypatch, state,
                                                                                        line):
    monkeypatch.setattr(Recorder, "state_dict", lambda self: state if self.evals >= 2 else {"evals": self.evals})
    with pytest.raises(ConfigError) as e:
        train(tiny_config(**SECTIONS), tmp_path)
    assert str(e.value) == line
    assert torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)["step"] == 2
    assert json.loads((tmp_path / "results.json").read_text())["status"] == "failed"


def test_a_checkpoint_of_a_callback_not_installed_here_names_it(tmp_path):
    from vit_train.config import Config

    train(tiny_config(**{**SECTIONS, "trainer": {"max_steps": 1}}), tmp_path)
    saved = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)["config"]
    from vit_train.schema import typed

    del typed.REGISTRY["callbacks"]["recorder"]  # another process, without the package that has it
    with pytest.raises(ConfigError) as e:
        Config.from_saved(saved, source="last.pt")
    assert str(e.value) == ("last.pt was trained with callbacks=[recorder], which is not registered here: install the "
                            "package that has it (docs/extending.md), then run the same command")
