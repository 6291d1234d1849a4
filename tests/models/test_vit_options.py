"""The modern ViT options (registers, LayerScale, QK-norm) and DeiT's distillation token: the same
outputs as timm's VisionTransformer / VisionTransformerDistilled with the same weights, with every
pool and position embedding, and through attention maps, export and resume."""

import pytest
import torch

from helpers.cases import VIT_LAYOUTS, VIT_OPTIONS
from vit_train.models.vit import VisionTransformer
from vit_train.models.probe import set_trainable
from vit_train.train.trainer import train
from vit_train.viz.attention import attention_rollout, pooled_attention

SMALL = dict(img_size=32, patch_size=8, num_classes=10, embed_dim=32, depth=2, num_heads=2)


def randomized(model: torch.nn.Module) -> torch.nn.Module:
    """Every parameter drawn afresh, so no option hides behind its initial value (gamma 1e-5, norms at 1)."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model.eval()


def timm_twin(pool: str, **options):
    timm = pytest.importorskip("timm")
    layout = dict(global_pool="token") if pool == "cls" else dict(global_pool="avg", class_token=False, fc_norm=False)
    return timm.models.vision_transformer.VisionTransformer(**SMALL, **layout, **options).eval()


@pytest.mark.parametrize("pool, pos_embed", VIT_LAYOUTS)
@pytest.mark.parametrize("options", VIT_OPTIONS, ids=lambda o: "+".join(o))
def test_options_give_timms_outputs_with_the_same_weights(pool, pos_embed, options):
    model = randomized(VisionTransformer(**SMALL, pool=pool, pos_embed=pos_embed, **options))
    reference = timm_twin(pool, **options)
    reference.load_state_dict(model.state_dict(), strict=True)  # the same names and shapes: no converter
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        ours, theirs = model(x), reference(x)
    print(f"{pool}/{pos_embed}/{options}: max abs diff {(ours - theirs).abs().max().item():.2e}")
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    assert not torch.allclose(ours, VisionTransformer(**SMALL, pool=pool, pos_embed=pos_embed).eval()(x))


def test_option_parameters_carry_timms_names():
    model = VisionTransformer(**SMALL, reg_tokens=4, init_values=1e-5, qk_norm=True, distilled=True)
    names = set(model.state_dict())
    assert {"reg_token", "dist_token", "head_dist.weight", "blocks.0.ls1.gamma", "blocks.1.ls2.gamma",
            "blocks.0.attn.q_norm.weight", "blocks.0.attn.k_norm.bias"} <= names
    assert model.reg_token.shape == (1, 4, 32) and model.num_prefix_tokens == 6
    assert model.pos_embed.shape == (1, 6 + 16, 32)  # every prefix token has a position, as timm's default
    assert torch.equal(model.blocks[0].ls1.gamma, torch.full((32,), 1e-5))
    plain = VisionTransformer(**SMALL)
    assert set(plain.state_dict()) == names - {n for n in names if any(
        k in n for k in ("reg_token", "dist_token", "head_dist", "ls1", "ls2", "q_norm", "k_norm"))}


@pytest.mark.parametrize("pos_embed", ["learned", "sincos2d"])
def test_distilled_model_gives_timms_deit_outputs_in_eval_and_training(pos_embed):
    timm = pytest.importorskip("timm")
    model = randomized(VisionTransformer(**SMALL, pos_embed=pos_embed, distilled=True))
    reference = timm.models.deit.VisionTransformerDistilled(**SMALL).eval()
    reference.load_state_dict(model.state_dict(), strict=True)
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        ours, theirs = model(x), reference(x)
        print(f"distilled/{pos_embed}: max abs diff {(ours - theirs).abs().max().item():.2e}")
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)  # eval: the mean of the two heads
        model.train(), reference.train()
        reference.set_distilled_training(True)
        for a, b in zip(model(x, both_heads=True), reference(x)):  # training: (class head, distillation head)
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    cls_logits, dist_logits = model(x, both_heads=True)
    assert not torch.allclose(cls_logits, dist_logits)


def test_distilled_mean_pool_model_reads_patches_for_the_head_and_the_dist_token_for_head_dist():
    model = randomized(VisionTransformer(**SMALL, pool="mean", reg_tokens=2, distilled=True))
    assert model.cls_token is None and model.dist_index == 0 and model.num_prefix_tokens == 3
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        tokens = model.forward_features(x)
        expected = (model.head(tokens[:, 3:].mean(dim=1)) + model.head_dist(tokens[:, 0])) / 2
        torch.testing.assert_close(model(x), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("pool, pos_embed", VIT_LAYOUTS)
def test_the_class_token_shortcut_and_attention_maps_agree_with_the_full_forward(pool, pos_embed):
    model = randomized(VisionTransformer(**SMALL, pool=pool, pos_embed=pos_embed, reg_tokens=3, init_values=0.5,
                                         qk_norm=True, distilled=True))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        full = model.forward_head(model.forward_features(x))
        torch.testing.assert_close(model(x), full, rtol=0, atol=1e-5)
        logits, maps = model.attention_maps(x)
    torch.testing.assert_close(logits, full, rtol=0, atol=1e-5)
    tokens = model.num_prefix_tokens + 16
    assert [m.shape for m in maps] == [(2, 2, tokens, tokens)] * 2
    readout = model.readout_weights()
    assert readout.sum().item() == pytest.approx(1.0)
    rollout = attention_rollout(maps, model.num_prefix_tokens, readout)
    assert rollout.shape == (2, 16)  # patches only: no class, distillation or register token among them
    torch.testing.assert_close(rollout.sum(dim=1), torch.ones(2))
    assert pooled_attention(maps, model.num_prefix_tokens, readout).shape == (2, 2, 2, 16)


def test_rollout_reads_the_rows_the_heads_read():
    """With 2 prefix tokens (class, distillation) the pooled row is the mean of rows 0 and 1; a
    register-only prefix under mean pooling reads the patch rows, never the registers' rows."""
    tokens = 6  # 2 prefix + 4 patches
    weights = torch.zeros(1, 1, tokens, tokens)
    weights[0, 0, 0, 2] = weights[0, 0, 1, 3] = 1.0  # class -> patch 0, dist -> patch 1
    weights[0, 0, 2:, 5] = 1.0  # every patch -> patch 3
    distilled = torch.tensor([0.5, 0.5, 0, 0, 0, 0])
    torch.testing.assert_close(pooled_attention([weights], 2, distilled)[0, 0, 0], torch.tensor([0.5, 0.5, 0, 0]))
    patches = torch.tensor([0, 0, 0.25, 0.25, 0.25, 0.25])
    torch.testing.assert_close(pooled_attention([weights], 2, patches)[0, 0, 0], torch.tensor([0, 0, 0, 1.0]))


