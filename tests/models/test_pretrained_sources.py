"""model.pretrained= with weights from other tools: torchvision's ViT, timm's distilled DeiT, state
dicts saved through DDP / DataParallel / AveragedModel / torch.compile wrappers in any nesting; a
file that is none of these is refused in one line naming what it holds."""

import inspect

import pytest
import torch
import torchvision
from torch import nn
from torch.optim.swa_utils import AveragedModel

from vit_train.errors import ConfigError
from vit_train.models.vit import VisionTransformer
from vit_train.objectives.weights_in import load_pretrained

SHAPE = dict(patch_size=4, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0)


def logits(model: nn.Module, size: int) -> torch.Tensor:
    torch.manual_seed(3)
    with torch.no_grad():
        return model.eval()(torch.randn(2, 3, size, size))


@pytest.mark.slow  # two ViT-B/16 (86M parameters each) built, saved and loaded: ~10 s alone, a minute on a busy CPU
def test_torchvision_vit_b_16_gives_the_same_logits(tmp_path):
    torch.manual_seed(0)
    reference = torchvision.models.vit_b_16(weights=None, image_size=32).eval()  # a 2x2 patch grid, for speed
    with torch.no_grad():  # torchvision zero-initialises its head; make the logits carry information
        nn.init.normal_(reference.heads.head.weight, std=0.02)
        nn.init.normal_(reference.heads.head.bias, std=0.02)
    torch.save(reference.state_dict(), tmp_path / "vit_b_16.pth")
    model = VisionTransformer(img_size=32, patch_size=16, embed_dim=768, depth=12, num_heads=12, num_classes=1000)
    report = load_pretrained(model, tmp_path / "vit_b_16.pth")
    assert report["resized"] == report["reinitialised"] == report["ignored"] == []
    assert len(report["loaded"]) == len(model.state_dict())
    torch.testing.assert_close(logits(model, 32), logits(reference, 32), rtol=0, atol=1e-5)


def test_torchvision_weights_give_the_same_logits_and_resize(tmp_path):
    """torchvision's VisionTransformer, the class vit_b_16 and vit_l_16 build, at a small width."""
    torch.manual_seed(0)
    reference = torchvision.models.VisionTransformer(image_size=16, patch_size=4, num_layers=2, num_heads=2,
                                                     hidden_dim=32, mlp_dim=64, num_classes=10)
    torch.save({"model": reference.state_dict()}, tmp_path / "tv.pth")
    same = VisionTransformer(img_size=16, num_classes=10, **SHAPE)
    load_pretrained(same, tmp_path / "tv.pth")
    torch.testing.assert_close(logits(same, 16), logits(reference, 16), rtol=0, atol=1e-5)
    model = VisionTransformer(img_size=32, num_classes=5, **SHAPE)
    report = load_pretrained(model, tmp_path / "tv.pth", reset_head=True)  # 10 classes -> 5: a new head, as asked
    assert report["resized"] == ["pos_embed (1, 17, 32) -> (1, 65, 32)"]
    assert [r.split(" ")[0] for r in report["reinitialised"]] == ["head.weight", "head.bias"]
    assert torch.equal(model.blocks[1].attn.qkv.weight, reference.encoder.layers[1].self_attention.in_proj_weight)
    assert torch.equal(model.blocks[0].mlp.fc2.bias, reference.encoder.layers[0].mlp[3].bias)
    assert torch.equal(model.pos_embed[0, 0], reference.encoder.pos_embedding[0, 0])


def wrapped(model: nn.Module) -> dict[str, nn.Module]:
    """The model inside the wrappers users save through, in several nestings and orders."""
    compiled = torch.compile(model)  # lazy: nothing is compiled until it is called
    return {"DataParallel(compile)": nn.DataParallel(compiled), "compile(DataParallel)": torch.compile(nn.DataParallel(model)),
            "AveragedModel(compile)": AveragedModel(compiled), "DataParallel(DataParallel(compile))":
            nn.DataParallel(nn.DataParallel(compiled)), "Lightning-style": nn.ModuleDict({"model": nn.DataParallel(model)})}


@pytest.mark.parametrize("wrapper", list(wrapped(nn.Identity())))
def test_state_dicts_saved_through_wrappers_load(tmp_path, wrapper):
    torch.manual_seed(0)
    reference = VisionTransformer(img_size=16, num_classes=10, **SHAPE)
    state = wrapped(reference)[wrapper].state_dict()
    assert all(not k.startswith(("patch_embed", "blocks")) for k in state)  # every key carries a prefix
    torch.save({"state_dict": state}, tmp_path / "w.pth")
    torch.manual_seed(1)
    model = VisionTransformer(img_size=16, num_classes=10, **SHAPE)
    report = load_pretrained(model, tmp_path / "w.pth")
    assert report["reinitialised"] == [] and report["resized"] == []
    torch.testing.assert_close(logits(model, 16), logits(reference, 16), rtol=0, atol=0)


def timm_distilled(img_size: int = 16):
    timm = pytest.importorskip("timm")
    torch.manual_seed(2)
    return timm.models.deit.VisionTransformerDistilled(img_size=img_size, num_classes=10, **SHAPE).eval()


