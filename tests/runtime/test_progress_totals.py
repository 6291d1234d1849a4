"""The progress counts against what the run will do, and numbers epochs as the resume line does.

From issue 24: a 20-step run (trainer.max_steps=20, 78 steps an epoch) ended `epoch 1/10: 20/78
(26%)`; the resume line said `epoch 1` where the bar then said `epoch 2/5`. (Lightning users
report the same kind: a bar whose total ignores max_steps, Lightning #5484 / #7426.)
"""

import io
import re

import pytest

from vit_train.runtime import progress
from vit_train.runtime.progress import epoch_span
from vit_train.train.trainer import train


@pytest.mark.parametrize("epoch, done, left, run_left, per_epoch, span", [
    (0, 0, 78, 20, 78, (20, 1)),        # max_steps=20: one epoch, 20 of it
    (0, 0, 78, 780, 78, (78, 10)),      # whole epochs: trainer.epochs
    (0, 0, 78, 100, 78, (78, 2)),       # max_steps=100: a whole epoch, then
    (1, 0, 78, 22, 78, (22, 2)),        # 22 steps of the second
    (1, 30, 48, 48 + 3 * 78, 78, (78, 5)),  # resumed 30 steps into epoch 2 of 5
    (1, 30, 48, 10, 78, (40, 2)),       # resumed there with a cap 10 steps on
    (0, 0, 5, 5, 0, (5, 1)),            # no later epochs to count
])
def test_an_epochs_span_is_what_the_run_will_do(epoch, done, left, run_left, per_epoch, span):
    assert epoch_span(epoch, done, left, run_left, per_epoch) == span


def epoch_lines(stderr: io.StringIO) -> list[str]:
    return [line.split(" steps")[0] for line in stderr.getvalue().splitlines() if line.startswith("epoch ")]


def as_a_log(monkeypatch) -> io.StringIO:
    """stderr as a log file, with a progress line at each epoch's end only (set in the test itself:
    pytest puts its own sys.stderr back between a fixture's setup and the test)."""
    monkeypatch.setattr(progress, "LINE_INTERVAL", float("inf"))
    stderr = io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    return stderr


@pytest.mark.parametrize("max_steps, shown", [(5, ["epoch 1/1: 5/5"]), (12, ["epoch 1/2: 8/8", "epoch 2/2: 4/4"])])
def test_max_steps_sets_the_bars_totals(tmp_path, make_config, monkeypatch, max_steps, shown):
    log_lines = as_a_log(monkeypatch)
    train(make_config(trainer={"progress": True, "epochs": 10, "max_steps": max_steps}), tmp_path)  # 8 steps an epoch
    assert epoch_lines(log_lines) == shown


@pytest.mark.parametrize("stop_at, resumed", [(4, ("1", "4", "epoch 1/2: 8/8")), (8, ("2", "8", "epoch 2/2: 8/8"))],
                         ids=["mid-epoch", "at-an-epochs-end"])
def test_the_resume_line_and_the_bar_number_epochs_alike(tmp_path, make_config, monkeypatch, caplog, stop_at, resumed):
    log_lines = as_a_log(monkeypatch)
    caplog.set_level("INFO", logger="vit_train")
    train(make_config(trainer={"progress": True, "max_steps": stop_at}), tmp_path)  # 2 epochs of 8 steps, capped
    log_lines.seek(0)
    log_lines.truncate()
    caplog.clear()
    train(make_config(trainer={"progress": True}, resume="auto"), tmp_path)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("resumed from"))
    epoch, step = re.search(r" at epoch (\d+), step (\d+)$", line).groups()
    assert (epoch, step, epoch_lines(log_lines)[0]) == resumed
