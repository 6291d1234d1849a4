"""Weights that cross from one run into another (checkpoint/weights.py, the one door): every door
(model.pretrained, objective.teacher, vit-eval/predict/export's ckpt) takes every input kind (a
checkpoint, a run directory, its checkpoints/ folder, vit-export's safetensors of the model's or the
EMA's weights, plain and wrapper-prefixed state dicts in both orders, DeiT and Lightning files) by the
same rule, with the weights it says it took (torch.equal); architecture and class mismatches stop in
one line naming the field or the first differing class; another run's last.pt in a run directory is
recognised as such. The EMA and the model differ on purpose, and which one scored better is forced
both ways, so a door that took the wrong set cannot pass."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch

from helpers.cases import ARCHITECTURE_FIELDS
from helpers.configs import tiny_config
from vit_train.config import Config
from vit_train.objectives.distill import Distill
from vit_train.data.sources.shapes import CLASS_NAMES
from vit_train.errors import CheckpointError, ConfigError
from vit_train.models.vit import VisionTransformer
from vit_train.objectives.teacher import load_teacher
from vit_train.checkpoint import open_weights
from vit_train.objectives.weights_in import load_pretrained
from vit_train.checkpoint import ema_weights, export_safetensors
from vit_train.tools.inference import load_for_inference
from vit_train.train.trainer import train

FEW = {"train_size": 64, "val_size": 32, "batch_size": 16}
SHAPE = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0)
CLASSES = list(CLASS_NAMES)  # the shapes data set's


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A real 2-step classifier run with an EMA, and copies of its last.pt whose last evaluation says the
    model won (22.5% vs 8.0%) or the EMA won, with EMA weights made to differ from the model's."""
    folder = tmp_path_factory.mktemp("identity")
    train(tiny_config(data=FEW, trainer={"max_steps": 2, "ema_decay": 0.5}), folder / "run")
    ckpt = torch.load(folder / "run" / "checkpoints" / "last.pt", weights_only=True)
    ckpt["ema"] = {k: (v + 1.0 if v.is_floating_point() and k.startswith("module.") else v)
                   for k, v in ckpt["ema"].items()}
    for name, scores in (("model_won", {"model": 22.5, "ema": 8.0}), ("ema_won", {"model": 8.0, "ema": 22.5})):
        run = folder / name
        (run / "checkpoints").mkdir(parents=True)
        torch.save({**ckpt, "last_eval": {"step": ckpt["step"], "metric": "top1", **scores}},
                   run / "checkpoints" / "best.pt")
    return folder, ckpt


def written(folder, ckpt, kind):
    """The file or directory of input `kind` holding the `model_won` run's weights, and those weights."""
    run, model = folder / "model_won", ckpt["model"]
    ema = ema_weights(ckpt["ema"])
    best = torch.load(run / "checkpoints" / "best.pt", weights_only=True)
    plain = {
        "checkpoint": (run / "checkpoints" / "best.pt", model),
        "run-dir": (run, model),
        "checkpoints-folder": (run / "checkpoints", model),
        "plain": ({k: v for k, v in model.items()}, model),
        "module.": ({f"module.{k}": v for k, v in model.items()}, model),
        "_orig_mod.": ({f"_orig_mod.{k}": v for k, v in model.items()}, model),
        "module._orig_mod.": ({f"module._orig_mod.{k}": v for k, v in model.items()}, model),
        "_orig_mod.module.": ({f"_orig_mod.module.{k}": v for k, v in model.items()}, model),
        "deit": ({"model": model}, model),
        "lightning": ({"state_dict": {f"model.{k}": v for k, v in model.items()}}, model),
    }
    if kind == "safetensors-model":
        pytest.importorskip("safetensors")
        path = folder / "model.safetensors"
        export_safetensors(best, path, "model")
        return path, model
    if kind == "safetensors-ema":
        pytest.importorskip("safetensors")
        path = folder / "ema.safetensors"
        export_safetensors(best, path, "ema")
        return path, ema
    target, weights = plain[kind]
    if isinstance(target, dict):
        path = folder / f"{kind}.pth"
        torch.save(target, path)
        return path, weights
    return target, weights


