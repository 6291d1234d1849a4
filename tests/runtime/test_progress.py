"""What a run shows while it trains: a bar on a terminal, whole lines in a log; one line for the config.

Made from users' reports: a SLURM or CI log filled with a progress bar's carriage-return redraws
(Lightning #6647, #8975; CompRhys/roost #19); a bar throttled by time that still wrote a line for
every postfix change (niznik-dev/cruijff_kit #269); a progress line wanted once per epoch in a
log (Lightning #9412); a bar that did not show in a notebook once it was switched off for non-
terminals (tqdm.auto draws a widget there, whose stream is not a tty); a config tree printed at
every start that buried the log (IntelLabs/MART #202), and users who could not find the config
that Hydra had saved (hydra #1907: it is in the hidden .hydra/), so the one line names it.
"""

import io

import pytest
import yaml
from helpers.configs import TINY
from helpers.runs import vit_train

from vit_train.runtime import progress
from vit_train.runtime.progress import LineProgress, interactive, progress_bar, progress_iter
from vit_train.train.trainer import train


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class NotebookStream(io.StringIO):
    """Like ipykernel's OutStream: not a tty, but shown live."""


NotebookStream.__module__ = "ipykernel.iostream"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_line_comes_once_the_interval_has_passed_and_not_before():
    out, clock = io.StringIO(), Clock()
    bar = LineProgress(total=10, desc="epoch 2/5", initial=4, interval=60.0, file=out, clock=clock)
    bar.set_postfix(loss="0.8964", lr="1.54e-03", img_s="156", wait="3%")
    clock.now += 59.9
    bar.update()
    assert out.getvalue() == ""  # 59.9 s: not yet, and set_postfix printed nothing
    clock.now += 0.1
    bar.update()
    assert out.getvalue() == ("epoch 2/5: 6/10 steps (60%), 30.00 s/step, loss=0.8964, lr=1.54e-03, img_s=156, "
                              "wait=3%\n")
    clock.now += 30.0
    bar.update()  # 30 s after the last line: none
    bar.set_postfix(loss="0.5000")
    assert out.getvalue().count("\n") == 1
    bar.close()
    bar.close()  # once
    assert out.getvalue().splitlines()[1] == "epoch 2/5: 7/10 steps (70%), 30.00 s/step, loss=0.5000"
    assert "\r" not in out.getvalue()


def test_close_prints_only_what_no_line_has_shown():
    out = io.StringIO()
    LineProgress(total=3, desc="epoch 1/1", initial=3, file=out).close()  # a resumed run at the epoch's end
    assert out.getvalue() == ""
    clock = Clock()
    bar = LineProgress(total=2, desc="epoch 1/1", interval=60.0, file=out, clock=clock)
    bar.update()
    clock.now += 60.0
    bar.update()  # the epoch's last step, a minute in: its line
    bar.close()  # not the same line again
    assert out.getvalue() == "epoch 1/1: 2/2 steps (100%), 30.00 s/step\n"


@pytest.mark.parametrize("stream, bar", [(Terminal(), True), (NotebookStream(), True), (io.StringIO(), False)],
                         ids=["terminal", "notebook", "log-file"])
def test_the_bar_only_where_it_is_shown_live(monkeypatch, stream, bar):
    monkeypatch.setattr("sys.stderr", stream)
    assert interactive() == bar
    made = progress_bar(5, "epoch 1/1", enabled=True)
    assert isinstance(made, LineProgress) != bar
    made.close()
    items = [1, 2]
    assert (progress_iter(items, "eval", enabled=True) is items) != bar  # a log gets no eval lines
    quiet = progress_bar(5, "epoch 1/1", enabled=False)  # trainer.progress=false: nothing anywhere
    quiet.update()
    quiet.close()
    assert progress_iter(items, "eval", enabled=False) is items
    if not bar:
        assert stream.getvalue() == ""


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "log-file"])
def test_a_run_in_a_log_prints_whole_lines_one_per_epoch(tmp_path, make_config, monkeypatch, terminal):
    monkeypatch.setattr(progress, "LINE_INTERVAL", float("inf"))  # only the epochs' ends
    stderr = Terminal() if terminal else io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    train(make_config(trainer={"progress": True}), tmp_path)  # 2 epochs of 8 steps, a log every 2
    shown = stderr.getvalue()
    ends = [line for line in shown.splitlines() if ": 8/8 steps (100%), " in line]
    if terminal:
        assert "\r" in shown and "epoch 2/2" in shown and not ends  # a redrawn bar
    else:
        assert "\r" not in shown and [line.split(":")[0] for line in ends] == ["epoch 1/2", "epoch 2/2"]
        assert len([line for line in shown.splitlines() if line.startswith(("epoch", "eval"))]) == 2  # no eval lines
        assert all(", loss=" in line and ", lr=" in line and ", img_s=" in line for line in ends)


@pytest.mark.parametrize("hydra_record", [True, False])
def test_the_config_is_one_console_line_and_whole_in_train_log(tmp_path, make_config, caplog, hydra_record):
    if hydra_record:  # as vit-train leaves it; a run from Python has none
        (tmp_path / ".hydra").mkdir()
        (tmp_path / ".hydra" / "config.yaml").write_text("model: {}\n")
    caplog.set_level("INFO", logger="vit_train")
    cfg = make_config(trainer={"max_steps": 1})
    train(cfg, tmp_path)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("config")]
    where = f", {tmp_path / '.hydra' / 'config.yaml'}" if hydra_record else ""
    assert lines == [f"config: in {tmp_path / 'train.log'}{where} and TensorBoard's Text tab"]
    log = (tmp_path / "train.log").read_text()
    whole = log.split("config:\n", 1)[1].split("\n[")[0]  # up to the next record
    assert yaml.safe_load(whole) == cfg.to_dict()


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_the_command_line_in_a_log_shows_one_config_line_and_whole_progress_lines(tmp_path):
    """The real command, its stderr and stdout pipes as under SLURM or `> file`."""
    args = [a for a in TINY if a != "trainer.progress=false"]
    done = vit_train(*args, "trainer.epochs=2", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stdout + done.stderr
    ends = [line for line in done.stderr.splitlines() if line.startswith("epoch ") and " (100%)" in line]
    assert [line.split(" steps")[0] for line in ends] == ["epoch 1/2: 4/4", "epoch 2/2: 4/4"]  # (and one a minute)
    run = tmp_path / "run"
    assert [line for line in done.stdout.splitlines() if line.startswith("config")] == [
        f"config: in {run / 'train.log'}, {run / '.hydra' / 'config.yaml'} and TensorBoard's Text tab"]
    assert "model:\n" not in done.stdout and "model:\n" in (run / "train.log").read_text()
