"""trainer.strategy=fsdp (FSDP2 fully_shard, train/sharding.py): torchrun with gloo on the CPU, 2 processes.

The oracle is tests/helpers/two_processes.py's, which tests/runtime/test_distributed.py uses for 2 processes
against 1: per-step losses within
1e-5 relative, weights within rtol 1e-4 / atol 1e-5 but the key thirds of the qkv biases, pure rounding noise,
within their AdamW noise bound (`assert_weights_close`). FSDP against DDP on the
same 2 processes draws the same dropout masks (the same per-rank seeds), so that holds with dropout on.
Checkpoints do not care how they were written: an FSDP one resumes under DDP and under one process, a
DDP one under FSDP, continuing as the uninterrupted run within the same tolerance.

Inputs from users' reports: the LR scheduler's `initial_lr` in the saved param groups, which
set_optimizer_state_dict drops or refuses (pytorch/pytorch#126948, #140900: a DDP checkpoint resumed
under FSDP keeps it, the param groups compared whole); an EMA sharded exactly like the model so it
averages shard by shard (meta-pytorch/tnt#565), with MAE's plain sin-cos buffers beside DTensor
parameters (one foreach call cannot take both); clipping by the global norm of DTensor gradients.
"""

from __future__ import annotations

import re
import shutil

import pytest
import torch

from helpers.configs import tiny_config
from helpers.files import logged, model_weights, read_results
from helpers.in_process import run_main
from helpers.runs import torchrun, vit_train
from helpers.two_processes import TINY, assert_weights_close
from vit_train.config import Config
from vit_train.errors import ConfigError
from vit_train.schema.config import ignored_keys
from vit_train.tools.report import evaluate_checkpoint
from vit_train.train.sharding import reshard_policy

EXTRAS = ["trainer.ema_decay=0.9", "optim.clip_grad=0.05", "model.drop_path=0.2"]  # EMA, clipping that bites, RNG
FSDP = "trainer.strategy=fsdp"


def _ckpt(run, name="last.pt"):
    return torch.load(run / "checkpoints" / name, weights_only=True)


def _assert_losses_close(a, b):
    la, lb = logged(a, "train"), logged(b, "train")
    assert [e["step"] for e in la] == [e["step"] for e in lb] and la
    for x, y in zip(la, lb):
        assert abs(x["loss"] - y["loss"]) <= 1e-5 * x["loss"], (x, y)
        assert abs(x["grad_norm"] - y["grad_norm"]) <= 1e-4 * x["grad_norm"], (x, y)


