import pytest
import torch

from vit_train.models.families.vit import ViT
from vit_train.models.vit import VisionTransformer, sincos_2d

SMALL = dict(img_size=32, patch_size=4, num_classes=10, embed_dim=64, depth=3, num_heads=4)


@pytest.mark.parametrize("ours, theirs", [
    (dict(pool="cls", pos_embed="learned"), dict(global_pool="token")),
    (dict(pool="mean", pos_embed="sincos2d"), dict(global_pool="avg", class_token=False, fc_norm=False)),
])
def test_outputs_equal_timm_with_same_weights(ours, theirs):
    timm = pytest.importorskip("timm")
    model = VisionTransformer(**SMALL, **ours).eval()
    reference = timm.models.vision_transformer.VisionTransformer(**SMALL, **theirs).eval()
    reference.load_state_dict(model.state_dict(), strict=True)  # same parameter names and shapes
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize("embed_dim, depth, heads, exact, published", [
    (192, 12, 3, 5_717_416, "5.7M"), (384, 12, 6, 22_050_664, "22M"), (768, 12, 12, 86_567_656, "86M"),
])
def test_named_sizes_have_the_papers_parameter_counts(embed_dim, depth, heads, exact, published):
    model = VisionTransformer(img_size=224, patch_size=16, num_classes=1000, embed_dim=embed_dim, depth=depth,
                              num_heads=heads)
    count = sum(p.numel() for p in model.parameters())
    assert count == exact  # DeiT-Ti/S/B and timm's counts; the papers print them as 5.7M / 22M / 86M
    assert f"{count / 1e6:.1f}".startswith(published.rstrip("M"))
    timm = pytest.importorskip("timm")
    reference = timm.models.vision_transformer.VisionTransformer(embed_dim=embed_dim, depth=depth, num_heads=heads)
    assert count == sum(p.numel() for p in reference.parameters())


def test_preset_yaml_sizes_match_the_papers():
    from omegaconf import OmegaConf
    from pathlib import Path
    folder = Path(__file__).resolve().parents[2] / "configs" / "model"
    expected = {"vit_tiny": (192, 12, 3), "vit_small": (384, 12, 6), "vit_base": (768, 12, 12),
                "vit_large": (1024, 24, 16)}
    for name, (dim, depth, heads) in expected.items():
        cfg = OmegaConf.load(folder / f"{name}.yaml")
        assert (cfg.embed_dim, cfg.depth, cfg.num_heads, cfg.mlp_ratio) == (dim, depth, heads, 4.0)


def test_attention_maps_come_from_the_same_computation_as_forward():
    model = VisionTransformer(**SMALL).eval()
    x = torch.randn(2, 3, 32, 32)
    logits, maps = model.attention_maps(x)
    torch.testing.assert_close(logits, model(x), rtol=0, atol=1e-5)
    assert len(maps) == 3
    for weights in maps:
        assert weights.shape == (2, 4, 65, 65)  # (B, heads, 1 + 8*8 tokens, same)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 65))


def test_class_token_forward_skips_only_work_the_head_never_reads():
    model = VisionTransformer(**SMALL, drop_path_rate=0.3).eval()
    x = torch.randn(3, 3, 32, 32)
    full = model.forward_head(model.forward_features(x))  # every token through every block
    torch.testing.assert_close(model(x), full, rtol=0, atol=1e-6)
    model.train()
    model(x).sum().backward()  # the shortcut trains: every parameter gets a gradient
    assert all(p.grad is not None for p in model.parameters())


def test_sincos_position_embedding_values():
    pe = sincos_2d(grid_size=3, dim=8)  # 2 frequencies per sin/cos, x then y
    omega = torch.tensor([1.0, 1e-4])  # 1 / 10000 ** (i / (dim/4 - 1))
    for index in range(9):
        row, col = divmod(index, 3)
        expected = torch.cat([(col * omega).sin(), (col * omega).cos(), (row * omega).sin(), (row * omega).cos()])
        torch.testing.assert_close(pe[index], expected)


def test_sincos_embedding_is_fixed_and_kept_in_state_dict():
    model = VisionTransformer(**SMALL, pos_embed="sincos2d")
    assert "pos_embed" in model.state_dict()
    assert "pos_embed" not in dict(model.named_parameters())
    assert torch.equal(model.pos_embed[0, 0], torch.zeros(64))  # the class token has no position


def test_stochastic_depth_and_dropout_act_only_in_training():
    model = VisionTransformer(**SMALL, drop_path_rate=0.5, drop_rate=0.1)
    x = torch.randn(8, 3, 32, 32)
    model.eval()
    torch.testing.assert_close(model(x), model(x))
    model.train()
    assert not torch.allclose(model(x), model(x))
    rates = [block.drop_path1.p for block in model.blocks]
    assert rates == pytest.approx([0.0, 0.25, 0.5])  # linear over depth


def test_init_follows_timm():
    torch.manual_seed(0)
    model = VisionTransformer(**SMALL)
    qkv = model.blocks[0].attn.qkv
    assert qkv.bias.abs().max() == 0
    assert qkv.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert qkv.weight.abs().max() <= 2.0  # truncated at +-2 (absolute), as timm's trunc_normal_
    assert model.cls_token.std().item() < 1e-5


def test_build_model_from_config():
    cfg = ViT(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, pool="mean")
    model = cfg.build(7)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 7)
    assert model.pos_embed.shape == (1, 16, 48)  # 4x4 patches, no class token