def test_onnx_export_of_a_model_with_every_option_matches_pytorch(tmp_path):
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")
    from vit_train.tools.onnx_export import export_onnx

    model = randomized(VisionTransformer(**SMALL, reg_tokens=2, init_values=0.5, qk_norm=True, distilled=True))
    result = export_onnx(model, 32, tmp_path / "model.onnx")
    print(f"ONNX max abs diff {result['max_abs_diff']:.2e}")
    assert result["checked"] and result["max_abs_diff"] < 1e-4


OPTIONS_MODEL = {"embed_dim": 32, "depth": 2, "num_heads": 2, "img_size": 16, "patch_size": 4, "reg_tokens": 2,
                 "init_values": 1e-4, "qk_norm": True, "distilled": True, "dropout": 0.1, "drop_path": 0.1}


def test_a_run_with_every_option_resumes_bit_for_bit(tmp_path, make_config):
    trainer = {"max_steps": 6, "ckpt_every": 1, "keep_last": 10}
    train(make_config(model=OPTIONS_MODEL, trainer=trainer), tmp_path / "whole")
    snapshot = tmp_path / "whole" / "checkpoints" / "step_00000003.pt"
    train(make_config(model=OPTIONS_MODEL, trainer=trainer, resume=str(snapshot)), tmp_path / "resumed")
    a = torch.load(tmp_path / "whole" / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "resumed" / "checkpoints" / "last.pt", weights_only=True)
    assert a["step"] == b["step"] == 6 and a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert not torch.equal(a["model"]["blocks.0.ls1.gamma"], torch.full((32,), 1e-4))  # the options trained
    for x, y in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert all(torch.equal(x[k], y[k]) for k in x)


@pytest.mark.parametrize("change", [{"reg_tokens": 0}, {"qk_norm": False}, {"distilled": False},
                                    {"init_values": None}])
def test_resuming_with_an_option_changed_is_refused_naming_it(tmp_path, make_config, change):
    from vit_train.errors import CheckpointError

    train(make_config(model=OPTIONS_MODEL, trainer={"max_steps": 1}), tmp_path)
    key = next(iter(change))
    with pytest.raises(CheckpointError, match=f"model.{key}"):
        train(make_config(model={**OPTIONS_MODEL, **change}, trainer={"max_steps": 2}, resume="auto"), tmp_path)


# --- linear probe ---------------------------------------------------------------------------------

def test_linear_probe_trains_only_the_heads_with_features_in_eval_mode():
    model = VisionTransformer(**SMALL, distilled=True, drop_rate=0.3, drop_path_rate=0.3)
    set_trainable(model, "head")
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        "head.weight", "head.bias", "head_dist.weight", "head_dist.bias"}
    model.train()
    assert model.training and model.head.training and not model.blocks.training and not model.pos_drop.training
    x = torch.randn(4, 3, 32, 32)
    torch.testing.assert_close(model(x), model(x))  # no dropout or drop path in the frozen features
    model(x).sum().backward()
    assert model.head.weight.grad is not None and model.blocks[0].attn.qkv.weight.grad is None


def test_figures_of_a_model_with_registers_and_a_distillation_token():
    pytest.importorskip("matplotlib")
    from vit_train.viz.figures import model_figures

    model = randomized(VisionTransformer(**SMALL, reg_tokens=2, distilled=True))
    figures = model_figures(model, torch.randn(2, 3, 32, 32), torch.tensor([0, 1]), [str(i) for i in range(10)],
                            ((0.5,) * 3, (0.25,) * 3))
    assert {"attention", "attention_heads", "position_similarity", "patch_filters"} <= set(figures)


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_the_mae_encoder_keeps_every_prefix_token(pool):
    """MAE's visible-only encoder prepends the model's own prefix tokens (class, registers) with their positions."""
    from vit_train.models.mae import MaskedAutoencoder

    encoder = randomized(VisionTransformer(**{**SMALL, "num_classes": 0}, pool=pool, reg_tokens=3, qk_norm=True,
                                           init_values=0.5))
    mae = MaskedAutoencoder(encoder, 0.0, decoder_dim=16, decoder_depth=1, decoder_heads=2).eval()
    images, noise = torch.randn(2, 3, 32, 32), torch.rand(2, 16)
    with torch.no_grad():
        latent, ids_restore, _ = mae.forward_encoder(images, noise)
        full = encoder.forward_features(images)
    P = encoder.num_prefix_tokens
    torch.testing.assert_close(latent[:, :P], full[:, :P], atol=1e-5, rtol=1e-5)
    restored = torch.gather(latent[:, P:], 1, ids_restore[..., None].expand(-1, -1, 32))
    torch.testing.assert_close(restored, full[:, P:], atol=1e-5, rtol=1e-5)
