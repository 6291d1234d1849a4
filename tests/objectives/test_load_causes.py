"""Each refusal that names a cause derives it from the values compared: tried with an input that triggers it
for that cause and one that triggers it for another, the two lines name different causes, each the true one.

A whole file of another architecture is not "incomplete" (timm's pre_norm ViT was once told to "give the
whole state dict"); a file with tensors cut out is; a healthy checkpoint at another image size is not
"edited or damaged" (tests/tools/test_eval_sizes.py); positions of a rectangular grid are not "no ViT"."""

from __future__ import annotations

import pytest
import torch

from helpers.configs import tiny_config
from vit_train.errors import ConfigError
from vit_train.models.vit import VisionTransformer
from vit_train.objectives.distill import Distill
from vit_train.objectives.teacher import load_teacher
from vit_train.objectives.weights_in import load_pretrained
from vit_train.train.trainer import train

SHAPE = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=10)


def refused(path) -> str:
    with pytest.raises(ConfigError) as info:
        load_pretrained(VisionTransformer(**SHAPE), path)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_another_architecture_and_a_cut_file_name_their_own_causes(tmp_path):
    timm = pytest.importorskip("timm")
    torch.save(timm.models.vision_transformer.VisionTransformer(**SHAPE, pre_norm=True).state_dict(), tmp_path / "a.pth")
    cut = {k: v for k, v in VisionTransformer(**SHAPE).state_dict().items() if not k.startswith("blocks.1.mlp.")}
    torch.save(cut, tmp_path / "b.pth")
    whole, partial = refused(tmp_path / "a.pth"), refused(tmp_path / "b.pth")
    assert "is another architecture than this model: a norm before the blocks" in whole
    assert "give the whole state dict" not in whole and "lacks" not in whole
    assert partial == ("model.pretrained: b.pth lacks 4 trained tensors of this network (blocks.1.mlp.fc1.weight, "
                       "blocks.1.mlp.fc1.bias, blocks.1.mlp.fc2.weight, blocks.1.mlp.fc2.bias); they would start at "
                       "their init inside trained weights: the file is cut or edited, give the whole state dict")


def test_a_missing_bias_beside_its_weight_is_the_architecture_a_missing_layer_is_a_cut(tmp_path):
    state = VisionTransformer(**SHAPE).state_dict()
    no_bias = {k: v for k, v in state.items() if not k.endswith("attn.proj.bias")}
    torch.save(no_bias, tmp_path / "a.pth")
    torch.save({k: v for k, v in state.items() if not k.startswith("blocks.0.attn.proj.")}, tmp_path / "b.pth")
    assert "is another architecture than this model: no bias in attn.proj;" in refused(tmp_path / "a.pth")
    assert "lacks 2 trained tensors of this network (blocks.0.attn.proj.weight, blocks.0.attn.proj.bias)" in \
        refused(tmp_path / "b.pth")


def test_positions_of_a_rectangular_grid_say_so_a_known_architecture_difference_names_the_field(tmp_path):
    timm = pytest.importorskip("timm")
    wide = timm.models.vision_transformer.VisionTransformer(**{**SHAPE, "img_size": (16, 32)}).state_dict()
    torch.save(wide, tmp_path / "a.pth")
    torch.save(VisionTransformer(**{**SHAPE, "patch_size": 8}).state_dict(), tmp_path / "b.pth")
    assert refused(tmp_path / "a.pth") == (
        "pretrained pos_embed has 33 positions, which is no square patch grid after its 1 prefix tokens (cls) nor "
        "without them; this ViT's patch grid is square, so its positions cannot be matched")
    assert "holds another network: model.patch_size=8 (here 4); set model.patch_size=8" in refused(tmp_path / "b.pth")


