"""Fixtures only (pytest's own mechanism): tiny configs, a trained run, image folders, the logging a
test leaves. What tests share besides fixtures is in tests/helpers/ (`from helpers.files import rows`);
no test imports another test module or this file."""

from __future__ import annotations

import logging
import os

import pytest

from helpers.configs import tiny_config


@pytest.fixture
def make_config():
    return tiny_config


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """One short real training on shapes (~13 s on 2 CPU cores), shared by the tests that need a model
    that has learned: (run dir, results). Measured: 90.2% best val top-1 (seed 0), chance 10%."""
    from vit_train.train.trainer import train

    cfg = tiny_config(model={"embed_dim": 64, "depth": 3, "num_heads": 4, "img_size": 32, "patch_size": 8,
                             "pool": "mean", "pos_embed": "sincos2d"},
                      data={"train_size": 6000, "val_size": 500, "batch_size": 64},
                      trainer={"epochs": 7, "log_every": 50, "ema_decay": 0.9}, optim={"lr": 2e-3})
    run_dir = tmp_path_factory.mktemp("trained")
    return run_dir, train(cfg, run_dir)


@pytest.fixture
def image_folder(tmp_path):
    """A tiny image folder: `root/{train,val}/<class>/*.png`, 3 classes of solid colours with noise,
    48 train and 12 val images at 20x20; returns its root."""
    from helpers.images import write_noisy_colours

    return write_noisy_colours(tmp_path / "images")


@pytest.fixture
def ugly_folder(tmp_path):
    """An image folder as users have them (tests/helpers/ugly_folder.py): hidden entries in train/ and val/,
    one picture per class in every image mode, odd and NFD class names; an UglyFolder record."""
    from helpers.ugly_folder import write_ugly_folder

    return write_ugly_folder(tmp_path / "ugly data #1, [a]=b é")


@pytest.fixture(autouse=True)
def _logging_as_before():
    """An in-process command call (cli.main, commands.run) points the root logger at the stream pytest
    captured for that test; later tests' log lines must not go to that closed stream."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


@pytest.fixture(autouse=True, scope="session")
def _one_cpu_thread_unless_told():
    """Torch's threads pinned for the session (OMP_NUM_THREADS=1 unless the environment sets it): the
    default count depends on the CPUs other processes keep busy (runtime/cpu.py), and two runs a test
    compares bit for bit must use the same count; one thread also keeps tests from oversubscribing a
    small shared machine, and subprocesses (sweep jobs) inherit it. The count is set in this process too:
    torch read the environment at import, and each pytest-xdist worker (one per CPU) is such a process."""
    import torch

    from vit_train.runtime.cpu import env_count

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if env_count("OMP_NUM_THREADS"):
        torch.set_num_threads(env_count("OMP_NUM_THREADS"))
