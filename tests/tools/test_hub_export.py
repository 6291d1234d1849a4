"""vit-export format=hf: the folder timm's save_for_hf writes, loaded by timm offline (create_model("local-dir:DIR"))
with vit-train's logits, label names and preprocessing, over what vit-train's ViT varies; the doors model.pretrained
and objective.teacher reading such a folder (vit-train's export, and one timm's own save_for_hf wrote) through the
identity checks; and the folders that go wrong in timm's and the Hub's trackers (a '#' in the path: timm #2725; a
head of another class count than config.json says: timm #1016; label_names as a mapping or timm's older `labels`;
save_for_hf's default pytorch_model.bin without model.safetensors; avg pooling beside a class token)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from helpers.configs import tiny_config
from helpers.images import write_image_folder
from vit_train.checkpoint.hub import SIZES, timm_layout
from vit_train.cli import commands
from vit_train.data.preprocess import eval_transform
from vit_train.data.sources.shapes import CLASS_NAMES
from vit_train.errors import CheckpointError, ConfigError, UserError
from vit_train.objectives.weights_in import load_pretrained
from vit_train.tools.inference import load_for_inference
from vit_train.train.trainer import train

timm = pytest.importorskip("timm")
pytest.importorskip("safetensors")

# (id, model keys, trainer keys, weights): what vit-train's ViT varies
VARIANTS = [
    ("cls-learned", {}, {}, "model"),
    ("mean-sincos", {"pool": "mean", "pos_embed": "sincos2d"}, {}, "model"),
    ("patch8-img32", {"patch_size": 8, "img_size": 32}, {}, "model"),
    ("patch2-mlp4", {"patch_size": 2, "mlp_ratio": 4.0}, {}, "model"),
    ("options", {"reg_tokens": 2, "init_values": 1e-5, "qk_norm": True, "qkv_bias": False}, {}, "model"),
    ("mean-registers", {"pool": "mean", "reg_tokens": 1}, {}, "model"),
    ("ema", {}, {"ema_decay": 0.5}, "ema"),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{id: (checkpoint, its Hub folder, weights)}: each variant trained 2 steps and exported through the command."""
    found = {}
    for name, model, trainer, weights in VARIANTS:
        run_dir = tmp_path_factory.mktemp(name)
        train(tiny_config(model=model, trainer={"max_steps": 2, **trainer}), run_dir)
        ckpt = run_dir / "checkpoints" / "last.pt"
        found[name] = (ckpt, export(ckpt, run_dir / "hub#1", weights), weights)  # '#' in the path: timm #2725
    return found


def export(ckpt: Path, out: Path, weights: str = "auto") -> Path:
    """`vit-export ckpt=... format=hf out=...` in this process; returns `out`."""
    argv, sys.argv = sys.argv, ["vit-export", f"ckpt={ckpt}", "format=hf", f"out='{out}'", f"weights={weights}"]
    try:
        commands.export_main()
    finally:
        sys.argv = argv
    return out