KINDS = ["checkpoint", "run-dir", "checkpoints-folder", "safetensors-model", "safetensors-ema", "plain", "module.",
         "_orig_mod.", "module._orig_mod.", "_orig_mod.module.", "deit", "lightning"]
RECORDED = {"checkpoint", "run-dir", "checkpoints-folder", "safetensors-model", "safetensors-ema"}  # carry identity


def same(state: dict, expected: dict) -> bool:
    return all(torch.equal(state[k], v) for k, v in expected.items() if k in state) and \
        all(k in state for k in expected)


@pytest.mark.parametrize("kind", KINDS)
def test_model_pretrained_takes_every_input_kind(runs, kind):
    folder, ckpt = runs
    path, expected = written(folder, ckpt, kind)
    model = VisionTransformer(num_classes=10, **SHAPE)
    load_pretrained(model, path, CLASSES)
    assert same(model.state_dict(), expected)


@pytest.mark.parametrize("kind", KINDS)
def test_distill_teacher_takes_every_input_kind_or_refuses_in_one_line(runs, kind):
    folder, ckpt = runs
    path, expected = written(folder, ckpt, kind)
    if kind not in RECORDED:  # a plain state dict names no network: the teacher needs objective.teacher_arch
        with pytest.raises(ConfigError, match="holds plain weights without a vit-train config; name the network"):
            load_teacher(Distill(teacher=str(path)), 10, 16, class_names=CLASSES)
        return
    teacher, _ = load_teacher(Distill(teacher=str(path)), 10, 16, class_names=CLASSES)
    assert same(teacher.state_dict(), expected)


@pytest.mark.parametrize("kind", KINDS)
def test_vit_eval_takes_every_recorded_input_kind_and_refuses_plain_ones_in_one_line(runs, kind):
    folder, ckpt = runs
    path, expected = written(folder, ckpt, kind)
    if kind not in RECORDED:
        with pytest.raises(ConfigError, match="state dict without a vit-train config: it names no network"):
            load_for_inference(path)
        return
    trained = load_for_inference(path)
    assert same(trained.model.state_dict(), expected)
    assert trained.source == ("ema" if kind == "safetensors-ema" else "model") and trained.class_names == CLASSES


@pytest.mark.parametrize("won", ["model_won", "ema_won"])
@pytest.mark.parametrize("door", ["pretrained", "teacher", "eval"])
def test_every_door_takes_the_better_scoring_weights_and_says_so(runs, caplog, door, won):
    """The report's case: a teacher whose EMA scored 8.0% against its model's 22.5% was distilled from
    the EMA. Each door takes the set that scored better, by one rule, and its log line says which."""
    folder, ckpt = runs
    expected = ckpt["model"] if won == "model_won" else ema_weights(ckpt["ema"])
    with caplog.at_level(logging.INFO, logger="vit_train"):
        if door == "pretrained":
            model = VisionTransformer(num_classes=10, **SHAPE)
            load_pretrained(model, folder / won, CLASSES)
        elif door == "teacher":
            model, _ = load_teacher(Distill(teacher=str(folder / won)), 10, 16, class_names=CLASSES)
        else:
            model = load_for_inference(folder / won).model
    assert same(model.state_dict(), expected)
    said = "the EMA weights" if won == "ema_won" else "the model's weights"
    line = next(r.getMessage() for r in caplog.records if said in r.getMessage())
    assert "top-1 22.50%" in line and "8.00%" in line, line  # why: both scores


@pytest.mark.parametrize("kind", ["checkpoint", "run-dir", "safetensors-model", "plain", "module._orig_mod."])
@pytest.mark.parametrize("change, named, revealed", ARCHITECTURE_FIELDS, ids=[str(c[0]) for c in ARCHITECTURE_FIELDS])
def test_another_architecture_stops_pretrained_naming_the_field(runs, kind, change, named, revealed):
    """Another num_heads loaded as 'ignored: none' and computed another function; another depth loaded
    partially. A recorded architecture is compared field by field; a plain file on what its shapes show
    (not the head count: docs/finetuning.md; positions by their values)."""
    folder, ckpt = runs
    path, _ = written(folder, ckpt, kind)
    model = VisionTransformer(num_classes=10, **{**SHAPE, **change})
    before = {k: v.clone() for k, v in model.state_dict().items()}
    if kind not in RECORDED and not revealed:
        load_pretrained(model, path, CLASSES)  # cannot be seen in the tensors: loads (documented)
        return
    with pytest.raises(ConfigError) as refused:
        load_pretrained(model, path, CLASSES)
    text = str(refused.value)
    assert named in text and "\n" not in text and f"set {named.split(' (')[0]}" in text, text
    assert same(model.state_dict(), before)  # nothing loaded


