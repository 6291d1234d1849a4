"""Where distillation's teacher meets other parts (docs/distillation.md "The teacher"): a file without
a classifier head (an MAE pre-training checkpoint, its run directory or export, a headless state) is
refused in one line; a run directory is hashed as the best.pt it resolves to; a relative teacher path
resumed from elsewhere, or a changed teacher file, is refused with what to do; objective=classify
refuses model.distilled."""

import shutil
import subprocess
import sys

import pytest
import torch

from vit_train.errors import CheckpointError, ConfigError
from vit_train.objectives import check_objective
from vit_train.objectives.distill import file_sha256
from vit_train.outputs.checkpoint import load_checkpoint
from vit_train.train.trainer import train

FEW = {"train_size": 64, "val_size": 32, "batch_size": 16}
MAE = {"objective": {"name": "mae"}, "mae": {"decoder_dim": 16, "decoder_depth": 1, "decoder_heads": 2}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"mae": an MAE pre-training run, "classify": a classifier run, "mae.safetensors": MAE's export,
    "headless.pt": the classifier's checkpoint without its head.* tensors}, 2 steps each."""
    from tests.helpers.configs import tiny_config
    from vit_train.outputs.weights import export_safetensors

    folder = tmp_path_factory.mktemp("teachers")
    train(tiny_config(**MAE, data=FEW, trainer={"max_steps": 2}), folder / "mae")
    train(tiny_config(data=FEW, trainer={"max_steps": 2}), folder / "classify")
    export_safetensors(load_checkpoint(folder / "mae" / "checkpoints" / "last.pt"), folder / "mae.safetensors")
    ckpt = torch.load(folder / "classify" / "checkpoints" / "last.pt", weights_only=True)
    ckpt["model"] = {k: v for k, v in ckpt["model"].items() if not k.startswith("head.")}
    ckpt["ema"] = None
    torch.save(ckpt, folder / "headless.pt")
    return folder


def distill(make_config, teacher, **extra):
    return make_config(objective={"name": "distill"}, model={"distilled": True}, data=FEW,
                       distill={"teacher": str(teacher)}, **extra)


@pytest.mark.parametrize("teacher, message", [
    ("mae/checkpoints/last.pt", "is a masked-autoencoder pre-training checkpoint (objective=mae)"),
    ("mae", "is a masked-autoencoder pre-training checkpoint (objective=mae)"),  # its run directory
    ("mae.safetensors", "is a masked-autoencoder pre-training checkpoint (objective=mae)"),
    ("headless.pt", "holds no classifier head (head.weight, head.bias missing)"),
], ids=["mae-checkpoint", "mae-run-dir", "mae-safetensors", "headless"])
def test_a_teacher_without_a_classifier_head_is_refused_in_one_line(runs, tmp_path, make_config, teacher, message):
    pytest.importorskip("safetensors")
    with pytest.raises(ConfigError) as refused:
        train(distill(make_config, runs / teacher, trainer={"max_steps": 1}), tmp_path / "student")
    text = str(refused.value)
    assert message in text and "\n" not in text, text
    assert "fine-tune it first" in text.lower() and "model.pretrained=" in text, text
    assert not any((tmp_path / "student").rglob("*.pt"))  # refused before any checkpoint


@pytest.mark.parametrize("named", ["classify", "classify/checkpoints"], ids=["run-dir", "checkpoints-dir"])
def test_a_run_directory_teacher_is_hashed_as_its_best_pt_and_resumes(runs, tmp_path, make_config, named):
    trainer = {"max_steps": 2, "ckpt_every": 1}
    train(distill(make_config, runs / named, trainer=trainer), tmp_path)
    saved = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)["objective"]
    best = runs / "classify" / "checkpoints" / "best.pt"
    assert saved["teacher"] == str(runs / named) and saved["teacher_sha256"] == file_sha256(best)
    results = train(distill(make_config, runs / named, trainer={**trainer, "max_steps": 3}, resume="auto"), tmp_path)
    assert results["status"] == "completed" and results["steps"] == 3


