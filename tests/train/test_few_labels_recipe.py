"""The few-label recipe (configs/experiment/imagefolder_mae_few_labels.yaml) as a user runs it, at a tiny size: MAE
pre-training on an image folder without its labels, then `experiment=imagefolder_mae_few_labels` from that encoder.
Both LP-FT stages run (the head alone, then the whole network) and results.json records them; the encoder the
recipe reads is the pre-training's, bit for bit, through the probe stage."""

from __future__ import annotations

import json

import pytest
import torch

from helpers.configs import composed
from vit_train.config import Config
from vit_train.train.trainer import train

TINY = {"img_size": 16, "patch_size": 4, "embed_dim": 32, "depth": 2, "num_heads": 2}


def test_the_recipe_composes_to_lp_ft_at_a_probes_lr():
    plain = composed(["experiment=imagefolder_mae_few_labels", "data.root=/data/labelled"])
    assert plain["data"]["name"] == "imagefolder" and plain["model"]["arch"] == "vit"
    model = plain["model"]
    assert (model["lp_epochs"], model["lp_lr"], model["pos_embed"]) == (10, 0.1, "learned")  # from any encoder's
    assert model["lp_epochs"] < plain["trainer"]["epochs"]  # a fine-tuning stage after the probe's
    assert plain["optim"]["lr"] < model["lp_lr"]


@pytest.mark.slow
def test_the_recipe_runs_both_stages_from_an_mae_encoder(image_folder, tmp_path):
    pretrain = composed(["experiment=imagefolder_mae_pretrain", f"data.root={image_folder}"])
    pretrain["model"].update(TINY)
    pretrain["objective"].update(decoder_dim=16, decoder_depth=1, decoder_heads=2)
    pretrain["data"].update(batch_size=16, num_workers=0)
    pretrain["trainer"].update(epochs=1, device="cpu", progress=False)
    encoder = tmp_path / "mae"
    train(Config.from_dict(pretrain), encoder)

    plain = composed(["experiment=imagefolder_mae_few_labels", f"data.root={image_folder}",
                      f"model.pretrained={encoder}", "model=vit_base"])  # the pre-training's model, as documented
    plain["model"].update(TINY, lp_epochs=1)  # 48 images at batch 16: 3 steps an epoch, the first epoch's alone
    plain["data"].update(batch_size=16, num_workers=0)
    plain["trainer"].update(epochs=3, device="cpu", progress=False, ckpt_every=1, keep_last=100)
    run = tmp_path / "few"
    results = train(Config.from_dict(plain), run)
    assert results["status"] == "completed" and (results["lp_steps"], results["ft_steps"]) == (3, 6)
    assert results["lp_score"] is not None and results["final_top1"] is not None
    assert json.loads((run / "results.json").read_text())["lp_steps"] == 3
    saved = torch.load(encoder / "checkpoints" / "last.pt", weights_only=True)["model"]
    mae = {k.removeprefix("encoder."): v for k, v in saved.items() if k.startswith("encoder.")}
    probe, after = (torch.load(run / "checkpoints" / f"step_{s:08d}.pt", weights_only=True)["model"] for s in (3, 4))
    encoder_keys = [k for k in probe if k in mae]
    assert len(encoder_keys) > 10 and all(torch.equal(probe[k], mae[k]) for k in encoder_keys)
    assert not torch.equal(after["blocks.0.attn.qkv.weight"], mae["blocks.0.attn.qkv.weight"])