@pytest.mark.parametrize("classes, first", [
    (["bar"] + CLASSES[1:], "class 0 is 'circle' there and 'bar' here"),
    ([CLASSES[1], CLASSES[0]] + CLASSES[2:], "class 0 is 'circle' there and 'square' here; 'square' is class 1 there"),
    (CLASSES[:9] + ["zebra"], "class 9 is 'frame' there and 'zebra' here"),
], ids=["renamed", "permuted", "last-differs"])
@pytest.mark.parametrize("kind", ["checkpoint", "run-dir", "safetensors-model"])
def test_other_classes_stop_the_teacher_and_pretrained_naming_the_first_difference(runs, kind, classes, first):
    """A teacher trained on [bar, circle, square] and a student's data [circle, square, stripe] was
    accepted and the student distilled permuted labels. Both doors compare the recorded class names."""
    folder, ckpt = runs
    path, _ = written(folder, ckpt, kind)
    with pytest.raises(ConfigError) as refused:
        load_teacher(Distill(teacher=str(path)), 10, 16, class_names=classes)
    assert first in str(refused.value) and "distil from a teacher trained on these classes" in str(refused.value)
    model = VisionTransformer(num_classes=10, **SHAPE)
    with pytest.raises(ConfigError) as refused:
        load_pretrained(model, path, classes)
    assert first in str(refused.value) and "model.reset_head=true" in str(refused.value)
    fresh = model.head.weight.clone()
    report = load_pretrained(model, path, classes, reset_head=True)  # the user says so: a new head
    assert torch.equal(model.head.weight, fresh) and "head.weight (model.reset_head=true)" in report["reinitialised"]
    assert torch.equal(model.blocks[0].attn.qkv.weight, ckpt["model"]["blocks.0.attn.qkv.weight"])


@pytest.mark.parametrize("kind", ["plain", "deit", "lightning"])
def test_a_file_without_class_names_needs_reset_head_for_another_class_count(runs, kind):
    folder, ckpt = runs
    path, _ = written(folder, ckpt, kind)
    with pytest.raises(ConfigError, match="has a head for 10 classes and the data has 5; add model.reset_head=true"):
        load_pretrained(VisionTransformer(num_classes=5, **SHAPE), path, CLASSES[:5])
    report = load_pretrained(VisionTransformer(num_classes=5, **SHAPE), path, CLASSES[:5], reset_head=True)
    assert "head.weight (10 classes in the file, 5 here)" in report["reinitialised"]


@pytest.mark.parametrize("given, message", [
    ("missing.pt", "objective.teacher={} does not exist; give a vit-train run directory"),
    ("empty-dir", "objective.teacher={} is a directory but no vit-train run directory (it has no checkpoints/)"),
])
def test_a_teacher_path_that_is_no_weights_is_one_line_before_any_work(tmp_path, given, message):
    """objective.teacher=<a directory> was an IsADirectoryError traceback that left an empty run directory."""
    (tmp_path / "empty-dir").mkdir()
    cfg = tiny_config(objective={"name": "distill", "teacher": str(tmp_path / given)}, data=FEW,
                      trainer={"max_steps": 1})
    with pytest.raises(ConfigError) as refused:
        train(cfg, tmp_path / "student")
    assert message.format(tmp_path / given) in str(refused.value)
    assert not (tmp_path / "student").exists() or not any((tmp_path / "student").rglob("*.pt"))