def refusal(ckpt: Path, out: Path, capsys) -> str:
    """The one line `vit-export ckpt=... format=hf out=...` ends with (exit status 2)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        export(ckpt, out)
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and "\n" not in err and "Traceback" not in err
    return err


def timm_model(folder: Path) -> torch.nn.Module:
    return timm.create_model(f"local-dir:{folder}", pretrained=True).eval()


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No network: the Hub's client is told so (timm reads local-dir without it)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.mark.parametrize("name", [v[0] for v in VARIANTS])
def test_timm_loads_the_folder_with_vit_trains_logits_and_label_names(runs, name):
    ckpt, folder, weights = runs[name]
    ours = load_for_inference(ckpt, weights)
    assert ours.source == weights
    theirs = timm_model(folder)
    size = ours.cfg.model.img_size
    x = torch.randn(4, 3, size, size)
    with torch.no_grad():
        torch.testing.assert_close(theirs(x), ours.model(x), rtol=0, atol=1e-5)
    config = json.loads((folder / "config.json").read_text())
    assert timm.is_model(config["architecture"]) and config["num_classes"] == len(CLASS_NAMES)
    assert theirs.pretrained_cfg["label_names"] == CLASS_NAMES == config["label_names"]
    assert theirs.num_classes == len(CLASS_NAMES) and config["num_features"] == ours.cfg.model.embed_dim
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "model.safetensors"]


@pytest.mark.parametrize("name", ["cls-learned", "patch8-img32"])
def test_timms_preprocessing_from_the_folder_is_vit_trains(runs, name):
    ckpt, folder, weights = runs[name]
    ours = load_for_inference(ckpt, weights)
    config = timm.data.resolve_data_config({}, model=timm_model(folder))
    transform = timm.data.create_transform(**config)
    image = Image.fromarray(torch.randint(0, 256, (45, 61, 3), dtype=torch.uint8).numpy())  # another size and shape
    torch.testing.assert_close(transform(image), eval_transform(ours.preprocess)(image), rtol=0, atol=1e-6)


def test_a_fine_tuned_100_class_run_keeps_its_classes_and_preprocessing(runs, tmp_path):
    """A fine-tuned run on an image folder of 100 classes: timm's head has 100 outputs named as the folders, and its
    transform (resize to size / crop_pct, centre crop: not full frame) is vit-train's."""
    classes = [f"class_{i:03d}" for i in range(100)]
    root = write_image_folder(tmp_path / "images", {"train": 1, "val": 1}, classes=classes,
                              pixels=lambda c, i: (int(c[-3:]) * 2, 40, 90))
    base = runs["cls-learned"][0]
    run_dir = tmp_path / "fine"
    train(tiny_config(data={"name": "imagefolder", "root": str(root), "batch_size": 50},
                      model={"pretrained": str(base), "reset_head": True}, trainer={"max_steps": 1}), run_dir)
    folder = export(run_dir / "checkpoints" / "last.pt", tmp_path / "hf")
    ours, theirs = load_for_inference(run_dir / "checkpoints" / "last.pt"), timm_model(folder)
    assert theirs.pretrained_cfg["label_names"] == classes and theirs.num_classes == 100
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(theirs(x), ours.model(x), rtol=0, atol=1e-5)
    config = timm.data.resolve_data_config({}, model=theirs)
    image = Image.new("RGB", (50, 37), (200, 40, 90))
    assert ours.preprocess["resize"] != ours.preprocess["size"]
    torch.testing.assert_close(timm.data.create_transform(**config)(image), eval_transform(ours.preprocess)(image),
                               rtol=0, atol=1e-6)


def test_a_distilled_deit_exports_as_timms_distilled_model(runs, tmp_path):
    teacher = runs["cls-learned"][0]
    train(tiny_config(model={"distilled": True}, trainer={"max_steps": 2},
                      objective={"name": "distill", "teacher": str(teacher)}), tmp_path / "run")
    ckpt = tmp_path / "run" / "checkpoints" / "last.pt"
    folder = export(ckpt, tmp_path / "hf")
    assert json.loads((folder / "config.json").read_text())["architecture"].startswith("deit_")
    x = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(timm_model(folder)(x), load_for_inference(ckpt).model(x), rtol=0, atol=1e-5)


def test_the_model_card_holds_the_runs_results_and_recipe(runs):
    ckpt, folder, _ = runs["cls-learned"]
    card = (folder / "README.md").read_text()
    results = json.loads((ckpt.parent.parent / "results.json").read_text())
    assert card.startswith("---\ntags:\n- image-classification\n- timm\n")
    assert f"- **best_top1:** {results['best_top1']}" in card and f"- **steps:** {results['steps']}" in card
    assert "\nmodel:\n" in card and "  embed_dim: 32\n" in card and "\noptim:\n" in card and "\nschedule:\n" in card
    assert results["run_id"] in card


# --- the doors: model.pretrained and objective.teacher read a Hub folder -------------------------------------------


def student(**model) -> torch.nn.Module:
    return tiny_config(model=model).model.build(len(CLASS_NAMES))


