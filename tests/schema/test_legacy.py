"""The earlier layout, read by this one (vit_train/schema/legacy.py): a checkpoint whose config held every
option's keys side by side and mae.*/distill.* at the top resumes, evaluates and exports as one written
now; the old spelling on the command line works for one release, with one line naming the new one; in a
dict or a YAML file it is refused naming the new one."""

from __future__ import annotations

import copy

import pytest
import torch

from helpers.configs import TINY
from helpers.files import assert_identical, logged
from helpers.runs import vit_train
from vit_train.config import Config
from vit_train.errors import ConfigError
from vit_train.schema.legacy import rename_old_keys, upgrade_saved
from vit_train.train.resume import check_compatible
from vit_train.train.trainer import train

# what every section held before, besides the chosen option's own keys (the schema's defaults of the time)
OLD_DATA = {"root": None, "download": True, "train_size": 10000, "val_size": 2000, "seed": 0, "bad_images": "skip",
            "max_bad_fraction": 0.01, "train_shards": None, "val_shards": None, "shuffle_buffer": 5000,
            "image_key": "image", "label_key": "label", "train_split": "train", "val_split": None}
OLD_AUG = {"crop_padding": None, "scale_min": 0.08, "hflip": 0.5, "randaug_n": 2, "randaug_m": 9, "autoaug_policy": None,
           "mixup_alpha": 0.0, "cutmix_alpha": 0.0, "mix_prob": 1.0, "switch_prob": 0.5, "random_erasing": 0.0,
           "label_smoothing": 0.0}
OLD_MAE = {"mask_ratio": 0.75, "decoder_dim": 128, "decoder_depth": 2, "decoder_heads": 4, "norm_pix_loss": True}
OLD_DISTILL = {"teacher": None, "teacher_arch": None, "type": "hard", "alpha": 0.5, "tau": 1.0}


def old_layout(config: dict) -> dict:
    """`config` (this version's) as the earlier version wrote it: every option's keys in each section, the
    objective's own keys in its top-level section and objective.name alone under objective."""
    old = copy.deepcopy(config)
    old["data"] = {**OLD_DATA, **old["data"]}
    old["aug"] = {**OLD_AUG, **old["aug"]}
    name, own = old["objective"]["name"], {k: v for k, v in old["objective"].items() if k != "name"}
    old["mae"] = {**OLD_MAE, **(own if name == "mae" else {})}
    old["distill"] = {**OLD_DISTILL, **(own if name == "distill" else {})}
    old["objective"] = {"name": name}
    return old


@pytest.mark.parametrize("objective", [{"name": "classify"}, {"name": "mae", "mask_ratio": 0.6, "decoder_dim": 32}])
def test_an_old_layout_reads_as_todays_and_todays_unchanged(make_config, objective):
    config = make_config(objective=objective).to_dict()
    assert upgrade_saved(old_layout(config)) == config
    assert upgrade_saved(config) == config
    assert Config.from_saved(old_layout(config)).to_dict() == config
    with pytest.raises(ConfigError):  # the old layout is not today's input: another option's keys are refused
        Config.from_dict(old_layout(config))


def test_a_checkpoint_of_the_old_layout_resumes_exactly_and_sees_no_change(make_config, tmp_path):
    sections = dict(trainer={"max_steps": 6, "ckpt_every": 1, "keep_last": 10, "log_every": 1},
                    model={"drop_path": 0.1})
    full = tmp_path / "full"
    train(make_config(**sections), full)
    snapshot = torch.load(full / "checkpoints" / "step_00000003.pt", weights_only=True)
    snapshot["config"] = old_layout(snapshot["config"])  # as the earlier version wrote it
    old = tmp_path / "old.pt"
    torch.save(snapshot, old)
    cfg = make_config(**sections, resume=str(old))
    assert check_compatible(snapshot, cfg, old) == []  # nothing changed: the other options' keys were never read
    train(cfg, tmp_path / "resumed")
    expected, got = (torch.load(run / "checkpoints" / "last.pt", weights_only=True) for run in (full,
                                                                                                 tmp_path / "resumed"))
    for key in ("model", "optimizer", "step", "best_score", "rng"):
        assert_identical(expected[key], got[key], key)
    assert got["config"] == {**expected["config"], "resume": str(old)}  # written in today's layout
    losses = lambda run: {r["step"]: r["loss"] for r in logged(run, "train")}  # noqa: E731 (timings differ)
    assert losses(tmp_path / "resumed") == {s: v for s, v in losses(full).items() if s > 3}