def test_a_teacher_whose_patches_do_not_tile_the_student_names_the_teacher_key(runs):
    folder, _ = runs
    with pytest.raises(ConfigError) as refused:
        load_teacher(Distill(teacher=str(folder / "model_won")), 10, 18, class_names=CLASSES)
    text = str(refused.value)
    assert text.startswith(f"objective.teacher={folder / 'model_won'} is a ViT with 4-pixel patches") and \
        "model.img_size=18" in text, text


def test_weights_ema_from_a_model_export_is_refused_in_one_line(runs):
    folder, ckpt = runs
    path, _ = written(folder, ckpt, "safetensors-model")
    with pytest.raises(CheckpointError, match="holds only the model weights, not the ema's"):
        open_weights(path, "ckpt", "ema")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two finished runs, a and b, with keep_last=2 (last.pt, two step files, best.pt)."""
    folder = tmp_path_factory.mktemp("two_runs")
    cfg = tiny_config(data=FEW, trainer={"max_steps": 4, "epochs": 1, "keep_last": 2, "ckpt_every": 2})
    train(cfg, folder / "a")
    train(cfg, folder / "b")
    return folder


def without_lock(run_dir):
    from helpers.files import file_bytes

    return {k: v for k, v in file_bytes(run_dir).items() if k.name != ".lock"}  # who holds the lock: rewritten


@pytest.mark.parametrize("slot", ["last.pt", "step_00000002.pt", "best.pt", "step_00000099.pt"])
@pytest.mark.parametrize("results", [True, False], ids=["results.json", "killed-no-results"])
def test_another_runs_checkpoint_put_in_a_run_directory_is_named_as_such(two_runs, tmp_path, slot, results):
    """A checkpoint of run b copied into run a's checkpoints/ (over last.pt, a step file, best.pt, or as a
    new step file): resume=auto would continue b in a's directory, or keep it beside a's. Refused in one
    line naming the stranger, whichever file resume takes; every file of a unchanged."""
    a = tmp_path / "a"
    shutil.copytree(two_runs / "a", a)
    if not results:
        (a / "results.json").unlink()
    foreign = a / "checkpoints" / slot
    foreign.unlink(missing_ok=True)
    shutil.copyfile(two_runs / "b" / "checkpoints" / "last.pt", foreign)
    ids = {r: torch.load(two_runs / r / "checkpoints" / "last.pt", weights_only=True)["run_id"] for r in "ab"}
    before = without_lock(a)
    resumed = tiny_config(data=FEW, trainer={"max_steps": 8, "epochs": 2, "keep_last": 2}, resume="auto")
    with pytest.raises(CheckpointError) as refused:
        train(resumed, a)
    text = str(refused.value)
    assert f"checkpoints/{slot} is run {ids['b'][:8]}'s" in text and f"run {ids['a'][:8]}'s" in text, text
    assert f"move checkpoints/{slot} out of" in text and "\n" not in text, text
    assert without_lock(a) == before


def test_resuming_another_runs_file_into_a_directory_that_holds_a_run_is_refused(two_runs, tmp_path):
    a = tmp_path / "a"
    shutil.copytree(two_runs / "a", a)
    before = without_lock(a)
    resumed = tiny_config(data=FEW, trainer={"max_steps": 8, "epochs": 2}, resume=str(two_runs / "b" / "checkpoints" / "last.pt"))
    with pytest.raises(CheckpointError, match="continued there it would overwrite them; resume it in a new directory"):
        train(resumed, a)
    assert without_lock(a) == before


def test_a_run_directory_named_like_a_checkpoint_file_is_a_run_directory(two_runs, tmp_path):
    """resume=<a directory named x.pt> wrote the resumed run into the directory above it."""
    from vit_train.config import run_dir_of

    shutil.copytree(two_runs / "a", tmp_path / "x.pt")
    assert run_dir_of(str(tmp_path / "x.pt")) == tmp_path / "x.pt"
    assert run_dir_of(str(tmp_path / "x.pt" / "checkpoints" / "last.pt")) == tmp_path / "x.pt"
    assert run_dir_of(str(tmp_path / "gone.pt")) == tmp_path  # a file that is not there (yet): its folder


def test_model_pretrained_on_resume_is_said_to_be_ignored(two_runs):
    from vit_train.train.resume import check_compatible

    ckpt = torch.load(two_runs / "a" / "checkpoints" / "last.pt", weights_only=True)
    changed = Config.from_dict({**ckpt["config"], "model": {**ckpt["config"]["model"], "pretrained": "elsewhere.pt"}})
    assert check_compatible(ckpt, changed) == [
        "model.pretrained: None -> 'elsewhere.pt' (ignored: a resumed run continues from its checkpoint's weights)"]


def test_another_patch_size_is_advised_with_the_image_size_it_was_trained_at(runs):
    """Following 'set model.patch_size=4' alone at model.img_size=224 made a model 500x costlier."""
    folder, ckpt = runs
    model = VisionTransformer(num_classes=10, **{**SHAPE, "img_size": 64, "patch_size": 16})
    with pytest.raises(ConfigError, match=r"set model.patch_size=4 model.img_size=16 to load it"):
        load_pretrained(model, folder / "model_won", CLASSES)


def test_the_run_id_is_kept_across_a_resume_and_written_to_results(tmp_path):
    import json

    train(tiny_config(data=FEW, trainer={"max_steps": 2, "epochs": 2}), tmp_path / "r")
    first = torch.load(tmp_path / "r" / "checkpoints" / "last.pt", weights_only=True)["run_id"]
    train(tiny_config(data=FEW, trainer={"max_steps": 4, "epochs": 2}, resume="auto"), tmp_path / "r")
    assert torch.load(tmp_path / "r" / "checkpoints" / "last.pt", weights_only=True)["run_id"] == first
    assert json.loads((tmp_path / "r" / "results.json").read_text())["run_id"] == first


def test_a_safetensors_export_carries_the_identity_of_the_weights_it_holds(runs):
    pytest.importorskip("safetensors")
    from vit_train.checkpoint import load_weights

    folder, ckpt = runs
    for kind, source, value in (("safetensors-model", "model", 22.5), ("safetensors-ema", "ema", 8.0)):
        path, _ = written(folder, ckpt, kind)
        record = load_weights(path)[1]["identity"]
        assert record["run_id"] == ckpt["run_id"] and record["class_names"] == CLASSES
        assert record["weights"] == source and record["step"] == ckpt["step"]
        assert record["score"] == {"metric": "top1", "value": value, "step": ckpt["step"]}
        assert record["architecture"]["model.num_heads"] == 2 and record["architecture"]["model.depth"] == 2


@pytest.mark.parametrize("prog", ["eval", "predict", "export"])
def test_the_commands_refuse_a_plain_state_dict_in_one_line(runs, tmp_path, prog, monkeypatch, capsys):
    """Through each command's entry point in this process (tests/helpers/in_process.py)."""
    from helpers.in_process import run_main
    from vit_train.cli import commands

    folder, ckpt = runs
    path, _ = written(folder, ckpt, "module._orig_mod.")
    extra = {"eval": [], "predict": ["images=[x.png]"], "export": [f"out={tmp_path / 'm.safetensors'}"]}[prog]
    status, _, err = run_main(getattr(commands, f"{prog}_main"), monkeypatch, capsys, f"ckpt={path}", *extra,
                              prog=f"vit-{prog}")
    assert status == 2 and err.count("\n") == 1, err
    assert "is a state dict without a vit-train config: it names no network to rebuild" in err


