"""mae.* keys are checked by the MAE objective (vit_train/objectives/mae.py `check`), only when
objective=mae: a classify or distill run never reads them (docs/resuming.md, docs/mae.md), so an
impossible value there neither refuses it nor changes it. The reported input: `vit-train
model=vit_micro data=shapes model.patch_size=32` (one patch per image) was refused with
"mae.mask_ratio=0.75 leaves no visible patch of the 1".
"""

from __future__ import annotations

import pytest

from helpers.configs import tiny_config
from vit_train.errors import ConfigError
from vit_train.objectives import check_objective
from vit_train.train.trainer import train

# (mae.* values, model.* values, what the MAE objective's refusal names)
BAD = [
    ({"mask_ratio": 0.75}, {"img_size": 32, "patch_size": 32}, "mae.mask_ratio=0.75 leaves no visible patch of the 1"),
    ({"mask_ratio": 0.99}, {}, "mae.mask_ratio=0.99 leaves no visible patch of the 16"),
    ({"mask_ratio": 1.0}, {}, "mae.mask_ratio must be in (0, 1), got 1.0"),
    ({"mask_ratio": 0.0}, {}, "mae.mask_ratio must be in (0, 1), got 0.0"),
    ({"decoder_dim": 0}, {}, "mae.decoder_dim must be > 0, got 0"),
    ({"decoder_depth": 0}, {}, "mae.decoder_depth must be > 0, got 0"),
    ({"decoder_heads": -1}, {}, "mae.decoder_heads must be > 0, got -1"),
    ({"decoder_dim": 30, "decoder_heads": 3}, {}, "mae.decoder_dim (30) must be divisible by mae.decoder_heads (3)"),
    ({"decoder_dim": 18, "decoder_heads": 2}, {}, "mae.decoder_dim (18) must be divisible by mae.decoder_heads (2) "
                                                   "and by 4"),
]
IDS = [f"{'-'.join(f'{k}={v}' for k, v in mae.items())}{'-one-patch' if model else ''}" for mae, model, _ in BAD]


@pytest.mark.parametrize("objective", ["classify", "distill"])
@pytest.mark.parametrize("mae,model,named", BAD, ids=IDS)
def test_another_objective_accepts_any_mae_keys(mae, model, named, objective):
    extra = {"model": {**model, "distilled": True}, "distill": {"teacher": "teacher.pt"}} if objective == "distill" \
        else {"model": model}
    cfg = tiny_config(mae=mae, objective={"name": objective}, **extra)  # Config.validate: no ConfigError
    if objective == "classify":
        assert check_objective(cfg).NAME == "classify"


@pytest.mark.parametrize("mae,model,named", BAD, ids=IDS)
def test_the_mae_objective_refuses_them_in_one_line_naming_the_key(mae, model, named):
    cfg = tiny_config(mae=mae, model=model, objective={"name": "mae"})
    with pytest.raises(ConfigError) as refused:
        check_objective(cfg)
    assert named in str(refused.value) and "\n" not in str(refused.value), refused.value


def test_the_reported_classify_run_with_one_patch_per_image_trains(tmp_path):
    """model.patch_size=32 on 32x32 images, mae.mask_ratio at its default 0.75: trains to its last step."""
    cfg = tiny_config(model={"img_size": 32, "patch_size": 32}, data={"train_size": 64, "val_size": 32},
                      trainer={"epochs": 1, "max_steps": 2})
    results = train(cfg, tmp_path / "run")
    assert results["status"] == "completed" and results["steps"] == 2


def test_an_mae_run_with_no_visible_patch_is_refused_before_any_work(tmp_path):
    cfg = tiny_config(model={"img_size": 32, "patch_size": 32}, objective={"name": "mae"}, trainer={"max_steps": 2})
    with pytest.raises(ConfigError, match="leaves no visible patch of the 1"):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints").exists()
