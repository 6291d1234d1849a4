"""data.decode=gpu's crop on the device (vit_train/data/device/crops.py) against torchvision's per-image
transforms: RandomResizedCrop's window by torchvision's own rule (its make_params fed the same uniforms), the
crop, resize and flip equal to torchvision's kernels on tensors bit for bit, and within 1 level of the loader
path's (PIL's resize) with the same window; each aug option's crop read from its own transform."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from helpers.configs import aug
from helpers.jpegs import photo
from vit_train.data.device.crops import (Geometry, central_window, crop, crop_uniforms, crop_windows,
                                        resized_crops)
from vit_train.data.preprocess import CROP_FRACTION
from vit_train.errors import ConfigError

STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def torchvision_windows(sizes, uniforms, scale, ratio, monkeypatch):
    """torchvision's RandomResizedCrop.make_params per image, its uniform_ and randint fed our draws."""
    area_u, ratio_u, where_u = uniforms
    log_ratio = torch.log(torch.tensor(ratio))
    rrc = v2.RandomResizedCrop(8, scale=scale, ratio=ratio)
    out = []
    for k, (h, w) in enumerate(sizes.tolist()):
        values = []
        for t in range(area_u.shape[1]):
            values += [(torch.tensor(scale[0]) + area_u[k, t] * (scale[1] - scale[0])).item(),
                       (log_ratio[0] + ratio_u[k, t] * (log_ratio[1] - log_ratio[0])).item()]
        draws, places = iter(values), iter(where_u[k].tolist())
        monkeypatch.setattr(torch.Tensor, "uniform_", lambda self, a, b: self.fill_(next(draws)))
        monkeypatch.setattr(torch, "randint", lambda low, high, size: torch.tensor([math.floor(next(places) * high)]))
        params = rrc.make_params([torch.zeros(3, h, w, dtype=torch.uint8)])
        monkeypatch.undo()
        out.append([params["top"], params["left"], params["height"], params["width"]])
    return torch.tensor(out)


@pytest.mark.parametrize("scale, ratio", [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.35, 1.0), (3 / 4, 4 / 3)),
                                          ((0.9, 1.0), (0.5, 2.0))])
def test_windows_are_torchvisions_from_the_same_uniforms(monkeypatch, scale, ratio):
    g = torch.Generator().manual_seed(0)
    sizes = torch.tensor([[375, 500], [500, 333], [32, 32], [7, 300], [300, 7], [1, 1], [224, 225], [40, 41]] * 8)
    uniforms = crop_uniforms(len(sizes), g)
    ours = crop_windows(sizes, uniforms, scale, ratio)
    assert torch.equal(ours, torchvision_windows(sizes, uniforms, scale, ratio, monkeypatch))
    top, left, h, w = ours.T
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= sizes[:, 0]).all() and (left + w <= sizes[:, 1]).all()


def test_the_fallback_is_torchvisions_central_crop():
    assert central_window(7, 300, (3 / 4, 4 / 3)) == (0, 145, 7, 9)
    assert central_window(300, 7, (3 / 4, 4 / 3)) == (145, 0, 9, 7)  # round(7 / 0.75) = 9
    assert central_window(40, 41, (3 / 4, 4 / 3)) == (0, 0, 40, 41)


def test_crop_resize_and_flip_equal_torchvisions_per_image_and_pils_within_one_level():
    """The same windows and flips: torchvision's resized_crop and horizontal_flip on each tensor, exactly; the
    loader path's (RandomResizedCrop and the flip on a PIL image: PIL's resize) within 1 level (measured here:
    at most 1, for about 5% of the values on the CPU's uint8 kernel)."""
    g = torch.Generator().manual_seed(1)
    images = [torch.from_numpy(photo(h, w, seed=i)).permute(2, 0, 1).contiguous()
              for i, (h, w) in enumerate([(37, 53), (120, 90), (16, 200), (224, 224), (31, 30), (300, 401)])]
    geometry = Geometry(24, hflip=0.5)
    uniforms = crop_uniforms(len(images), g)
    flips = torch.tensor([True, False, True, True, False, False])
    out = crop(images, geometry, uniforms, flips)
    windows = crop_windows(torch.tensor([list(x.shape[1:]) for x in images]), uniforms, geometry.scale, geometry.ratio)
    worst = 0
    for image, window, flipped, got in zip(images, windows.tolist(), flips.tolist(), out):
        expected = TF.resized_crop(image, *window, [24, 24], antialias=True)
        expected = TF.horizontal_flip(expected) if flipped else expected
        assert torch.equal(got, expected)
        pil = TF.resized_crop(Image.fromarray(image.permute(1, 2, 0).numpy()), *window, [24, 24], antialias=True)
        pil = np.asarray(TF.horizontal_flip(pil) if flipped else pil).astype(int)
        worst = max(worst, int(np.abs(pil - got.permute(1, 2, 0).numpy().astype(int)).max()))
    assert worst <= 1