def test_numbered_classes_sorted_as_text_by_one_run_and_as_numbers_by_the_other_are_caught(runs, tmp_path):
    """places365#22, vision#714, deit#130: folders 0..N sorted as strings ('0', '1', '10', '11', '2', ...)
    by one tool and naturally by another: the same names in another order, so every label is permuted."""
    folder, ckpt = runs
    as_text = sorted(str(i) for i in (*range(8), 10, 11))
    as_numbers = [str(i) for i in (*range(8), 10, 11)]
    record = {**ckpt["identity"], "class_names": as_text}
    torch.save({**ckpt, "class_names": as_text, "identity": record}, tmp_path / "numbered.pt")
    expected = "class 2 is '10' there and '2' here; '2' is class 4 there"
    for load in (lambda: load_teacher(Distill(teacher=str(tmp_path / "numbered.pt")), 10, 16, class_names=as_numbers),
                 lambda: load_pretrained(VisionTransformer(num_classes=10, **SHAPE), tmp_path / "numbered.pt", as_numbers)):
        with pytest.raises(ConfigError) as refused:
            load()
        assert expected in str(refused.value), refused.value


# --- files edited by hand or by other tools (inputs of an adversarial trial; Lightning's model_ema.* beside model.*,
# CompVis/stable-diffusion#271; missing tensors under strict=False, pytorch/pytorch#141256) --------------------------