@pytest.mark.parametrize("img_size", [16, 32])
def test_a_distilled_deit_loads_into_a_plain_model_without_its_distillation_token(tmp_path, img_size):
    reference = timm_distilled()
    torch.save({"model": reference.state_dict()}, tmp_path / "deit_distilled.pth")  # DeiT's checkpoint layout
    model = VisionTransformer(img_size=img_size, num_classes=10, **SHAPE)
    report = load_pretrained(model, tmp_path / "deit_distilled.pth")
    assert sorted(report["ignored"]) == ["dist_token", "head_dist.bias", "head_dist.weight"]
    assert report["resized"] == [f"pos_embed (1, 18, 32) -> (1, {1 + (img_size // 4) ** 2}, 32)"]
    pos = reference.pos_embed.detach()
    torch.testing.assert_close(model.pos_embed[:, 0], pos[:, 0], rtol=0, atol=0)  # the class token's; not dist's
    if img_size == 16:
        torch.testing.assert_close(model.pos_embed[:, 1:], pos[:, 2:], rtol=0, atol=0)
    for name in ("cls_token", "head.weight", "blocks.1.attn.qkv.weight", "norm.bias"):
        assert torch.equal(model.state_dict()[name], reference.state_dict()[name]), name


def test_a_distilled_deit_loads_into_a_distilled_model_with_the_same_logits(tmp_path):
    if "distilled" not in inspect.signature(VisionTransformer).parameters:
        pytest.skip("this model has no distillation token (model.distilled)")
    reference = timm_distilled()
    torch.save(reference.state_dict(), tmp_path / "deit_distilled.pth")
    model = VisionTransformer(img_size=16, num_classes=10, distilled=True, **SHAPE)
    report = load_pretrained(model, tmp_path / "deit_distilled.pth")
    assert report["ignored"] == report["resized"] == report["reinitialised"] == []
    torch.testing.assert_close(logits(model, 16), logits(reference, 16), rtol=0, atol=1e-5)


@pytest.mark.parametrize("content, held", [
    ([torch.zeros(2)], "it holds a list"),
    ({"epoch": 3, "optimizer": {"state": {}}}, "it holds a dict of 2 entries: epoch (int), optimizer (dict)"),
    (torch.zeros(3, 4), "it holds one tensor of shape (3, 4)"),
    ({"conv1.weight": torch.zeros(8, 3, 7, 7), "bn1.weight": torch.zeros(8), "fc.weight": torch.zeros(10, 8)},
     "it holds 3 tensors named like conv1.weight, bn1.weight, fc.weight, not ViT weights"),
])
def test_a_file_that_holds_no_vit_weights_is_refused_naming_what_it_holds(tmp_path, content, held):
    torch.save(content, tmp_path / "x.pth")
    model = VisionTransformer(img_size=16, num_classes=10, **SHAPE)
    with pytest.raises(Exception) as info:
        load_pretrained(model, tmp_path / "x.pth")
    assert held in str(info.value) and "\n" not in str(info.value)
    assert isinstance(info.value, ConfigError) or type(info.value).__name__ == "CheckpointError"


def test_a_lightning_checkpoint_named_with_equals_signs_loads(tmp_path):
    """Lightning saves `epoch=9-step=990.ckpt` holding {"state_dict": {"model.<name>": ...}, ...}
    (hydra-ecosystem/hydra#1577 is the same path refused by the override grammar unquoted)."""
    torch.manual_seed(0)
    reference = VisionTransformer(img_size=16, num_classes=10, **SHAPE)
    lightning = {"epoch": 9, "global_step": 990, "pytorch-lightning_version": "2.4.0", "lr_schedulers": [],
                 "state_dict": nn.ModuleDict({"model": reference}).state_dict(), "optimizer_states": [{"state": {}}]}
    path = tmp_path / "checkpoints" / "epoch=9-step=990.ckpt"
    path.parent.mkdir()
    torch.save(lightning, path)
    torch.manual_seed(1)
    model = VisionTransformer(img_size=16, num_classes=10, **SHAPE)
    assert load_pretrained(model, path)["reinitialised"] == []
    torch.testing.assert_close(logits(model, 16), logits(reference, 16), rtol=0, atol=0)


def test_positions_of_the_patches_only_load_beside_a_class_token(tmp_path):
    """timm's no_embed_class models (and MAE/BEiT-style checkpoints) hold pos_embed for the patches
    only, 196 rows where a model with a class token has 197 (microsoft/Cream#238)."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(2)
    reference = timm.models.vision_transformer.VisionTransformer(img_size=16, num_classes=10, no_embed_class=True,
                                                                 **SHAPE).eval()
    torch.save(reference.state_dict(), tmp_path / "w.pth")
    model = VisionTransformer(img_size=16, num_classes=10, **SHAPE)
    assert load_pretrained(model, tmp_path / "w.pth")["resized"] == ["pos_embed (1, 16, 32) -> (1, 17, 32)"]
    torch.testing.assert_close(logits(model, 16), logits(reference, 16), rtol=0, atol=1e-5)
