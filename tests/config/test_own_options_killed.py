"""The pieces docs/extending.md invites a user to write (a data set, an objective, one that defines only what it
must, a model family: tests/helpers/toy_options.py, imported from a folder outside vit_train) under kill -9 in the
middle of an epoch, then resumed: every file a user reads is the uninterrupted run's (as train/test_faults.py
shows for vit-train's own options). The killed child imports the user's module as the real command does."""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path

import pytest

from helpers.configs import tiny_config
from helpers.kill_resume import kill_9_at, resume_as_the_reference
from helpers.registry import registry_kept
from vit_train.train.trainer import train

HELPERS = Path(__file__).resolve().parents[1] / "helpers"
STRIPES = {"name": "stripes", "train_size": 128, "val_size": 32, "batch_size": 16}  # 8 steps an epoch
TRAINER = {"log_every": 1, "ckpt_every": 3, "keep_last": 2}  # checkpoints at 3, 6, 8 (the epoch's end), 9, ...
PIECES = {  # the user's pieces in the run: each once, and all of them together
    "data": {"data": STRIPES},
    "objective": {"objective": {"name": "hinge", "margin": 0.5}},
    "objective of only what it must define": {"objective": {"name": "brier"}},
    "model family": {"model": {"arch": "tinycnn", "img_size": 16, "width": 8}},
    "all of them": {"data": STRIPES, "objective": {"name": "hinge"}, "model": {"arch": "tinycnn", "img_size": 16}},
}


@pytest.fixture
def own(tmp_path):
    """The user's module in a folder of its own, imported (registering its options); unregistered after the test."""
    folder = tmp_path / "mine"
    folder.mkdir()
    shutil.copy(HELPERS / "toy_options.py", folder / "my_options.py")
    sys.path.insert(0, str(folder))
    with registry_kept():
        try:
            importlib.import_module("my_options")
            yield folder
        finally:
            sys.path.remove(str(folder))
            sys.modules.pop("my_options", None)


@pytest.mark.slow
@pytest.mark.parametrize("piece", list(PIECES))
def test_a_users_piece_killed_mid_epoch_resumes_as_the_uninterrupted_run(own, tmp_path, piece):
    sections = {"trainer": TRAINER, **PIECES[piece]}
    reference = tmp_path / "reference"
    train(tiny_config(**sections), reference)
    killed = tmp_path / "killed"
    kill_9_at(killed, sections, "row", 5, imports=[(str(own), "my_options")])  # after step 5: last.pt holds step 3
    resume_as_the_reference(killed, sections, reference)
