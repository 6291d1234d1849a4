"""The on-device pipeline, FLOP counting and MFU (on the CPU)."""

import os

import pytest
import torch
from torchvision.transforms import v2
import torch.nn.functional as F

from vit_train.models.families.vit import ViT
from helpers.configs import build_data
from vit_train.data.mix import BatchMix
from vit_train.errors import ConfigError
from vit_train.train.throughput import flops_per_image, peak_tflops
from vit_train.train.trainer import train

CPU = torch.device("cpu")


def batches(cfg, epoch=0, start=0, split="train"):
    data = build_data(cfg, CPU)
    data.train_sampler.set_epoch(epoch, start)
    loader = data.train_loader if split == "train" else data.val_loader
    return [(x.clone(), y.clone()) for x, y in loader], data


def test_device_and_loader_pipelines_give_the_same_batches_up_to_the_random_crop(make_config):
    loader, _ = batches(make_config(data={"pipeline": "loader"}))
    device, data = batches(make_config(data={"pipeline": "device"}))
    assert len(device) == len(loader) == data.steps_per_epoch
    for (xd, yd), (xl, yl) in zip(device, loader):
        assert xd.shape == xl.shape and xd.dtype == xl.dtype == torch.float32
        assert torch.equal(yd, yl)  # the same images in the same order: the same permutation
        low, high = xl.amin(), xl.amax()
        assert xd.amin() >= low - 1e-5 and xd.amax() <= high + 1e-5
    val_device, _ = batches(make_config(data={"pipeline": "device"}), split="val")
    val_loader, _ = batches(make_config(data={"pipeline": "loader"}), split="val")
    for (xd, yd), (xl, yl) in zip(val_device, val_loader):
        torch.testing.assert_close(xd, xl, rtol=0, atol=1e-6)  # no augmentation: the same pixels
        assert torch.equal(yd, yl)


def crop(image, dy, dx, flip, size=16):
    out = image[:, dy:dy + size, dx:dx + size]
    return out.flip(-1) if flip else out


def test_each_device_augmented_image_is_a_padded_crop_of_its_image_maybe_flipped(make_config):
    cfg = make_config(data={"pipeline": "device"}, aug={"name": "none"})
    plain, _ = batches(cfg)
    augmented, data = batches(make_config(data={"pipeline": "device"}))
    pad, flipped, shifted = 16 // 8, 0, 0
    for (x, _), (reference, _) in zip(augmented, plain):
        black = (0 - data.stats[0][0]) / data.stats[1][0]  # a zero pixel after normalisation
        padded = F.pad(reference - black, (pad,) * 4) + black
        for image, source in zip(x, padded):
            found = [(dy, dx, flip) for dy in range(2 * pad + 1) for dx in range(2 * pad + 1) for flip in (0, 1)
                     if torch.allclose(crop(source, dy, dx, flip), image, atol=1e-5)]
            assert found, "not a crop of its image"
            flipped += found[0][2]
            shifted += found[0][:2] != (pad, pad)
    count = sum(len(x) for x, _ in augmented)
    assert 0.35 < flipped / count < 0.65 and shifted / count > 0.7


def test_device_pipeline_is_deterministic_and_resumes_mid_epoch_exactly(make_config):
    cfg = make_config(data={"pipeline": "device"})
    first, _ = batches(cfg, epoch=1)
    again, _ = batches(cfg, epoch=1)
    resumed, _ = batches(cfg, epoch=1, start=3 * 32)  # three batches done
    other_epoch, _ = batches(cfg, epoch=2)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, again))
    assert len(resumed) == len(first) - 3
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first[3:], resumed))
    assert not torch.equal(first[0][0], other_epoch[0][0])


def test_device_batches_mix_into_soft_targets(make_config):
    cfg = make_config(data={"pipeline": "device"}, aug={"mixup_alpha": 0.8, "cutmix_alpha": 1.0})
    (x, y), *_ = batches(cfg)[0]
    mixed, targets = BatchMix(cfg.aug, 10, seed=0)(x, y, step=0)
    assert mixed.shape == x.shape and targets.shape == (len(y), 10)
    torch.testing.assert_close(targets.sum(1), torch.ones(len(y)))


def test_device_pipeline_trains_and_resumes_bit_identically(tmp_path, make_config):
    sections = dict(data={"pipeline": "device"}, trainer={"ckpt_every": 1, "keep_last": 100})
    train(make_config(**sections), tmp_path / "full")
    train(make_config(**sections, resume=str(tmp_path / "full" / "checkpoints" / "step_00000005.pt")),
          tmp_path / "resumed")
    expected = torch.load(tmp_path / "full" / "checkpoints" / "last.pt", weights_only=True)["model"]
    got = torch.load(tmp_path / "resumed" / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(expected[k], got[k]) for k in expected)


