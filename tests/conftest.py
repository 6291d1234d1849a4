"""Shared fixtures and helpers: tiny configs on the built-in shapes data, CPU only, outputs under
tmp_path; the real command line in a subprocess; a run's logged metrics. Test files take helpers
from here (fixtures, or `from conftest import ...`), never from one another."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vit_train.config.schema import Config


# A micro ViT on a small shapes set, as command-line overrides: 4 steps per epoch.
TINY = ["model.embed_dim=32", "model.depth=2", "model.num_heads=2", "model.img_size=16", "data.train_size=128",
        "data.val_size=64", "data.batch_size=32", "trainer.device=cpu", "trainer.progress=false"]


def vit_train(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m vit_train ARGS` in `cwd`, its output captured."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "vit_train", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=300)


def hold_lock(path: Path) -> subprocess.Popen:
    """Another process holding the run-directory lock on `path` (vit_train/rundir.py) until killed."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from vit_train.outputs import rundir; "
                               f"rundir.acquire({str(path)!r}); print('locked', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "locked\n"
    return holder


def lock_is_free(path: Path) -> bool:
    """Whether another process could take the lock on `path` now (it tries, in a subprocess, and lets go)."""
    probe = subprocess.run([sys.executable, "-c", f"from vit_train.outputs import rundir; rundir.acquire({str(path)!r})"],
                           capture_output=True, text=True)
    assert probe.returncode == 0 or "is in use by another vit-train run" in probe.stderr, probe.stderr
    return probe.returncode == 0


def rows(run_dir):
    """All rows of a run's metrics.jsonl, in order."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def tb_scalars(run_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})  # purges orphaned steps, as TB does
    acc.Reload()
    return sorted((e.step, e.value) for e in acc.Scalars(tag))  # as TensorBoard plots them: by step


def assert_same_run(run_dir, reference):
    """Every (split, step) row once, with the reference's values (an uninterrupted run with the same seed);
    the same TensorBoard scalars, final weights and optimiser state; no temporary files; completed."""
    import torch

    got, want = rows(run_dir), rows(reference)
    keys = [(r["split"], r["step"]) for r in got]
    assert len(keys) == len(set(keys)), f"rows logged twice: {sorted(k for k in keys if keys.count(k) > 1)}"
    drop = ("images_per_s", "data_wait", "tflops", "mfu")  # timing
    strip = lambda r: {k: v for k, v in r.items() if k not in drop}  # noqa: E731
    assert sorted(map(strip, got), key=lambda r: (r["step"], r["split"])) == \
        sorted(map(strip, want), key=lambda r: (r["step"], r["split"]))
    for tag in ("train/loss", "val/top1"):
        assert tb_scalars(run_dir, tag) == tb_scalars(reference, tag), tag
    a = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(reference / "checkpoints" / "last.pt", weights_only=True)
    for part in ("model", "optimizer"):
        flat_a, flat_b = (torch.utils._pytree.tree_flatten(x[part])[0] for x in (a, b))
        assert all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(flat_a, flat_b)), part
    assert not list(run_dir.rglob("*.tmp")), list(run_dir.rglob("*.tmp"))
    assert json.loads((run_dir / "results.json").read_text())["status"] == "completed"


def logged(run_dir: Path, split: str) -> list[dict]:
    """The rows of a run's metrics.jsonl for `split` (train, val, val_ema), in order."""
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["split"] == split]


def composed(overrides: list[str]) -> dict:
    """The config `vit-train OVERRIDES` composes, as plain data (before the typed schema's validation)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from vit_train.cli.train import _config_dir  # also registers the schema node that train.yaml lists first

    with initialize_config_dir(config_dir=_config_dir(), version_base="1.3"):
        return OmegaConf.to_container(compose("train", overrides=overrides), resolve=True)


def model_weights(run_dir: Path, name: str = "last.pt") -> dict:
    """The model state dict of a run's checkpoints/<name>."""
    import torch

    return torch.load(run_dir / "checkpoints" / name, weights_only=True)["model"]


def tiny_config(**sections) -> Config:
    """A micro ViT on a small shapes set; `sections` override keys, e.g. trainer={"max_steps": 3}."""
    plain = {
        "model": {"embed_dim": 32, "depth": 2, "num_heads": 2, "img_size": 16, "patch_size": 4},
        "data": {"train_size": 256, "val_size": 128, "batch_size": 32},
        "trainer": {"epochs": 2, "device": "cpu", "log_every": 2, "progress": False},
        "schedule": {"warmup_epochs": 0.5},
    }
    for name, values in sections.items():
        if isinstance(values, dict):
            plain.setdefault(name, {}).update(values)
        else:
            plain[name] = values
    return Config.from_dict(plain)


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
    import numpy as np
    from PIL import Image

    root = tmp_path / "images"
    rng = np.random.default_rng(0)
    colours = {"red": (200, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 200)}
    for split, count in (("train", 16), ("val", 4)):
        for name, colour in colours.items():
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                pixels = np.clip(np.array(colour) + rng.normal(0, 40, (20, 20, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(root / split / name / f"{i}.png")
    return root


@pytest.fixture
def ugly_folder(tmp_path):
    """An image folder as users have them (tests/ugly_folder.py): hidden entries in train/ and val/,
    one picture per class in every image mode, odd and NFD class names; an UglyFolder record."""
    from ugly_folder import write_ugly_folder

    return write_ugly_folder(tmp_path / "ugly data #1, [a]=b é")


@pytest.fixture(autouse=True)
def _logging_as_before():
    """An in-process command call (cli.main, commands.run) points the root logger at the stream pytest
    captured for that test; later tests' log lines must not go to that closed stream."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level
