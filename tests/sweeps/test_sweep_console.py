"""A sweep job's console lines start with its tag, `[job N] `, as torchrun's `[rank0]:` and SLURM's
`srun --label` do: the parallel launcher's jobs share one terminal and their lines interleave
(issue 24). A job beside others draws no bar (bars of several processes redraw over each other on
one line): its progress comes as whole lines. train.log stays untagged."""

import io
import logging
import sys

from vit_train.sweeps import console
from vit_train.sweeps.console import TaggedStream, tagged_console
from vit_train.sweeps.job import run_job


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_every_line_starts_with_the_tag_and_a_redrawn_bar_keeps_it():
    out = io.StringIO()
    stream = TaggedStream(out, "[job 3] ")
    for piece in ["step 1", " done\nstep 2\n", "\rbar 1/4", "\rbar 2/4", "\n", "\r\n", "last\n"]:
        assert stream.write(piece) == len(piece)
    assert out.getvalue() == ("[job 3] step 1 done\n[job 3] step 2\n\r[job 3] bar 1/4\r[job 3] bar 2/4\n\r\n"
                              "[job 3] last\n")


def test_a_job_beside_others_is_not_a_terminal():
    assert TaggedStream(Terminal(), "[job 0] ", live=True).isatty()
    assert not TaggedStream(Terminal(), "[job 0] ", live=False).isatty()
    assert not TaggedStream(io.StringIO(), "[job 0] ", live=True).isatty()


def test_a_parallel_job_tags_its_log_progress_and_errors_but_not_train_log(tmp_path, make_config, monkeypatch):
    out, err = io.StringIO(), Terminal()
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setattr("sys.stderr", err)
    monkeypatch.setattr(console, "side_by_side", lambda: True)  # as in a worker of the parallel launcher
    handler = logging.StreamHandler(sys.stdout)  # what vit-train's entry point sets up
    logging.getLogger().addHandler(handler)
    try:
        cfg = make_config(trainer={"progress": True, "epochs": 1})
        value = run_job(lambda: (cfg, [], None), tmp_path / "3", ["optim.lr=0.001"], 3, "best_top1")
    finally:
        logging.getLogger().removeHandler(handler)
    assert value == value  # not NaN: the job completed
    assert sys.stdout is out and sys.stderr is err and handler.stream is out  # all put back
    lines = (out.getvalue() + err.getvalue()).splitlines()
    assert any(line.startswith("[job 3] completed: best top-1") for line in lines)
    assert any(line.startswith("[job 3] epoch 1/1: 8/8 steps (100%)") for line in lines)  # whole lines, no bar
    assert "\r" not in err.getvalue()
    assert [line for line in lines if line and not line.startswith("[job 3] ")] == []
    assert "completed: best top-1" in (tmp_path / "3" / "train.log").read_text()
    assert "[job" not in (tmp_path / "3" / "train.log").read_text()


def test_the_streams_are_put_back_when_the_job_raises(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    try:
        with tagged_console(5, live=True):
            print("inside")
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert sys.stdout is out and out.getvalue() == "[job 5] inside\n"