@pytest.mark.parametrize("name", ["cls-learned", "mean-sincos", "options", "ema"])
def test_model_pretrained_reads_vit_trains_folder_with_its_identity(runs, name):
    ckpt, folder, weights = runs[name]
    keys = dict(next(v[1] for v in VARIANTS if v[0] == name))
    model = student(**keys).eval()
    report = load_pretrained(model, folder, CLASS_NAMES)
    fixed = ["pos_embed"] if keys.get("pos_embed") == "sincos2d" else []  # the model's own sin-cos table, equal
    assert not report["reinitialised"] and report["ignored"] == fixed
    x = torch.randn(2, 3, keys.get("img_size", 16), keys.get("img_size", 16))
    with torch.no_grad():
        torch.testing.assert_close(model(x), load_for_inference(ckpt, weights).model(x), rtol=0, atol=0)


def test_another_head_count_is_named_from_vit_trains_folder(runs):
    with pytest.raises(ConfigError, match=r"holds another network: model\.num_heads=2 \(here 4\)"):
        load_pretrained(student(num_heads=4), runs["cls-learned"][1], CLASS_NAMES)


def test_other_classes_are_named_from_the_folders_label_names(runs):
    with pytest.raises(ConfigError, match=r"other classes than this data's: class 0 is 'circle' there and 'square'"):
        load_pretrained(student(), runs["cls-learned"][1], [CLASS_NAMES[1], CLASS_NAMES[0], *CLASS_NAMES[2:]])


def timm_folder(path: Path, labels=CLASS_NAMES, safe=True, **options) -> Path:
    """A Hub folder written by timm's own save_for_hf (as the Hub serves them) of a micro ViT; `options` are timm's."""
    torch.manual_seed(0)
    args = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=10)
    net = timm.create_model("vit_tiny_patch16_224", **{**args, **options})
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.02 * torch.randn_like(p))
    # model_args given as a user's push_to_hf_hub gives them (timm 1.0.31 also records the factory's on its own)
    timm.models.save_for_hf(net, str(path), model_config={"label_names": labels} if labels else None,
                            model_args={**args, **options}, safe_serialization=safe)
    return path


@pytest.mark.parametrize("options, ours", [
    ({}, {}),
    ({"global_pool": "avg", "class_token": False, "fc_norm": False}, {"pool": "mean"}),
    ({"reg_tokens": 2, "qk_norm": True}, {"reg_tokens": 2, "qk_norm": True}),
])
def test_model_pretrained_reads_a_folder_timms_save_for_hf_wrote(tmp_path, options, ours):
    folder = timm_folder(tmp_path / "timm", **options)
    model = student(**ours).eval()
    load_pretrained(model, folder, CLASS_NAMES)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), timm_model(folder)(x), rtol=0, atol=1e-5)


def test_a_timm_folder_says_its_image_size_where_its_positions_read_two_ways(tmp_path):
    """9 positions beside 5 prefix tokens (no_embed_class): a 3x3 grid, or 5 prefix positions and 2x2. A plain state
    dict is refused for it; the folder's config.json says the image size, so it loads with timm's logits."""
    options = dict(img_size=12, reg_tokens=4, no_embed_class=True)
    folder = timm_folder(tmp_path / "timm", **options)
    torch.save(timm_model(folder).state_dict(), tmp_path / "plain.pth")
    with pytest.raises(ConfigError, match="read two ways"):
        load_pretrained(student(img_size=12, reg_tokens=4), tmp_path / "plain.pth", CLASS_NAMES)
    model = student(img_size=12, reg_tokens=4).eval()
    load_pretrained(model, folder, CLASS_NAMES)
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        torch.testing.assert_close(model(x), timm_model(folder)(x), rtol=0, atol=1e-5)


def test_a_timm_folder_says_its_head_count_which_its_tensors_cannot(tmp_path):
    folder = timm_folder(tmp_path / "timm")
    with pytest.raises(ConfigError, match=r"model\.num_heads=2 \(here 4\)"):
        load_pretrained(student(num_heads=4), folder, CLASS_NAMES)


def test_a_timm_folder_pooling_the_mean_beside_a_class_token_is_refused(tmp_path):
    """Its tensors read as class-token pooling; only config.json's global_pool says otherwise."""
    folder = timm_folder(tmp_path / "timm", global_pool="avg", fc_norm=False)
    with pytest.raises(ConfigError, match=r"pools the mean of the patch tokens beside a class token \(timm's "
                                          r"global_pool='avg'"):
        load_pretrained(student(), folder, CLASS_NAMES)