def edited(folder, ckpt, kind, tmp_path):
    """A file of `kind`, made from the runs fixture's checkpoint; returns its path."""
    model = ckpt["model"]
    zeros = {k: torch.zeros_like(v) for k, v in model.items()}
    path = tmp_path / f"{kind}.pt"
    if kind == "lightning-two-networks":
        torch.save({"state_dict": {**{f"ema_model.{k}": v for k, v in zeros.items()},
                                   **{f"model.{k}": v for k, v in model.items()}}}, path)
    elif kind == "dino-two-networks":
        torch.save({**{f"teacher.backbone.{k}": v for k, v in zeros.items()},
                    **{f"student.backbone.{k}": v for k, v in model.items()}}, path)
    elif kind == "no-mlp-of-block-1":
        torch.save({k: v for k, v in model.items() if not k.startswith("blocks.1.mlp.")}, path)
    elif kind == "no-final-norm":
        torch.save({k: v for k, v in model.items() if not k.startswith("norm.")}, path)
    elif kind == "timm-fc-norm":
        torch.save({k.replace("norm.", "fc_norm.", 1) if k.startswith("norm.") else k: v for k, v in model.items()}, path)
    elif kind == "record-classes-differ":
        torch.save({**ckpt, "class_names": sorted(CLASSES)}, path)
    elif kind == "record-heads-differ":
        torch.save({**ckpt, "config": {**ckpt["config"], "model": {**ckpt["config"]["model"], "num_heads": 4}}}, path)
    elif kind == "head-of-5-rows":
        torch.save({**ckpt, "model": {**model, "head.weight": model["head.weight"][:5], "head.bias": model["head.bias"][:5]}},
                   path)
    elif kind == "qkv-of-another-shape":
        torch.save({**ckpt, "model": {**model, "blocks.0.attn.qkv.weight": torch.zeros(96, 16)}}, path)
    elif kind in ("identity-architecture-a-string", "identity-class-names-a-string", "foreign-config-metadata"):
        pytest.importorskip("safetensors")
        from vit_train.outputs.weights import save_safetensors

        path = tmp_path / f"{kind}.safetensors"
        meta = {"identity-architecture-a-string": {"identity": {"architecture": "vit"}},
                "identity-class-names-a-string": {"identity": {**ckpt["identity"], "class_names": "circle"}},
                "foreign-config-metadata": {"config": {"foo": 1}}}[kind]
        save_safetensors(model, path, meta)
    return path


REFUSED = [  # (kind, doors refusing it, what the one line says)
    ("lightning-two-networks", "pretrained", "holds 2 networks (ema_model., model.); save the one you mean"),
    ("dino-two-networks", "pretrained", "holds 2 networks (teacher.backbone., student.backbone.)"),
    ("no-mlp-of-block-1", "pretrained", "lacks 4 trained tensors of this network (blocks.1.mlp.fc1.weight"),
    ("no-final-norm", "pretrained", "is another architecture than this model: no final norm (norm.*); loading it would "
                                    "compute another function"),
    ("timm-fc-norm", "pretrained", "is another architecture than this model: a norm after pooling (timm's fc_norm): "
                                   "fc_norm.weight, fc_norm.bias; no final norm (norm.*); loading it"),
    ("record-classes-differ", "pretrained teacher eval", "contradicts itself: its class names differ from the record's"),
    ("record-heads-differ", "pretrained teacher eval", "contradicts itself: model.num_heads=2 in the record, 4 in its config"),
    ("head-of-5-rows", "pretrained teacher eval", "contradicts itself: its head has 5 outputs for the record's 10 class names"),
    ("qkv-of-another-shape", "teacher eval", "its weights do not fit the network its config names (size mismatch for "
                                             "blocks.0.attn.qkv.weight"),
    ("identity-architecture-a-string", "pretrained teacher eval", "its identity record is malformed"),
    ("identity-class-names-a-string", "pretrained teacher eval", "its identity record is malformed"),
]


