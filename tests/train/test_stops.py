"""How a run stops: the record it leaves (results.json, train.log) and the line it ends with.

Made from what went wrong for users elsewhere: a stopped run's "rerun the same command" that
started a fresh run in a new time-stamped folder (Hydra #1822: resuming needs the run's own
directory); total training time that restarts from zero after a resume (DALI #2603, nequip #171);
an error printed after a progress bar that was never closed, so it is glued to the bar (tqdm #548).
"""

import io
import os
import signal

import pytest
import torch

from helpers.files import read_results
from helpers.images import write_image_folder
from vit_train.errors import DataError, RunStopped
from vit_train.train.trainer import train


class Terminal(io.StringIO):
    """stderr as a terminal: tqdm draws its bar here."""

    def isatty(self) -> bool:
        return True


def column_zero(text: str) -> bool:
    """Whether a terminal that was sent `text` has its cursor at the start of a line."""
    return text == "" or text.endswith(("\n", "\r"))


def stop_at_second_step(monkeypatch):
    """SIGUSR1 during the second training forward, as a cluster's pre-emption notice would arrive."""
    from vit_train.models.vit import VisionTransformer

    forward, calls = VisionTransformer.forward, []

    def signalling_forward(self, x):
        if self.training:
            calls.append(1)
            if len(calls) == 2:
                os.kill(os.getpid(), signal.SIGUSR1)
        return forward(self, x)

    monkeypatch.setattr(VisionTransformer, "forward", signalling_forward)


def test_the_stop_line_gives_the_command_that_continues_the_run(tmp_path, make_config, monkeypatch):
    run = tmp_path / "outputs" / "2026-11-30" / "06-37-12"
    stop_at_second_step(monkeypatch)
    with pytest.raises(RunStopped) as stopped:
        train(make_config(), run)
    assert str(stopped.value) == (f"stopped by SIGUSR1 at step 2; {run / 'checkpoints' / 'last.pt'} holds it; "
                                  f"continue with: vit-train resume={run}")
    assert read_results(run)["status"] == "interrupted"
    monkeypatch.undo()
    resumed = train(make_config(resume=str(run)), run)  # what `vit-train resume=<run dir>` runs
    assert resumed["status"] == "completed" and resumed["steps"] == 16
    assert "resumed from" in (run / "train.log").read_text() and "at epoch 1, step 2" in (run / "train.log").read_text()


def test_resume_auto_that_finds_nothing_says_where_it_looked_and_names_the_newest_run(tmp_path, make_config,
                                                                                       caplog):
    outputs = tmp_path / "outputs"
    older, newer = outputs / "2026-11-29" / "13-05-12", outputs / "2026-11-30" / "06-37-12"
    train(make_config(trainer={"max_steps": 1}), older)
    train(make_config(trainer={"max_steps": 1}), newer)
    os.utime(older / "checkpoints" / "last.pt", (1e9, 1e9))  # older by its time, whatever the clock did
    fresh = outputs / "2026-11-30" / "09-00-00"
    caplog.set_level("INFO", logger="vit_train")
    results = train(make_config(trainer={"max_steps": 1}, resume="auto"), fresh)
    assert results["steps"] == 1  # it started at step 0
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("resume=auto")]
    assert lines == [f"resume=auto: no checkpoint in {fresh} (hydra.run.dir), so this run starts at step 0; to "
                     f"continue an earlier run, give its directory, e.g. the newest beside it: vit-train "
                     f"resume={newer}"]
    caplog.clear()
    alone = tmp_path / "elsewhere" / "a" / "b"  # nothing beside it: no run is named
    train(make_config(trainer={"max_steps": 1}, resume="auto"), alone)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("resume=auto")]
    assert lines == [f"resume=auto: no checkpoint in {alone} (hydra.run.dir), so this run starts at step 0; to "
                     f"continue an earlier run, give its directory: resume=<run dir>"]
    caplog.clear()
    train(make_config(trainer={"max_steps": 2}, resume="auto"), alone)  # found one: no such line
    assert not [r for r in caplog.records if r.getMessage().startswith("resume=auto")]


def test_results_give_the_wall_time_of_all_attempts(tmp_path, make_config):
    first = train(make_config(trainer={"max_steps": 3}), tmp_path)
    assert first["wall_seconds_all_attempts"] == first["wall_seconds"] > 0 and first["error"] is None
    saved = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)["wall_seconds"]
    assert 0 < saved <= first["wall_seconds"]  # up to the checkpoint, written before the results
    second = train(make_config(trainer={"max_steps": 6}, resume="auto"), tmp_path)
    assert second["wall_seconds_all_attempts"] == saved + second["wall_seconds"]
    assert torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)["wall_seconds"] > saved
    assert read_results(tmp_path) == second