def test_label_names_as_a_mapping_are_read(tmp_path):
    folder = timm_folder(tmp_path / "timm", labels={str(i): n for i, n in enumerate(CLASS_NAMES)})
    load_pretrained(student(), folder, CLASS_NAMES)
    with pytest.raises(ConfigError, match="class 0 is 'circle' there and 'frame' here"):
        load_pretrained(student(), folder, CLASS_NAMES[::-1])


def test_timms_older_config_with_labels_and_a_named_size_is_read(tmp_path):
    """timm's older single-dict config.json: `labels`, no model_args; the name says the head count (timm builds
    vit_tiny's 3 heads from it)."""
    folder = timm_folder(tmp_path / "timm", labels=None, embed_dim=48, num_heads=3)
    config = json.loads((folder / "config.json").read_text())
    flat = {"architecture": config["architecture"], **config["pretrained_cfg"], "labels": CLASS_NAMES[::-1]}
    (folder / "config.json").write_text(json.dumps(flat))
    with pytest.raises(ConfigError, match=r"model\.num_heads=3 \(here 2\)"):
        load_pretrained(student(embed_dim=48, num_heads=2), folder, CLASS_NAMES[::-1])
    with pytest.raises(ConfigError, match="class 0 is 'frame' there and 'circle' here"):
        load_pretrained(student(embed_dim=48, num_heads=3), folder, CLASS_NAMES)
    load_pretrained(student(embed_dim=48, num_heads=3), folder, CLASS_NAMES[::-1])


def test_a_timm_folder_teaches_a_distilled_student(tmp_path):
    folder = timm_folder(tmp_path / "timm")
    cfg = tiny_config(objective={"name": "distill", "teacher": str(folder)}, trainer={"max_steps": 1})
    train(cfg, tmp_path / "run")
    from vit_train.objectives.teacher import load_teacher

    teacher, described = load_teacher(cfg.objective, len(CLASS_NAMES), 16, class_names=CLASS_NAMES)
    assert described == "timm's vit_tiny_patch16_224 from its Hub folder, as vit-train's ViT"
    named = tiny_config(objective={"name": "distill", "teacher": str(folder), "teacher_arch": "resnet18"})
    with pytest.raises(ConfigError, match=r"^objective\.teacher=timm is a Hub folder, which names its own network "
                                          r"\(vit_tiny_patch16_224\): drop objective\.teacher_arch=resnet18$"):
        load_teacher(named.objective, len(CLASS_NAMES), 16)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(teacher.eval()(x), timm_model(folder)(x), rtol=0, atol=1e-5)


def test_vit_trains_folder_teaches_with_its_classes_checked(runs, tmp_path):
    folder = runs["cls-learned"][1]
    cfg = tiny_config(objective={"name": "distill", "teacher": str(folder)})
    from vit_train.objectives.teacher import load_teacher

    teacher, _ = load_teacher(cfg.objective, len(CLASS_NAMES), 16, class_names=CLASS_NAMES)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(teacher.eval()(x), load_for_inference(runs["cls-learned"][0]).model(x),
                                   rtol=0, atol=0)
    with pytest.raises(ConfigError, match="other classes"):
        load_teacher(cfg.objective, len(CLASS_NAMES), 16, class_names=CLASS_NAMES[::-1])


# --- folders that are not whole, or contradict themselves: one line each --------------------------------------------


@pytest.mark.parametrize("remove, said", [
    ("model.safetensors", "is a Hub folder without model.safetensors"),
    ("config.json", "is a Hub folder without config.json"),
])
def test_a_folder_missing_a_file_is_one_line(runs, tmp_path, remove, said):
    import shutil

    folder = shutil.copytree(runs["cls-learned"][1], tmp_path / "copy")
    (folder / remove).unlink()
    with pytest.raises(ConfigError, match=said):
        load_pretrained(student(), folder, CLASS_NAMES)


def test_save_for_hfs_default_pytorch_model_bin_is_named(tmp_path):
    """timm's save_for_hf writes pytorch_model.bin alone unless safe_serialization=True."""
    folder = timm_folder(tmp_path / "timm", safe=False)
    with pytest.raises(ConfigError, match=r"without model\.safetensors .*its pytorch_model\.bin is a plain state "
                                          r"dict: give model\.pretrained=.*pytorch_model\.bin"):
        load_pretrained(student(), folder, CLASS_NAMES)
    load_pretrained(student(), folder / "pytorch_model.bin", CLASS_NAMES)  # the advice works


