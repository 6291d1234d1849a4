"""Recipes inherit what they share (a recipe's defaults list names the recipe it builds on) and state
only what differs from their composition, yet every recipe composes to exactly the config it had when
each was a full copy.

tests/fixtures/recipes_composed.json holds, per configs/experiment/*.yaml, what `vit-train experiment=NAME`
composed before the recipes inherited (Hydra's compose API, resolved, no other override), in the layout
of the time: every option's keys side by side in its section, mae.* and distill.* at the top. Read in
today's layout (schema/legacy.py `upgrade_saved`: an objective's keys under objective.*, each option's
section cut to its own keys), each recipe composes to exactly that; and no key a section lost held
anything but the schema's default of the time (`OLD_DEFAULTS`): the same run. A new recipe adds its
entry in today's layout, once it is known to be right:
    python -c "import json, sys; sys.path.insert(0, 'tests'); from helpers.configs import composed; \
print(json.dumps(composed(['experiment=NAME']), indent=1))"
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from helpers.configs import composed
from vit_train.config import config_dir
from vit_train.schema.legacy import upgrade_saved
from vit_train.schema.typed import options

CONFIGS = Path(config_dir())
RECIPES = sorted(path.stem for path in (CONFIGS / "experiment").glob("*.yaml"))
BEFORE = json.loads((Path(__file__).parents[1] / "fixtures" / "recipes_composed.json").read_text())
# the schema's defaults, at the time of the fixture, of the keys a section no longer holds for every option
OLD_DEFAULTS = {
    "data": {"root": None, "download": True, "train_size": 10000, "val_size": 2000, "seed": 0, "bad_images": "skip",
             "max_bad_fraction": 0.01, "train_shards": None, "val_shards": None, "shuffle_buffer": 5000,
             "image_key": "image", "label_key": "label", "train_split": "train", "val_split": None},
    "aug": {"crop_padding": None, "scale_min": 0.08, "hflip": 0.5, "randaug_n": 2, "randaug_m": 9,
            "autoaug_policy": None},
    "mae": {"mask_ratio": 0.75, "decoder_dim": 128, "decoder_depth": 2, "decoder_heads": 4, "norm_pix_loss": True},
    "distill": {"teacher": None, "teacher_arch": None, "type": "hard", "alpha": 0.5, "tau": 1.0},
    # a ResNet's section held the ViT's keys; AdamW's, SGD's and cosine's keys were in every optim and schedule
    "model": {"embed_dim": 64, "depth": 4, "num_heads": 4, "mlp_ratio": 2.0, "qkv_bias": True, "pool": "cls",
              "pos_embed": "learned", "dropout": 0.0, "attn_dropout": 0.0, "drop_path": 0.0, "reg_tokens": 0,
              "init_values": None, "qk_norm": False, "distilled": False, "trainable": "all",
              "grad_checkpointing": False},
    "optim": {"betas": [0.9, 0.999], "eps": 1e-08, "momentum": 0.9},
    "schedule": {"min_lr": 1e-05},
}


def test_the_fixture_holds_every_recipe():
    assert sorted(BEFORE) == RECIPES


@pytest.mark.parametrize("name", RECIPES)
def test_every_recipe_composes_exactly_as_before(name):
    expected = upgrade_saved(json.loads(json.dumps(BEFORE[name])))
    # An earlier intended change: sizes the data set supplied inside the checks are now in the composed config.
    img, patch = options("data")[expected["data"]["name"]].input_size
    model = expected["model"]
    model["img_size"] = img if model["img_size"] is None else model["img_size"]
    model["patch_size"] = patch if model["patch_size"] is None else model["patch_size"]
    if options("data")[expected["data"]["name"]].encoded:  # data.decode, added since, at its default
        expected["data"].setdefault("decode", "auto")
    trainer = expected["trainer"]  # trainer.compile_scope and compile_backend, added since, at their defaults
    trainer.setdefault("compile_scope", "model")
    trainer.setdefault("compile_backend", "inductor")
    if model.get("arch", "vit") == "vit":  # model.lp_epochs and lp_lr (LP-FT), added since, at their defaults
        model.setdefault("lp_epochs", 0.0)
        model.setdefault("lp_lr", None)
    expected.setdefault("logger", {"tensorboard": {}})  # the list groups, added since, at their defaults
    expected.setdefault("callbacks", {})
    assert composed([f"experiment={name}"]) == expected


@pytest.mark.parametrize("name", RECIPES)
def test_no_key_a_recipe_set_was_lost_in_todays_layout(name):
    """What `upgrade_saved` dropped from a recipe's composition (another option's keys, another objective's
    section) held the old schema's defaults: the recipe set none of them, so its run reads all it set."""
    before, after = _keys(BEFORE[name]), _keys(upgrade_saved(json.loads(json.dumps(BEFORE[name]))))
    moved = {key for key in before if key.split(".")[0] in ("mae", "distill")
             and f"objective.{key.split('.', 1)[1]}" in after}  # now objective.*, equal (the test above)
    dropped = {key: value for key, value in before.items() if key not in after and key not in moved}
    if upgrade_saved(json.loads(json.dumps(BEFORE[name]))) == BEFORE[name]:  # an entry added in today's layout
        assert not dropped, dropped
    else:
        assert dropped and dropped == {k: OLD_DEFAULTS[k.split(".")[0]][k.split(".")[1]] for k in dropped}


