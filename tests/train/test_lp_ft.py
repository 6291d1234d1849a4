"""LP-FT in one run (model.lp_epochs; Kumar et al. 2022): the head alone trains on the frozen network for the first
lp_epochs, then the whole network from that head, the lr schedule restarting at the change. Shown exactly: the
frozen parameters equal the pre-trained weights bit for bit through the probe stage (no weight decay, no moments),
the probe is evaluated at its last step and recorded in results.json, the lr at the change is the lr of the first
step, and a run killed on either side of the change resumes as the uninterrupted one (every file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers.configs import tiny_config
from helpers.files import logged
from helpers.kill_resume import kill_9_at, resume_as_the_reference
from vit_train.config import Config
from vit_train.errors import CheckpointError, ConfigError
from vit_train.train.trainer import train

# 8 steps an epoch, 16 in all: steps 1-8 the head alone, 9-16 everything; checkpoints at 3, 6, 8 (eval), 9, 12, 15, 16
TRAINER = {"log_every": 1, "ckpt_every": 3, "keep_last": 100}
HEAD = ("head.weight", "head.bias")


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """A short run whose weights the LP-FT runs start from."""
    run = tmp_path_factory.mktemp("pretrained")
    train(tiny_config(trainer={"max_steps": 4}), run)
    return run / "checkpoints" / "last.pt"


def sections(pretrained: Path, **model) -> dict:
    return {"trainer": TRAINER, "model": {"pretrained": str(pretrained), "lp_epochs": 1, **model},
            "schedule": {"warmup_epochs": 0.5}}


@pytest.fixture(scope="module")
def lp_ft(pretrained, tmp_path_factory) -> tuple[Path, dict]:
    run = tmp_path_factory.mktemp("lp_ft")
    return run, train(tiny_config(**sections(pretrained)), run)


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["model"]


def test_the_probe_stage_trains_the_head_alone_then_every_parameter_trains(pretrained, lp_ft):
    run, _ = lp_ft
    start = weights(pretrained)
    for step in (3, 6, 8):
        now = weights(run / "checkpoints" / f"step_{step:08d}.pt")
        frozen = [k for k in start if k not in HEAD]
        assert frozen and all(torch.equal(now[k], start[k]) for k in frozen), (step, [
            k for k in frozen if not torch.equal(now[k], start[k])])
        assert not torch.equal(now["head.weight"], start["head.weight"])
    after = weights(run / "checkpoints" / "step_00000009.pt")
    changed = [k for k in start if not torch.equal(after[k], weights(run / "checkpoints" / "step_00000008.pt")[k])]
    assert {"blocks.0.attn.qkv.weight", "patch_embed.proj.weight", "norm.weight"} <= set(changed)


def test_the_frozen_parameters_have_no_moments_until_they_train(lp_ft):
    """AdamW keeps moments for the parameters it has stepped: the head's in the probe stage, every one after."""
    run, _ = lp_ft
    probe, after = (torch.load(run / "checkpoints" / f"step_{s:08d}.pt", weights_only=True) for s in (8, 9))
    assert len(probe["optimizer"]["state"]) == len(HEAD)
    assert len(after["optimizer"]["state"]) == len(after["model"])  # the ViT's entries are all parameters


def test_the_probe_is_evaluated_at_its_last_step_and_recorded(lp_ft):
    run, results = lp_ft
    val = {row["step"]: row for row in logged(run, "val")}
    assert sorted(val) == [8, 16]
    assert (results["lp_steps"], results["lp_score"], results["ft_steps"]) == (8, val[8]["top1"], 8)
    assert json.loads((run / "results.json").read_text())["lp_score"] == val[8]["top1"]
    log = (run / "train.log").read_text()
    assert "LP-FT (model.lp_epochs=1): steps 1-8 train the head alone on the frozen network (peak lr 0.001), " \
           "then the whole network trains (steps 9-16); the lr schedule restarts at the change" in log
    assert f"LP-FT: the head trained alone for 8 steps (val top1 {val[8]['top1']:.4g}); the whole network trains " \
           f"from step 9" in log


def test_the_lr_schedule_restarts_at_the_change(lp_ft):
    run, _ = lp_ft
    lr = {row["step"]: row["lr"] for row in logged(run, "train")}
    assert lr[9] == lr[1] and lr[10] == lr[2] and lr[12] == lr[4]  # the warmup again, step for step
    assert lr[4] == max(lr[s] for s in range(1, 9))  # warmup ends at the stage's 4th step, then cosine
    assert lr[8] < lr[4] and lr[16] < lr[12]


