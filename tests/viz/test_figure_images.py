"""The val images the figures show (vit-eval's attention figure, TensorBoard's during training): taken
round-robin by class from the val set's labels, so a val set sorted by class (an image folder's) shows several
classes, not the first `count` images of its first class; deterministic; only the chosen images are read."""

from __future__ import annotations

import numpy as np
import torch

from helpers.configs import build_data, composed
from helpers.images import write_image_folder
from vit_train.config import Config
from vit_train.data.device.pipeline import DeviceEvalPipeline
from vit_train.viz.figures import across_classes, figure_images, first_images

COLOURS = {"ant": (250, 0, 0), "bee": (0, 250, 0), "cat": (0, 0, 250), "dog": (250, 250, 0)}


def _sorted_folder_data(tmp_path):
    """An image folder of 4 classes, 6 val images each, listed class by class; each class its own colour."""
    root = write_image_folder(tmp_path / "images", {"train": 2, "val": 6}, classes=tuple(COLOURS),
                              pixels=lambda cls, i: COLOURS[cls], size=(20, 20))
    cfg = Config.from_dict(composed(["data=imagefolder", f"data.root={root}", "model.img_size=16",
                                     "model.patch_size=4", "data.batch_size=4", "data.num_workers=0",
                                     "trainer.device=cpu"]))
    return build_data(cfg, torch.device("cpu"))


def test_a_val_set_sorted_by_class_gives_figures_of_every_class(tmp_path):
    data = _sorted_folder_data(tmp_path)
    val = data.val_loader.dataset.base
    assert [label for _, label in val.samples] == [c for c in range(4) for _ in range(6)]  # sorted by class
    assert first_images is figure_images  # vit-eval's figures too (tools/report.py)
    images, labels = figure_images(data.val_loader, 8)
    assert labels.tolist() == [0, 1, 2, 3, 0, 1, 2, 3]  # all 4 classes, twice, round-robin
    colours = images.mean(dim=(2, 3)).argmax(dim=1)  # each image's own pixels: red, green, blue, then yellow
    assert colours[:3].tolist() == [0, 1, 2]
    again, again_labels = figure_images(data.val_loader, 8)
    assert torch.equal(images, again) and torch.equal(labels, again_labels)  # the same ones every time


def test_only_the_chosen_images_are_read(tmp_path):
    data = _sorted_folder_data(tmp_path)
    val = data.val_loader.dataset.base
    read, real = [], val.loader
    val.loader = lambda path: read.append(path) or real(path)
    figure_images(data.val_loader, 8)
    assert sorted(read) == sorted(val.samples[i][0] for i in (0, 1, 6, 7, 12, 13, 18, 19))


def test_round_robin_by_class_and_an_even_spread_over_more_classes_than_images():
    labels = [c for c in range(4) for _ in range(5)]  # sorted: 5 of each
    assert across_classes(labels, 8) == [0, 5, 10, 15, 1, 6, 11, 16]
    assert across_classes(labels, 3) == [0, 5, 10]  # classes 0, 1, 2 (4 * k // 3)
    many = [c for c in range(20) for _ in range(2)]
    picks = across_classes(many, 8)
    assert [many[i] for i in picks] == [0, 2, 5, 7, 10, 12, 15, 17]
    assert across_classes([3, 3, 1], 8) == [2, 0, 1]  # fewer images than asked: all of them, by class
    assert across_classes([], 8) == []


def test_the_on_device_pipeline_and_a_stream_choose_across_classes_too():
    labels = torch.tensor([c for c in range(4) for _ in range(10)])
    images = (labels[:, None, None, None] * 60).expand(40, 3, 4, 4).to(torch.uint8).contiguous()
    device = DeviceEvalPipeline(images, labels, 16, lambda x: x.float(), torch.device("cpu"))
    shown, said = figure_images(device, 8)
    assert said.tolist() == [0, 1, 2, 3, 0, 1, 2, 3] and shown[:, 0, 0, 0].tolist() == [0, 60, 120, 180] * 2
    stream = [(images[i:i + 16].float(), labels[i:i + 16]) for i in range(0, 40, 16)]  # no labels before reading
    shown, said = figure_images(stream, 8)
    assert sorted(set(said.tolist())) == [0, 1, 2, 3] and np.array_equal(shown[:, 0, 0, 0].numpy(), said.numpy() * 60.0)
