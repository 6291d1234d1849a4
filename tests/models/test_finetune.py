"""model.pretrained: timm and vit-train weights, resized position embeddings, a re-initialised head."""

import pytest
import torch

from vit_train.errors import ConfigError
from vit_train.models.vit import VisionTransformer
from vit_train.models.pretrained import resize_pos_embed
from vit_train.objectives.weights_in import load_pretrained
from vit_train.train.trainer import train

timm = pytest.importorskip("timm")
SHAPE = dict(patch_size=4, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0)


def timm_model(img_size=16, num_classes=10, **kwargs):
    torch.manual_seed(1)
    return timm.models.vision_transformer.VisionTransformer(img_size=img_size, num_classes=num_classes, **SHAPE,
                                                             **kwargs).eval()


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_timm_weights_of_the_same_shape_give_identical_outputs(tmp_path, suffix):
    reference = timm_model()
    path = tmp_path / f"timm{suffix}"
    if suffix == ".pth":
        torch.save(reference.state_dict(), path)
    else:
        from safetensors.torch import save_file
        save_file(reference.state_dict(), str(path))
    model = VisionTransformer(img_size=16, num_classes=10, **SHAPE).eval()
    report = load_pretrained(model, path)
    assert report["resized"] == report["reinitialised"] == report["ignored"] == []
    assert sorted(report["loaded"]) == sorted(reference.state_dict())
    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=0, atol=1e-6)


def test_other_grid_and_class_count_resize_positions_and_reinit_the_head(tmp_path):
    reference = timm_model(img_size=16, num_classes=10)  # 4x4 patches + class token
    with torch.no_grad():
        reference.pos_embed[:, 1:] = torch.arange(32.0)  # the same value at every patch position
    torch.save(reference.state_dict(), tmp_path / "w.pth")
    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, num_classes=5, **SHAPE)  # 8x8 patches, 5 classes
    fresh_head = model.head.weight.detach().clone()
    report = load_pretrained(model, tmp_path / "w.pth", reset_head=True)  # 10 classes -> 5: a new head, as asked
    assert report["resized"] == ["pos_embed (1, 17, 32) -> (1, 65, 32)"]
    assert [r.split(" ")[0] for r in report["reinitialised"]] == ["head.weight", "head.bias"]
    assert "10 classes in the file, 5 here" in report["reinitialised"][0]
    # interpolating a constant gives that constant at every new position; the class token's is kept
    torch.testing.assert_close(model.pos_embed[0, 1:], torch.arange(32.0).expand(64, 32))
    torch.testing.assert_close(model.pos_embed[0, 0], reference.pos_embed[0, 0])
    torch.testing.assert_close(model.blocks[1].mlp.fc2.weight, reference.blocks[1].mlp.fc2.weight)
    assert torch.equal(model.head.weight, fresh_head)


def test_position_resizing_adds_or_drops_the_class_token_slot():
    pos = torch.randn(1, 1 + 16, 8)
    assert torch.equal(resize_pos_embed(pos, num_prefix=0, grid=4), pos[:, 1:])
    added = resize_pos_embed(pos[:, 1:], num_prefix=1, grid=4)
    assert torch.equal(added[:, 0], torch.zeros(1, 8)) and torch.equal(added[:, 1:], pos[:, 1:])
    with pytest.raises(ConfigError, match="no square patch grid"):
        resize_pos_embed(torch.randn(1, 7, 8), num_prefix=1, grid=4)


def test_fixed_sincos_positions_load_as_the_same_function_and_learned_ones_are_refused(tmp_path):
    """Positions are compared by their values: a file whose pos_embed is the fixed sin-cos table (an MAE
    encoder's, a sincos2d run's) loads into a sincos2d model (its own table kept: the same values) and into a
    learned one (fine-tuning starts from the table); learned positions into fixed ones would be dropped:
    another function, refused naming model.pos_embed."""
    fixed = VisionTransformer(img_size=16, num_classes=10, pos_embed="sincos2d", **SHAPE)
    state = fixed.state_dict() | {"dist_token": torch.zeros(1, 1, 32)}
    torch.save({"model": state}, tmp_path / "deit_style.pth")  # DeiT wraps its weights in "model"
    model = VisionTransformer(img_size=16, num_classes=10, pos_embed="sincos2d", **SHAPE)
    report = load_pretrained(model, tmp_path / "deit_style.pth")
    assert sorted(report["ignored"]) == ["dist_token", "pos_embed"] and torch.equal(model.pos_embed, fixed.pos_embed)
    torch.save(fixed.state_dict(), tmp_path / "fixed.pth")
    learned = VisionTransformer(img_size=16, num_classes=10, **SHAPE)
    load_pretrained(learned, tmp_path / "fixed.pth")
    assert torch.equal(learned.pos_embed.detach(), fixed.pos_embed)
    torch.save(timm_model().state_dict(), tmp_path / "learned.pth")
    with pytest.raises(ConfigError, match=r"holds another network: model.pos_embed=learned \(here sincos2d\); set "
                                          r"model.pos_embed=learned to load it"):
        load_pretrained(VisionTransformer(img_size=16, num_classes=10, pos_embed="sincos2d", **SHAPE),
                        tmp_path / "learned.pth")


@pytest.mark.parametrize("change, message", [
    ({"embed_dim": 64, "num_heads": 2}, r"holds another network: model.embed_dim=32 \(here 64\); set model.embed_dim=32"),
])
def test_weights_of_another_width_are_refused_naming_the_key(tmp_path, change, message):
    torch.save(timm_model().state_dict(), tmp_path / "w.pth")
    model = VisionTransformer(img_size=16, num_classes=10, **(SHAPE | change))
    with pytest.raises(ConfigError, match=message):
        load_pretrained(model, tmp_path / "w.pth")


def test_missing_file_and_foreign_weights_are_explained(tmp_path):
    model = VisionTransformer(img_size=16, num_classes=10, **SHAPE)
    with pytest.raises(ConfigError, match="does not exist"):
        load_pretrained(model, tmp_path / "nope.pth")
    torch.save({"conv1.weight": torch.zeros(3)}, tmp_path / "resnet.pth")
    with pytest.raises(ConfigError, match="no tensor in .* fits this model"):
        load_pretrained(model, tmp_path / "resnet.pth")


def test_a_run_fine_tunes_from_another_runs_checkpoint_at_a_larger_size(tmp_path, make_config, caplog):
    train(make_config(trainer={"max_steps": 2}), tmp_path / "first")
    source = torch.load(tmp_path / "first" / "checkpoints" / "last.pt", weights_only=True)["model"]
    cfg = make_config(model={"img_size": 32, "pretrained": str(tmp_path / "first" / "checkpoints" / "last.pt")},
                      trainer={"max_steps": 1}, optim={"lr": 1e-9}, schedule={"min_lr": 0.0})
    with caplog.at_level("INFO", logger="vit_train"):
        train(cfg, tmp_path / "second")
    assert "resized: pos_embed (1, 17, 32) -> (1, 65, 32)" in caplog.text
    tuned = torch.load(tmp_path / "second" / "checkpoints" / "last.pt", weights_only=True)["model"]
    torch.testing.assert_close(tuned["blocks.0.attn.qkv.weight"], source["blocks.0.attn.qkv.weight"], atol=1e-6,
                               rtol=0)  # one step at lr 1e-9 moves nothing visibly