def test_vit_eval_reads_a_checkpoint_of_the_old_layout(make_config, tmp_path):
    from vit_train.tools.report import evaluate_checkpoint

    train(make_config(trainer={"max_steps": 2}), tmp_path / "run")
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    now = evaluate_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt", attention_images=0, progress=False,
                              out_dir=tmp_path / "now")
    ckpt["config"] = old_layout(ckpt["config"])
    torch.save(ckpt, tmp_path / "old.pt")
    before = evaluate_checkpoint(tmp_path / "old.pt", attention_images=0, progress=False, out_dir=tmp_path / "before")
    assert (before["top1"], before["loss"], before["overrides"]) == (now["top1"], now["loss"], {})


@pytest.mark.parametrize("args, renamed, notes", [
    (["mae.mask_ratio=0.6"], ["objective.mask_ratio=0.6"], 1),
    (["+distill.teacher=t.pt", "~mae.decoder_dim"], ["+objective.teacher=t.pt", "~objective.decoder_dim"], 2),
    (["-m", "mae.mask_ratio=0.5,0.75", "optim.lr=1e-3"], ["-m", "objective.mask_ratio=0.5,0.75", "optim.lr=1e-3"], 1),
    (["model.mae=2", "objective.mask_ratio=0.5"], ["model.mae=2", "objective.mask_ratio=0.5"], 0),  # not moved keys
])
def test_the_old_spelling_on_the_command_line_is_renamed_with_one_line_each(args, renamed, notes):
    got, lines = rename_old_keys(args)
    assert got == renamed and len(lines) == notes
    assert all(line.endswith("the old spelling works until the next release") and "\n" not in line for line in lines)


@pytest.mark.parametrize("args, refused", [
    (["objective=mae", "mae.teacher=x"], r"^mae.teacher: 'mae' is no longer a section \(objective=mae's keys are "
                                         r"objective.\* now\) and objective=mae has no key teacher \(its keys: mask_"),
    (["mae.mask_ratio=0.6", "objective.mask_ratio=0.5"], r"^mae.mask_ratio=0.6 and objective.mask_ratio=0.5 set the "
                                                         r"same key .*; give one: objective.mask_ratio=0.5$"),
])
def test_an_old_spelling_that_names_no_key_or_a_key_given_twice_is_refused(args, refused):
    """`mae.teacher` was "did you mean objective.teacher? (keys of 'mae': )"; both spellings of one key let the
    later one win silently."""
    with pytest.raises(ConfigError, match=refused):
        rename_old_keys(args)


def test_a_run_spelled_the_old_way_trains_says_so_once_and_records_the_new_spelling(tmp_path):
    done = vit_train(*TINY, "objective=mae", "mae.mask_ratio=0.5", "mae.decoder_dim=32", "trainer.max_steps=1",
                     f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    said = "mae.mask_ratio is spelled objective.mask_ratio now (objective=mae's keys moved under objective.*)"
    assert done.stdout.count(said) == 1 and said in (tmp_path / "run" / "train.log").read_text()
    saved = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    assert saved["config"]["objective"] == {"name": "mae", "mask_ratio": 0.5, "decoder_dim": 32, "decoder_depth": 2,
                                            "decoder_heads": 4, "norm_pix_loss": True}
    assert "objective.mask_ratio=0.5" in (tmp_path / "run" / ".hydra" / "overrides.yaml").read_text()
