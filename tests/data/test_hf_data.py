"""data=hf: a Hugging Face dataset on local disk (save_to_disk folder or parquet files) read as a map-style
base data set: the same pixels and labels as the images written, class names from the features, one line
for what is missing, the unreadable-image policy, and exact mid-epoch resume through the EpochSampler."""

import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

datasets = pytest.importorskip("datasets")

from helpers.configs import tiny_config  # noqa: E402
from helpers.files import assert_same_run  # noqa: E402
from helpers.configs import build_data  # noqa: E402
from vit_train.data.sources.hf import load_hf_splits  # noqa: E402
from vit_train.errors import DataError, RunStopped  # noqa: E402
from vit_train.train.trainer import train  # noqa: E402

HELPERS = Path(__file__).parents[1] / "helpers"
CLASSES = ["cat", "dog", "emu"]


def picture(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)


def png(seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(picture(seed)).save(buffer, format="PNG")
    return buffer.getvalue()


def split(n: int, start: int, labels: str | None = "classlabel", names=CLASSES, bad: tuple = ()) -> "datasets.Dataset":
    """`n` 8x8 PNG cells (picture(start + i)), labels i % 3 (a ClassLabel, plain ints, or none);
    rows in `bad` hold bytes no decoder reads."""
    columns = {"image": [{"bytes": b"not an image" if i in bad else png(start + i), "path": None} for i in range(n)]}
    features = {"image": datasets.Image()}
    if labels:
        columns["label"] = [i % 3 for i in range(n)]
        features["label"] = datasets.ClassLabel(names=names) if labels == "classlabel" else datasets.Value("int64")
    return datasets.Dataset.from_dict(columns, features=datasets.Features(features))


def save(root: Path, layout: str = "disk", val_name: str = "validation", **kwargs) -> Path:
    """A train split of 64 and a val split of 16 at `root`: save_to_disk, or parquet files as the Hub lays them out."""
    parts = {"train": split(64, 0, **kwargs), val_name: split(16, 1000, **kwargs)}
    if layout == "disk":
        datasets.DatasetDict(parts).save_to_disk(str(root))
    elif layout == "parquet":  # the Hub's data/SPLIT-NNNNN-of-NNNNN.parquet
        for name, ds in parts.items():
            ds.to_parquet(str(root / "data" / f"{name}-00000-of-00001.parquet"))
    else:  # a folder a split, as the Hub's parquet conversion lays them out (SPLIT/0000.parquet)
        for name, ds in parts.items():
            ds.select(range(len(ds) // 2)).to_parquet(str(root / name / "0000.parquet"))
            ds.select(range(len(ds) // 2, len(ds))).to_parquet(str(root / name / "0001.parquet"))
    return root


@pytest.mark.parametrize("layout", ["disk", "parquet", "parquet-folders"])
def test_a_dataset_reads_as_the_pixels_and_labels_written(tmp_path, layout):
    train, val, names = load_hf_splits(save(tmp_path / "ds", layout), "image", "label", "train", None)
    assert names == CLASSES and (len(train), len(val)) == (64, 16)
    for base, start in ((train, 0), (val, 1000)):
        for i in (0, 5, len(base) - 1):
            image, label = base[i]
            assert image.mode == "RGB" and np.array_equal(np.asarray(image), picture(start + i)) and label == i % 3
    assert train.samples[5] == (f"{tmp_path / 'ds'} train[5]", 2)


def test_parquet_is_read_offline_and_cached_outside_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home" / ".cache" / "huggingface"))
    train, _, _ = load_hf_splits(save(tmp_path / "ds", "parquet"), "image", "label", "train", None)
    assert len(train) == 64 and not (tmp_path / "home").exists()


@pytest.mark.parametrize("val_name", ["val", "test"])
def test_val_split_null_takes_validation_else_val_else_test(tmp_path, val_name):
    _, val, _ = load_hf_splits(save(tmp_path / "ds", val_name=val_name), "image", "label", "train", None)
    assert np.array_equal(np.asarray(val[0][0]), picture(1000))


def test_a_missing_split_names_the_splits_there_are(tmp_path):
    root = save(tmp_path / "ds")
    with pytest.raises(DataError, match=r"has no split 'dev' \(data.val_split\); its splits: train, validation$"):
        load_hf_splits(root, "image", "label", "train", "dev")


def test_plain_integer_labels_are_named_by_number_in_one_log_line(tmp_path, caplog):
    caplog.set_level(logging.INFO, "vit_train")
    _, _, names = load_hf_splits(save(tmp_path / "ds", labels="int"), "image", "label", "train", None)
    assert names == ["0", "1", "2"]
    assert [r.message for r in caplog.records if "no class names" in r.message] == \
        ["data=hf: the label column 'label' has no class names (no ClassLabel): classes are named 0..2"]


@pytest.mark.parametrize("key, value", [("image_key", "img"), ("label_key", "fine_label")])
def test_a_missing_column_names_the_columns_there_are(tmp_path, key, value):
    keys = {"image_key": "image", "label_key": "label", key: value}
    with pytest.raises(DataError, match=rf"split 'train' of .* has no column '{value}' \(data.{key}\); "
                                        r"its columns: image, label$"):
        load_hf_splits(save(tmp_path / "ds"), keys["image_key"], keys["label_key"], "train", None)


def test_without_labels_the_label_column_may_be_absent(tmp_path):
    train, val, names = load_hf_splits(save(tmp_path / "ds", labels=None), "image", "label", "train", None,
                                       labels=False)
    assert names == ["image"] and train[3][1] == 0 and np.array_equal(np.asarray(train[3][0]), picture(3))


def test_class_names_that_differ_between_train_and_val_are_refused(tmp_path):
    root = tmp_path / "ds"
    datasets.DatasetDict(train=split(6, 0), validation=split(3, 10, names=["cat", "dog", "eel"])).save_to_disk(str(root))
    with pytest.raises(DataError, match="names other classes in split 'validation' than in 'train'"):
        load_hf_splits(root, "image", "label", "train", None)


def test_one_split_with_a_classlabel_names_the_classes_of_both(tmp_path):
    root = tmp_path / "ds"
    datasets.DatasetDict(train=split(6, 0, labels="int"), validation=split(3, 10)).save_to_disk(str(root))
    train, _, names = load_hf_splits(root, "image", "label", "train", None)
    assert names == CLASSES and train[4][1] == 1


def test_a_label_outside_the_classes_is_refused_in_one_line(tmp_path):
    root = tmp_path / "ds"
    bad = split(3, 10, labels="int").map(lambda row, i: {"label": -1 if i == 2 else row["label"]}, with_indices=True)
    datasets.DatasetDict(train=split(6, 0), validation=bad).save_to_disk(str(root))
    with pytest.raises(DataError, match=r"validation row 2 has label -1, outside 0..2 \(1 such rows; an unlabelled "
                                        r"split has -1\); use a labelled split$"):
        load_hf_splits(root, "image", "label", "train", None)


def test_a_column_of_file_paths_is_read_relative_to_the_root(tmp_path):
    root = tmp_path / "ds"
    (root / "img").mkdir(parents=True)
    for i in range(4):
        Image.fromarray(picture(i)).save(root / "img" / f"{i}.png")
    ds = datasets.Dataset.from_dict({"file": [f"img/{i}.png" for i in range(4)], "label": [0, 1, 0, 1]})
    for name in ("train", "validation"):
        ds.to_parquet(str(root / f"{name}-00000.parquet"))
    train, _, names = load_hf_splits(root, "file", "label", "train", None)
    assert names == ["0", "1"] and np.array_equal(np.asarray(train[2][0]), picture(2))


def test_parquet_files_of_one_split_in_two_layouts_are_refused_naming_both(tmp_path):
    """The same files at root/ and root/data/ (a copy left behind when moving to the Hub's layout) would
    read every row twice; so would root/train-*.parquet beside root/train/*.parquet."""
    root = save(tmp_path / "ds", "parquet")
    for f in (root / "data").glob("*.parquet"):
        (root / f.name).write_bytes(f.read_bytes())
    with pytest.raises(DataError, match=rf"split 'train' of {root} has parquet files in two layouts \({root}/train"
                                        rf"\*\.parquet and {root}/data/train\*\.parquet\), so every row would be "
                                        r"read twice; keep one layout"):
        load_hf_splits(root, "image", "label", "train", None)
    other = save(tmp_path / "folders", "parquet-folders")
    (other / "train-00000.parquet").write_bytes((other / "train" / "0000.parquet").read_bytes())
    with pytest.raises(DataError, match=rf"\({other}/train\*\.parquet and {other}/train/\*\.parquet\)"):
        load_hf_splits(other, "image", "label", "train", None)


def test_an_empty_split_is_named_in_one_line(tmp_path):
    root = tmp_path / "ds"
    datasets.DatasetDict(train=split(6, 0), validation=split(0, 10)).save_to_disk(str(root))
    with pytest.raises(DataError, match=rf"^split folder {root / 'validation'} of the save_to_disk folder {root} "
                                        r"holds no Arrow file \(an empty split\)"):
        load_hf_splits(root, "image", "label", "train", None)


def _cut(path: Path) -> None:
    arrow = next((path / "train").glob("*.arrow"))
    arrow.write_bytes(arrow.read_bytes()[:200])


@pytest.mark.parametrize("damage, error", [
    (lambda p: (p / "train" / "state.json").write_text("{not json"), "JSONDecodeError"),
    (lambda p: (p / "train" / "state.json").write_text("{}"), "KeyError"),
    (lambda p: (p / "train" / "state.json").write_text("[1]"), "TypeError"),
    (lambda p: (p / "dataset_dict.json").write_text('{"splits": 3}'), "TypeError"),
    (lambda p: (p / "train" / "dataset_info.json").write_text("junk"), "JSONDecodeError"),
    (_cut, "ArrowInvalid"),
])
def test_a_damaged_save_to_disk_folder_is_named_in_one_line(tmp_path, damage, error):
    root = save(tmp_path / "ds")
    damage(root)
    with pytest.raises(DataError, match=rf"^{root} is not a readable save_to_disk folder \({error}: [^\n]*\); "
                                        r"save it again or point data.root at another$"):
        load_hf_splits(root, "image", "label", "train", None)


@pytest.mark.parametrize("layout", ["disk", "parquet"])
def test_a_label_cell_without_a_value_names_its_split_and_row(tmp_path, layout):
    root = tmp_path / "ds"
    val = split(5, 10, labels="int").map(lambda row, i: {"label": None if i in (3, 4) else row["label"]},
                                         with_indices=True)
    parts = {"train": split(6, 0, labels="int"), "validation": val}
    if layout == "disk":
        datasets.DatasetDict(parts).save_to_disk(str(root))
    else:
        for name, ds in parts.items():
            ds.to_parquet(str(root / f"{name}-0.parquet"))
    with pytest.raises(DataError, match=rf"^{root} validation row 3 has no label \(an empty cell in column 'label'; "
                                        r"2 such rows\); fill in or drop those rows"):
        load_hf_splits(root, "image", "label", "train", None)


def test_string_labels_are_refused_with_how_to_cast_them_to_a_classlabel(tmp_path):
    root = tmp_path / "ds"
    words = split(3, 10, labels=None).add_column("label", ["cat", "dog", "emu"])
    datasets.DatasetDict(train=split(6, 0), validation=words).save_to_disk(str(root))
    with pytest.raises(DataError, match=r"^the label column 'label' of split 'validation' of .* holds strings "
                                        r"\(class names\?\), not class indices; the other split has a ClassLabel "
                                        r"\(cat, dog, emu\): cast this one to it, ds.cast_column\('label', "
                                        r"ClassLabel\(names=\[\.\.\.\]\)\)$"):
        load_hf_splits(root, "image", "label", "train", None)
    datasets.DatasetDict(train=split(3, 0, labels=None).add_column("label", ["a", "b", "a"]),
                         validation=words).save_to_disk(str(tmp_path / "both"))
    with pytest.raises(DataError, match=r"split 'train' of .* holds strings \(class names\?\), not class indices; "
                                        r"cast it with ds.cast_column\('label', ClassLabel"):
        load_hf_splits(tmp_path / "both", "image", "label", "train", None)


def hf_config(root: Path, resume: str | None = None, **data):
    return tiny_config(data={"name": "hf", "root": str(root), "batch_size": 16, "num_workers": 0, **data},
                       trainer={"epochs": 2, "log_every": 1, "ckpt_every": 3}, aug={"name": "basic"}, resume=resume)


def test_an_unreadable_cell_is_replaced_under_skip_and_stops_the_run_under_error(tmp_path, caplog):
    root = tmp_path / "ds"
    datasets.DatasetDict(train=split(64, 0, bad=(3,)), validation=split(16, 1000)).save_to_disk(str(root))
    with pytest.raises(DataError, match=rf"^{root} train\[3\] cannot be read \(UnidentifiedImageError: .*"
                                        r"set data.bad_images=skip"):
        train(hf_config(root, bad_images="error"), tmp_path / "error")
    caplog.set_level(logging.WARNING, "vit_train")
    results = train(hf_config(root, bad_images="skip", max_bad_fraction=0.05), tmp_path / "skip")
    assert results["status"] == "completed"
    replaced = [r.message for r in caplog.records if "replaced" in r.message]
    assert replaced == [  # the image named once, when first met; each epoch's count
        f"unreadable train image replaced: {root} train[3] (UnidentifiedImageError: cannot identify image file "
        f"'{root} train[3]')", "epoch 1: 1 unreadable train image replaced (1 distinct so far)",
        "epoch 2: 1 unreadable train image replaced (1 distinct so far)"], replaced


def test_a_dataset_whose_images_are_all_unreadable_says_why_under_skip_and_stops_at_the_first_under_error(tmp_path):
    """Path cells relative to another folder than data.root (a newcomer's first dataset): every image is
    missing. skip: one line naming the first image and why, worded for a dataset (no class folder);
    error: the usual line at the first unreadable image, though no readable one follows it."""
    root = tmp_path / "ds"
    ds = datasets.Dataset.from_dict({"file": [f"elsewhere/{i}.png" for i in range(32)], "label": [i % 2 for i in range(32)]})
    datasets.DatasetDict(train=ds, validation=ds.select(range(8))).save_to_disk(str(root))
    with pytest.raises(DataError) as skipped:
        train(hf_config(root, image_key="file", max_bad_fraction=1.0), tmp_path / "skip")
    message = str(skipped.value)
    assert re.fullmatch(rf"16 unreadable images in a row from {re.escape(str(root))} train\[(\d+)\] \(FileNotFoundError: "
                        rf".*{re.escape(str(root))}/elsewhere/\1\.png.*; image files that path cells name, relative "
                        r"to data.root, missing\? a damaged dataset\?\); check that the data is in place and readable, "
                        r"then resume", message), message
    with pytest.raises(DataError) as stopped:
        train(hf_config(root, image_key="file", bad_images="error"), tmp_path / "error")
    assert re.fullmatch(rf"{re.escape(str(root))} train\[\d+\] cannot be read \(FileNotFoundError: .*\); fix or remove "
                        r"it, or set data.bad_images=skip to replace unreadable images", str(stopped.value))


def test_two_processes_take_the_same_global_batches_as_one(tmp_path):
    cfg = hf_config(save(tmp_path / "ds"))
    one = build_data(cfg, torch.device("cpu"))
    two = [build_data(cfg, torch.device("cpu"), rank=r, world_size=2) for r in range(2)]
    for data in (one, *two):
        data.train_sampler.set_epoch(1)
    for (x, y), (x0, y0), (x1, y1) in zip(one.train_loader, two[0].train_loader, two[1].train_loader):
        assert torch.equal(x, torch.cat([x0, x1])) and torch.equal(y, torch.cat([y0, y1]))


def test_one_parquet_file_feeds_every_loader_worker_the_batches_of_one_process(tmp_path):
    """datasets#8669: with fewer files than workers, workers of an iterable dataset get nothing. Here
    the sampler hands out items, not files: 2 workers over 1 file give the batches that no worker gives."""
    root = save(tmp_path / "ds", "parquet")
    loaders = [build_data(hf_config(root, num_workers=n), torch.device("cpu")).train_loader for n in (0, 2)]
    batches = [list(loader) for loader in loaders]
    assert len(batches[0]) == len(batches[1]) == 4
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(*batches))


@pytest.fixture(scope="module")
def hf_reference(tmp_path_factory):
    """(dataset root, an uninterrupted run on it: 2 epochs of 4 steps, checkpoints at 3, 4, 6, 8)."""
    root = save(tmp_path_factory.mktemp("hf") / "ds")
    run_dir = tmp_path_factory.mktemp("hf_reference")
    train(hf_config(root), run_dir)
    return root, run_dir


def test_a_run_stopped_mid_epoch_resumes_as_the_uninterrupted_run(tmp_path, hf_reference, monkeypatch):
    from vit_train.models.vit import VisionTransformer

    root, reference = hf_reference
    forward, calls = VisionTransformer.forward, []

    def signalling_forward(self, x):  # SIGUSR1 in the 7th step: it stops with a checkpoint at step 6 or 7
        if self.training:
            calls.append(1)
            if len(calls) == 7:
                os.kill(os.getpid(), signal.SIGUSR1)
        return forward(self, x)

    monkeypatch.setattr(VisionTransformer, "forward", signalling_forward)
    with pytest.raises(RunStopped):
        train(hf_config(root), tmp_path)
    monkeypatch.undo()
    assert 0 < torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)["batch_in_epoch"] < 4
    train(hf_config(root, resume="auto"), tmp_path)
    assert_same_run(tmp_path, reference)


@pytest.mark.slow
def test_a_run_killed_mid_epoch_with_loader_workers_resumes_as_the_uninterrupted_run(tmp_path, hf_reference):
    root, reference = hf_reference
    cfg = hf_config(root, num_workers=2).to_dict()
    sections = {k: cfg[k] for k in ("data", "trainer", "aug")}
    done = subprocess.run([sys.executable, str(HELPERS / "killer.py"),  # killed at step 7: resumes at 6, mid-epoch
                           json.dumps({"run_dir": str(tmp_path), "sections": sections, "fault": "row", "n": 7})],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == -9, done.stderr[-2000:]
    last = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert (last["step"], last["batch_in_epoch"]) == (6, 2)
    train(hf_config(root, num_workers=2, resume="auto"), tmp_path)
    assert_same_run(tmp_path, reference)  # the reference read without workers: the same batches


def test_an_image_cell_that_holds_only_a_path_is_read_from_that_file(tmp_path):
    """A cell {"bytes": None, "path": ...} (datasets keeps paths for images it has not embedded; see
    huggingface/datasets#8254's review): the file is read and decoded as any other image."""
    from vit_train.data.sources import hf

    for i in range(2):
        Image.fromarray(picture(i)).save(tmp_path / f"{i}.png")
    ds = datasets.Dataset.from_dict({"image": [str(tmp_path / f"{i}.png") for i in range(2)], "label": [0, 1]},
                                    features=datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")}))
    images = hf._images(ds, "image", "label", 2, "memory", tmp_path)
    assert images.dataset[1]["image"] == {"bytes": None, "path": str(tmp_path / "1.png")}
    assert np.array_equal(np.asarray(images[1][0]), picture(1)) and images[1][1] == 1
    (tmp_path / "1.png").unlink()
    assert "FileNotFoundError" in images.describe_unreadable(1)


def test_mae_pretrains_on_a_dataset_without_a_label_column(tmp_path):
    datasets.DatasetDict(train=split(32, 0, labels=None), validation=split(8, 100, labels=None)).save_to_disk(
        str(tmp_path / "ds"))
    cfg = tiny_config(objective={"name": "mae", "decoder_dim": 16, "decoder_depth": 1, "decoder_heads": 2},
                      data={"name": "hf", "root": str(tmp_path / "ds"), "batch_size": 8, "num_workers": 0},
                      trainer={"max_steps": 2})
    results = train(cfg, tmp_path / "run")
    assert results["steps"] == 2 and results["final_loss"] > 0
    assert torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)["class_names"] == ["image"]


def test_without_the_datasets_package_data_hf_says_what_to_install(tmp_path, monkeypatch):
    import vit_train.extras as extras

    monkeypatch.setattr(extras, "available", lambda module: module != "datasets")
    with pytest.raises(DataError) as error:
        load_hf_splits(tmp_path, "image", "label", "train", None)
    assert str(error.value) == "data=hf needs the datasets package: pip install 'vit-train[data]'"


@pytest.mark.slow  # torchrun: ~30 s on 2 cores
def test_torchrun_with_two_processes_trains_like_one_on_a_hugging_face_dataset(tmp_path):
    from helpers.files import logged, model_weights
    from helpers.runs import torchrun, vit_train

    root = save(tmp_path / "ds")
    args = ["data=hf", f"data.root={root}", "model=vit_micro", "model.embed_dim=32", "model.depth=2",
            "model.num_heads=2", "model.img_size=16", "model.patch_size=4", "data.batch_size=16", "data.num_workers=1",
            "trainer.device=cpu", "trainer.progress=false", "trainer.log_every=1", "trainer.epochs=2"]
    one = vit_train(*args, f"hydra.run.dir={tmp_path / 'one'}", cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    two = torchrun(*args, f"hydra.run.dir={tmp_path / 'two'}", cwd=tmp_path)
    assert two.returncode == 0, two.stdout + two.stderr
    ones, twos = logged(tmp_path / "one", "train"), logged(tmp_path / "two", "train")
    assert [e["step"] for e in twos] == [e["step"] for e in ones] == list(range(1, 9))
    assert all(abs(a["loss"] - b["loss"]) < 1e-5 * a["loss"] for a, b in zip(ones, twos)), (ones, twos)
    for key, value in model_weights(tmp_path / "one").items():
        torch.testing.assert_close(value, model_weights(tmp_path / "two")[key], rtol=1e-4, atol=1e-5, msg=key)
    # the 16 val images split 8 + 8: the val top-1 is the whole set's, as one process measures it
    assert logged(tmp_path / "two", "val")[-1]["top1"] == logged(tmp_path / "one", "val")[-1]["top1"]
