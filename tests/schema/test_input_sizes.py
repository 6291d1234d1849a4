"""model.img_size and model.patch_size come from the data set, visibly: each data set's class says them
(its `input_size`), its Hydra node sets them, so `vit-train --cfg job` shows them; the model option, a
recipe and the command line (in any order) set others; a Config built in Python gets the same sizes from
the same class attribute."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from helpers.configs import composed
from helpers.runs import vit_train
from vit_train.config import Config, config_dir
from vit_train.schema.typed import options

CONFIGS = Path(config_dir())
DATA_OPTIONS = sorted(path.stem for path in (CONFIGS / "data").glob("*.yaml"))
DATASET_DEFAULTS = {name: cls.input_size for name, cls in options("data").items()}  # each data set's own


def printed_model(*args: str, cwd: Path) -> dict:
    """The model section `vit-train ARGS --cfg job` prints."""
    done = vit_train(*args, "--cfg", "job", cwd=cwd)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)["model"]


def test_every_data_option_has_sizes_in_the_table():
    assert sorted(DATASET_DEFAULTS) == DATA_OPTIONS


@pytest.mark.parametrize("data, size, patch", [  # one fast, the others slow: to keep `pytest` near 5 minutes
    pytest.param("cifar10", 32, 4, marks=pytest.mark.slow), pytest.param("cifar100", 32, 4, marks=pytest.mark.slow),
    pytest.param("imagefolder", 224, 16, marks=pytest.mark.slow), ("shapes", 32, 4)])
def test_print_config_shows_the_data_sets_sizes(data, size, patch, tmp_path):
    model = printed_model(f"data={data}", cwd=tmp_path)
    assert (model["img_size"], model["patch_size"]) == (size, patch) == DATASET_DEFAULTS[data]


def test_a_command_line_size_wins_before_or_after_the_data_option(tmp_path):
    model = printed_model("model.patch_size=8", "data=cifar10", cwd=tmp_path)  # the real command line, once
    assert (model["img_size"], model["patch_size"]) == (32, 8)
    model = composed(["data=cifar10", "model.patch_size=8"])["model"]
    assert (model["img_size"], model["patch_size"]) == (32, 8)


@pytest.mark.parametrize("args", [["model.img_size=64", "data=imagefolder", "model=vit_tiny"],
                                  ["model=vit_tiny", "data=imagefolder", "model.img_size=64"]])
def test_a_command_line_size_wins_over_the_image_folder_default_in_either_order(args):
    model = composed(args)["model"]
    assert (model["img_size"], model["patch_size"], model["embed_dim"]) == (64, 16, 192)


def test_a_model_option_and_a_recipe_that_set_sizes_win(tmp_path):
    configs = tmp_path / "configs"
    shutil.copytree(CONFIGS, configs)
    (configs / "model" / "vit_p14.yaml").write_text("name: vit_p14\npatch_size: 14\n")
    (configs / "experiment" / "big_patches.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /data: cifar10\n\nmodel:\n  patch_size: 8\n")
    model = composed(["model=vit_p14", "data=imagefolder"], configs)["model"]
    assert (model["img_size"], model["patch_size"]) == (224, 14)
    model = composed(["experiment=big_patches"], configs)["model"]
    assert (model["img_size"], model["patch_size"]) == (32, 8)
    model = composed(["experiment=big_patches", "model.patch_size=16"], configs)["model"]
    assert (model["img_size"], model["patch_size"]) == (32, 16)


def test_a_config_built_in_python_gets_the_same_sizes():
    assert (Config().model.img_size, Config().model.patch_size) == (None, None)  # filled on validation
    cfg = Config().validate()
    assert (cfg.model.img_size, cfg.model.patch_size) == (32, 4)
    cfg = Config.from_dict({"data": {"name": "imagefolder", "root": "/somewhere"}})
    assert (cfg.model.img_size, cfg.model.patch_size) == (224, 16)
    cfg = Config.from_dict({"data": {"name": "imagefolder", "root": "/somewhere"}, "model": {"patch_size": 14}})
    assert (cfg.model.img_size, cfg.model.patch_size) == (224, 14)


@pytest.mark.parametrize("data", DATA_OPTIONS)
def test_the_composed_and_the_python_sizes_agree(data):
    plain = composed([f"data={data}"] + ["data.root=/somewhere"] * options("data")[data].encoded)
    filled = Config.from_dict({"data": plain["data"]}).model
    assert (plain["model"]["img_size"], plain["model"]["patch_size"]) == (filled.img_size, filled.patch_size)
