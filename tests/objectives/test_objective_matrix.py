"""Every objective x model x `model.trainable` x option either trains with the right parameters
learning, or is refused in one line before any work (Config.validate: each section's `check`, the
objective's among them).

The combinations are built directly (the objective's model, loss, evaluation and score, the run's
optimiser) and train two steps on a few `shapes` images on the CPU; a few representative refusals go
through the real command line. The oracle is `expected_refusal`, written from the docs (docs/mae.md,
docs/distillation.md, docs/configs.md), not from the code's checks.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

from helpers.configs import tiny_config
from helpers.in_process import run_main
from vit_train.checkpoint import TrainState, best_weights, upgraded
from vit_train.data.mix import BatchMix
from vit_train.data.sources.shapes import generate_shapes
from vit_train.errors import ConfigError
from vit_train.objectives.weights_in import load_pretrained
from vit_train.train.optim import build_optimizer

CPU = torch.device("cpu")
OBJECTIVES = ["classify", "distill", "mae"]
MODELS = {"vit_micro": {}, "resnet18": {"name": "resnet18", "arch": "resnet18"}}
OPTIONS = {
    "plain": {},
    "layer_decay": {"optim": {"layer_decay": 0.75}},
    "distilled": {"model": {"distilled": True}},
    "mixup": {"aug": {"mixup_alpha": 0.8}},
    "cutmix": {"aug": {"cutmix_alpha": 1.0}},
    "pretrained": {},  # model.pretrained: a file of the same network's weights (the fixture below)
    "ema": {"trainer": {"ema_decay": 0.9}},
    "mean_pool": {"model": {"pool": "mean"}},
    "reg_tokens": {"model": {"reg_tokens": 2}},
}


def expected_refusal(objective: str, model: str, trainable: str, option: str) -> str | None:
    """A fragment of the one-line refusal this combination must get, or None: it must train."""
    if model == "resnet18":  # a ResNet has no ViT keys, nor numbered layers for layer-wise lr decay
        if trainable == "head" or option in ("distilled", "mean_pool", "reg_tokens"):
            return "is a key of model.arch=vit, not of model.arch=resnet18"
        if objective == "mae":  # pre-trains a ViT encoder (docs/mae.md)
            return "model.arch=resnet18 has none"
        if option == "layer_decay":
            return "optim.layer_decay is for networks of numbered layers"
    if objective == "mae":  # pre-trains a ViT encoder, without labels (docs/mae.md)
        if trainable == "head":
            return "pre-trains the encoder"
        if option == "distilled":
            return "model.distilled"
        if option == "layer_decay":
            return "optim.layer_decay"
        if option in ("mixup", "cutmix"):
            return "batch mixing has nothing to mix"
    return None


@pytest.fixture(scope="module")
def weights_files(tmp_path_factory):
    """{"vit_micro", "resnet18": a plain state-dict file of that network (10 classes)} and a vit-train-like
    teacher checkpoint for objective=distill."""

    folder = tmp_path_factory.mktemp("weights")
    files = {}
    for name, model in MODELS.items():
        cfg = tiny_config(model=model)
        torch.manual_seed(1)
        files[name] = folder / f"{name}.pth"
        torch.save(cfg.model.build(10).state_dict(), files[name])
    teacher_cfg = tiny_config(model={"depth": 1})
    torch.manual_seed(2)
    files["teacher"] = folder / "teacher.pt"
    torch.save({"model": teacher_cfg.model.build(10).state_dict(), "config": teacher_cfg.to_dict(),
                "class_names": [str(i) for i in range(10)], "ema": None, "step": 0}, files["teacher"])
    return files


def config_for(objective: str, model: str, trainable: str, option: str, files: dict):
    sections = {name: dict(values) for name, values in OPTIONS[option].items()}
    sections.setdefault("model", {}).update(MODELS[model])
    if model != "resnet18" or trainable != "all":  # a ResNet has no model.trainable: named, it is refused
        sections["model"]["trainable"] = trainable
    if option == "pretrained":
        sections["model"]["pretrained"] = str(files[model])
    sections["objective"] = {"name": objective, **({"teacher": str(files["teacher"])} if objective == "distill" else {})}
    sections["data"] = {"batch_size": 8}
    return tiny_config(**sections)


@functools.lru_cache(maxsize=None)
def batches(count: int = 2, size: int = 8) -> tuple:
    images, labels = generate_shapes(count * size, 16, seed=3)
    images = (images.float() / 255 - 0.5) / 0.25
    return tuple((images[i * size:(i + 1) * size], labels[i * size:(i + 1) * size]) for i in range(count))


def two_steps(cfg, files: dict) -> tuple[torch.nn.Module, dict, set[str]]:
    """Build as a run does and train two steps: (model, val metrics, names of the parameters that changed)."""
    objective = cfg.objective
    torch.manual_seed(0)
    model = objective.build_model(cfg, 10)
    if cfg.model.pretrained:
        report = load_pretrained(objective.pretrained_target(model), cfg.model.pretrained)
        assert report["loaded"], report
    optimizer = build_optimizer(model, cfg.optim, CPU, lr=1e-2, family=cfg.model)
    loss_fn = objective.build_loss(cfg, model, 10)
    mix = BatchMix(cfg.aug, 10, cfg.seed) if BatchMix.wanted(cfg.aug) else None
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    model.train()
    for step, (images, labels) in enumerate(batches()):
        targets = labels
        if mix is not None:
            images, targets = mix(images, labels, step)
        loss, logits = loss_fn(model, images, targets)
        assert math.isfinite(loss.item())
        assert logits is None or logits.shape == (len(images), 10)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    metrics = objective.evaluate(model, batches(1), CPU, None, cfg)
    changed = {k for k, v in model.named_parameters() if not torch.equal(v.detach(), before[k])}
    return model, metrics, changed


def combinations() -> list:
    """Every combination; a ResNet-18 that trains (~3-15 s on 2 busy cores) is `slow` but for its plain run."""
    combos = []
    for objective in OBJECTIVES:
        for model in MODELS:
            for trainable in ("all", "head"):
                for option in OPTIONS:
                    slow = model == "resnet18" and option != "plain" and not expected_refusal(objective, model,
                                                                                               trainable, option)
                    combos.append(pytest.param(objective, model, trainable, option,
                                               marks=[pytest.mark.slow] if slow else []))
    return combos


@pytest.mark.parametrize("objective, model, trainable, option", combinations())
def test_each_combination_trains_the_right_parameters_or_is_refused_in_one_line(objective, model, trainable, option,
                                                                                weights_files):
    refusal = expected_refusal(objective, model, trainable, option)
    try:
        cfg = config_for(objective, model, trainable, option, weights_files)  # validated
    except ConfigError as e:
        assert refusal is not None, f"refused, but should train: {e}"
        assert refusal in str(e) and "\n" not in str(e), str(e)
        return
    assert refusal is None, f"trained, but should be refused ({refusal})"
    kind = cfg.objective
    model_, metrics, changed = two_steps(cfg, weights_files)
    assert math.isfinite(metrics[kind.metric])
    first = "conv1.weight" if model == "resnet18" else "patch_embed.proj.weight"
    if objective == "mae":  # the encoder pre-trains (and the decoder with it)
        assert f"encoder.{first}" in changed and "encoder.blocks.0.attn.qkv.weight" in changed, sorted(changed)
        assert any(k.startswith("decoder.") for k in changed)
    elif trainable == "head":  # a linear probe: the heads alone learn
        heads = {"head.weight", "head.bias", "head_dist.weight", "head_dist.bias"}
        assert "head.weight" in changed and changed <= heads, sorted(changed - heads)
        assert ("head_dist.weight" in changed) == (option == "distilled")
    else:
        assert first in changed and ("fc.weight" if model == "resnet18" else "head.weight") in changed
    if option == "pretrained":  # the weights went where the objective says: for mae, the encoder
        saved = torch.load(weights_files[model], weights_only=True)
        target = kind.pretrained_target(kind.build_model(cfg, 10))
        load_pretrained(target, cfg.model.pretrained)
        key = "blocks.1.mlp.fc2.weight" if model == "vit_micro" else "layer4.1.conv2.weight"
        assert torch.equal(target.state_dict()[key], saved[key])


def test_the_matrix_holds_refusals_of_every_objective_kind_and_trains_every_objective():
    """The oracle itself: not everything refused, not everything accepted, each objective trains somewhere."""
    combos = [(o, m, t, opt) for o in OBJECTIVES for m in MODELS for t in ("all", "head") for opt in OPTIONS]
    refused = [c for c in combos if expected_refusal(*c)]
    assert 0 < len(refused) < len(combos)
    assert all(any(c[0] == o and not expected_refusal(*c) for c in combos) for o in OBJECTIVES)


@pytest.mark.parametrize("objective, scores, won", [
    ("top1", {"model": 80.0, "ema": 81.0}, "ema"), ("top1", {"model": 81.0, "ema": 80.0}, "model"),
    ("top1", {"model": 80.0, "ema": 80.0}, "model"), ("loss", {"model": 0.5, "ema": 0.4}, "ema"),
    ("loss", {"model": 0.4, "ema": 0.5}, "model"), ("loss", {"model": 0.4, "ema": 0.4}, "model")])
def test_one_best_score_follows_the_objectives_direction_and_weights_auto_agrees(objective, scores, won):
    state = TrainState(step=5)
    assert state.record_eval(objective, scores) == won
    assert (state.best_score, state.best_metric, state.best_step, state.best_source) == (scores[won], objective, 5,
                                                                                          won)
    state.step = 6
    worse = {k: v - 1 if objective == "top1" else v + 1 for k, v in scores.items()}
    state.record_eval(objective, worse)
    assert (state.best_score, state.best_step) == (scores[won], 5)  # a worse evaluation keeps the best
    ckpt = {**state.checkpoint_fields(), "ema": {"module.x": torch.zeros(1)},
            "last_eval": {"step": 5, "metric": objective, **scores}}
    assert best_weights(ckpt)[0] == won  # weights=auto: the same rule
    assert (ckpt["best_score"], ckpt["best_metric"]) == (scores[won], objective)
    assert "best_top1" not in ckpt and "best_loss" not in ckpt  # the one best score, under no metric's own key


@pytest.mark.parametrize("old, metric, score", [({"best_top1": 71.5, "best_loss": math.inf}, "top1", 71.5),
                                                ({"best_top1": -1.0, "best_loss": 0.25}, "loss", 0.25),
                                                ({"best_top1": -1.0, "best_loss": math.inf}, "", None)])
def test_an_older_checkpoints_best_top1_or_best_loss_becomes_the_one_best_score(old, metric, score):
    ckpt = {"step": 9, "best_step": 4, "best_source": "ema", **old}
    state = TrainState.from_checkpoint(upgraded(ckpt))  # as load_checkpoint and restore read a checkpoint
    assert (state.best_metric, state.best_score, state.best_step, state.best_source) == (metric, score, 4, "ema")
    again = state.checkpoint_fields()
    assert (again["best_score"], again["best_metric"]) == (score, metric)  # written back as the one best score


@pytest.mark.parametrize("overrides, says", [  # in this process (tests/helpers/in_process.py): both fast
    (["objective=mae", "model=resnet18"], "model.arch=resnet18 has none"),
    (["objective=mae", "model.trainable=head"], "pre-trains the encoder"),
])
def test_the_command_line_refuses_in_one_line_before_writing_anything(tmp_path, overrides, says, monkeypatch, capsys):
    from vit_train.cli.train import train_main

    monkeypatch.chdir(tmp_path)
    status, _, err = run_main(train_main, monkeypatch, capsys, *overrides, "trainer.device=cpu",
                              f"hydra.run.dir={tmp_path / 'run'}", prog="vit-train")
    assert status == 2, err
    assert err.count("\n") == 1 and says in err and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()


def test_a_checkpoint_without_best_score_resumes_with_its_best_top1_through_restore(tmp_path):
    """An older checkpoint (best_top1 and best_loss, no best_score) read by the resume path itself: the file
    through the door's reader, then restored."""
    from vit_train.checkpoint import checkpoint_state, load_checkpoint, restore

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    state = TrainState(step=7)
    state.record_eval("top1", {"model": 55.0})
    ckpt = checkpoint_state(model, optimizer, scheduler, scaler, None, state, tiny_config(), [], ["a", "b"])
    assert (ckpt["best_score"], ckpt["best_metric"]) == (55.0, "top1")
    old = {**{k: v for k, v in ckpt.items() if k not in ("best_score", "best_metric")},
           "best_top1": 55.0, "best_loss": math.inf}  # what checkpoints held before best_score
    torch.save(old, tmp_path / "old.pt")
    restored = restore(load_checkpoint(tmp_path / "old.pt"), model, optimizer, scaler)
    assert (restored.best_metric, restored.best_score, restored.best_step) == ("top1", 55.0, 7)
