"""vit-shards' console in a log file (`> file`, SLURM, CI): whole progress lines, never a carriage-return bar,
and its summary line; on a terminal it keeps its bar (runtime/progress.py's rule, as vit-train's)."""

import functools
import subprocess
import sys

from vit_train.runtime import progress
from vit_train.runtime.progress import progress_items

SHARDS = "import sys; from vit_train.cli.commands import shards_main as main; sys.argv[0] = 'vit-shards'; main()"


def test_output_to_a_file_has_whole_lines_and_the_summary(tmp_path, image_folder):
    log = tmp_path / "shards.log"
    with open(log, "w") as out:
        done = subprocess.run([sys.executable, "-c", SHARDS, "data=imagefolder", f"data.root={image_folder}",
                               f"out={tmp_path / 'shards'}", "workers=0"], stdout=out, stderr=subprocess.STDOUT,
                              timeout=300)
    text = log.read_text()
    assert done.returncode == 0, text
    assert "\r" not in text, repr(text)
    lines = text.splitlines()
    assert lines[-1] == (f"wrote 48 train samples in 1 shard and 12 val samples in 1 shard (3 classes) to "
                         f"{tmp_path / 'shards'}, index.json last")
    assert [line.split(",")[0] for line in lines[:-1]] == ["vit-shards train: 48/48 images (100%)",
                                                           "vit-shards val: 12/12 images (100%)"]


def test_in_a_log_a_line_at_most_every_interval_and_one_at_the_end(monkeypatch, capsys):
    now = [0.0]
    monkeypatch.setattr(progress, "LineProgress", functools.partial(progress.LineProgress, clock=lambda: now[0]))
    monkeypatch.setattr(progress, "LINE_INTERVAL", 60.0)

    def images():
        for i in range(5):
            now[0] += 25.0  # 25 s an image: a line after the 3rd (75 s), then only the last one
            yield i

    assert list(progress_items(images(), 5, "vit-shards train", enabled=True)) == list(range(5))
    assert capsys.readouterr().err.splitlines() == ["vit-shards train: 3/5 images (60%), 25.00 s/image",
                                                    "vit-shards train: 5/5 images (100%), 25.00 s/image"]


def test_stopped_early_it_prints_no_last_line(capsys):
    items = progress_items(iter(range(5)), 5, "vit-shards train", enabled=True)
    next(items)
    items.close()  # an unreadable image stopped the split: its error is the last line
    assert capsys.readouterr().err == ""


def test_on_a_terminal_the_bar_stays_and_progress_false_shows_nothing(monkeypatch, capsys):
    monkeypatch.setattr(progress, "interactive", lambda stream=None: True)
    assert list(progress_items(iter(range(3)), 3, "vit-shards train", enabled=True)) == [0, 1, 2]
    assert "\r" in capsys.readouterr().err  # tqdm's bar, as before
    assert list(progress_items(iter(range(3)), 3, "vit-shards train", enabled=False)) == [0, 1, 2]
    assert capsys.readouterr().err == ""
