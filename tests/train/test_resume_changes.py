"""What a resumed run may change (docs/resuming.md, 'What may change on resume'): every change listed
there either resumes (and takes effect; some continue exactly as without the change) or is refused
before any work, in one line naming the key, both values and what to do, with every file of the run
directory byte for byte as it was.

Three base runs on the built-in shapes data, each stopped at step 3 of the 8 of its first epoch:
classify (with an EMA), MAE, and distillation from the classify run. Most cases call train()
directly; the real command line (a subprocess) is tested where it is the point: the reported
commands (`resume=<run> optim.name=sgd`, `resume=<run> objective.name=distill objective.teacher=...`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vit_train.cli.arguments import apply_overrides
from vit_train.config import Config
from vit_train.errors import CheckpointError, ConfigError
from vit_train.outputs import rundir
from vit_train.train import trainer
from vit_train.train.trainer import train

STOP, RESUMED_TO = 3, 5  # the base runs stop at step 3 (mid-epoch); resumed runs train to step 5


def tiny(**sections) -> dict:
    """A micro ViT on a small shapes set, as plain data: 256 training images, 8 steps per epoch."""
    plain = {
        "model": {"embed_dim": 32, "depth": 2, "num_heads": 2, "img_size": 16, "patch_size": 4},
        "data": {"train_size": 256, "val_size": 64, "batch_size": 32},
        "trainer": {"epochs": 2, "device": "cpu", "log_every": 2, "progress": False, "max_steps": STOP},
        "schedule": {"warmup_epochs": 0.5},
    }
    if sections.get("model", {}).get("arch", "vit") != "vit":  # another family: the ViT's keys are not its
        plain["model"] = {"img_size": 16, "patch_size": 4}
    for name, values in sections.items():
        plain.setdefault(name, {}).update(values)
    return plain


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, Path]:
    """{"classify", "mae", "distill"}: run directories stopped at step 3, never written again (copy them)."""
    root = tmp_path_factory.mktemp("bases")
    runs = {"classify": tiny(trainer={"ema_decay": 0.9}), "mae": tiny(objective={"name": "mae"})}
    runs["distill"] = tiny(objective={"name": "distill", "teacher": str(root / "classify" / "checkpoints" / "last.pt")},
                           model={"distilled": True})
    for name, plain in runs.items():
        train(Config.from_dict(plain), root / name)
    return {name: root / name for name in runs}


def copy_run(bases: dict[str, Path], base: str, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(bases[base], run)
    return run


def resumed_config(run: Path, changes: dict) -> Config:
    """The run's saved config with `changes` ({"optim.name": "sgd"}) applied as the command line applies
    `vit-train resume=<run> optim.name=sgd` (cli/arguments.py `apply_overrides`), resuming `run`."""
    plain = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["config"]
    spelled = {None: "null", True: "true", False: "false"}
    plain = apply_overrides(plain, [f"{k}={spelled.get(v, v) if isinstance(v, (bool, type(None))) else v}"
                                    for k, v in changes.items()])
    return Config.from_dict({**plain, "resume": str(run)})


def snapshot(run: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `run` (the lock file too: a refused command's holder record is not left in it), its
    bytes and modification time."""
    return {str(p.relative_to(run)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(run.rglob("*"))
            if p.is_file()}


# (base run, key, new value): each changes what the checkpoint's state means
REFUSED = [
    ("classify", "model.arch", "resnet18"), ("classify", "model.img_size", 32), ("classify", "model.patch_size", 8),
    ("classify", "model.embed_dim", 48), ("classify", "model.depth", 3), ("classify", "model.num_heads", 4),
    ("classify", "model.mlp_ratio", 4.0), ("classify", "model.qkv_bias", False), ("classify", "model.reg_tokens", 1),
    ("classify", "model.init_values", 1e-5), ("classify", "model.qk_norm", True), ("classify", "model.pool", "mean"),
    ("classify", "model.pos_embed", "sincos2d"), ("classify", "model.trainable", "head"),
    ("classify", "optim.name", "sgd"), ("classify", "optim.layer_decay", 0.75), ("classify", "data.name", "cifar10"),
    ("classify", "objective.name", "mae"), ("classify", "trainer.ema_decay", None),
    ("mae", "objective.name", "classify"), ("mae", "objective.mask_ratio", 0.5),
    ("mae", "objective.norm_pix_loss", False), ("mae", "objective.decoder_dim", 64),
    ("mae", "objective.decoder_depth", 1), ("mae", "objective.decoder_heads", 2),
    ("distill", "objective.type", "soft"), ("distill", "model.distilled", False),
]
# in the middle of an epoch, what reorders its permutation (check_data_position); fine at an epoch's end
REFUSED_MID_EPOCH = [("classify", "seed", 1, "seed is 1, not 0"),
                     ("classify", "data.train_size", 512, "the training set holds 512 images, not 256"),
                     ("classify", "data.repeated_aug", 2, "data.repeated_aug is 2, not 1")]
CASES = [(b, k, v, None) for b, k, v in REFUSED] + REFUSED_MID_EPOCH


@pytest.mark.parametrize("base,key,value,named", CASES, ids=[f"{b}-{k}" for b, k, _, _ in CASES])
def test_a_change_that_alters_what_the_checkpoint_means_is_refused_before_any_work(bases, tmp_path, base, key, value,
                                                                                  named):
    run = copy_run(bases, base, tmp_path)
    saved = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["config"]
    section, _, name = key.rpartition(".")
    old = saved[section][name] if section else saved[name]
    before = snapshot(run)
    with pytest.raises((CheckpointError, ConfigError)) as refused:
        train(resumed_config(run, {key: value}), run)
    message = str(refused.value)
    assert "\n" not in message
    assert (named or f"{key}: {old!r} -> {value!r}") in message, message
    assert advice_fits(key, message), message
    assert snapshot(run) == before


# keys whose new value the checkpoint's weights do not fit even through model.pretrained (the door for weights refuses
# every architecture field that changes the function; models/pretrained.py other LayerScale, QK-norm or registers): the
# advice is a new run from scratch
NO_FIT = {"model.arch", "model.embed_dim", "model.patch_size", "model.depth", "model.num_heads", "model.mlp_ratio",
          "model.qkv_bias", "model.pool", "model.pos_embed", "model.init_values", "model.qk_norm", "model.reg_tokens"}


def advice_fits(key: str, message: str) -> bool:
    """The refusal's alternative to resuming suits the kind of key: no model.pretrained for weights that
    cannot load, the encoder-only note for objective=mae's own keys, model.pretrained=<checkpoint> for the rest."""
    if key in NO_FIT:
        return "start a new run from scratch" in message and "do not fit the new architecture" in message
    if key.startswith("objective.") and key != "objective.name" and "objective=mae" in message:
        return ("vit-train objective=mae model.pretrained=" in message and "loads the encoder only" in message
                and "decoder starts fresh" in message)
    return "model.pretrained=" in message


# (key, new value) the refusal advises model.pretrained for: a new run from the classify base's weights with it trains
PRETRAINED_WORKS = [("model.img_size", 32), ("model.distilled", True), ("model.trainable", "head"),
                    ("optim.name", "sgd")]


@pytest.mark.slow
@pytest.mark.parametrize("key,value", PRETRAINED_WORKS, ids=[k for k, _ in PRETRAINED_WORKS])
def test_the_advised_model_pretrained_run_starts(bases, tmp_path, key, value):
    section, name = key.split(".")
    ckpt = bases["classify"] / "checkpoints" / "last.pt"
    plain = tiny(model={"pretrained": str(ckpt)}, trainer={"max_steps": 1})
    plain.setdefault(section, {})[name] = value
    assert train(Config.from_dict(plain), tmp_path / "new")["steps"] == 1


NO_FIT_CHANGES = [("model.arch", "resnet18"), ("model.embed_dim", 48), ("model.patch_size", 8), ("model.depth", 3),
                  ("model.num_heads", 4), ("model.mlp_ratio", 4.0), ("model.qkv_bias", False), ("model.pool", "mean"),
                  ("model.pos_embed", "sincos2d"), ("model.init_values", 1e-5), ("model.qk_norm", True),
                  ("model.reg_tokens", 1)]


@pytest.mark.slow
@pytest.mark.parametrize("key,value", NO_FIT_CHANGES, ids=[k for k, _ in NO_FIT_CHANGES])
def test_model_pretrained_cannot_load_the_weights_after_a_no_fit_change(bases, tmp_path, key, value):
    """Why the refusal does not advise model.pretrained for NO_FIT keys: that run is refused too."""
    assert set(dict(NO_FIT_CHANGES)) == NO_FIT
    section, name = key.split(".")
    ckpt = bases["classify"] / "checkpoints" / "last.pt"
    plain = tiny(model={"pretrained": str(ckpt), name: value}, trainer={"max_steps": 1})  # another family: its keys
    with pytest.raises(ConfigError, match="model.pretrained"):
        train(Config.from_dict(plain), tmp_path / "new")


def optimizer_groups(run: Path) -> list[dict]:
    return torch.load(run / "checkpoints" / "last.pt", weights_only=True)["optimizer"]["param_groups"]


def ema_of(run: Path):
    return torch.load(run / "checkpoints" / "last.pt", weights_only=True)["ema"]


# (base run, key, new value, what shows that it took effect, or None)
ALLOWED = [
    ("classify", "trainer.epochs", 3, None), ("classify", "trainer.max_steps", 6, None),
    ("classify", "optim.lr", 5e-4, None),
    ("classify", "optim.weight_decay", 0.1,
     lambda run: {g["weight_decay"] for g in optimizer_groups(run)} == {0.0, 0.1}),
    ("classify", "optim.betas", [0.8, 0.99],
     lambda run: {tuple(g["betas"]) for g in optimizer_groups(run)} == {(0.8, 0.99)}),
    ("classify", "optim.eps", 1e-6, lambda run: {g["eps"] for g in optimizer_groups(run)} == {1e-6}),
    ("classify", "optim.clip_grad", 0.5, None), ("classify", "schedule.name", "constant", None),
    ("classify", "schedule.warmup_epochs", 0.25, None), ("classify", "schedule.min_lr", 0.0, None),
    ("classify", "data.batch_size", 16, None), ("classify", "data.eval_batch_size", 16, None),
    ("classify", "data.num_workers", 2, None), ("classify", "trainer.eval_every", 1, None),
    ("classify", "trainer.ckpt_every", 1, None), ("classify", "trainer.log_every", 1, None),
    ("classify", "trainer.progress", True, None), ("classify", "trainer.keep_last", 1, None),
    ("classify", "trainer.max_bad_steps", 5, None), ("classify", "trainer.precision", "bf16", None),
    ("classify", "trainer.accum_steps", 2, None), ("classify", "trainer.ema_decay", 0.99, None),
    ("classify", "model.drop_path", 0.1, None), ("classify", "model.dropout", 0.1, None),
    ("classify", "model.name", "vit_renamed", None), ("classify", "aug.mixup_alpha", 0.8, None),
    ("classify", "aug.label_smoothing", 0.1, None),
    ("mae", "trainer.ema_decay", 0.9, lambda run: ema_of(run) is not None),
    ("distill", "objective.alpha", 0.7, None), ("distill", "objective.tau", 2.0, None),
]


# the fast suite resumes these; the others are marked slow (each is a short real run)
FAST = {"optim.weight_decay", "optim.betas", "data.batch_size", "trainer.precision", "trainer.ema_decay"}


@pytest.mark.parametrize("base,key,value,effect", [
    pytest.param(*case, id=f"{case[0]}-{case[1]}",
                 marks=() if case[0] == "classify" and case[1] in FAST else pytest.mark.slow)
    for case in ALLOWED])
def test_a_safe_change_resumes_and_takes_effect(bases, tmp_path, base, key, value, effect):
    run = copy_run(bases, base, tmp_path)
    max_steps = value if key == "trainer.max_steps" else RESUMED_TO
    results = train(resumed_config(run, {key: value, "trainer.max_steps": max_steps}), run)
    assert results["status"] == "completed" and results["steps"] == max_steps
    saved = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    section, _, name = key.rpartition(".")
    assert (saved["config"][section][name] if section else saved["config"][name]) == value
    if effect is not None:
        assert effect(run)


@pytest.fixture(scope="module")
def unchanged(bases, tmp_path_factory) -> dict:
    """The classify base resumed to step 5 without a change: its last.pt."""
    run = tmp_path_factory.mktemp("unchanged") / "run"
    shutil.copytree(bases["classify"], run)
    train(resumed_config(run, {"trainer.max_steps": RESUMED_TO}), run)
    return torch.load(run / "checkpoints" / "last.pt", weights_only=True)


def same_state(a: dict, b: dict) -> bool:
    flat = [torch.utils._pytree.tree_flatten([x["model"], x["optimizer"]["state"], x["ema"]])[0] for x in (a, b)]
    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(*flat))


