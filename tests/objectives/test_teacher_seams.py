"""Where distillation's teacher meets other parts (docs/distillation.md "The teacher"): a file without
a classifier head (an MAE pre-training checkpoint, its run directory or export, a headless state) is
refused in one line; a run directory is hashed as the best.pt it resolves to; a relative teacher path
resumed from elsewhere, or a changed teacher file, is refused with what to do; objective=classify
with model.distilled trains both heads on the labels."""

import shutil
import subprocess
import sys

import pytest
import torch

from helpers.files import file_bytes
from vit_train.errors import CheckpointError, ConfigError
from vit_train.objectives.teacher import file_sha256
from vit_train.checkpoint import load_checkpoint
from vit_train.train.trainer import train

FEW = {"train_size": 64, "val_size": 32, "batch_size": 16}
MAE = {"objective": {"name": "mae", "decoder_dim": 16, "decoder_depth": 1, "decoder_heads": 2}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"mae": an MAE pre-training run, "classify": a classifier run, "mae.safetensors": MAE's export,
    "headless.pt": the classifier's checkpoint without its head.* tensors}, 2 steps each."""
    from helpers.configs import tiny_config
    from vit_train.checkpoint import export_safetensors

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
    return make_config(objective={"name": "distill", "teacher": str(teacher)}, model={"distilled": True}, data=FEW,
                       **extra)


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
    assert "relative to where the first run started" in text and "objective.teacher=<its new path>" in text, text
    assert "\n" not in text
    results = train(distill(make_config, teacher, trainer={"max_steps": 3}, resume="auto"), run)  # the same file
    assert results["status"] == "completed" and results["steps"] == 3


@pytest.mark.parametrize("change", [b"\0", b"other"], ids=["appended", "replaced"])
def test_another_teacher_file_on_resume_offers_a_new_run_from_the_weights(relative_run, make_config, tmp_path, change):
    run, teacher = relative_run
    other = tmp_path / "other.pt"
    other.write_bytes(teacher.read_bytes() + change if change == b"\0" else teacher.read_bytes()[:-8] + change * 2)
    before = file_bytes(run)
    with pytest.raises(CheckpointError) as refused:
        train(distill(make_config, other, trainer={"max_steps": 3}, resume="auto"), run)
    text = str(refused.value)
    assert "SHA-256 differs" in text and "\n" not in text, text
    assert f"vit-train objective=distill model.pretrained={run / 'checkpoints' / 'last.pt'} " in text, text  # its path
    assert file_bytes(run) == before  # refused before the run was built: nothing written, the lock file as it was


def test_classify_with_a_distillation_token_trains_both_heads_on_the_labels(make_config, tmp_path):
    """Fine-tuning a distilled DeiT on a new task without a teacher (timm: VisionTransformerDistilled,
    distilled training off): objective=classify accepts model.distilled and both heads learn."""
    cfg = make_config(model={"distilled": True}, data=FEW, trainer={"max_steps": 2, "ckpt_every": 1, "keep_last": 5})
    train(cfg, tmp_path / "run")
    folder = tmp_path / "run" / "checkpoints"
    after_1, after_2 = (torch.load(folder / f"step_{n:08d}.pt", weights_only=True)["model"] for n in (1, 2))
    for name in ("head.weight", "head_dist.weight", "dist_token"):  # the second step moved every head
        assert not torch.equal(after_1[name], after_2[name]), name


@pytest.mark.slow
def test_the_command_line_refuses_an_mae_teacher_in_one_line_with_exit_2(runs, tmp_path):
    """The tester's repro: an MAE run's last.pt as objective.teacher crashed with KeyError: 'pos_embed'."""
    result = subprocess.run([sys.executable, "-m", "vit_train", "model=vit_micro", "trainer=debug", "data=shapes",
                             "data.train_size=64", "data.val_size=32", "data.batch_size=16", "trainer.max_steps=2",
                             "objective=distill", f"objective.teacher={runs / 'mae' / 'checkpoints' / 'last.pt'}",
                             "model.distilled=true", "hydra.run.dir=student"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stdout + result.stderr, result.stderr
    assert "is a masked-autoencoder pre-training checkpoint" in lines[0], lines[0]
    assert not list((tmp_path / "student").rglob("*.pt"))