def test_a_teacher_that_fits_at_no_size_is_damaged_a_teacher_at_another_size_is_not(tmp_path):
    run = tmp_path / "teacher"
    train(tiny_config(trainer={"max_steps": 1}), run)
    teacher, _ = load_teacher(Distill(teacher=str(run)), 10, 32)  # trained at 16, the student's 32: positions resized
    assert teacher.pos_embed.shape[1] == 1 + (32 // 4) ** 2
    ckpt = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    ckpt["model"]["blocks.0.mlp.fc1.weight"] = ckpt["model"]["blocks.0.mlp.fc1.weight"][:, :5]
    torch.save(ckpt, tmp_path / "cut.pt")
    with pytest.raises(ConfigError, match=r"its weights do not fit the network its config names \(size mismatch for "
                                          r"blocks.0.mlp.fc1.weight.*the file was edited or damaged"):
        load_teacher(Distill(teacher=str(tmp_path / "cut.pt")), 10, 32)


def test_one_blocks_bias_or_half_a_norm_missing_is_a_cut_file_not_an_architecture(tmp_path):
    state = VisionTransformer(**SHAPE).state_dict()
    torch.save({k: v for k, v in state.items() if k != "blocks.1.mlp.fc2.bias"}, tmp_path / "a.pth")
    torch.save({k: v for k, v in state.items() if k != "norm.weight"}, tmp_path / "b.pth")
    torch.save({k: v for k, v in state.items() if not k.startswith("norm.")}, tmp_path / "c.pth")
    assert "lacks 1 trained tensors of this network (blocks.1.mlp.fc2.bias)" in refused(tmp_path / "a.pth")
    assert "lacks 1 trained tensors of this network (norm.weight)" in refused(tmp_path / "b.pth")
    assert "is another architecture than this model: no final norm (norm.*)" in refused(tmp_path / "c.pth")


def test_an_unknown_tensor_is_not_called_another_architecture(tmp_path):
    state = VisionTransformer(**SHAPE).state_dict() | {"foo.bar": torch.ones(3)}
    torch.save(state, tmp_path / "a.pth")
    assert refused(tmp_path / "a.pth") == (
        "model.pretrained: a.pth holds tensors this ViT has no place for (foo.bar); if its network computed with "
        "them, loading without them is another function, so they are not dropped unasked: save the state dict "
        "without them if they are not part of it (a training tool's extras)")


@pytest.mark.parametrize("pos", ["none", "sincos-with-class-position"])
def test_positions_into_fixed_sincos_ones_are_compared_not_dropped(tmp_path, pos):
    """No positions at all, or the sin-cos table with a trained class-token position, into model.pos_embed=sincos2d:
    the fixed table would replace them, another function (the fixed table's prefix positions are zero)."""
    fixed = VisionTransformer(**SHAPE, pos_embed="sincos2d")
    state = {k: v.clone() for k, v in fixed.state_dict().items()}
    if pos == "none":
        del state["pos_embed"]
        said = "no position embeddings (pos_embed; this model adds fixed sin-cos ones)"
    else:
        state["pos_embed"][0, 0] = 0.5
        said = "holds another network: model.pos_embed=learned (here sincos2d); set model.pos_embed=learned"
    torch.save(state, tmp_path / "a.pth")
    with pytest.raises(ConfigError) as info:
        load_pretrained(VisionTransformer(**SHAPE, pos_embed="sincos2d"), tmp_path / "a.pth")
    assert said in str(info.value)


def test_positions_that_read_as_two_grids_are_refused_a_recorded_size_decides(tmp_path):
    """9 positions with a class token and 4 registers: 3x3 patches (timm's no_embed_class) or 5 prefix positions
    and 2x2 patches. A plain file cannot say which (a guess loaded another function); a vit-train file's
    config does."""
    timm = pytest.importorskip("timm")
    shape = {**SHAPE, "img_size": 12}
    theirs = timm.models.vision_transformer.VisionTransformer(**shape, reg_tokens=4, no_embed_class=True).eval()
    torch.save(theirs.state_dict(), tmp_path / "a.pth")
    with pytest.raises(ConfigError, match=r"pos_embed's 9 positions read two ways: a 2x2 patch grid after positions "
                                          r"for its 5 prefix tokens \(cls, reg0, reg1, reg2, reg3\), or a 3x3 grid"):
        load_pretrained(VisionTransformer(**shape, reg_tokens=4), tmp_path / "a.pth")
    ours = VisionTransformer(**{**shape, "img_size": 8, "patch_size": 4}, reg_tokens=4)  # 2x2 + 5 prefix: 9 too
    torch.save({"model": ours.state_dict(), "config": {"model": {"img_size": 8, "patch_size": 4}}}, tmp_path / "b.pt")
    from vit_train.models.pretrained import map_pos_embed
    names = ["cls", "reg0", "reg1", "reg2", "reg3"]
    pos = map_pos_embed(ours.pos_embed.detach(), names, names, 2, source_grid=2)
    assert torch.equal(pos, ours.pos_embed.detach())


def test_another_width_from_a_plain_file_asks_for_the_head_count_it_cannot_show(tmp_path):
    """Following "set model.embed_dim=64 ..." alone split a plain file's qkv into the model's head count: another
    function, loaded silently. A plain file's refusal asks for model.num_heads too; a recorded one names it."""
    torch.save(VisionTransformer(**{**SHAPE, "embed_dim": 64, "num_heads": 4}).state_dict(), tmp_path / "a.pth")
    assert refused(tmp_path / "a.pth").endswith(
        "set model.embed_dim=64 to load it, and model.num_heads as the weights were trained (their tensors cannot "
        "show it) (loaded into this one it would compute another function)")
