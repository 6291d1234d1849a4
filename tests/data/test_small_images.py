"""Images far smaller than model.img_size: one warning line at a training run's start, from what is known cheaply
(a few images' headers spread over the training set; index.json's recorded size for shards), naming both sizes and
the fix. A 28x28 folder trained at the image-folder default of 224 in 16-pixel patches is the user's report."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from helpers.configs import build_data, composed
from helpers.images import write_image_folder
from helpers.shards import write_shards
from vit_train.config import Config
from vit_train.data import loaders
from vit_train.data.loaders import SIZE_SAMPLE, image_sizes, small_images
from vit_train.tools.report import evaluate_checkpoint
from vit_train.train.trainer import train

SMALL_RUN = ["model.embed_dim=16", "model.depth=1", "model.num_heads=2", "data.batch_size=4", "data.num_workers=0",
             "trainer.max_steps=1", "trainer.device=cpu", "trainer.progress=false"]


def _folder(root: Path, size: tuple[int, int], per_class: int = 4) -> Path:
    return write_image_folder(root, {"train": per_class, "val": 1}, classes=("a", "b", "c"),
                              pixels=lambda cls, i: (40 * i, 80, 120), size=size)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "far smaller than the model's input" in r.getMessage()]


def _run(tmp_path: Path, caplog, *overrides: str) -> list[str]:
    cfg = Config.from_dict(composed([*overrides, *SMALL_RUN]))
    caplog.set_level(logging.INFO, "vit_train")
    assert train(cfg, tmp_path / "run")["status"] == "completed"
    return _warnings(caplog)


def test_a_folder_of_28x28_images_at_the_default_size_warns_once_naming_both_sizes_and_the_fix(tmp_path, caplog):
    root = _folder(tmp_path / "mnist", (28, 28))
    said = _run(tmp_path, caplog, "data=imagefolder", f"data.root={root}")
    assert said == ["the images are far smaller than the model's input: a median shorter side of 28 px (28x28; 12 "
                    "images sampled) against model.img_size=224 (patch 16), so each is upscaled 8.0x; for images this "
                    "small set model.img_size=32 model.patch_size=4"]
    assert said[0] in (tmp_path / "run" / "train.log").read_text()
    caplog.clear()  # vit-eval of the run: the model is trained, the advice would be late
    evaluate_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt", attention_images=0, out_dir=tmp_path / "eval",
                        progress=False)
    assert _warnings(caplog) == []


def test_images_near_the_input_size_or_a_model_sized_for_them_give_no_warning(tmp_path, caplog):
    root = _folder(tmp_path / "photos", (240, 200))
    assert _run(tmp_path / "a", caplog, "data=imagefolder", f"data.root={root}") == []
    small = _folder(tmp_path / "mnist", (28, 28))
    assert _run(tmp_path / "b", caplog, "data=imagefolder", f"data.root={small}", "model.img_size=32",
                "model.patch_size=4") == []


def test_shards_whose_index_records_small_images_warn_from_the_index(tmp_path, caplog):
    pytest.importorskip("webdataset")
    write_shards(tmp_path / "shards", [8, 8], [4])  # 8x8 PNGs; index.json: "image_size": [8, 8]
    said = _run(tmp_path, caplog, "data=webdataset", f"data.root={tmp_path / 'shards'}")
    assert len(said) == 1 and "8 px (8x8; every image, as index.json records) against model.img_size=224" in said[0]
    assert said[0].endswith("set model.img_size=8 model.patch_size=1")


def test_rank_0_alone_reads_the_headers(tmp_path):
    root = _folder(tmp_path / "mnist", (28, 28))
    cfg = Config.from_dict(composed(["data=imagefolder", f"data.root={root}", *SMALL_RUN]))
    assert build_data(cfg, torch.device("cpu")).start_warnings[0].startswith("the images are far smaller")
    assert build_data(cfg, torch.device("cpu"), rank=1, world_size=2).start_warnings == ()  # rank 0 reads, says


def test_the_check_reads_a_few_headers_only_and_passes_over_what_it_cannot_read(tmp_path, monkeypatch):
    root = _folder(tmp_path / "many", (28, 28), per_class=40)
    (root / "train" / "a" / "0.png").write_bytes(b"not an image")
    opened = []
    real = loaders.open_regular
    monkeypatch.setattr(loaders, "open_regular", lambda path: opened.append(path) or real(path))
    cfg = Config.from_dict(composed(["data=imagefolder", f"data.root={root}", *SMALL_RUN]))
    base = cfg.data.splits(cfg.model.img_size)[0]
    sizes = image_sizes(base)
    assert len(opened) == SIZE_SAMPLE < len(base) == 120  # spread over the set, not a pass over it
    assert str(root / "train" / "a" / "0.png") in map(str, opened) and sizes == [(28, 28)] * (SIZE_SAMPLE - 1)


@pytest.mark.parametrize("sizes, img_size, said", [
    ([(28, 28)] * 3 + [(500, 400)] * 2, 224, "28 px"),  # the median, not the largest
    ([(120, 90)] * 5, 224, "90 px"),  # the shorter side: 90 < 112
    ([(120, 112)] * 5, 224, None),  # half of img_size is not far smaller
    ([(20, 20)] * 5, 32, None),  # upscaled 1.6x: fine
    ([], 224, None),  # nothing readable: nothing said
])
def test_the_median_shorter_side_below_half_the_input_is_what_warns(sizes, img_size, said):
    line = small_images(sizes, img_size, 16)
    assert (line is None) if said is None else (said in line)


@pytest.mark.parametrize("model, patches", [({"name": "resnet18", "arch": "resnet18"}, False),
                                            ({"name": "vit_micro"}, True)])
def test_a_model_without_patches_is_not_told_about_patches(tmp_path, make_config, model, patches):
    """A ResNet on tiny images: the fix names model.img_size only (it read 'patch 16' and a model.patch_size it has
    no use for); a ViT's names both."""
    from vit_train.data.loaders import reads_patch_size

    cfg = make_config(model={**model, "img_size": 224, "patch_size": 16})
    line = small_images([(28, 28)] * 5, 224, reads_patch_size(cfg))
    assert line.endswith("set model.img_size=32 model.patch_size=4" if patches else "set model.img_size=32"), line
    assert ("patch" in line) == patches