def test_a_run_that_diverges_before_its_first_checkpoint_does_not_point_at_checkpoints(tmp_path, make_config):
    blown = {"lr": 1e30}  # the first step is finite, the ones after it are not
    with pytest.raises(RunStopped) as early:
        train(make_config(optim=blown, trainer={"max_bad_steps": 2}), tmp_path / "early")
    assert early.value.exit_code == 3 and not (tmp_path / "early" / "checkpoints").exists()
    assert "it had written no checkpoint yet" in str(early.value) and "checkpoints" not in str(early.value)
    assert str(early.value).endswith("and start again")
    assert read_results(tmp_path / "early")["status"] == "diverged"

    train(make_config(trainer={"epochs": 1}), tmp_path / "late")  # a checkpoint at step 8, then it diverges
    with pytest.raises(RunStopped) as late:
        train(make_config(optim=blown, trainer={"max_bad_steps": 2}, resume="auto"), tmp_path / "late")
    assert f"the checkpoints in {tmp_path / 'late' / 'checkpoints'} are from before" in str(late.value)
    assert str(late.value).endswith("and start again or resume")


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "log-file"])
def test_bad_data_found_mid_run_leaves_a_failed_record_and_a_line_of_its_own(tmp_path, make_config, monkeypatch,
                                                                            terminal):
    """A val image goes bad after the run has started (a disk or mount gone bad): the first evaluation,
    with the epoch's bar still drawn, stops the run. The bar is gone before the message."""
    from vit_train.data.sources.base import EncodedImages

    build = EncodedImages.build

    write_image_folder(tmp_path / "data", {"train": 4, "val": 2},
                       pixels=lambda cls, i: (40 * i, 100 if cls == "a" else 0, 0))
    bad = tmp_path / "data" / "val" / "b" / "1.png"

    def build_then_damage(*args, **kwargs):
        data = build(*args, **kwargs)
        bad.write_bytes(b"\0" * 10)
        return data

    monkeypatch.setattr(EncodedImages, "build", build_then_damage)  # the image folder's door to its loaders
    stderr = Terminal() if terminal else io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    cfg = make_config(data={"name": "imagefolder", "root": str(tmp_path / "data"), "batch_size": 2, "num_workers": 0,
                            "bad_images": "error"}, model={"img_size": 16, "patch_size": 8},
                      trainer={"progress": True, "log_every": 1})
    with pytest.raises(DataError, match="1.png cannot be read") as failed:
        train(cfg, tmp_path / "run")
    shown = stderr.getvalue()
    assert ("epoch 1/2" in shown) and (("\r" in shown) == terminal)  # the bar, or lines in a log
    assert column_zero(shown)  # what is printed next starts on its own line
    results = read_results(tmp_path / "run")
    assert results["status"] == "failed" and results["error"] == str(failed.value) and results["steps"] == 4
    assert f"[ERROR] {failed.value}" in (tmp_path / "run" / "train.log").read_text()


def test_a_run_stopped_before_its_first_train_row_still_counts_its_images_per_s(tmp_path, make_config, monkeypatch):
    """Interrupted at step 2 with trainer.log_every=100: the closing line said 0 images/s, results.json null."""
    from helpers.files import logged

    stop_at_second_step(monkeypatch)
    with pytest.raises(RunStopped):
        train(make_config(trainer={"log_every": 100}), tmp_path)
    assert not (tmp_path / "metrics.jsonl").exists() or logged(tmp_path, "train") == []  # no train row before it
    assert read_results(tmp_path)["images_per_s"] > 0


def test_the_stop_warning_says_what_ends_before_the_checkpoint_where_the_signal_landed(caplog):
    from vit_train.runtime.preemption import StopRequest

    with caplog.at_level("WARNING", logger="vit_train"), StopRequest() as stop:
        with stop.during("the evaluation of step 8"):
            os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)
    assert [r.getMessage() for r in caplog.records] == [
        "received SIGUSR1: checkpointing once the evaluation of step 8 ends (or is cut short), then stopping "
        "(Ctrl-C again to stop at once)",
        "received SIGTERM: checkpointing after this step, then stopping (Ctrl-C again to stop at once)"]
    assert stop.doing is None and stop.name == "SIGTERM"