@pytest.fixture
def relative_run(runs, tmp_path, make_config, monkeypatch):
    """A distillation run started in tmp_path/first with the relative teacher path teacher.pt; then the
    working directory is tmp_path/elsewhere. (run dir, teacher file)."""
    first, elsewhere = tmp_path / "first", tmp_path / "elsewhere"
    first.mkdir(), elsewhere.mkdir()
    shutil.copyfile(runs / "classify" / "checkpoints" / "last.pt", first / "teacher.pt")
    monkeypatch.chdir(first)
    train(distill(make_config, "teacher.pt", trainer={"max_steps": 2}), tmp_path / "run")
    monkeypatch.chdir(elsewhere)
    return tmp_path / "run", first / "teacher.pt"


def test_a_relative_teacher_resumed_elsewhere_says_where_it_is_relative_to(relative_run, make_config):
    run, teacher = relative_run
    with pytest.raises(ConfigError) as refused:
        train(distill(make_config, "teacher.pt", trainer={"max_steps": 3}, resume="auto"), run)
    text = str(refused.value)
    assert "relative to where the first run started" in text and "distill.teacher=<its new path>" in text, text
    assert "\n" not in text
    results = train(distill(make_config, teacher, trainer={"max_steps": 3}, resume="auto"), run)  # the same file
    assert results["status"] == "completed" and results["steps"] == 3


@pytest.mark.parametrize("change", [b"\0", b"other"], ids=["appended", "replaced"])
def test_another_teacher_file_on_resume_offers_a_new_run_from_the_weights(relative_run, make_config, tmp_path, change):
    run, teacher = relative_run
    other = tmp_path / "other.pt"
    other.write_bytes(teacher.read_bytes() + change if change == b"\0" else teacher.read_bytes()[:-8] + change * 2)
    with pytest.raises(CheckpointError) as refused:
        train(distill(make_config, other, trainer={"max_steps": 3}, resume="auto"), run)
    text = str(refused.value)
    assert "SHA-256 differs" in text and "model.pretrained=<the checkpoint>" in text and "\n" not in text, text


@pytest.mark.parametrize("sections, refused", [
    ({"model": {"distilled": True}}, True),
    ({"model": {"distilled": True, "trainable": "head"}}, True),
    ({"model": {"distilled": True, "pos_embed": "sincos2d"}}, True),
    ({"model": {"distilled": False}}, False),
    ({"model": {"distilled": True}, "objective": {"name": "distill"}, "distill": {"teacher": "t.pt"}}, False),
], ids=["classify-distilled", "classify-probe-distilled", "classify-sincos-distilled", "classify-plain",
        "distill-distilled"])
def test_classify_refuses_a_distillation_token_without_a_teacher(make_config, sections, refused):
    cfg = make_config(**sections)
    if not refused:
        check_objective(cfg)
        return
    with pytest.raises(ConfigError) as error:
        check_objective(cfg)
    assert str(error.value).startswith("model.distilled adds DeiT's distillation token; it is for objective=distill "
                                       "with a distill.teacher") and "\n" not in str(error.value)


def test_classify_with_a_distillation_token_is_refused_before_train_writes_anything(make_config, tmp_path):
    with pytest.raises(ConfigError, match="model.distilled adds DeiT's distillation token"):
        train(make_config(model={"distilled": True}, data=FEW, trainer={"max_steps": 1}), tmp_path / "run")
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").rglob("*.pt"))


@pytest.mark.slow
def test_the_command_line_refuses_an_mae_teacher_in_one_line_with_exit_2(runs, tmp_path):
    """The tester's repro: an MAE run's last.pt as distill.teacher crashed with KeyError: 'pos_embed'."""
    result = subprocess.run([sys.executable, "-m", "vit_train", "model=vit_micro", "trainer=debug", "data=shapes",
                             "data.train_size=64", "data.val_size=32", "data.batch_size=16", "trainer.max_steps=2",
                             "objective=distill", f"distill.teacher={runs / 'mae' / 'checkpoints' / 'last.pt'}",
                             "model.distilled=true", "hydra.run.dir=student"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stdout + result.stderr, result.stderr
    assert "is a masked-autoencoder pre-training checkpoint" in lines[0], lines[0]
    assert not list((tmp_path / "student").rglob("*.pt"))
