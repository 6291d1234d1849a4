"""model=resnet18 / resnet50: torchvision's networks, a 3x3 stem without max-pool for small images."""

import pytest
import torch
import torchvision

from vit_train.models.families.resnet import build_resnet
from vit_train.errors import ConfigError
from vit_train.train.trainer import train


@pytest.mark.parametrize("arch", ["resnet18", "resnet50"])
def test_imagenet_sized_resnet_is_torchvisions_own(arch):
    ours = build_resnet(arch, 1000, 224)
    theirs = torchvision.models.get_model(arch, weights=None)
    theirs.load_state_dict(ours.state_dict(), strict=True)  # the same names and shapes
    if arch == "resnet18":  # the same module types too (resnet50 is checked by names and shapes: it is slow on CPU)
        x = torch.randn(1, 3, 32, 32)
        with torch.no_grad():
            torch.testing.assert_close(ours.eval()(x), theirs.eval()(x), rtol=0, atol=0)


@pytest.mark.parametrize("arch, params", [("resnet18", 11_173_962), ("resnet50", 23_520_842)])
def test_small_images_get_a_3x3_stem_without_max_pool(arch, params):
    net = build_resnet(arch, 10, 32)
    assert net.conv1.kernel_size == (3, 3) and net.conv1.stride == (1, 1) and isinstance(net.maxpool, torch.nn.Identity)
    assert sum(p.numel() for p in net.parameters()) == params  # 11.2M / 23.5M, as CIFAR ResNets are quoted
    if arch == "resnet18":
        trunk = torch.nn.Sequential(*list(net.children())[:-2])
        assert trunk(torch.randn(1, 3, 32, 32)).shape[-2:] == (4, 4)  # 32 -> 32, 16, 8, 4: no stem downsampling


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_a_resnet_trains_evaluates_and_exports(tmp_path, make_config):
    pytest.importorskip("onnxscript")
    from vit_train.tools.export import export
    from vit_train.tools.inference import load_for_inference
    from vit_train.tools.report import evaluate_checkpoint

    cfg = make_config(model={"arch": "resnet18", "name": "resnet18"}, optim={"name": "sgd", "lr": 0.05},
                      trainer={"max_steps": 3})
    results = train(cfg, tmp_path)
    assert results["status"] == "completed" and results["final_top1"] is not None
    last = tmp_path / "checkpoints" / "last.pt"
    report = evaluate_checkpoint(last, attention_images=2, out_dir=tmp_path / "eval", progress=False)
    assert report["images"] == 128
    exported = export(load_for_inference(last), "onnx", tmp_path / "resnet.onnx")
    assert exported.get("max_abs_diff", 0.0) < 1e-3


@pytest.mark.parametrize("extra, message", [
    ({"model": {"distilled": True}}, "model.distilled is a key of model.arch=vit, not of model.arch=resnet50"),
    ({"optim": {"layer_decay": 0.7}}, "optim.layer_decay is for networks of numbered layers; model.arch=resnet50 has "
                                      "none: set optim.layer_decay=null"),
    ({"model": {"trainable": "head"}}, "model.trainable is a key of model.arch=vit, not of model.arch=resnet50")])
def test_vit_only_options_on_a_resnet_are_refused(make_config, extra, message):
    sections = {"model": {"arch": "resnet50", **extra.get("model", {})}, **{k: v for k, v in extra.items()
                                                                           if k != "model"}}
    with pytest.raises(ConfigError, match=message):
        make_config(**sections)


def test_vit_keys_on_a_resnet_are_refused_in_one_line_and_its_own_warn_nothing():
    """A ResNet carried the ViT's 14 keys, read by nothing (a warning at best): each family owns its keys."""
    from vit_train.config import Config
    from vit_train.schema.config import ignored_keys

    with pytest.raises(ConfigError, match=r"^model.reg_tokens is a key of model.arch=vit, not of model.arch=resnet18 "
                                          r"\(its keys: name, img_size, patch_size, pretrained, reset_head\); pick "
                                          r"a model of model.arch=vit or drop model.reg_tokens$"):
        Config.from_dict({"model": {"arch": "resnet18", "reg_tokens": 4}})
    assert ignored_keys(Config.from_dict({"model": {"arch": "resnet18"}})) == []
    assert ignored_keys(Config.from_dict({"model": {"arch": "resnet18", "patch_size": 8}})) == [
        "model.patch_size=8 has no effect with model.arch=resnet18; it applies only to families with patches "
        "(model.arch=vit)"]