def _assert_same_layout_and_close(a: dict, b: dict):
    """Two checkpoints' model, EMA and optimiser: the same keys, shapes and layout, values within tolerance."""
    assert_weights_close(a, b)
    assert a["model"].keys() == b["model"].keys()
    assert (a["ema"] is None) == (b["ema"] is None)
    if a["ema"] is not None:
        assert a["ema"].keys() == b["ema"].keys()
        assert_weights_close(a, b, "ema")
    oa, ob = a["optimizer"], b["optimizer"]
    assert oa["param_groups"] == ob["param_groups"]  # hyperparameters and parameter indices as torch numbers them
    assert sorted(oa["state"]) == sorted(ob["state"])
    for i in oa["state"]:
        assert oa["state"][i].keys() == ob["state"][i].keys()
        for key, value in oa["state"][i].items():
            assert not hasattr(value, "placements")  # a plain tensor, not a DTensor
            torch.testing.assert_close(value, ob["state"][i][key], rtol=1e-4, atol=1e-7, msg=f"{i}.{key}")


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_fsdp_trains_as_ddp_and_as_one_process_and_saves_the_same_checkpoint(tmp_path):
    fsdp = torchrun(*TINY, *EXTRAS, "trainer.epochs=2", FSDP, "hydra.run.dir=fsdp", cwd=tmp_path)
    assert fsdp.returncode == 0, fsdp.stdout + fsdp.stderr
    ddp = torchrun(*TINY, *EXTRAS, "trainer.epochs=2", "hydra.run.dir=ddp", cwd=tmp_path)
    assert ddp.returncode == 0, ddp.stdout + ddp.stderr
    _assert_losses_close(tmp_path / "ddp", tmp_path / "fsdp")
    _assert_same_layout_and_close(_ckpt(tmp_path / "ddp"), _ckpt(tmp_path / "fsdp"))
    assert "x 2 processes (FSDP: weights, gradients and optimiser state sharded)" in (tmp_path / "fsdp" / "train.log").read_text()
    assert "x 2 processes (DDP)" in (tmp_path / "ddp" / "train.log").read_text()
    # against one process (drop path off: its draws are per process)
    quiet = [a for a in EXTRAS if not a.startswith("model.drop_path")]
    one = vit_train(*TINY, *quiet, "trainer.epochs=2", "hydra.run.dir=one", cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    fsdp_quiet = torchrun(*TINY, *quiet, "trainer.epochs=2", FSDP, "hydra.run.dir=fsdp_quiet", cwd=tmp_path)
    assert fsdp_quiet.returncode == 0, fsdp_quiet.stdout + fsdp_quiet.stderr
    _assert_losses_close(tmp_path / "one", tmp_path / "fsdp_quiet")
    assert_weights_close(tmp_path / "one", tmp_path / "fsdp_quiet")
    # the whole val set evaluated once (101 images: 51 + 50), as vit-eval reads the FSDP run's checkpoint
    results = read_results(tmp_path / "fsdp")
    alone = evaluate_checkpoint(tmp_path / "fsdp" / "checkpoints" / "last.pt", weights="model", attention_images=0,
                                out_dir=tmp_path / "eval", progress=False)  # final_top1 is the model's
    assert alone["images"] == 101 and alone["top1"] == results["final_top1"]
    assert alone["loss"] == pytest.approx(results["final_loss"], rel=1e-5)


@pytest.mark.slow  # 5 torchrun launches and a 1-process run, ~100 s on 2 cores
def test_an_fsdp_checkpoint_resumes_under_ddp_and_one_process_and_a_ddp_one_under_fsdp(tmp_path):
    quiet = [a for a in EXTRAS if not a.startswith("model.drop_path")]  # one process draws no per-rank masks
    for name, strategy in (("fsdp", FSDP), ("ddp", "trainer.strategy=ddp")):
        done = torchrun(*TINY, *quiet, "trainer.epochs=2", strategy, f"hydra.run.dir={name}", cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
    for source, into, launch in (("fsdp", "ddp", torchrun), ("fsdp", "one", vit_train), ("ddp", "fsdp", torchrun)):
        copy = tmp_path / f"{source}_into_{into}"
        shutil.copytree(tmp_path / source, copy)
        for name in ("last.pt", "step_00000016.pt", "best.pt"):
            (copy / "checkpoints" / name).unlink(missing_ok=True)  # the newest left is step 8, the end of epoch 1
        strategy = FSDP if into == "fsdp" else "trainer.strategy=ddp"
        done = launch(f"resume={copy}", strategy, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "step_00000008.pt" in done.stdout
        _assert_losses_close(tmp_path / source, copy)
        _assert_same_layout_and_close(_ckpt(tmp_path / source), _ckpt(copy))


@pytest.mark.slow  # 4 torchrun runs, ~60 s on 2 cores
@pytest.mark.parametrize("objective", ["mae", "distill"])
def test_every_objective_trains_under_fsdp_as_under_ddp(tmp_path, objective):
    extra = ["objective=mae", "objective.decoder_dim=16", "objective.decoder_depth=2", "objective.decoder_heads=2"]
    if objective == "distill":
        teacher = vit_train(*TINY, "model.depth=1", "trainer.max_steps=2", "hydra.run.dir=teacher", cwd=tmp_path)
        assert teacher.returncode == 0, teacher.stderr
        extra = ["objective=distill", "model.distilled=true", f"objective.teacher={tmp_path / 'teacher/checkpoints/last.pt'}"]
    for name, strategy in (("fsdp", FSDP), ("ddp", "trainer.strategy=ddp")):
        done = torchrun(*TINY, *EXTRAS, *extra, "trainer.max_steps=6", strategy, f"hydra.run.dir={name}", cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
    _assert_losses_close(tmp_path / "ddp", tmp_path / "fsdp")
    _assert_same_layout_and_close(_ckpt(tmp_path / "ddp"), _ckpt(tmp_path / "fsdp"))
    assert "x 2 processes (FSDP: weights, gradients and optimiser state sharded)" in (tmp_path / "fsdp" / "train.log").read_text()
    assert "x 2 processes (DDP)" in (tmp_path / "ddp" / "train.log").read_text()


@pytest.mark.slow  # 2 torchrun runs
def test_grad_checkpointing_under_fsdp_gives_the_run_without_it_exactly(tmp_path):
    for name, on in (("plain", "false"), ("checkpointed", "true")):
        done = torchrun(*TINY, *EXTRAS, "trainer.max_steps=6", FSDP, f"model.grad_checkpointing={on}",
                        f"hydra.run.dir={name}", cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
    assert [e["loss"] for e in logged(tmp_path / "plain", "train")] == \
        [e["loss"] for e in logged(tmp_path / "checkpointed", "train")]
    a, b = model_weights(tmp_path / "plain"), model_weights(tmp_path / "checkpointed")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow  # 2 torchrun runs
@pytest.mark.parametrize("reshard", ["true", "false"])
def test_resharding_after_forward_or_not_changes_nothing_but_memory(tmp_path, reshard):
    for name, extra in (("auto", []), ("set", [f"trainer.fsdp_reshard_after_forward={reshard}"])):
        done = torchrun(*TINY, "trainer.max_steps=4", FSDP, *extra, f"hydra.run.dir={name}", cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
    assert [e["loss"] for e in logged(tmp_path / "auto", "train")] == [e["loss"] for e in logged(tmp_path / "set", "train")]


def test_fsdp_in_one_process_trains_the_whole_model_as_ddp_would(tmp_path):
    from vit_train.train.trainer import train

    train(tiny_config(trainer={"max_steps": 3, "log_every": 1, "strategy": "fsdp"}), tmp_path / "fsdp")
    train(tiny_config(trainer={"max_steps": 3, "log_every": 1}), tmp_path / "ddp")
    assert [e["loss"] for e in logged(tmp_path / "fsdp", "train")] == [e["loss"] for e in logged(tmp_path / "ddp", "train")]
    assert "trainer.strategy=fsdp with one process: nothing to shard" in (tmp_path / "fsdp" / "train.log").read_text()


def test_reshard_policy_defaults_to_blocks_yes_root_no():
    assert reshard_policy(tiny_config(trainer={"strategy": "fsdp"})) == (True, False)
    assert reshard_policy(tiny_config(trainer={"strategy": "fsdp", "fsdp_reshard_after_forward": False})) == (False, False)
    assert reshard_policy(tiny_config(trainer={"strategy": "fsdp", "fsdp_reshard_after_forward": True})) == (True, True)


def test_fsdp_with_fp16_is_refused_in_one_line_and_the_reshard_key_warns_without_fsdp():
    with pytest.raises(ConfigError, match="trainer.strategy=fsdp does not take trainer.precision=fp16"):
        Config.from_dict({"trainer": {"strategy": "fsdp", "precision": "fp16"}})
    with pytest.raises(ConfigError, match="trainer.strategy"):
        Config.from_dict({"trainer": {"strategy": "zero3"}})
    lines = ignored_keys(tiny_config(trainer={"fsdp_reshard_after_forward": False}))
    assert lines == ["trainer.fsdp_reshard_after_forward=False has no effect with trainer.strategy=ddp; it applies "
                     "only to trainer.strategy=fsdp"]
    assert ignored_keys(tiny_config(trainer={"strategy": "fsdp", "fsdp_reshard_after_forward": False})) == []


def test_a_bad_strategy_on_the_command_line_is_one_line(tmp_path, monkeypatch, capsys):
    """vit-train's entry point in this process (tests/helpers/in_process.py), from tmp_path."""
    from vit_train.cli.train import train_main

    monkeypatch.chdir(tmp_path)
    status, _, err = run_main(train_main, monkeypatch, capsys, "trainer.strategy=fsdp", "trainer.precision=fp16",
                              prog="vit-train")
    assert status == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("vit-train: error: trainer.strategy=fsdp does not take")


@pytest.mark.slow  # per-block compilation in 2 processes, ~90 s on 2 cores
def test_compiled_blocks_under_fsdp_train_as_eager_ones(tmp_path):
    for name, compiled in (("eager", "false"), ("compiled", "true")):
        done = torchrun(*TINY, "trainer.max_steps=3", FSDP, f"trainer.compile={compiled}", f"hydra.run.dir={name}",
                        cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
    _assert_losses_close(tmp_path / "eager", tmp_path / "compiled")
    assert_weights_close(tmp_path / "eager", tmp_path / "compiled")


@pytest.mark.parametrize("door", ["auto", "run directory", "file"])
def test_a_resume_maps_the_checkpoint_file_instead_of_reading_it_into_each_process(tmp_path, monkeypatch, door):
    """torch.load(mmap=True): the processes of a run share the file's pages (one copy a machine, not one a
    process: 2 x 10 GB for a ViT-H checkpoint otherwise); the weights and moments come from the file."""
    import vit_train.checkpoint.files as checkpoint_module  # where find_resume_checkpoint calls it
    from vit_train.train.trainer import train

    cfg = tiny_config(trainer={"max_steps": 4, "ckpt_every": 2})
    run = tmp_path / "run"
    train(cfg, run)
    loaded = []
    original = checkpoint_module.load_checkpoint

    def spy(path, mmap=False):
        ckpt = original(path, mmap)
        loaded.append((path, _mapped_from(ckpt["model"]["head.weight"])))
        return ckpt

    monkeypatch.setattr(checkpoint_module, "load_checkpoint", spy)
    resume = {"auto": "auto", "run directory": str(run), "file": str(run / "checkpoints" / "last.pt")}[door]
    train(tiny_config(trainer={"max_steps": 6, "ckpt_every": 2}, resume=resume), run)
    last = run / "checkpoints" / "last.pt"
    assert [(str(p), name) for p, name in loaded] == [(str(last), str(last))]
    assert read_results(run)["steps"] == 6


def _mapped_from(tensor: torch.Tensor) -> str | None:
    """The file whose mapping (/proc/self/maps) holds the tensor's memory; None for anonymous memory."""
    address = tensor.data_ptr()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, end = (int(a, 16) for a in fields[0].split("-"))
            if start <= address < end:
                return fields[5].strip() if len(fields) == 6 and fields[5].startswith("/") else None
    return None


@pytest.mark.slow  # 1 torchrun run
def test_a_bf16_fsdp_run_draws_its_attention_figures(tmp_path):
    """figures call model.attention_maps on the sharded model: FSDP must gather for it and cast its input to the
    policy's bf16 (a crash at the first evaluation lost the epoch before the fix)."""
    done = torchrun(*TINY, "trainer.epochs=1", "trainer.precision=bf16", FSDP, "trainer.viz_every=1",
                    "hydra.run.dir=run", cwd=tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout[-3000:] + done.stderr[-3000:]
    assert read_results(tmp_path / "run")["status"] == "completed"
    from helpers.files import tb_events

    figures = {"figures/attention", "figures/attention_heads", "figures/position_similarity", "figures/patch_filters"}
    assert figures <= set(tb_events(tmp_path / "run").Tags()["images"])


BATCHNORM = {"resnet": ["model=resnet18"],  # BatchNorm throughout; the linear probe's head_norm is one BatchNorm
             "probe": ["model.trainable=head", "optim.layer_decay=0.75", "model.depth=2"]}


@pytest.mark.slow  # 3 torchrun runs and a vit-eval a case
@pytest.mark.parametrize("model, strategy", [("resnet", "fsdp"), ("probe", "ddp"), ("probe", "fsdp")])
def test_batchnorm_statistics_are_rank_0s_so_the_logged_val_is_the_checkpoints_and_resumes_exactly(tmp_path, model,
                                                                                                    strategy):
    """Each process evaluates a share of the val set: with its own BatchNorm running statistics (FSDP keeps them
    per process; DDP's broadcast_buffers leaves each process's last update) the logged top-1 was of no saved
    model, and a resume (every process loading rank 0's) changed it. Rank 0's are broadcast before each
    evaluation: the logged score is vit-eval's of the checkpoint, and a resume logs the uninterrupted run's."""
    vit_keys = ("model.embed_dim=", "model.depth=", "model.num_heads=")  # a ResNet has none: refused if given
    tiny = [a for a in TINY if model != "resnet" or not a.startswith(vit_keys)]
    args = [*tiny, *BATCHNORM[model], f"trainer.strategy={strategy}", "trainer.max_steps=6", "trainer.eval_every=3",
            "trainer.ckpt_every=3", "trainer.keep_last=5"]
    whole = torchrun(*args, "hydra.run.dir=whole", cwd=tmp_path)
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    resumed = torchrun(f"resume={tmp_path / 'whole' / 'checkpoints' / 'step_00000003.pt'}", "hydra.run.dir=resumed",
                       cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert [r for r in logged(tmp_path / "resumed", "val") if r["step"] == 6] == \
        [r for r in logged(tmp_path / "whole", "val") if r["step"] == 6]
    results = read_results(tmp_path / "whole")
    alone = evaluate_checkpoint(tmp_path / "whole" / "checkpoints" / "last.pt", weights="model", attention_images=0,
                                out_dir=tmp_path / "eval", progress=False)
    assert alone["images"] == 101 and alone["top1"] == results["final_top1"]
    assert alone["loss"] == pytest.approx(results["final_loss"], rel=1e-5)


@pytest.mark.slow  # 3 torchrun runs
@pytest.mark.parametrize("damage", ["moment of another shape", "moment missing"])
def test_a_damaged_optimiser_state_loads_as_in_one_process(tmp_path, damage):
    """The same file, resumed by 2 FSDP processes and by one: a moment of another shape is one line, exit 2, in
    both; a parameter without saved state starts with fresh moments in both (torch's load_state_dict's rule)."""
    made = torchrun(*TINY, FSDP, "trainer.max_steps=3", "hydra.run.dir=run", cwd=tmp_path)
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    ckpt = _ckpt(tmp_path / "run")
    last = len(ckpt["optimizer"]["state"]) - 1  # the last parameter the optimiser numbers
    if damage == "moment missing":
        del ckpt["optimizer"]["state"][last]
    else:
        ckpt["optimizer"]["state"][2]["exp_avg"] = torch.zeros(5)
    torch.save(ckpt, tmp_path / "damaged.pt")
    runs = {"fsdp": torchrun(f"resume={tmp_path / 'damaged.pt'}", "trainer.max_steps=5", "hydra.run.dir=a",
                             cwd=tmp_path),
            "one": vit_train(f"resume={tmp_path / 'damaged.pt'}", "trainer.max_steps=5", "trainer.strategy=ddp",
                             "hydra.run.dir=b", cwd=tmp_path)}
    if damage == "moment missing":
        assert all(done.returncode == 0 for done in runs.values()), {k: d.stderr[-2000:] for k, d in runs.items()}
        _assert_losses_close(tmp_path / "b", tmp_path / "a")  # FSDP gave it a phantom step: 3, not 2
        steps = [_ckpt(tmp_path / run)["optimizer"]["state"][last]["step"].item() for run in ("a", "b")]
        assert steps == [2.0, 2.0]  # the 2 resumed steps: it started fresh in both
        return
    for name, done in runs.items():
        errors = [line for line in done.stderr.splitlines() if line.startswith("vit-train: error:")]
        assert done.returncode != 0 and "/vit_train/" not in done.stderr, done.stderr[-3000:]  # no traceback of ours
        assert errors and "the checkpoint's optimiser state does not fit this model (the saved optimiser's exp_avg of" \
            in errors[0] and "has shape (5,), the parameter" in errors[0], (name, done.stderr[-2000:])


FC1 = r"blocks\.0\.mlp\.fc1\.weight"  # the parameter the optimiser numbers 3
ADAMW = r"AdamW keeps \['exp_avg', 'exp_avg_sq', 'step'\]"


@pytest.mark.parametrize("damage, says", [
    ("shape", rf"the saved optimiser's exp_avg of {FC1} has shape \(5,\), the parameter \(64, 32\)"),
    ("index", r"the saved optimiser has state for parameter 99, this model's are 0-31\)"),
    ("count", r"the saved optimiser has 31 parameters, this model 32\)"),
    ("group names one twice", r"the saved optimiser's parameter groups name parameter \d+ twice"),
    ("a moment missing", rf"the saved optimiser's state of {FC1} holds \['exp_avg', 'step'\]; {ADAMW}"),
    ("a key too many", rf"the saved optimiser's state of {FC1} holds \['exp_avg', 'exp_avg_sq', 'momentum_buffer', 'step'\]"),
    ("SGD's state", rf"the saved optimiser's state of {FC1} holds \['momentum_buffer'\]; {ADAMW}"),
    ("a moment None", rf"the saved optimiser's exp_avg_sq of {FC1} is a NoneType, the parameter"),
    ("a moment a list", rf"the saved optimiser's exp_avg of {FC1} is a list, the parameter"),
    ("integer moment", rf"the saved optimiser's exp_avg of {FC1} is a torch.int64 tensor of shape \(64, 32\)"),
    ("step text", rf"the saved optimiser's step of {FC1} is a str, not a count of steps"),
    ("step nan", rf"the saved optimiser's step of {FC1} is nan, not a count of steps"),
    ("step a vector", rf"the saved optimiser's step of {FC1} is a torch.float32 tensor of shape \(1,\), not a count")])
def test_an_optimiser_state_that_does_not_fit_is_one_checkpoint_error_before_any_step(tmp_path, damage, says):
    """Damage of every kind to a saved optimiser state (public reports' and a breaker's files): refused before any
    step, naming it (it was a traceback mid-step, or under FSDP a silent fresh start, before)."""
    from vit_train.errors import CheckpointError
    from vit_train.train.trainer import train

    train(tiny_config(trainer={"max_steps": 2}), tmp_path / "run")
    ckpt = _ckpt(tmp_path / "run")
    state, groups = ckpt["optimizer"]["state"], ckpt["optimizer"]["param_groups"]
    fc1 = state[3]
    if damage == "shape":
        fc1["exp_avg"] = torch.zeros(5)
    elif damage == "index":
        state[99] = state.pop(3)
    elif damage == "count":
        groups[-1]["params"].pop()
    elif damage == "group names one twice":
        groups[0]["params"][0] = groups[0]["params"][1]
    elif damage == "a moment missing":
        del fc1["exp_avg_sq"]
    elif damage == "a key too many":
        fc1["momentum_buffer"] = torch.zeros(64, 32)
    elif damage == "SGD's state":
        state[3] = {"momentum_buffer": torch.zeros(64, 32)}
    elif damage == "a moment None":
        fc1["exp_avg_sq"] = None
    elif damage == "a moment a list":
        fc1["exp_avg"] = fc1["exp_avg"].tolist()
    elif damage == "integer moment":
        fc1["exp_avg"] = fc1["exp_avg"].long()
    elif damage == "step text":
        fc1["step"] = "4"
    elif damage == "step nan":
        fc1["step"] = torch.tensor(float("nan"))
    else:
        fc1["step"] = torch.tensor([2.0])
    torch.save(ckpt, tmp_path / "damaged.pt")
    with pytest.raises(CheckpointError, match="the checkpoint's optimiser state does not fit this model") as caught:
        train(tiny_config(trainer={"max_steps": 4}, resume=str(tmp_path / "damaged.pt")), tmp_path / "other")
    assert re.search(says, str(caught.value)), str(caught.value)
    assert not (tmp_path / "other" / "checkpoints").exists()