def _body(path: Path) -> dict:
    plain = OmegaConf.to_container(OmegaConf.load(path))
    plain.pop("defaults", None)
    return plain


def _keys(plain: dict, prefix: str = "") -> dict:
    """{dotted key: value} of every leaf of `plain` (lists are leaves)."""
    flat = {}
    for key, value in plain.items():
        if isinstance(value, dict):
            flat.update(_keys(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


@pytest.mark.parametrize("name", RECIPES)
def test_no_recipe_key_restates_its_composition(name, tmp_path):
    """Each key a recipe sets changes what its defaults list (group options, the recipe it builds on)
    composes without it: a copy of the tree with the recipe's body removed composes differently there."""
    configs = tmp_path / "configs"
    shutil.copytree(CONFIGS, configs)
    source = (CONFIGS / "experiment" / f"{name}.yaml").read_text()
    defaults = OmegaConf.to_container(OmegaConf.load(CONFIGS / "experiment" / f"{name}.yaml")).get("defaults", [])
    (configs / "experiment" / f"{name}.yaml").write_text(
        source.split("\ndefaults:")[0] + "\n" + OmegaConf.to_yaml({"defaults": defaults}))
    without = _keys(composed([f"experiment={name}"], configs))
    restated = [f"{key}={value}" for key, value in _keys(_body(CONFIGS / "experiment" / f"{name}.yaml")).items()
                if key != "name" and without[key] == value]
    assert restated == [], f"experiment/{name}.yaml restates what its defaults list composes"


@pytest.mark.parametrize("child, parent", [
    ("cifar100_vit_small", "cifar10_vit_tiny"), ("cifar10_vit_tiny_distilled", "cifar10_vit_tiny"),
    ("imagenet_deit_small", "imagenet_deit_tiny"), ("imagenet_deit_base", "imagenet_deit_tiny"),
    ("imagenet_deit_tiny_distilled", "imagenet_deit_tiny"), ("cifar10_mae_pretrain", "imagefolder_mae_pretrain"),
    ("cifar10_mae_finetune", "imagefolder_mae_finetune"),
])
def test_a_change_to_a_base_recipe_reaches_the_recipes_built_on_it(child, parent, tmp_path):
    configs = tmp_path / "configs"
    shutil.copytree(CONFIGS, configs)
    with open(configs / "experiment" / f"{parent}.yaml", "a") as f:
        f.write("seed: 1234\n")  # no recipe sets the seed
    assert composed([f"experiment={child}"], configs)["seed"] == 1234
    assert composed([f"experiment={child}"])["seed"] == 0


def test_a_command_line_group_choice_still_beats_the_inherited_one():
    cfg = composed(["experiment=imagenet_deit_small", "model=vit_base", "model.drop_path=0.3"])
    assert (cfg["model"]["name"], cfg["model"]["embed_dim"], cfg["model"]["drop_path"]) == ("vit_base", 768, 0.3)
    assert cfg["name"] == "imagenet_deit_small" and cfg["trainer"]["ema_decay"] == 0.99996