@pytest.mark.parametrize("scaled", [False, True], ids=["lp_lr", "lp_lr batch-scaled"])
def test_lp_lr_is_the_probe_stages_peak_and_the_fine_tune_keeps_optim_lr(pretrained, lp_ft, tmp_path, scaled):
    """model.lp_lr: the head-alone stage's curve peaks at lp_lr (x data.batch_size / optim.lr_base_batch, as
    optim.lr) and ends at schedule.min_lr; from the change the lr is the run without lp_lr's, step for step."""
    reference, _ = lp_ft
    optim = {"lr": 1e-3 * 256 / 32, "lr_base_batch": 256} if scaled else {}  # scaled: the same Config.lr, 1e-3
    run = tmp_path / "lp_lr"
    train(tiny_config(**sections(pretrained, lp_lr=2e-2), optim=optim), run)
    peak, low = (2e-2 * 32 / 256 if scaled else 2e-2), 1e-5  # schedule.min_lr
    lr, plain = ({row["step"]: row["lr"] for row in logged(r, "train")} for r in (run, reference))
    assert plain[4] == pytest.approx(1e-3, rel=1e-12) and lr[4] == pytest.approx(peak, rel=1e-12)
    assert [lr[s] / peak for s in range(1, 5)] == pytest.approx([plain[s] / 1e-3 for s in range(1, 5)], rel=1e-12)
    assert [(lr[s] - low) / (peak - low) for s in range(5, 9)] == pytest.approx(  # the same cosine, to min_lr
        [(plain[s] - low) / (1e-3 - low) for s in range(5, 9)], rel=1e-9, abs=1e-12)
    assert lr[8] == pytest.approx(low, rel=1e-9)
    assert [lr[s] for s in range(9, 17)] == pytest.approx([plain[s] for s in range(9, 17)], rel=1e-12)
    assert f"(peak lr {peak:g})" in (run / "train.log").read_text()


@pytest.mark.parametrize("row, stage", [(7, "killed in the probe stage"), (10, "killed after the change")])
@pytest.mark.slow
def test_a_run_killed_on_either_side_of_the_change_resumes_as_the_uninterrupted_one(pretrained, lp_ft, tmp_path,
                                                                                        row, stage):
    reference, _ = lp_ft
    run = tmp_path / "killed"
    kill_9_at(run, sections(pretrained), "row", row)
    resume_as_the_reference(run, sections(pretrained), reference)


@pytest.mark.parametrize("change, said", [
    ({"model": {"lp_epochs": 1, "trainable": "head"}},
     "model.lp_epochs trains the head alone first, then the whole network, which model.trainable=head keeps frozen: "
     "set model.trainable=all (or model.lp_epochs=0 for a linear probe)"),
    ({"model": {"lp_epochs": -1}}, "model.lp_epochs must be >= 0 (0 = off), got -1"),
    ({"model": {"lp_epochs": 1}, "objective": {"name": "mae"}},
     "model.lp_epochs (LP-FT) fine-tunes a classifier from a probe of its head; objective=mae pre-trains an encoder "
     "without one: set model.lp_epochs=0 here, and give it to the fine-tuning run (model.pretrained=<this run>)"),
    ({"model": {"lp_epochs": 2}, "trainer": {"epochs": 2}},
     "model.lp_epochs=2 is not shorter than trainer.epochs=2: the whole network would never train, a linear probe "
     "without the probe's BatchNorm; raise trainer.epochs or lower model.lp_epochs (for a probe: model.trainable=head "
     "model.lp_epochs=0)"),
    ({"model": {"lp_lr": 1e-2}},
     "model.lp_lr=0.01 is the lr of LP-FT's head-alone stage, which model.lp_epochs=0 does not have: set "
     "model.lp_epochs, or drop model.lp_lr"),
    ({"model": {"lp_epochs": 1, "lp_lr": 0}}, "model.lp_lr must be a finite number > 0 (or null for optim.lr's), got 0"),
    ({"model": {"lp_epochs": 1, "lp_lr": float("inf")}},
     "model.lp_lr must be a finite number > 0 (or null for optim.lr's), got inf"),
    ({"model": {"lp_epochs": 1, "lp_lr": 1e300}},
     "model.lp_lr must be a finite number > 0 (or null for optim.lr's), got 1e+300"),
    ({"model": {"lp_epochs": 1, "lp_lr": float("nan")}},
     "model.lp_lr must be a finite number > 0 (or null for optim.lr's), got nan"),
    ({"model": {"lp_epochs": 1, "lp_lr": 1e-6}, "schedule": {"min_lr": 1e-5}},
     "model.lp_lr (1e-06) must be at least schedule.min_lr (1e-05)"),
    ({"model": {"lp_epochs": 1, "lp_lr": 1e-3}, "optim": {"lr": 1e-3, "lr_base_batch": 256}, "data": {"batch_size": 8},
      "schedule": {"min_lr": 1e-4}},
     "model.lp_lr (0.001, 3.125e-05 after batch scaling) must be at least schedule.min_lr (0.0001)"),
    ({"model": {"lp_epochs": 1}, "trainer": {"compile": True, "compile_scope": "step"}},
     "model.lp_epochs changes which parameters train mid-run, which trainer.compile_scope=step's one graph cannot "
     "follow; use trainer.compile_scope=model"),
])
def test_what_lp_ft_cannot_run_with_is_one_line(change, said):
    with pytest.raises(ConfigError) as caught:
        Config.from_dict(change)
    assert str(caught.value) == said