def test_the_gpus_way_is_torchvisions_float_resize_rounded_bit_for_bit():
    """On a GPU torchvision resizes uint8 as float32 and rounds (v2 resize_image); resized_crops does the same with
    one rounding for the batch: run here on the CPU against torchvision's float path rounded."""
    g = torch.Generator().manual_seed(2)
    images = [torch.from_numpy(photo(h, w, seed=i)).permute(2, 0, 1).contiguous()
              for i, (h, w) in enumerate([(37, 53), (120, 90), (16, 200), (300, 401)])]
    sizes = torch.tensor([list(x.shape[1:]) for x in images])
    windows = crop_windows(sizes, crop_uniforms(len(images), g), (0.08, 1.0), (3 / 4, 4 / 3))
    out = resized_crops(images, windows, Geometry(24), native_uint8=False)
    for image, window, got in zip(images, windows.tolist(), out):
        expected = TF.resized_crop(image.float(), *window, [24, 24], antialias=True).round().to(torch.uint8)
        assert torch.equal(got, expected)


def test_evaluations_resize_and_centre_crop_on_the_device_is_pils_within_one_level():
    images = [torch.from_numpy(photo(h, w, seed=i)).permute(2, 0, 1).contiguous()
              for i, (h, w) in enumerate([(37, 53), (300, 200), (18, 18)])]
    out = crop(images, Geometry(16, resize=int(16 / CROP_FRACTION)), None, None)
    for image, got in zip(images, out):
        pil = TF.center_crop(TF.resize(Image.fromarray(image.permute(1, 2, 0).numpy()), [18], antialias=True), [16])
        assert np.abs(np.asarray(pil).astype(int) - got.permute(1, 2, 0).numpy().astype(int)).max() <= 1


@pytest.mark.parametrize("name, keys, expected", [
    ("basic", {}, Geometry(32, (0.08, 1.0), hflip=0.5)),
    ("basic", {"scale_min": 0.35, "hflip": 0.0}, Geometry(32, (0.35, 1.0), hflip=0.0)),
    ("deit", {}, Geometry(32, (0.08, 1.0), hflip=0.5)),
    ("autoaug", {}, Geometry(32, (0.08, 1.0), hflip=0.5)),
    ("trivial", {}, Geometry(32, (0.08, 1.0), hflip=0.5)),
    ("randaug", {"scale_min": 0.5}, Geometry(32, (0.5, 1.0), hflip=0.5)),
    ("none", {}, Geometry(32, resize=36)),
])
def test_each_options_crop_is_read_from_its_own_transform(name, keys, expected):
    option = aug(name, **keys)
    assert Geometry.of(option.train_transform(32, STATS, None), name) == expected


def test_a_transform_starting_otherwise_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^data.decode=gpu crops .* starts with ColorJitter; use data.decode=cpu$"):
        Geometry.of([v2.ColorJitter(0.4), v2.RandomResizedCrop(32)], "mine")


def test_autoaugments_device_plan_for_files_draws_imagenets_policy():
    """AutoAugment's loader transform for image files uses ImageNet's policy, for small images CIFAR-10's."""
    from vit_train.data.device.ops import auto_augment_plan

    option = aug("autoaug")
    files = option.device_plan(64, 32, 32, torch.Generator().manual_seed(0), small_images=False)
    assert torch.equal(files.ops, auto_augment_plan(64, 32, 32, "imagenet", torch.Generator().manual_seed(0)).ops)
    small = option.device_plan(64, 32, 32, torch.Generator().manual_seed(0))
    assert torch.equal(small.ops, auto_augment_plan(64, 32, 32, "cifar10", torch.Generator().manual_seed(0)).ops)
