"""The resume matrix of docs/resuming.md: every consumer of randomness x every data path x kill -9 and
SIGTERM mid-epoch; the resumed run equals the uninterrupted one bit for bit, in every file a user reads.

Consumers: dropout and drop path (the model), MixUp/CutMix and random erasing (aug=deit: RandAugment too),
repeated augmentation, MAE's masks, the stream's shuffle buffer, loader workers' own RNG (2 workers).
Paths: shapes on the device pipeline and on the loader, CIFAR files, an image folder, shards (webdataset),
data=hf parquet; the three sets of image files as JPEGs with data.decode=gpu (its device=cpu path: decoded and
augmented in the training process, drawn per global batch). A cell is stopped after its 11th train row (epoch 2
of 2, step 3 of 8 at 8 steps an epoch), between checkpoints (every 5 steps), so the resume replays steps of an
epoch that started before the stop.
trainer.keep_last=1: a SIGTERM saves at the step it stops, so with step files kept the stopped run would keep
a step_<N>.pt the uninterrupted run never wrote (docs/resuming.md); every other file is compared."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.configs import tiny_config
from helpers.hf_sets import hf_parquet, png
from helpers.images import write_cifar10, write_noisy_colours
from helpers.jpegs import jpeg, photo
from helpers.kill_resume import stop_then_resume
from helpers.shards import write_shards
from vit_train.train.trainer import train

RANDOM = {"model": {"dropout": 0.1, "drop_path": 0.2}, "aug": {"name": "deit"}}  # dropout, drop path, deit's draws
# the device pipeline's augmentation: aug=deit's crop, flip, RandAugment and erasing, and MixUp/CutMix
DEVICE = {"model": {"dropout": 0.1, "drop_path": 0.2}, "aug": {"name": "deit"}}
REPEATS = {"data": {"repeated_aug": 2}}
MAE = {"objective": {"name": "mae"}, "model": {"drop_path": 0.1}}


def data_of(path: str, root: Path) -> dict:
    """The data section of a path; 8 global batches of 8 an epoch where the set allows it."""
    if path.endswith("-gpu"):  # the same sets as JPEGs, decoded on the device
        return {**data_of(path[:-4], root / "jpegs"), "decode": "gpu"}
    if path.startswith("shapes"):
        return {"pipeline": "device" if path == "shapes-device" else "loader", "train_size": 64, "val_size": 16}
    if path == "cifar10":
        write_cifar10(root / "cifar", per_batch=13)
        return {"name": "cifar10", "root": str(root / "cifar")}
    jpegs = root.name == "jpegs"
    if path == "imagefolder":
        images = write_noisy_colours(root / "images", "{i}.jpg" if jpegs else "{i}.png")
        return {"name": "imagefolder", "root": str(images)}
    if path == "webdataset":
        write_shards(root / "shards", [20, 20, 24], [8, 8], members=jpeg_members if jpegs else None)
        return {"name": "webdataset", "root": str(root / "shards"), "shuffle_buffer": 12}
    return {"name": "hf", "root": str(hf_parquet(root / "hf", train=64, val=16, image=jpg if jpegs else png))}


def jpg(i: int) -> bytes:
    return jpeg(photo(18 + i % 5, 20 + i % 3, seed=i), quality=90)


def jpeg_members(split: str, i: int, key: str) -> list[tuple[str, bytes]]:
    return [(f"{key}.jpg", jpg(i)), (f"{key}.cls", str(i % 3).encode())]


# (path, workers, the consumers) of each cell
CELLS = [
    ("shapes-device", 0, DEVICE), ("shapes-loader", 2, {**RANDOM, **REPEATS}), ("cifar10", 2, RANDOM),
    ("imagefolder", 0, {**RANDOM, **REPEATS}), ("webdataset", 2, RANDOM), ("webdataset", 0, RANDOM),
    ("hf", 2, RANDOM), ("shapes-loader", 2, MAE), ("webdataset", 2, MAE), ("imagefolder", 0, MAE),
    ("imagefolder-gpu", 2, {**RANDOM, **REPEATS}), ("webdataset-gpu", 2, RANDOM), ("hf-gpu", 0, RANDOM),
]


def sections(path: str, workers: int, consumers: dict, root: Path) -> dict:
    out = {"data": {**data_of(path, root), "batch_size": 8, "num_workers": workers},
           "trainer": {"epochs": 2, "log_every": 1, "ckpt_every": 5, "keep_last": 1}}
    for name, values in consumers.items():
        out[name] = {**out.get(name, {}), **values}
    return out


def label(cell) -> str:
    path, workers, consumers = cell
    kind = "mae" if consumers is MAE else "repeats" if "repeated_aug" in consumers.get("data", {}) else "random"
    return f"{path}-{workers}w-{kind}"


@pytest.mark.slow
@pytest.mark.parametrize("signal", ["KILL", "TERM"])
@pytest.mark.parametrize("cell", CELLS, ids=[label(c) for c in CELLS])
def test_a_run_stopped_mid_epoch_resumes_as_the_uninterrupted_run(tmp_path, cell, signal):
    path, workers, consumers = cell
    if path.startswith("hf"):
        pytest.importorskip("datasets")
    plain = sections(path, workers, consumers, tmp_path)
    reference = tmp_path / "reference"
    train(tiny_config(**plain), reference)
    stop_then_resume(tmp_path / "stopped", plain, reference, signal)
