"""Fine-tuning tools: layer-wise lr decay (BEiT/MAE rule, against the formula and timm), linear
probes (model.trainable=head) and evaluation at another resolution than training."""

import pytest
import torch

from vit_train.models.families.vit import ViT
from vit_train.optim.adamw import AdamW
from vit_train.schedules.cosine import Cosine
from vit_train.errors import CheckpointError, ConfigError
from vit_train.models.vit import VisionTransformer
from vit_train.models.probe import set_trainable
from vit_train.train.optim import build_optimizer, build_scheduler, param_groups
from vit_train.models.pretrained import resize_pos_embed
from vit_train.train.trainer import train

DEPTH = 3
SMALL = dict(img_size=16, patch_size=4, num_classes=5, embed_dim=16, depth=DEPTH, num_heads=2)
VIT = ViT()  # the family whose layers layer decay reads


def scale_by_name(model, groups) -> dict[str, tuple[float, float]]:
    """parameter name -> (lr scale, weight decay) of the group holding it."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: (g["lr_scale"], g["weight_decay"]) for g in groups for p in g["params"]}


def expected_scale(name: str, decay: float) -> float:
    """The BEiT/MAE rule written out: block i -> decay^(depth - i), embeddings decay^(depth + 1), rest 1."""
    if name.startswith(("cls_token", "dist_token", "reg_token", "pos_embed", "patch_embed")):
        return decay ** (DEPTH + 1)
    if name.startswith("blocks."):
        return decay ** (DEPTH - int(name.split(".")[1]))
    return 1.0


@pytest.mark.parametrize("options", [{}, {"reg_tokens": 2, "init_values": 1e-5, "qk_norm": True},
                                     {"distilled": True}], ids=["plain", "options", "distilled"])
def test_layer_decay_scales_follow_the_formula_and_timm(options):
    model = VisionTransformer(**SMALL, **options)
    ours = scale_by_name(model, param_groups(model, 0.05, layer_decay=0.75, family=VIT))
    assert set(ours) == {n for n, _ in model.named_parameters()}
    for name, (scale, _) in ours.items():
        assert scale == pytest.approx(expected_scale(name, 0.75)), name
    assert ours["blocks.0.attn.qkv.weight"][0] == pytest.approx(0.75 ** 3)
    assert ours["head.weight"] == (1.0, 0.05) and ours["norm.weight"] == (1.0, 0.0)
    timm = pytest.importorskip("timm")
    from timm.optim import param_groups_layer_decay

    twin_class = timm.models.deit.VisionTransformerDistilled if options.get("distilled") else \
        timm.models.vision_transformer.VisionTransformer
    twin = twin_class(**SMALL, **{k: v for k, v in options.items() if k != "distilled"})
    twin.load_state_dict(model.state_dict())
    theirs = scale_by_name(twin, param_groups_layer_decay(twin, 0.05, twin.no_weight_decay(), layer_decay=0.75))
    for name in ours:  # one known difference: timm puts the final norm with the last block, BEiT/MAE with the head
        timm_scale = 1.0 if name.startswith("norm.") else theirs[name][0]
        assert theirs[name][0] == pytest.approx(0.75 if name.startswith("norm.") else timm_scale), name
        assert ours[name][0] == pytest.approx(timm_scale) and ours[name][1] == theirs[name][1], name


def test_register_and_distillation_tokens_get_the_embeddings_rate_and_no_weight_decay():
    """timm #2712 and dinov2 #283: reg_token fell outside the embedding group (lr scale 1, decayed)."""
    model = VisionTransformer(**SMALL, reg_tokens=4, distilled=True)
    ours = scale_by_name(model, param_groups(model, 0.05, layer_decay=0.5, family=VIT))
    for name in ("reg_token", "dist_token", "cls_token", "pos_embed"):
        assert ours[name] == (pytest.approx(0.5 ** 4), 0.0), name
    plain = scale_by_name(model, param_groups(model, 0.05))
    assert plain["reg_token"] == plain["dist_token"] == (1.0, 0.0)


def test_each_groups_learning_rate_is_the_scheduled_rate_times_its_scale():
    """MAE #216 / timm #2532: an lr_scale the optimiser never applies leaves every layer at one rate."""
    model = VisionTransformer(**SMALL)
    cfg = AdamW(lr=1e-3, layer_decay=0.6)
    optimizer = build_optimizer(model, cfg, torch.device("cpu"), family=VIT)
    schedule = Cosine(warmup_epochs=1, min_lr=1e-5)
    scheduler = build_scheduler(optimizer, cfg, schedule, steps_per_epoch=4, total_steps=12)
    for step in range(12):
        factor = schedule.factor(step, 4, 12, 1e-3)
        for group in optimizer.param_groups:
            assert group["lr"] == pytest.approx(1e-3 * group["lr_scale"] * factor)
        optimizer.step()
        scheduler.step()
    assert len({g["lr"] for g in optimizer.param_groups}) == DEPTH + 2  # one rate per layer