@pytest.mark.parametrize("edit, said", [
    (lambda c: c.update(label_names=CLASS_NAMES[::-1]), "label_names differ from its weights' class names"),
    (lambda c: c["model_args"].update(num_heads=4), r"model\.num_heads=4 in its config\.json, 2 in its weights"),
    (lambda c: c.update(num_classes=9), "num_classes=9"),
])
def test_a_folder_whose_config_contradicts_its_weights_is_refused(runs, tmp_path, edit, said):
    import shutil

    folder = shutil.copytree(runs["cls-learned"][1], tmp_path / "copy")
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=f"contradicts itself: .*{said}"):
        load_pretrained(student(), folder, CLASS_NAMES)


# --- what format=hf refuses, and how it writes -----------------------------------------------------------------------


def test_an_mae_checkpoint_is_refused_in_one_line(tmp_path, capsys):
    train(tiny_config(objective={"name": "mae"}, trainer={"max_steps": 1}), tmp_path / "run")
    said = refusal(tmp_path / "run" / "checkpoints" / "last.pt", tmp_path / "hf", capsys)
    assert "masked-autoencoder" in said and "format=safetensors writes its weights" in said
    assert not (tmp_path / "hf").exists() and list(tmp_path.glob(".hf*")) == []


def test_a_resnet_is_refused_in_one_line(tmp_path, capsys):
    train(tiny_config(model={"arch": "resnet18"}, trainer={"max_steps": 1}), tmp_path / "run")
    said = refusal(tmp_path / "run" / "checkpoints" / "last.pt", tmp_path / "hf", capsys)
    assert "model.arch=resnet18" in said and "format=safetensors writes its weights" in said
    assert not (tmp_path / "hf").exists()


def test_an_earlier_export_is_replaced_and_another_folder_refused(runs, tmp_path, capsys):
    ckpt, _, _ = runs["cls-learned"]
    out = export(ckpt, tmp_path / "hf")
    (out / "README.md").write_text("old")
    export(ckpt, out)
    assert (out / "README.md").read_text() != "old"
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    assert "holds other files than an earlier export (notes.txt)" in refusal(ckpt, other, capsys)
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "mine"]  # no temporary folder left


