"""A train row logged after a resume is the uninterrupted run's when trainer.log_every is larger than the
checkpoint interval: the checkpoint carries the log window's sums (loss, top-1 hits, steps, images, the
last gradient norm; distill's terms), so the row is not a mean over only the steps since the checkpoint.
Judged by tests/helpers/files.py `assert_every_file_as_the_reference` (every file, timings aside)."""

import os
import signal

import pytest
import torch

from helpers.configs import tiny_config
from helpers.files import assert_every_file_as_the_reference, logged
from helpers.kill_resume import kill_9_at, resume_as_the_reference
from vit_train.errors import RunStopped
from vit_train.train.trainer import train

# 16 steps (2 epochs of 8); train rows at 5, 10, 15, 16; checkpoints at 3, 6, 8 (eval), 9, 12, 15, 16 (eval).
SECTIONS = {"trainer": {"log_every": 5, "ckpt_every": 3, "keep_last": 2, "ema_decay": 0.9}}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("reference")
    train(tiny_config(**SECTIONS), run_dir)
    return run_dir


def test_the_reference_logs_every_fifth_step_and_checkpoints_between(reference):
    assert [r["step"] for r in logged(reference, "train")] == [5, 10, 15, 16]
    assert [r["step"] for r in logged(reference, "val")] == [8, 16]
    assert torch.load(reference / "checkpoints" / "last.pt", weights_only=True)["ema"]  # EMA scores are compared too


def test_a_kill_9_between_logs_then_resume_auto_logs_the_uninterrupted_rows(tmp_path, reference):
    # killed right after the row of step 10: the resume starts at step 9, inside the window 6..10
    kill_9_at(tmp_path, SECTIONS, "row", 2)
    window = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)["train_window"]
    assert window["finite_steps"] == 4 and window["images"] == 4 * 32  # steps 6..9 of the window
    resume_as_the_reference(tmp_path, SECTIONS, reference)


def test_a_sigterm_between_logs_then_resume_logs_the_uninterrupted_rows(tmp_path, reference, monkeypatch):
    from vit_train.models.vit import VisionTransformer

    forward, calls = VisionTransformer.forward, []

    def signalling_forward(self, x):
        if self.training:
            calls.append(1)
            if len(calls) == 12:  # step 12: the stop checkpoints there, inside the window 11..15
                os.kill(os.getpid(), signal.SIGTERM)
        return forward(self, x)

    monkeypatch.setattr(VisionTransformer, "forward", signalling_forward)
    with pytest.raises(RunStopped):
        train(tiny_config(**SECTIONS), tmp_path)
    monkeypatch.undo()
    window = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert window["step"] == 12 and window["train_window"]["finite_steps"] == 2
    train(tiny_config(**SECTIONS, resume="auto"), tmp_path)
    assert_every_file_as_the_reference(tmp_path, reference)


def test_a_checkpoint_without_a_window_resumes_with_an_empty_one(tmp_path):
    from vit_train.train.throughput import TrainWindow

    window = TrainWindow(torch.device("cpu"))
    window.add(torch.tensor(2.5), torch.tensor(1.25), torch.tensor(3), 8, torch.tensor(True))
    saved = window.state_dict()
    assert {k: v for k, v in saved.items() if k != "timing"} == {
        "loss": 2.5, "hits": 3, "finite_steps": 1, "finite_images": 8, "has_top1": True, "grad_norm": 1.25,
        "grad_norm_dtype": "float32", "images": 8, "logs": 0}
    again = TrainWindow(torch.device("cpu"))
    again.load_state_dict(saved)
    assert again.read()[0]["loss"] == 2.5 and again.read()[0]["loss"] != again.read()[0]["loss"]  # then empty: NaN
    empty = TrainWindow(torch.device("cpu"))
    empty.load_state_dict(None)
    assert empty.state_dict()["finite_steps"] == 0


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_distills_terms_after_a_kill_between_logs_are_the_uninterrupted_runs(tmp_path):
    train(tiny_config(trainer={"max_steps": 2}), tmp_path / "teacher")
    teacher = str(tmp_path / "teacher" / "checkpoints" / "last.pt")
    sections = {"trainer": {**SECTIONS["trainer"], "max_steps": 8}, "objective": {"name": "distill", "teacher": teacher}}
    train(tiny_config(**sections), tmp_path / "reference")
    assert [r["step"] for r in logged(tmp_path / "reference", "train")] == [5, 8]
    assert "loss_teacher" in logged(tmp_path / "reference", "train")[0]
    run = tmp_path / "run"  # killed after the row of step 5: the resume starts at step 3, inside the window 1..5
    kill_9_at(run, sections, "row", 1)
    assert set(torch.load(run / "checkpoints" / "last.pt", weights_only=True)["train_window"]["terms"]) == {
        "loss_label", "loss_teacher", "teacher_agreement", "images"}
    resume_as_the_reference(run, sections, tmp_path / "reference")
