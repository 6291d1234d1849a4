"""What the console says is what train.log holds: every log record of a run, from the first (the
command line's warnings, the CPU threads, what model.pretrained loaded, an MAE checkpoint's dropped
decoder), reaches train.log, in the console's order; and docs/python.md's one-liner shows a run
started from Python the same lines. The oracle compares the captured console with the file, not
the lines' wording (others change it), so it holds for any line a later change adds. Records logged
before train.log's handler exists are kept (runtime/logs.py, EarlyRecords) and written there first."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from helpers.configs import TINY
from helpers.runs import vit_train
from vit_train.train.trainer import train

ROOT = Path(__file__).resolve().parents[2]
RECORD = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\]\[(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\] ", re.M)


def log_messages(path: Path) -> list[str]:
    """train.log's records, as their messages (a record's further lines joined to it with newlines)."""
    text = path.read_text()
    starts = [m.start() for m in RECORD.finditer(text)]
    assert starts and starts[0] == 0, "train.log starts with a record"
    return [RECORD.sub("", text[a:b], count=1).rstrip("\n") for a, b in zip(starts, starts[1:] + [len(text)])]


def console_records(path: Path) -> list[str]:
    """What the console shows of train.log: every record but the full config (file only, by design)."""
    return [m for m in log_messages(path) if not m.startswith("config:\n")]


@pytest.fixture(scope="module")
def mae_run(tmp_path_factory):
    """A masked-autoencoder pre-training run (one step) to fine-tune from: its decoder is dropped then."""
    from helpers.configs import tiny_config

    run_dir = tmp_path_factory.mktemp("mae")
    train(tiny_config(objective={"name": "mae"}, trainer={"max_steps": 1}), run_dir)
    return run_dir


def test_log_messages_reads_records_and_their_further_lines(tmp_path):
    (tmp_path / "train.log").write_text("[2026-12-01 10:00:00,001][WARNING] warning: a\n"
                                        "[2026-12-01 10:00:00,002][INFO] config:\nmodel:\n  depth: 2\n"
                                        "[2026-12-01 10:00:01,000][INFO] b [c]\n")
    assert log_messages(tmp_path / "train.log") == ["warning: a", "config:\nmodel:\n  depth: 2", "b [c]"]
    assert console_records(tmp_path / "train.log") == ["warning: a", "b [c]"]


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_every_line_the_command_printed_is_in_train_log_in_order(tmp_path, mae_run):
    """MAE fine-tuning from the command line, with a key the chosen data set leaves unread (aug.scale_min: shapes'
    arrays take padded crops; the command line's own warning, logged before the run directory is used): stdout is
    the log; train.log has all of it."""
    result = vit_train(*TINY, "trainer.max_steps=1", f"model.pretrained={mae_run}", "aug=basic", "aug.scale_min=0.5",
                       "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    console = result.stdout.splitlines()
    assert console == console_records(tmp_path / "run" / "train.log")
    assert "aug.scale_min" in console[0]  # the command line's warning, first on both
    assert len(console) >= 8  # threads, the decoder dropped, what was loaded, config, size, FLOPs, eval, end


def test_the_python_one_liner_shows_what_train_log_holds(tmp_path, mae_run, capsys):
    """docs/python.md's snippet, run as written, then train() with model.pretrained: stderr has the
    console's lines, the same as train.log's."""
    from helpers.configs import tiny_config

    page = (ROOT / "docs" / "python.md").read_text()
    section = page[page.index("## Seeing the log"):]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        exec(snippet, {})
        capsys.readouterr()
        train(tiny_config(model={"pretrained": str(mae_run)}, trainer={"max_steps": 2}), tmp_path / "run")
        printed = capsys.readouterr().err.splitlines()
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
                handler.close()
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(level)
    assert printed == console_records(tmp_path / "run" / "train.log")
    assert len(printed) >= 7


def test_records_logged_before_train_reach_train_log_and_the_buffer_is_detached(tmp_path, caplog):
    """The command line's buffer (entered before train()) and train()'s own are one: a record logged
    before train() comes first in train.log, once; none is left attached afterwards."""
    from helpers.configs import tiny_config
    from vit_train.runtime.logs import EarlyRecords

    log = logging.getLogger("vit_train")
    with caplog.at_level("INFO", logger="vit_train"), EarlyRecords():
        log.warning("warning: said before train()")
        train(tiny_config(trainer={"max_steps": 1}), tmp_path)
    messages = log_messages(tmp_path / "train.log")
    assert messages[0] == "warning: said before train()" and messages.count(messages[0]) == 1
    assert not any(isinstance(h, EarlyRecords) for h in log.handlers)