def test_a_resume_that_moves_the_change_is_refused(pretrained, lp_ft, tmp_path):
    run, _ = lp_ft
    cfg = tiny_config(**{**sections(pretrained), "model": {"pretrained": str(pretrained), "lp_epochs": 0.5}},
                      resume=str(run / "checkpoints" / "step_00000006.pt"))
    with pytest.raises(CheckpointError, match=r"model.lp_epochs: 1.0 -> 0.5\): LP-FT's change from the head alone to "
                                              r"the whole network, and the lr schedule's restart, would move"):
        train(cfg, tmp_path / "moved")


def test_a_resume_with_another_batch_size_is_refused_not_refrozen(pretrained, lp_ft, tmp_path):
    """The probe stage is counted in epochs: at another batch size the change would move (a network fine-tuning
    since step 9 frozen again until step 16, the lr schedule restarting twice)."""
    run, _ = lp_ft
    cfg = tiny_config(**{**sections(pretrained), "data": {"batch_size": 16}},
                      resume=str(run / "checkpoints" / "step_00000012.pt"))
    with pytest.raises(ConfigError, match=r"^model.lp_epochs=1 counts epochs of data.batch_size=32 in this run: "
                                          r"resumed with data.batch_size=16 its change from the head alone to the "
                                          r"whole network would move; resume with data.batch_size=32$"):
        train(cfg, tmp_path / "moved")


def test_a_run_that_ends_in_the_probe_stage_says_so_and_records_the_steps_it_ran(pretrained, tmp_path):
    """trainer.max_steps before the change: a warning says the whole network never trains, and results.json counts
    the probe's steps that ran (5 of the 8 planned), none of the whole network's, no probe score (no evaluation at 8)."""
    results = train(tiny_config(**{**sections(pretrained), "trainer": {**TRAINER, "max_steps": 5}}), tmp_path / "short")
    assert (results["steps"], results["lp_steps"], results["ft_steps"], results["lp_score"]) == (5, 5, 0, None)
    assert json.loads((tmp_path / "short" / "results.json").read_text())["lp_steps"] == 5
    assert "[WARNING] LP-FT (model.lp_epochs=1): steps 1-5 train the head alone on the frozen network (peak lr 0.001), " \
           "then the whole network trains: never in this run, which ends first, at step 5 (raise trainer.max_steps or " \
           "trainer.epochs); the lr schedule restarts at the change" in (tmp_path / "short" / "train.log").read_text()


def test_a_run_that_ends_in_the_probe_stage_keeps_lp_lr(pretrained, tmp_path):
    """trainer.max_steps inside the probe stage: its curve runs to the run's end at model.lp_lr's peak (not optim.lr's),
    warmup and cosine over the 5 steps that run, ending at schedule.min_lr."""
    cfg = {**sections(pretrained, lp_lr=2e-2), "trainer": {**TRAINER, "max_steps": 5}, "schedule": {"warmup_epochs": 0.25}}
    train(tiny_config(**cfg), tmp_path / "short")
    lr = [row["lr"] for row in logged(tmp_path / "short", "train")]
    assert len(lr) == 5 and lr[:2] == pytest.approx([1e-2, 2e-2], rel=1e-12) and max(lr) == pytest.approx(2e-2)
    assert lr[-1] == pytest.approx(1e-5, rel=1e-9)


def test_lp_epochs_shorter_than_a_step_is_refused_not_dropped(pretrained, tmp_path):
    with pytest.raises(ConfigError, match=r"^model.lp_epochs=0.01 is 0.08 of a step \(8 steps an epoch\): give at "
                                          r"least 0.12, or 0 for no probe stage$"):
        train(tiny_config(**sections(pretrained, lp_epochs=0.01)), tmp_path / "short")