@pytest.mark.parametrize("key,value,exact", [
    ("data.num_workers", 2, True), ("trainer.log_every", 1, True),
    pytest.param("trainer.progress", True, True, marks=pytest.mark.slow),
    pytest.param("trainer.keep_last", 1, True, marks=pytest.mark.slow),
    pytest.param("trainer.ckpt_every", 1, True, marks=pytest.mark.slow),
    pytest.param("data.eval_batch_size", 16, True, marks=pytest.mark.slow),
    ("optim.lr", 5e-4, False),  # the oracle can fail: a change that matters changes the weights
])
def test_cadence_and_loader_changes_continue_exactly_as_without_them(bases, unchanged, tmp_path, key, value, exact):
    run = copy_run(bases, "classify", tmp_path)
    train(resumed_config(run, {key: value, "trainer.max_steps": RESUMED_TO}), run)
    assert same_state(torch.load(run / "checkpoints" / "last.pt", weights_only=True), unchanged) is exact


def test_a_checkpoint_the_caller_loaded_is_not_loaded_again_nor_the_lock_taken_twice(bases, tmp_path, monkeypatch):
    """The command line loads the resume checkpoint for its config and holds the run directory's lock:
    train() takes both from it."""
    from vit_train.checkpoint import load_checkpoint

    run = copy_run(bases, "classify", tmp_path)
    path = run / "checkpoints" / "last.pt"
    ckpt = load_checkpoint(path)

    def refuse(*args, **kwargs):
        raise AssertionError("loaded or locked a second time")

    monkeypatch.setattr(trainer, "find_start", refuse)
    monkeypatch.setattr(rundir, "acquire", refuse)
    lock = rundir.RunLock(run, -1)  # stands for the caller's: train() neither takes nor frees one
    results = train(resumed_config(run, {"trainer.max_steps": RESUMED_TO}), run, resume_from=(path, ckpt), lock=lock)
    assert results["status"] == "completed" and results["steps"] == RESUMED_TO


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m vit_train ARGS` in `cwd`, its output captured."""
    return subprocess.run([sys.executable, "-m", "vit_train", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("changes,named", [
    (["optim.name=sgd"], "optim.name: 'adamw' -> 'sgd'"),
    (["objective.name=distill", "model.distilled=true", "objective.teacher={teacher}"],
     "objective.name: 'classify' -> 'distill'"),
    (["trainer.ema_decay=null"], "trainer.ema_decay: 0.9 -> None"),
    (["data.name=cifar10"], "data.name: 'shapes' -> 'cifar10'"),  # a key override, not a group choice
], ids=["optim.name", "objective.name", "ema-off", "data.name"])
def test_the_command_line_refuses_in_one_line_and_changes_no_file(bases, tmp_path, changes, named):
    run = copy_run(bases, "classify", tmp_path)
    teacher = tmp_path / "teacher.pt"
    shutil.copyfile(run / "checkpoints" / "last.pt", teacher)
    before = snapshot(run)
    result = cli(f"resume={run}", *(c.format(teacher=teacher) for c in changes), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stdout + result.stderr, result.stderr
    assert named in lines[0] and f"model.pretrained={run / 'checkpoints' / 'last.pt'}" in lines[0], lines[0]
    assert snapshot(run) == before


@pytest.mark.slow
@pytest.mark.parametrize("base, change, said", [
    ("distill", "objective.alpha=0.7", "objective.alpha: 0.5 -> 0.7"),  # the run's own objective's keys
    ("mae", "objective.mask_ratio=0.75", None),  # its saved value: no change
    ("classify", "data.val_size=64", None),
])
def test_the_command_line_resumes_with_a_change_of_the_runs_own_options(bases, tmp_path, base, change, said):
    """The keys are those of the resumed run's options (its checkpoint's), not of what the command line composes
    by default: `resume=<a distill run> objective.alpha=0.7` was refused as a key of no classify option."""
    run = copy_run(bases, base, tmp_path)
    result = cli(f"resume={run}", f"trainer.max_steps={RESUMED_TO}", change, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert said is None or f"changed since the checkpoint: {said}" in result.stdout
    saved = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["config"]
    key, value = change.split("=")
    assert str(saved[key.split(".")[0]][key.split(".")[1]]) == value


@pytest.mark.slow
def test_the_command_line_refuses_a_key_the_resumed_runs_option_lacks(bases, tmp_path):
    run = copy_run(bases, "distill", tmp_path)
    result = cli(f"resume={run}", "objective.mask_ratio=0.5", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.startswith(
        "vit-train: error: objective.mask_ratio is a key of objective=mae, not of the resumed run's "
        "objective=distill; a resumed run keeps its objective: drop objective.mask_ratio\n"), result.stderr


@pytest.mark.slow
def test_the_command_line_resumes_with_a_safe_change(bases, tmp_path):
    run = copy_run(bases, "classify", tmp_path)
    result = cli(f"resume={run}", f"trainer.max_steps={RESUMED_TO}", "optim.weight_decay=0.1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert {g["weight_decay"] for g in optimizer_groups(run)} == {0.0, 0.1}
    assert "changed since the checkpoint: optim.weight_decay: 0.05 -> 0.1" in result.stdout


@pytest.fixture(scope="module")
def resnet_base(tmp_path_factory) -> Path:
    """A ResNet-18 run on the same shapes set, stopped at step 3 (copy it)."""
    run = tmp_path_factory.mktemp("resnet") / "run"
    train(Config.from_dict(tiny(model={"arch": "resnet18", "name": "resnet18"})), run)
    return run


# the ViT family's keys: a ResNet's section has none of them, so one named on resume is refused as on a new run,
# naming the family that has it, before anything is read or written
VIT_KEYS = [("model.embed_dim", 48), ("model.depth", 3), ("model.num_heads", 4), ("model.mlp_ratio", 4.0),
            ("model.pool", "mean"), ("model.pos_embed", "sincos2d"), ("model.reg_tokens", 1),
            ("model.qk_norm", True), ("model.init_values", 1e-5), ("model.qkv_bias", False)]


@pytest.mark.parametrize("key,value", VIT_KEYS, ids=[k for k, _ in VIT_KEYS])
def test_a_vit_key_on_resuming_a_resnet_run_is_refused_naming_the_family_that_has_it(resnet_base, key, value):
    with pytest.raises(ConfigError) as refused:
        resumed_config(resnet_base, {key: value, "trainer.max_steps": RESUMED_TO})
    assert str(refused.value) == (f"{key} is a key of model.arch=vit, not of the resumed run's model.arch=resnet18; a "
                                  f"resumed run keeps its model: drop {key}")


@pytest.mark.slow
def test_the_command_line_refuses_a_vit_key_on_resuming_a_resnet_run_and_changes_nothing(resnet_base, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(resnet_base, run)
    before = snapshot(run)
    result = cli(f"resume={run}", "model.depth=3", f"trainer.max_steps={RESUMED_TO}", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "model.depth is a key of model.arch=vit, not of the resumed run's model.arch=resnet18" in result.stderr, \
        result.stderr
    assert snapshot(run) == before


def test_a_resnet_run_still_refuses_another_architecture(resnet_base, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(resnet_base, run)
    with pytest.raises(CheckpointError, match="model.arch: 'resnet18' -> 'resnet50'"):
        train(resumed_config(run, {"model.arch": "resnet50", "model.name": "resnet50"}), run)