def test_layer_decay_of_a_linear_probe_covers_only_the_head():
    """timm #2691: frozen parameters must not shift the trainable ones' scales."""
    model = VisionTransformer(**SMALL, distilled=True)
    set_trainable(model, "head")
    ours = scale_by_name(model, param_groups(model, 0.05, layer_decay=0.75, family=VIT))
    assert ours == {"head.weight": (1.0, 0.05), "head.bias": (1.0, 0.0), "head_dist.weight": (1.0, 0.05),
                    "head_dist.bias": (1.0, 0.0)}


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_a_linear_probe_reads_batch_normalised_features_as_mae_does(pool):
    """MAE's linear probe (He et al. 2022, A.2): BatchNorm without affine parameters before the head; in
    training the head's input is standardised over the batch, in eval it uses the running statistics."""
    torch.manual_seed(0)
    model = VisionTransformer(**{**SMALL, "num_classes": 3}, pool=pool)
    set_trainable(model, "head")
    seen = []
    model.head.register_forward_hook(lambda module, args, out: seen.append(args[0]))
    x = torch.randn(32, 3, 16, 16)
    model.train()(x)
    assert torch.allclose(seen[-1].mean(0), torch.zeros(16), atol=1e-5)
    assert torch.allclose(seen[-1].var(0, unbiased=False), torch.ones(16), atol=1e-3)
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["head.weight", "head.bias"]
    model.eval()(x)
    with torch.no_grad():
        tokens = model.forward_features(x)
        pooled = tokens[:, 0] if pool == "cls" else tokens.mean(1)
        norm = model.head_norm
        torch.testing.assert_close(seen[-1], (pooled - norm.running_mean) / (norm.running_var + 1e-6).sqrt())
        torch.testing.assert_close(model.train()(x[:1]), model.eval()(x[:1]))  # a batch of one: the running stats


@pytest.mark.parametrize("value", [0.0, 1.5, -0.2])
def test_layer_decay_outside_0_1_is_refused(make_config, value):
    with pytest.raises(ConfigError, match="optim.layer_decay must be in"):
        make_config(optim={"layer_decay": value})


def test_a_linear_probe_run_changes_only_the_head(tmp_path, make_config):
    base = tmp_path / "base"
    train(make_config(trainer={"max_steps": 2}), base)
    probe = make_config(model={"trainable": "head", "pretrained": str(base / "checkpoints" / "last.pt"),
                               "dropout": 0.2}, optim={"layer_decay": 0.75}, trainer={"max_steps": 3})
    train(probe, tmp_path / "probe")
    before = torch.load(base / "checkpoints" / "last.pt", weights_only=True)["model"]
    after = torch.load(tmp_path / "probe" / "checkpoints" / "last.pt", weights_only=True)["model"]
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {"head.weight", "head.bias"}
    with pytest.raises(CheckpointError, match="optim.layer_decay"):
        train(make_config(model=probe.to_dict()["model"], optim={"layer_decay": 0.5}, trainer={"max_steps": 4},
                          resume="auto"), tmp_path / "probe")


# --- evaluation at another resolution ---------------------------------------------------------------

@pytest.mark.parametrize("pos_embed", ["learned", "sincos2d"])
def test_eval_at_another_img_size_interpolates_positions(tmp_path, make_config, pos_embed):
    """timm #426: a distilled DeiT (two prefix positions) failed to resize to another image size."""
    from vit_train.tools.inference import load_for_inference

    model_cfg = {"img_size": 16, "patch_size": 4, "pos_embed": pos_embed, "reg_tokens": 2, "distilled": True}
    teacher = tmp_path / "teacher"  # a distillation token is trained by objective=distill, from a teacher
    train(make_config(model={"img_size": 16, "patch_size": 4}, trainer={"max_steps": 1}), teacher)
    train(make_config(model=model_cfg, trainer={"max_steps": 2},
                      objective={"name": "distill", "teacher": str(teacher / "checkpoints" / "last.pt")}), tmp_path / "run")
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    loaded = load_for_inference(last, "model", {"model": {"img_size": 32}})
    model = loaded.model
    assert loaded.cfg.model.img_size == 32 and model.patch_embed.grid_size == 8
    trained = loaded.checkpoint["model"]["pos_embed"]  # (1, class + dist + 2 registers + 16 patches, D)
    if pos_embed == "learned":  # the prefix positions kept, the 4x4 grid resized to 8x8 bicubically
        expected = resize_pos_embed(trained, 4, 8, source_prefix=4)
        assert torch.equal(model.pos_embed[:, :4], trained[:, :4])
    else:  # fixed: the table of the new grid
        expected = VisionTransformer(img_size=32, patch_size=4, embed_dim=32, pos_embed="sincos2d",
                                     reg_tokens=2, distilled=True).pos_embed
    torch.testing.assert_close(model.pos_embed.detach(), expected)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(ConfigError, match="model.patch_size cannot change"):
        load_for_inference(last, "model", {"model": {"patch_size": 8}})


def test_resized_learned_positions_at_the_same_grid_are_unchanged():
    pos = torch.randn(1, 3 + 16, 8)
    torch.testing.assert_close(resize_pos_embed(pos, 3, 4, source_prefix=3), pos)


def test_vit_eval_at_another_img_size(tmp_path, make_config):
    from vit_train.cli.commands import parse_args
    from vit_train.tools.report import evaluate_checkpoint

    train(make_config(trainer={"max_steps": 2}), tmp_path)
    _, overrides = parse_args(["ckpt=x", "model.img_size=32"], {"ckpt": ...}, config=True)
    assert overrides == {"model": {"img_size": 32}}
    results = evaluate_checkpoint(tmp_path / "checkpoints" / "last.pt", overrides, attention_images=0,
                                  out_dir=tmp_path / "eval32", progress=False)
    assert results["images"] == 128 and 0 <= results["top1"] <= 100
    with pytest.raises(ConfigError, match="unknown option 'model.depth'"):
        parse_args(["ckpt=x", "model.depth=3"], {"ckpt": ...}, config=True)
