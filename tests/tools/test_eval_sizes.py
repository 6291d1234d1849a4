"""vit-eval / vit-predict at another model.img_size: a network whose shape follows the image size (a ResNet's
stem: 3x3 up to 64 pixels, else ImageNet's 7x7) does not fit its weights there. The refusal names that, derived
from the architectures compared, never "edited or damaged" of a healthy file; a file that fits at no size is."""

from __future__ import annotations

import pytest
import torch

from vit_train.errors import CheckpointError, ConfigError
from vit_train.tools.inference import load_for_inference
from vit_train.train.trainer import train


@pytest.fixture(scope="module")
def resnet_run(tmp_path_factory):
    from helpers.configs import tiny_config

    run_dir = tmp_path_factory.mktemp("resnet")
    train(tiny_config(model={"arch": "resnet18", "name": "resnet18"}, optim={"name": "sgd", "lr": 0.05},
                      trainer={"max_steps": 1}), run_dir)
    return run_dir / "checkpoints" / "last.pt"


def test_a_resnet_at_a_size_with_another_stem_is_refused_naming_the_stem(resnet_run):
    with pytest.raises(ConfigError) as info:
        load_for_inference(resnet_run, overrides={"model": {"img_size": 96}})
    assert str(info.value) == (f"ckpt={resnet_run} cannot run at model.img_size=96: the network is another at that size "
                               f"(model.stem=7x7 (ImageNet) at 96, 3x3 (small images) as trained); evaluate at "
                               f"model.img_size=16 (its own size: leave model.img_size out)")


def test_a_resnet_at_another_size_with_the_same_stem_evaluates(resnet_run):
    trained = load_for_inference(resnet_run, overrides={"model": {"img_size": 48}})
    assert trained.cfg.model.img_size == 48 and trained.model(torch.zeros(1, 3, 48, 48)).shape == (1, 10)


def test_a_file_that_fits_at_no_size_is_still_called_damaged(resnet_run, tmp_path):
    ckpt = torch.load(resnet_run, weights_only=True)
    ckpt["model"]["fc.weight"] = ckpt["model"]["fc.weight"][:, :7]
    torch.save(ckpt, tmp_path / "cut.pt")
    with pytest.raises(CheckpointError, match=r"its weights do not fit the network its config names \(size mismatch "
                                              r"for fc.weight.*the file was edited or damaged"):
        load_for_inference(tmp_path / "cut.pt", overrides={"model": {"img_size": 96}})
