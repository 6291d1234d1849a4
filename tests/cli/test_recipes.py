"""Every recipe (configs/experiment/*.yaml) runs a few steps end to end, at a tiny size: its
augmentation, optimiser, schedule, EMA, repeated augmentation and batch scaling all go through the
real loop (as lightning-hydra-template runs `experiment=glob(*)`)."""

from pathlib import Path

import pytest

from helpers.configs import composed
from vit_train.config import Config, config_dir
from vit_train.train.trainer import train

RECIPES = sorted(path.stem for path in (Path(config_dir()) / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_runs_a_few_steps(recipe, tmp_path, image_folder):
    plain = composed([f"experiment={recipe}"])
    plain["model"].update(img_size=16, patch_size=4)
    if plain["model"]["arch"] == "vit":  # a small one
        plain["model"].update(embed_dim=32, depth=2, num_heads=2)
    data = plain["data"]
    if data["name"] == "imagefolder":
        data["root"] = str(image_folder)  # 3 classes, 48 train images
    else:  # the CIFAR recipes' settings every data set has, on built-in images
        data = plain["data"] = {"name": "shapes", "pipeline": data["pipeline"], "repeated_aug": data["repeated_aug"],
                                "train_size": 48, "val_size": 24}
    data.update(batch_size=24, eval_batch_size=None, num_workers=0)
    plain["trainer"].update(max_steps=2, device="cpu", progress=False, log_every=1, compile=False, viz_every=None)
    if plain["objective"]["name"] == "distill":  # a distillation recipe names its teacher on the command line
        import torch
        from vit_train.models.families.resnet import build_resnet

        classes = 3 if data["name"] == "imagefolder" else 10
        torch.save(build_resnet("resnet18", classes, 16).state_dict(), tmp_path / "teacher.pth")
        plain["objective"].update(teacher=str(tmp_path / "teacher.pth"), teacher_arch="resnet18")
    results = train(Config.from_dict(plain), tmp_path / "run")
    assert results["status"] == "completed" and results["steps"] == 2
    if plain["objective"]["name"] == "mae":  # pre-training: a reconstruction loss, no top-1
        assert results["final_loss"] is not None and "final_top1" not in results
    else:
        assert results["final_top1"] is not None