@pytest.mark.parametrize("sections, why", [
    ({"aug": {"name": "solarized"}}, "aug=solarized's transform is done by the loader only"),
    ({"aug": {"name": "basic"}, "data": {"name": "plain"}}, "data=plain's sets are not uint8 tensors"),
])
def test_device_pipeline_does_only_what_it_does_whole(make_config, sections, why):
    """The on-device pipeline does every aug option's work (test_device_pipeline.py); what it does not do (a
    subclass's own transform that kept its base's on_device flag, sets that are not uint8 tensors) was silently
    skipped there on a GPU: now data.pipeline=auto takes the loader for it and data.pipeline=device is refused
    naming why."""
    from dataclasses import dataclass

    from helpers.registry import registry_kept
    from vit_train.data.aug.basic import Basic
    from vit_train.data.loaders import pipeline
    from vit_train.data.sources.shapes import Shapes

    with registry_kept():
        @dataclass
        class Solarized(Basic):  # a user's augmentation as docs/extending.md builds one: Basic plus a transform
            name: str = "solarized"

            def train_transform(self, img_size, stats, native_size):
                return [v2.RandomSolarize(128), *super().train_transform(img_size, stats, native_size)]

        @dataclass
        class Plain(Shapes):  # a data set whose sets are any Dataset of (image, label) items
            name: str = "plain"

            def splits(self, img_size, labels=True):
                train, val, names, native = super().splits(img_size, labels)
                return list(zip(train.images, train.labels)), list(zip(val.images, val.labels)), names, native

        cfg = make_config(**{**sections, "data": {**sections.get("data", {}), "pipeline": "device"}})
        with pytest.raises(ConfigError, match=f"^data.pipeline=device does the augmentation .*: {why}.*; use "
                                              f"data.pipeline=loader"):
            build_data(cfg, CPU)
        auto = make_config(**{**sections, "data": {**sections.get("data", {}), "pipeline": "auto"}})
        assert pipeline(auto, torch.device("cuda"), cfg.data.splits(16)) == "loader"
    assert pipeline(make_config(data={"pipeline": "auto"}), torch.device("cuda"),
                    make_config().data.splits(16)) == "device"  # what it does whole: on the device


def test_training_flops_of_vit_tiny_at_224_match_the_published_count():
    cfg = ViT(embed_dim=192, depth=12, num_heads=3, mlp_ratio=4.0, img_size=224, patch_size=16)
    flops = flops_per_image(cfg, num_classes=1000)
    assert flops == pytest.approx(7.5e9, rel=0.02)  # REFERENCES.md: 7.52 GFLOP (3 x 2.51 forward)


def test_peak_flops_come_from_the_table_or_the_config():
    assert peak_tflops(torch.device("cpu"), torch.float32, None) is None
    assert peak_tflops(torch.device("cpu"), torch.float32, 1.5) == 1.5
    assert peak_tflops(torch.device("cuda"), torch.bfloat16, None, name="NVIDIA H200") == 989.0


def test_cpu_threads_come_from_the_setting_the_environment_or_the_cpu_share(monkeypatch, tmp_path):
    from vit_train.runtime import cpu
    from vit_train.runtime.cpu import cpu_threads, usable_cpus

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(cpu, "usable_cpus", lambda: 8)  # no cgroup quota, whatever this machine has
    monkeypatch.setattr(cpu, "busy_cpus", lambda cpus: 0.0)  # nothing else running (test_cpu_threads.py: busy)
    monkeypatch.setattr(cpu, "recent_load", lambda cpus: 0.0)
    assert cpu_threads() == (8, "8 CPUs / 1 process of this run")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")  # torchrun, when the user unset its OMP_NUM_THREADS=1
    assert cpu_threads() == (2, "8 CPUs / 3 processes of this run")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")
    assert cpu_threads()[0] == 1  # never below one
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # joblib's parallel-sweep workers, torchrun, or the user
    assert cpu_threads() == (3, "OMP_NUM_THREADS")
    assert cpu_threads(5) == (5, "trainer.cpu_threads")
    quota = tmp_path / "cpu.max"
    quota.write_text("150000 100000\n")  # docker --cpus=1.5 on an 8-CPU host
    assert usable_cpus(quota) == 2
    quota.write_text("max 100000\n")
    assert usable_cpus(quota) == 8
    assert usable_cpus(tmp_path / "absent") == 8


class Clock:
    """A clock the test moves by hand (TrainWindow reads time.perf_counter)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.mark.parametrize("data, device, advice", [
    ({"name": "shapes"}, "cpu", "raise data.num_workers, or on a GPU use data.pipeline=device"),
    ({"name": "shapes", "pipeline": "loader"}, "cuda",
     "use data.pipeline=device (the images augmented on the GPU), or raise data.num_workers"),
    ({"name": "imagefolder", "root": "x"}, "cuda",
     "raise data.num_workers, or try data.decode=gpu (docs/data.md), or pre-resize the images (vit-shards short_side=N)"),
    ({"name": "imagefolder", "root": "x", "decode": "gpu"}, "cpu",
     "data.decode=gpu on the CPU decodes in the training process itself: data.decode=cpu decodes in data.num_workers "
     "loader workers"),
])
def test_a_data_bound_run_is_warned_once_from_its_second_window_with_its_data_sets_advice(monkeypatch, caplog, data,
                                                                                         device, advice):
    """Above 20% of the step time waiting for data, from the second logged window (the first warms up), once; the
    advice fits the data set and device: a GPU decode on the CPU is not told to raise workers it does not use."""
    import time

    import torch

    from helpers.configs import tiny_config
    from vit_train.outputs.metrics import NullLogger
    from vit_train.checkpoint import TrainState
    from vit_train.train.throughput import TrainWindow, log_train

    clock = Clock()
    monkeypatch.setattr(time, "perf_counter", clock)
    window = TrainWindow(torch.device("cpu"))
    window.advice = tiny_config(data=data).data.data_bound_advice(torch.device(device))
    state, scaler = TrainState(), torch.amp.GradScaler("cpu", enabled=False)
    bar = type("Bar", (), {"set_postfix": lambda self, **kw: None})()
    for waited in (0.5, 0.3, 0.1, 0.9):  # a window of one 1-second step each, `waited` of it waiting
        window.start()
        window.wait(waited)
        window.add(torch.tensor(1.0), torch.tensor(1.0), None, 8, torch.tensor(True))
        clock.now += 1.0
        with caplog.at_level("WARNING", logger="vit_train"):
            log_train(NullLogger(), bar, window, state, 1e-3, scaler)
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"the run is data-bound: 30% of the step time waits for data; {advice}"]