def test_a_failed_write_leaves_the_earlier_export_whole(runs, tmp_path, monkeypatch, capsys):
    ckpt, _, _ = runs["cls-learned"]
    out = export(ckpt, tmp_path / "hf")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def full_disk(ckpt, path, *args):
        path.write_bytes(b"half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("vit_train.tools.hub_export.export_safetensors", full_disk)
    said = refusal(ckpt, out, capsys)
    assert "no space left" in said.lower()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


# --- the tables that stand for timm's: checked against timm itself --------------------------------------------------


@pytest.mark.parametrize("size", ["tiny", "small", "base", "large", "huge"])
@pytest.mark.parametrize("family", ["vit", "deit"])
def test_the_named_sizes_are_timms(size, family):
    from vit_train.checkpoint.hub import NAMED

    name = f"{family}_{size}_patch{14 if size == 'huge' else 16}_224"
    if not timm.is_model(name):
        assert family == "deit" and size in ("large", "huge")  # timm has no DeiT of these sizes
        return
    assert NAMED.match(name)
    with torch.device("meta"):
        net = timm.create_model(name)
    assert (net.embed_dim, len(net.blocks), net.blocks[0].attn.num_heads) == SIZES[size]


@pytest.mark.parametrize("dim, depth, heads", [(32, 2, 2), (48, 3, 3), *SIZES.values()])
@pytest.mark.parametrize("patch, size", [(16, 224), (32, 384), (8, 224), (14, 224), (4, 32)])
@pytest.mark.parametrize("distilled", [False, True])
def test_every_name_format_hf_writes_is_a_timm_model(dim, depth, heads, patch, size, distilled):
    model = dict(arch="vit", embed_dim=dim, depth=depth, num_heads=heads, patch_size=patch, img_size=size,
                 mlp_ratio=4.0, distilled=distilled)
    name, args = timm_layout(model, {}, 10)
    assert timm.is_model(name) and name.startswith("deit_" if distilled else "vit_")
    assert (args["embed_dim"], args["depth"], args["num_heads"], args["patch_size"]) == (dim, depth, heads, patch)


def test_crop_pct_gives_timm_the_resize_of_vit_trains_preprocessing():
    import math

    from vit_train.tools.hub_export import crop_pct

    for size in range(8, 1025):
        resize = int(size / 0.875)
        assert math.floor(size / crop_pct(size, resize)) == resize, size  # timm's transforms_factory rule
        assert abs(crop_pct(size, resize) - size / resize) < 1e-12


def test_vit_eval_and_predicts_door_reads_vit_trains_folder(runs):
    ckpt, folder, weights = runs["ema"]
    theirs, ours = load_for_inference(folder), load_for_inference(ckpt, weights)
    assert (theirs.source, theirs.class_names, theirs.preprocess) == (ours.source, ours.class_names, ours.preprocess)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(theirs.model(x), ours.model(x), rtol=0, atol=0)


@pytest.mark.parametrize("architecture, unchecked", [
    ("vit_tiny_patch16_224", "its activation (GELU or a variant) cannot be checked"),  # save_for_hf's model_args
    ("vit_micro_own", "its head count, its activation (GELU or a variant) cannot be checked"),  # no timm size, no args
])
def test_the_log_says_what_a_timm_folder_leaves_unchecked(tmp_path, caplog, architecture, unchecked):
    folder = timm_folder(tmp_path / "timm")
    config = json.loads((folder / "config.json").read_text())
    if architecture != config["architecture"]:
        config.update(architecture=architecture, model_args={})
    (folder / "config.json").write_text(json.dumps(config))
    with caplog.at_level("INFO", logger="vit_train"):
        load_pretrained(student(), folder, CLASS_NAMES)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("model.pretrained="))
    assert line.endswith(f"checked by its config.json and tensors: {unchecked}")


def test_the_docs_timm_snippet_predicts_as_vit_predict(runs, tmp_path, monkeypatch, capsys):
    """docs/looking-inside.md's snippet, run as written in a folder holding the export as vit-shapes."""
    import re
    import shutil

    from vit_train.tools.predict import predict

    doc = (Path(__file__).resolve().parents[2] / "docs" / "looking-inside.md").read_text()
    (snippet,) = [b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "local-dir:vit-shapes" in b]
    ckpt, folder, _ = runs["cls-learned"]
    shutil.copytree(folder, tmp_path / "vit-shapes")
    Image.fromarray(torch.randint(0, 256, (23, 30, 3), dtype=torch.uint8).numpy()).save(tmp_path / "photo.png")
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    exec(compile(snippet, "looking-inside.md", "exec"), {})
    (ours,) = predict(load_for_inference(ckpt), [str(tmp_path / "photo.png")], 1)
    assert capsys.readouterr().out.strip() == ours["top"][0]["class"]


def test_vit_eval_writes_beside_a_hub_folder_never_into_it(runs, tmp_path):
    """eval/ inside the folder would make the next export refuse it, and ship with it to the Hub."""
    import shutil

    from vit_train.tools.report import eval_dir

    ckpt, folder, _ = runs["cls-learned"]
    elsewhere = shutil.copytree(folder, tmp_path / "vit-shapes")
    assert eval_dir(load_for_inference(elsewhere).path, {}) == tmp_path / "eval"
    in_run = export(ckpt, ckpt.parent.parent / "export" / "best-hf")
    assert eval_dir(load_for_inference(in_run).path, {}) == ckpt.parent.parent / "eval"


def test_out_as_the_current_folder_exports_into_it_by_its_own_name(tmp_path, monkeypatch):
    """out=. once ended in a traceback (the temporary folder is named after out's name, which '.' has none of)."""
    from helpers.configs import tiny_config
    from vit_train.train.trainer import train

    train(tiny_config(trainer={"max_steps": 1}), tmp_path / "run")
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    export(tmp_path / "run" / "checkpoints" / "last.pt", Path("."))
    assert sorted(p.name for p in (tmp_path / "here").iterdir()) == ["README.md", "config.json", "model.safetensors"]
