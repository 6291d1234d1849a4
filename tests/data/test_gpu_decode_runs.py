"""data.decode=gpu through whole loaders and runs on the CPU (the device=cpu path): each data set of image files
trains with it; its batches do not depend on data.num_workers; its validation images are the loader path's
within 1 level (the same top-1); unreadable images follow data.bad_images; where it cannot run it says so in one
line. Exact resume mid-epoch: tests/train/test_resume_matrix.py's decode=gpu cells (slow)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from helpers.configs import aug, build_data, tiny_config
from helpers.hf_sets import hf_parquet
from helpers.jpegs import jpeg, kinds, photo, write_jpeg_folder
from helpers.shards import write_shards
from helpers.runs import vit_train
from vit_train.cli import train as _cli  # noqa: F401 (the schema's Hydra nodes, as the command line has them)
from vit_train.cli.compose import read
from vit_train.data.decoding import batched, image as decode
from vit_train.data.aug.basic import Basic
from vit_train.data.device.files import DecodedTrain, check_decode
from vit_train.errors import ConfigError, DataError
from vit_train.train.trainer import train

CPU = torch.device("cpu")


def jpg(i: int) -> bytes:
    return jpeg(photo(20 + i % 7, 24 + i % 5, seed=i), quality=90)


def source(name: str, root) -> dict:
    """The data section of a small set of JPEGs of `name` (imagefolder, webdataset, hf): 3 classes."""
    if name == "imagefolder":
        return {"name": "imagefolder", "root": str(write_jpeg_folder(root / "folder"))}
    if name == "hf":
        pytest.importorskip("datasets")
        return {"name": "hf", "root": str(hf_parquet(root / "hf", 48, 12, image=jpg))}
    write_shards(root / "shards", [20, 28], [12],
                 members=lambda split, i, key: [(f"{key}.jpg", jpg(i)), (f"{key}.cls", str(i % 3).encode())])
    return {"name": "webdataset", "root": str(root / "shards"), "shuffle_buffer": 8}


def config(data: dict, workers: int = 0, name: str = "deit", **sections):
    return tiny_config(data={"decode": "gpu", **data, "batch_size": 8, "num_workers": workers}, aug={"name": name},
                       **sections)


@pytest.mark.parametrize("name", ["imagefolder", "webdataset", "hf"])
def test_each_data_set_of_image_files_trains_with_decode_gpu(tmp_path, name, caplog):
    caplog.set_level(logging.WARNING, logger="vit_train")
    results = train(config(source(name, tmp_path), trainer={"epochs": 2, "log_every": 2}), tmp_path / "run")
    assert results["status"] == "completed" and results["steps"] == 12  # 48 images, batch 8, 2 epochs
    assert results["final_top1"] is not None
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("data.decode=gpu on cpu")]
    assert len(said) == 1  # the one line a CPU-only run gets


@pytest.mark.parametrize("name", ["none", "deit", "autoaug"])
def test_batches_do_not_depend_on_the_loader_workers(tmp_path, name):
    data = source("imagefolder", tmp_path)
    epochs = []
    for workers in (0, 2):
        loaders = build_data(config(data, workers, name), CPU)
        loaders.train_sampler.set_epoch(1, start=16)  # in the middle of an epoch, as a resumed run starts
        epochs.append([(x.clone(), y.clone()) for x, y in loaders.train_loader])
    assert len(epochs[0]) == 4
    for (x0, y0), (x2, y2) in zip(*epochs):
        assert torch.equal(x0, x2) and torch.equal(y0, y2)


@pytest.mark.parametrize("name", ["imagefolder", "webdataset"])
def test_validation_is_the_loader_paths_within_one_level_and_the_same_top1(tmp_path, name):
    data = source(name, tmp_path)
    gpu, cpu = (build_data(config({**data, "decode": decode_}), CPU) for decode_ in ("gpu", "cpu"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 3))
    (xg, yg), (xc, yc) = ([torch.cat(t) for t in zip(*d.val_loader)] for d in (gpu, cpu))
    assert torch.equal(yg, yc) and xg.shape == xc.shape == (12, 3, 16, 16)
    levels = (xg - xc).abs() * torch.tensor(gpu.stats[1]).view(1, 3, 1, 1) * 255  # back to 0-255 levels
    assert levels.max() <= 1 + 1e-3  # PIL's resize against torchvision's on uint8 tensors
    assert torch.equal(model(xg).argmax(1), model(xc).argmax(1))


@pytest.mark.parametrize("policy", ["skip", "error"])
def test_unreadable_images_follow_bad_images(tmp_path, policy, caplog):
    data = source("imagefolder", tmp_path)
    for broken in ("truncated", "zero_bytes"):
        (tmp_path / "folder" / "train" / "red" / f"{broken}.jpg").write_bytes(kinds()[broken][0])
    cfg = config({**data, "bad_images": policy, "max_bad_fraction": 0.1})
    loaders = build_data(cfg, CPU)
    loaders.train_sampler.set_epoch(0)
    caplog.set_level(logging.WARNING, logger="vit_train")
    if policy == "error":
        with pytest.raises(DataError, match=r"cannot be read \(.*\); fix or remove it, or set data.bad_images=skip"):
            list(loaders.train_loader)
        return
    batches = list(loaders.train_loader)
    assert sum(len(y) for _, y in batches) == 48  # 50 images, 6 global batches of 8
    replaced = [r.getMessage() for r in caplog.records if r.getMessage().startswith("unreadable train image")]
    seen = loaders.train_unreadable.seen
    assert len(replaced) == len(seen) >= 1 and all(".jpg (" in line for line in replaced)


@pytest.mark.parametrize("policy", ["skip", "error"])
def test_an_image_neither_decoder_reads_follows_bad_images(tmp_path, monkeypatch, policy, caplog):
    """A stream that passes the header check and that both decoders refuse (found in the training process): the
    split's policy; skip replaces it by its batch's first readable image, logged once and counted."""
    data = source("imagefolder", tmp_path)
    loaders = build_data(config({**data, "bad_images": policy, "max_bad_fraction": 0.1}, name="none"), CPU)
    loaders.train_sampler.set_epoch(0)
    cursed = (tmp_path / "folder" / "train" / "green" / "3.jpg").read_bytes()
    real_batched, real_cpu = batched.batched_decode, decode._decode

    def refusing(data, device):
        if any(bytes(d.numpy()) == cursed for d in data):
            raise RuntimeError("Error while decoding JPEG images")
        return real_batched(data, device)

    def cpu(source, name, resized):  # the CPU decoder, for bytes (decode_rgb) and files (open_rgb) alike
        data = source.getvalue() if hasattr(source, "getvalue") else source.read()
        if data == cursed:
            raise OSError("broken data stream when reading image file")
        return real_cpu(decode._NamedBytes(data, name), name, resized)

    monkeypatch.setattr(batched, "batched_decode", refusing)
    monkeypatch.setattr(decode, "_decode", cpu)
    caplog.set_level(logging.WARNING, logger="vit_train")
    if policy == "error":
        with pytest.raises(DataError, match=r"green/3.jpg cannot be read \(OSError: broken data stream"):
            list(loaders.train_loader)
        return
    assert sum(len(y) for _, y in loaders.train_loader) == 48
    assert [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()] == [
        f"unreadable train image replaced: {tmp_path}/folder/train/green/3.jpg (OSError: broken data stream when "
        f"reading image file)"]


def test_decode_is_a_key_of_the_data_sets_of_image_files_only():
    for other in ("cifar10", "shapes"):
        with pytest.raises(ConfigError, match=rf"^data.decode is a key of data=hf, imagefolder and webdataset, not of "
                                              rf"data={other} .*; pick one of data=hf, imagefolder, webdataset or drop data.decode$") as info:
            read([f"data={other}", "data.decode=gpu"])
        assert "\n" not in str(info.value)


@pytest.mark.slow
def test_decode_on_shapes_is_one_line_and_exit_2_on_the_command_line(tmp_path):
    done = vit_train("data=shapes", "data.decode=gpu", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "drop data.decode" in done.stderr


def test_an_option_without_a_device_version_is_refused_in_one_line():
    class Mine(Basic):  # changes the policy, keeps its base's flag: done by the loader only
        def policy(self, small_images):
            return []

    cfg = SimpleNamespace(data=SimpleNamespace(decode="gpu", stats=((0.5,) * 3, (0.5,) * 3)), aug=Mine(),
                          model=SimpleNamespace(img_size=32))
    with pytest.raises(ConfigError, match=r"^data.decode=gpu does .*aug=basic's transform is done by the loader only; "
                                          r"use data.decode=cpu$"):
        check_decode(cfg)
    cfg.aug = aug("trivial")
    assert check_decode(cfg).size == 32


def test_auto_is_the_loader_path_until_measured(tmp_path):
    data = source("imagefolder", tmp_path)
    for value in ("auto", "cpu"):
        loaders = build_data(config({**data, "decode": value}), CPU)
        assert not isinstance(loaders.train_loader, DecodedTrain) and loaders.decoder is None


def test_a_batch_of_images_no_decoder_reads_takes_the_next_readable_image_of_the_split(tmp_path, caplog):
    """A JPEG whose header the workers' check passes but that neither decoder reads (a scan naming a component the
    frame lacks), alone in its batch (batch size 1): data.bad_images=skip replaces it by the split's next readable
    image after it, as the loader path replaces one, and the epoch goes on; the same image whatever the workers."""
    data = source("imagefolder", tmp_path)
    good = bytearray((tmp_path / "folder" / "train" / "red" / "0.jpg").read_bytes())
    good[good.find(b"\xff\xda") + 5] = 9  # SOS: the first component selector names no component of the frame
    bad = tmp_path / "folder" / "train" / "red" / "00_bad.jpg"  # listed first of its class
    bad.write_bytes(bytes(good))
    cfg = tiny_config(data={**data, "decode": "gpu", "batch_size": 1, "num_workers": 0, "max_bad_fraction": 0.1},
                      aug={"name": "none"})
    loaders = build_data(cfg, CPU)
    loaders.train_sampler.set_epoch(0)
    caplog.set_level(logging.WARNING, logger="vit_train")
    seen = [(images[0], int(labels[0])) for images, labels in loaders.train_loader]
    assert len(seen) == 49  # the epoch goes on
    replaced = [r.getMessage() for r in caplog.records if r.getMessage().startswith("unreadable train image")]
    assert len(replaced) == 1 and "00_bad.jpg" in replaced[0] and len(loaders.train_unreadable.seen) == 1
    twins = [(i, j) for i in range(len(seen)) for j in range(i) if torch.equal(seen[i][0], seen[j][0])]
    assert len(twins) == 1  # the next readable image (red's 0.jpg) stands in for it: it appears twice, as red
    (i, j), = twins
    red = loaders.class_names.index("red")
    assert seen[i][1] == seen[j][1] == red
