"""objective=mae's own keys (objective.mask_ratio, ...; mae.* before) are checked by its section
(vit_train/objectives/mae.py `Mae.check`), only in an MAE run: another objective has no such keys, so
the schema refuses them there in one line naming the objective that has them, and a classify run
whose image has one patch trains. The reported input: `vit-train model=vit_micro data=shapes
model.patch_size=32` (one patch per image) was refused with "objective.mask_ratio=0.75 leaves no visible
patch of the 1".
"""

from __future__ import annotations

import pytest

from helpers.configs import tiny_config
from vit_train.errors import ConfigError
from vit_train.train.trainer import train

# (objective=mae's values, model.* values, what the MAE objective's refusal names)
BAD = [
    ({"mask_ratio": 0.75}, {"img_size": 32, "patch_size": 32}, "objective.mask_ratio=0.75 leaves no visible patch of the 1"),
    ({"mask_ratio": 0.99}, {}, "objective.mask_ratio=0.99 leaves no visible patch of the 16"),
    ({"mask_ratio": 1.0}, {}, "objective.mask_ratio must be in (0, 1), got 1.0"),
    ({"mask_ratio": 0.0}, {}, "objective.mask_ratio must be in (0, 1), got 0.0"),
    ({"decoder_dim": 0}, {}, "objective.decoder_dim must be > 0, got 0"),
    ({"decoder_depth": 0}, {}, "objective.decoder_depth must be > 0, got 0"),
    ({"decoder_heads": -1}, {}, "objective.decoder_heads must be > 0, got -1"),
    ({"decoder_dim": 30, "decoder_heads": 3}, {}, "objective.decoder_dim (30) must be divisible by "
                                                  "objective.decoder_heads (3)"),
    ({"decoder_dim": 18, "decoder_heads": 2}, {}, "objective.decoder_dim (18) must be divisible by "
                                                  "objective.decoder_heads (2) and by 4"),
]
IDS = [f"{'-'.join(f'{k}={v}' for k, v in mae.items())}{'-one-patch' if model else ''}" for mae, model, _ in BAD]


@pytest.mark.parametrize("objective", ["classify", "distill"])
@pytest.mark.parametrize("mae,model,named", BAD, ids=IDS)
def test_another_objective_has_no_such_keys_and_says_whose_they_are(mae, model, named, objective):
    own = {"teacher": "teacher.pt"} if objective == "distill" else {}
    with pytest.raises(ConfigError) as refused:
        tiny_config(objective={"name": objective, **own, **mae}, model=model)
    key = next(iter(mae))
    assert str(refused.value).startswith(f"objective.{key} is a key of objective=mae, not of objective={objective}")


@pytest.mark.parametrize("mae,model,named", BAD, ids=IDS)
def test_the_mae_objective_refuses_them_in_one_line_naming_the_key(mae, model, named):
    with pytest.raises(ConfigError) as refused:
        tiny_config(objective={"name": "mae", **mae}, model=model)
    assert named in str(refused.value) and "\n" not in str(refused.value), refused.value


def test_the_reported_classify_run_with_one_patch_per_image_trains(tmp_path):
    """model.patch_size=32 on 32x32 images: a classify run has no mask ratio and trains to its last step."""
    cfg = tiny_config(model={"img_size": 32, "patch_size": 32}, data={"train_size": 64, "val_size": 32},
                      trainer={"epochs": 1, "max_steps": 2})
    results = train(cfg, tmp_path / "run")
    assert results["status"] == "completed" and results["steps"] == 2


def test_an_mae_run_with_no_visible_patch_is_refused_before_any_work(tmp_path):
    with pytest.raises(ConfigError, match="leaves no visible patch of the 1"):
        tiny_config(model={"img_size": 32, "patch_size": 32}, objective={"name": "mae"}, trainer={"max_steps": 2})
    assert not (tmp_path / "run").exists()
