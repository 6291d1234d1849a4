"""Masked autoencoder (vit_train/mae.py): masking, the visible-only encoder, the decoder, the loss.

Several tests turn public bug reports of other MAE implementations into inputs (named at each test).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from helpers.images import write_images
from vit_train.data.sources.shapes import generate_shapes
from vit_train.errors import ConfigError
from vit_train.models.mae import MaskedAutoencoder, MaskSampler, build_autoencoder, mae_flops_per_image, num_visible, patch_targets, patchify, reconstruct, reconstruction_loss, unpatchify
from vit_train.errors import ConfigError
from vit_train.objectives.mae import Mae, MaskedReconstruction
from vit_train.models.vit import VisionTransformer


def small_mae(pool: str = "cls", mask_ratio: float = 0.75, img_size: int = 16, patch_size: int = 4,
              pos_embed: str = "learned") -> MaskedAutoencoder:
    torch.manual_seed(0)
    encoder = VisionTransformer(img_size=img_size, patch_size=patch_size, num_classes=0, embed_dim=32, depth=2,
                                num_heads=2, pool=pool, pos_embed=pos_embed)
    return MaskedAutoencoder(encoder, mask_ratio, decoder_dim=16, decoder_depth=1, decoder_heads=2).eval()


def test_patchify_inverts_and_matches_the_patch_projection():
    images = torch.randn(2, 3, 16, 16)
    patches = patchify(images, 4)
    assert patches.shape == (2, 16, 48)
    assert torch.equal(unpatchify(patches, 4), images)
    assert torch.equal(patches[0, 5].reshape(4, 4, 3), images[0, :, 4:8, 4:8].permute(1, 2, 0))  # row 1, column 1


@pytest.mark.parametrize("pool", ["cls", "mean"])
@pytest.mark.parametrize("pos_embed", ["learned", "sincos2d"])
def test_without_masking_the_encoder_is_the_vision_transformer(pool, pos_embed):
    """The MAE path (patches picked from pixels, projection as a matrix product, positions gathered,
    prefix token prepended) computes what VisionTransformer.forward_features does; the offset of the
    class token's position is where lucidrains/vit-pytorch#253 went wrong."""
    model = small_mae(pool, mask_ratio=0.0, pos_embed=pos_embed)
    images, noise = torch.randn(3, 3, 16, 16), torch.rand(3, 16)
    latent, ids_restore, mask = model.forward_encoder(images, noise)
    full = model.encoder.forward_features(images)
    P = model.encoder.num_prefix_tokens
    restored = torch.gather(latent[:, P:], 1, ids_restore[..., None].expand(-1, -1, 32))
    torch.testing.assert_close(restored, full[:, P:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(latent[:, :P], full[:, :P], atol=1e-5, rtol=1e-5)
    assert mask.sum() == 0


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_masked_patches_never_reach_the_encoder(pool):
    """Poisoned masked patches (NaN, then huge values) leave the encoder's output bit-identical."""
    model = small_mae(pool)
    images, noise = torch.randn(2, 3, 16, 16), torch.rand(2, 16)
    latent, _, mask = model.forward_encoder(images, noise)
    pixel_mask = unpatchify(mask[..., None].expand(-1, -1, 48), 4).bool()
    for poison in (float("nan"), 1e30):
        poisoned = images.masked_fill(pixel_mask, poison)
        latent_poisoned, _, mask_poisoned = model.forward_encoder(poisoned, noise)
        assert torch.equal(mask_poisoned, mask)
        assert torch.equal(latent_poisoned, latent)
    # and a visible patch does reach it
    visible = unpatchify((1 - mask)[..., None].expand(-1, -1, 48), 4).bool()
    assert not torch.equal(model.forward_encoder(images.masked_fill(visible, 1.0), noise)[0], latent)


@pytest.mark.parametrize("img_size, patch_size, embed_dim, depth, heads, pool", [
    (32, 4, 192, 12, 3, "cls"),    # ViT-Ti/4 on CIFAR: 1 + 16 of 1 + 64 tokens
    (224, 16, 384, 12, 6, "cls"),  # ViT-S/16 at 224
    (224, 16, 768, 12, 12, "mean"),  # ViT-B/16, no class token
])
@pytest.mark.parametrize("mask_ratio", [0.75, 0.5])
def test_encoder_flops_are_the_visible_share_of_a_full_pass(img_size, patch_size, embed_dim, depth, heads, pool,
                                                            mask_ratio):
    """Encoder FLOPs with masking / FLOPs of a full forward pass = 1 - mask_ratio within 5% (He et al. 2022,
    sec. 3), at the field's model shapes. (A narrow model with many tokens comes out lower: its attention
    scores, quadratic in the token count, are a larger share of the work.)"""
    with torch.device("meta"):
        encoder = VisionTransformer(img_size=img_size, patch_size=patch_size, num_classes=0, embed_dim=embed_dim,
                                    depth=depth, num_heads=heads, pool=pool)
        model = MaskedAutoencoder(encoder, mask_ratio)
        images = torch.empty(1, 3, img_size, img_size)
        noise = torch.empty(1, encoder.patch_embed.num_patches)
    with FlopCounterMode(display=False) as full:
        encoder.forward_features(images)
    with FlopCounterMode(display=False) as masked:
        model.forward_encoder(images, noise)
    ratio = masked.get_total_flops() / full.get_total_flops()
    assert ratio == pytest.approx(1 - mask_ratio, rel=0.05)


def test_training_flops_of_mae_are_far_below_classification(make_config):
    from vit_train.train.throughput import flops_per_image

    cfg = make_config(model={"embed_dim": 192, "depth": 12, "num_heads": 3, "img_size": 32, "patch_size": 4})
    mae, full = mae_flops_per_image(cfg.model, Mae()), flops_per_image(cfg.model, 10)
    assert 0.25 < mae / full < 0.45  # encoder ~0.26 of a full pass, plus a light decoder on every patch


def test_masks_are_per_image_exact_in_count_and_new_at_every_draw():
    """Every image gets its own mask with exactly N - int(N (1 - r)) masked patches, and the masks change from
    one draw to the next (pengzhiliang/MAE-pytorch#28: the same masks every epoch)."""
    model = small_mae(img_size=32)  # 64 patches: C(64, 48) masks, so two equal ones would be a fault
    sampler = MaskSampler(seed=0)
    images = torch.randn(8, 3, 32, 32)
    _, _, first = model.forward_encoder(images, sampler.noise(8, 64, "cpu"))
    _, _, second = model.forward_encoder(images, sampler.noise(8, 64, "cpu"))
    assert (first.sum(dim=1) == 64 - num_visible(64, 0.75)).all()
    assert len({tuple(m.tolist()) for m in first}) == 8
    assert not torch.equal(first, second)


def test_mask_sampler_resumes_exactly_and_differs_per_rank():
    a = MaskSampler(seed=3)
    draws = [a.noise(4, 16, "cpu") for _ in range(3)]
    b = MaskSampler(seed=3)
    b.load_state_dict({"draws": 2})
    assert torch.equal(b.noise(4, 16, "cpu"), draws[2])
    assert not torch.equal(MaskSampler(seed=3, rank=1).noise(4, 16, "cpu"), draws[0])
    assert not torch.equal(MaskSampler(seed=4).noise(4, 16, "cpu"), draws[0])


def test_loss_counts_masked_patches_only_and_matches_the_formula():
    torch.manual_seed(0)
    images, pred = torch.randn(2, 3, 8, 8), torch.randn(2, 4, 48)
    mask = torch.tensor([[1.0, 0, 0, 1], [0, 1, 0, 0]])
    target = patchify(images, 4)
    mean, var = target.mean(-1, keepdim=True), target.var(-1, keepdim=True)
    normed = (target - mean) / (var + 1e-6) ** 0.5
    expected = ((pred - normed) ** 2).mean(-1)[mask.bool()].mean()
    torch.testing.assert_close(reconstruction_loss(pred, images, mask, 4, True), expected)
    expected_raw = ((pred - target) ** 2).mean(-1)[mask.bool()].mean()
    torch.testing.assert_close(reconstruction_loss(pred, images, mask, 4, False), expected_raw)
    changed = pred.clone()
    changed[~mask.bool()] = 1e6  # predictions for visible patches do not count
    torch.testing.assert_close(reconstruction_loss(changed, images, mask, 4, True), expected)


def test_norm_pix_loss_is_finite_on_flat_patches_and_in_half_precision():
    """A flat patch (variance 0) gets the 1e-6 floor, and bf16 predictions are scored in float32."""
    images = torch.zeros(2, 3, 8, 8)
    images[:, :, :4] = 5.0
    pred = torch.zeros(2, 4, 48, dtype=torch.bfloat16)
    loss = reconstruction_loss(pred, images.bfloat16(), torch.ones(2, 4), 4, True)
    assert loss.dtype == torch.float32 and torch.isfinite(loss) and loss == 0


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_decoder_puts_each_token_at_its_own_patch(pool):
    """Unshuffling (lucidrains/vit-pytorch#241: masked and visible tokens swapped; IcarusWizard/MAE#17: off by
    the class token): with an identity projection and no positions, the decoder blocks must receive each
    visible patch's encoder token at that patch's position and the mask token at every masked one."""
    torch.manual_seed(0)
    encoder = VisionTransformer(img_size=16, patch_size=4, num_classes=0, embed_dim=16, depth=1, num_heads=2, pool=pool)
    model = MaskedAutoencoder(encoder, 0.75, decoder_dim=16, decoder_depth=1, decoder_heads=2)
    dec = model.decoder
    with torch.no_grad():
        dec.decoder_embed.weight.copy_(torch.eye(16))
        dec.decoder_embed.bias.zero_()
        dec.decoder_pos_embed.zero_()
        dec.mask_token.fill_(-7.0)
    seen = []
    dec.decoder_blocks.register_forward_hook(lambda module, args, out: seen.append(args[0]))
    images, noise = torch.randn(2, 3, 16, 16), torch.rand(2, 16)
    latent, ids_restore, mask = model.forward_encoder(images, noise)
    model(images, noise)
    P, blocks_input = encoder.num_prefix_tokens, seen[0]
    ids_keep = noise.argsort(dim=1)[:, :4]
    for b in range(2):
        torch.testing.assert_close(blocks_input[b, :P], latent[b, :P])
        torch.testing.assert_close(blocks_input[b, P + ids_keep[b]], latent[b, P:])
        assert (blocks_input[b, P:][mask[b].bool()] == -7.0).all()
        assert mask[b, ids_keep[b]].sum() == 0


def test_reconstruction_keeps_visible_patches_and_undoes_norm_pix():
    """With a perfect normalised-pixel prediction the figure's reconstruction is the original image
    (pengzhiliang/MAE-pytorch#40, facebookresearch/mae#12: predictions must be mapped back with each patch's
    own mean and std before display); the masked view is zero exactly on the masked patches."""
    model = small_mae()
    images, noise = torch.randn(2, 3, 16, 16), torch.rand(2, 16)
    perfect = patch_targets(images, 4, True)

    class Perfect(torch.nn.Module):
        patch_size, mask_ratio, num_patches = 4, 0.75, 16

        def forward(self, x, n):
            return perfect, model.forward_encoder(x, n)[2]

    masked, rebuilt = reconstruct(Perfect(), images, noise, norm_pix_loss=True)
    torch.testing.assert_close(rebuilt, images, atol=1e-4, rtol=1e-4)
    _, _, mask = model.forward_encoder(images, noise)
    pixel_mask = unpatchify(mask[..., None].expand(-1, -1, 48), 4).bool()
    assert (masked[pixel_mask] == 0).all() and torch.equal(masked[~pixel_mask], images[~pixel_mask])


def test_state_dict_keeps_the_encoder_names_and_the_fixed_positions():
    """`encoder.*` carries timm's names (so model.pretrained can strip the prefix); the decoder's fixed
    positions are saved too (pengzhiliang/MAE-pytorch#26: positions missing from checkpoints)."""
    keys = small_mae(pos_embed="sincos2d").state_dict().keys()
    assert {"encoder.pos_embed", "encoder.cls_token", "encoder.patch_embed.proj.weight", "encoder.norm.weight",
            "decoder.decoder_pos_embed", "decoder.mask_token", "decoder.decoder_pred.weight"} <= set(keys)
    assert not any(k.startswith("encoder.head") for k in keys)


@pytest.mark.parametrize("mae, message", [
    ({"mask_ratio": 1.0}, "objective.mask_ratio must be in (0, 1)"),
    ({"mask_ratio": 0.99}, "leaves no visible patch"),
    ({"decoder_dim": 30, "decoder_heads": 3}, "objective.decoder_dim (30) must be divisible"),
    ({"decoder_depth": 0}, "objective.decoder_depth must be > 0"),
])
def test_bad_mae_settings_are_refused_naming_the_key(make_config, mae, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_config(objective={"name": "mae", **mae})  # objective=mae's own keys, checked by its section


@pytest.mark.slow  # ~5 s alone, ~45 s on a shared 2-core machine
def test_short_pretraining_reconstructs_far_better_than_the_untrained_model(make_config):
    """60 AdamW steps on shapes: the val loss on masked patches falls far below the untrained model's
    (measured 2.44 -> 0.69) and well below the best blind guess, each patch's own mean (0.98 here)."""
    cfg = make_config(model={"embed_dim": 64, "depth": 2, "num_heads": 4, "img_size": 16, "patch_size": 4},
                      objective={"name": "mae", "decoder_dim": 64, "decoder_depth": 1, "decoder_heads": 4,
                                 "norm_pix_loss": True})
    torch.manual_seed(0)
    model = build_autoencoder(cfg.model, cfg.objective)
    train_images, _ = generate_shapes(1024, 16, seed=0)
    val_images, _ = generate_shapes(256, 16, seed=1)
    val = (val_images.float() / 255 - 0.28) / 0.236
    objective = MaskedReconstruction(cfg)

    def val_loss(predict_mean: bool = False) -> float:
        with torch.no_grad():
            pred, mask = model(val, MaskSampler(seed=99).noise(len(val), 16, "cpu"))
            return reconstruction_loss(pred * (not predict_mean), val, mask, 4, True).item()

    before, blind = val_loss(), val_loss(predict_mean=True)  # normalised targets: predicting 0 = the patch mean
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    for step in range(60):
        batch = (train_images[(step * 64) % 1024:][:64].float() / 255 - 0.28) / 0.236
        loss, logits = objective(model, batch, torch.zeros(64))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = val_loss()
    assert logits is None
    assert after < 0.4 * before and after < 0.8 * blind, (before, blind, after)


def test_a_classifier_starts_from_the_mae_encoder_with_a_new_head(tmp_path, caplog):
    """model.pretrained on an MAE checkpoint (or its run directory): the encoder's tensors are loaded, the
    decoder dropped, the head new; fixed sin-cos positions of the pre-training become the learned
    positions' start (as facebookresearch/mae fine-tunes; xplip/pixel#8)."""
    from vit_train.objectives.weights_in import load_pretrained

    mae = small_mae(pos_embed="sincos2d")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    torch.save({"model": mae.state_dict(), "step": 5}, tmp_path / "run" / "checkpoints" / "last.pt")
    classifier = VisionTransformer(img_size=16, patch_size=4, num_classes=7, embed_dim=32, depth=2, num_heads=2)
    head_before = classifier.head.weight.clone()
    with caplog.at_level("INFO", logger="vit_train"):
        report = load_pretrained(classifier, tmp_path / "run")
    assert "decoder (" in caplog.text
    own = classifier.state_dict()
    for key, value in mae.encoder.state_dict().items():
        assert torch.equal(own[key], value), key
    assert isinstance(classifier.pos_embed, torch.nn.Parameter)
    assert torch.equal(classifier.head.weight, head_before)
    assert "head.weight" in report["reinitialised"] and not any("decoder" in k for k in report["loaded"])
    images = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(classifier.forward_features(images), mae.encoder.forward_features(images))


def test_unlabelled_folders_flat_nested_or_split_by_holdout(tmp_path):
    from vit_train.data.sources.imagefolder_files import load_unlabelled_folders

    write_images(tmp_path / "a" / "train", 5)
    write_images(tmp_path / "a" / "train" / "cats", 2, start=50)  # class folders are read too, labels ignored
    write_images(tmp_path / "a" / "val", 3)
    train, val, names = load_unlabelled_folders(tmp_path / "a")
    assert (len(train), len(val), names) == (7, 3, ["image"])
    image, label = train[0]
    assert image.mode == "RGB" and image.size == (12, 10) and label == 0

    write_images(tmp_path / "b", 40)  # no train/: every 20th image (path order) is a val image
    (tmp_path / "b" / "notes.txt").write_text("not an image")
    train, val, _ = load_unlabelled_folders(tmp_path / "b")
    assert [p for p, _ in val.samples] == [str(tmp_path / "b" / "img019.png"), str(tmp_path / "b" / "img039.png")]
    assert len(train) == 38 and not {p for p, _ in train.samples} & {p for p, _ in val.samples}


def test_unlabelled_folders_that_cannot_work_are_explained(tmp_path):
    from vit_train.data.sources.imagefolder_files import load_unlabelled_folders
    from vit_train.errors import DataError

    with pytest.raises(DataError, match="does not exist"):
        load_unlabelled_folders(tmp_path / "missing")
    write_images(tmp_path / "few", 5)
    with pytest.raises(DataError, match="holds 5 images .* needs at least 20"):
        load_unlabelled_folders(tmp_path / "few")
    write_images(tmp_path / "noval" / "train", 5)
    with pytest.raises(DataError, match="val holds no images"):
        load_unlabelled_folders(tmp_path / "noval")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "train").mkdir()
    write_images(tmp_path / "broken" / "val", 2)
    with pytest.raises(DataError, match="no training images"):
        load_unlabelled_folders(tmp_path / "broken")


def test_facebookresearch_mae_checkpoints_load_their_encoder(tmp_path):
    """The official MAE files hold flat keys plus mask_token and decoder_* (quanlin-wu/dmae#3, Oneflow-Inc/libai#258:
    a strict load fails on them and on the missing head): the encoder loads, the rest is ignored, the head is new."""
    from vit_train.objectives.weights_in import load_pretrained

    mae = small_mae()
    flat = {k.removeprefix("encoder."): v for k, v in mae.state_dict().items() if k.startswith("encoder.")}
    flat |= {"mask_token": torch.zeros(1, 1, 16), "decoder_embed.weight": torch.zeros(16, 32),
             "decoder_pos_embed": torch.zeros(1, 17, 16), "decoder_pred.weight": torch.zeros(48, 16)}
    torch.save({"model": flat}, tmp_path / "mae_pretrain_vit_tiny.pth")
    classifier = VisionTransformer(img_size=16, patch_size=4, num_classes=3, embed_dim=32, depth=2, num_heads=2)
    report = load_pretrained(classifier, tmp_path / "mae_pretrain_vit_tiny.pth")
    assert set(report["ignored"]) == {"mask_token", "decoder_embed.weight", "decoder_pos_embed", "decoder_pred.weight"}
    assert torch.equal(classifier.blocks[1].mlp.fc2.weight, mae.encoder.blocks[1].mlp.fc2.weight)