# plain state dicts reach the teacher and the commands only to be refused as such (tested above)
EDITED = [(kind, door, says) for kind, doors, says in REFUSED for door in doors.split()]


@pytest.mark.parametrize("kind, door, says", EDITED, ids=[f"{k}-{d}" for k, d, _ in EDITED])
def test_an_edited_or_ambiguous_file_is_refused_in_one_line_at_every_door(runs, tmp_path, kind, door, says):
    folder, ckpt = runs
    path = edited(folder, ckpt, kind, tmp_path)
    model = VisionTransformer(num_classes=10, **SHAPE)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises((ConfigError, CheckpointError)) as refused:
        if door == "pretrained":
            load_pretrained(model, path, CLASSES)
        elif door == "teacher":
            load_teacher(Distill(teacher=str(path)), 10, 16, class_names=CLASSES)
        else:
            load_for_inference(path)
    assert says in str(refused.value) and "\n" not in str(refused.value), refused.value
    assert same(model.state_dict(), before)


def test_a_foreign_config_in_safetensors_metadata_is_not_taken_for_a_vit_train_one(runs, tmp_path):
    folder, ckpt = runs
    model = VisionTransformer(num_classes=10, **SHAPE)
    load_pretrained(model, edited(folder, ckpt, "foreign-config-metadata", tmp_path), CLASSES)
    assert same(model.state_dict(), ckpt["model"])


def test_a_run_directory_whose_best_pt_is_another_runs_is_refused_at_every_door(two_runs, tmp_path):
    a = tmp_path / "a"
    shutil.copytree(two_runs / "a", a)
    (a / "checkpoints" / "best.pt").unlink()
    shutil.copyfile(two_runs / "b" / "checkpoints" / "last.pt", a / "checkpoints" / "best.pt")
    for load in (lambda: load_for_inference(a), lambda: load_pretrained(VisionTransformer(num_classes=10, **SHAPE), a),
                 lambda: load_teacher(Distill(teacher=str(a)), 10, 16)):
        with pytest.raises(CheckpointError, match="holds files of two runs: checkpoints/best.pt is run"):
            load()
    load_for_inference(a / "checkpoints" / "last.pt")  # the file itself, named: taken as given


def test_a_checkpoint_with_a_config_but_no_class_names_says_so(runs, tmp_path):
    folder, ckpt = runs
    old = {k: v for k, v in ckpt.items() if k not in ("identity", "run_id")}
    torch.save({**old, "class_names": None}, tmp_path / "old.pt")
    with pytest.raises(CheckpointError, match="records no class names, so its predictions cannot be named"):
        load_for_inference(tmp_path / "old.pt")


def test_a_nan_score_never_wins_the_choice_of_weights(runs, tmp_path):
    folder, ckpt = runs
    torch.save({**ckpt, "last_eval": {"step": ckpt["step"], "metric": "top1", "model": float("nan"), "ema": 50.0}},
               tmp_path / "nan.pt")
    assert open_weights(tmp_path / "nan.pt", "ckpt").source == "ema"


@pytest.mark.parametrize("objective, classes", [("classify", True), ("distill", True), ("mae", False), (None, True)])
def test_the_door_names_the_classes_only_of_weights_trained_on_labels(objective, classes):
    """vit-eval of an MAE checkpoint said "classes [circle, square, ...]" of a run that read no labels."""
    from pathlib import Path

    from vit_train.checkpoint import Incoming, describe

    record = {"objective": objective, "class_names": ["circle", "square"], "step": 8, "run_id": "0123456789"}
    line = describe(Incoming("ckpt", "run/last.pt", Path("run/last.pt"), {}, "model", "asked for", record, {}, None))
    assert line == ("ckpt=run/last.pt: the model's weights (run 01234567) at step 8, as asked for"
                    + ("; classes [circle, square]" if classes else ""))
