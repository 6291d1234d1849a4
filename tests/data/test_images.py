"""Users' image folders: hidden entries are neither classes nor images, class names match after NFC
normalisation, and one decoder gives the same picture in every mode to training, vit-eval (and its
figures) and vit-predict."""

import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from helpers.ugly_folder import SIDE, picture, write_every_mode

from helpers.configs import build_data
from vit_train.data.decoding.image import open_rgb, read_uint8
from vit_train.data.sources.imagefolder_files import load_image_folders
from vit_train.errors import DataError
from vit_train.tools.inference import Trained
from vit_train.tools.predict import predict, read_image
from vit_train.data.preprocess import eval_transform as preprocess


def folder_config(make_config, root, **data):
    return make_config(model={"img_size": SIDE, "patch_size": 4}, aug={"name": "none"},
                       data={"name": "imagefolder", "root": str(root), "batch_size": 4, **data})


def test_every_mode_decodes_to_the_rgb_version(tmp_path):
    written = write_every_mode(tmp_path, picture(3))
    assert len(written) == 17
    for path, expected in written.items():
        got = np.asarray(open_rgb(path))
        assert got.shape == (SIDE, SIDE, 3) and got.dtype == np.uint8, path.name
        diff = np.abs(got.astype(int) - expected).max()
        # 16-bit: exactly round(v / 257); the others within 1 of Pillow's own conversion (YCbCr, CMYK round)
        assert diff == 0 if "I16" in path.name or "I32.tif" in path.name else diff <= 1, (path.name, diff)
        assert torch.equal(read_uint8(path), torch.from_numpy(got.copy()).permute(2, 0, 1))


def test_a_16_bit_ramp_is_scaled_not_clipped(tmp_path):
    ramp = (np.arange(SIDE * SIDE, dtype=np.uint32) * 65535 // (SIDE * SIDE - 1)).astype(np.uint16).reshape(SIDE, SIDE)
    Image.fromarray(ramp).save(tmp_path / "ramp.png")
    got = np.asarray(open_rgb(tmp_path / "ramp.png"))[..., 0]
    assert got.min() == 0 and got.max() == 255  # Pillow's convert("RGB") makes all but the first pixel white
    assert np.array_equal(got, np.rint(ramp / 257).astype(np.uint8))


def test_exif_orientation_is_applied(tmp_path):
    rgb = picture(5)
    exif = Image.Exif()
    exif[0x0112] = 8  # the viewer turns the stored pixels 90 degrees counter-clockwise
    Image.fromarray(np.rot90(rgb, -1).copy()).save(tmp_path / "phone.png", exif=exif.tobytes())
    assert np.array_equal(np.asarray(open_rgb(tmp_path / "phone.png")), rgb)
    assert not np.array_equal(np.asarray(Image.open(tmp_path / "phone.png").convert("RGB")), rgb)


def test_hidden_entries_are_neither_classes_nor_images(ugly_folder):
    train, val, names = load_image_folders(ugly_folder.root)
    assert names == ugly_folder.classes  # not '.ipynb_checkpoints', and the NFD val/ names match
    for split, data in (("train", train), ("val", val)):
        expected = {p for p in ugly_folder.expected if p.relative_to(ugly_folder.root).parts[0] == split}
        assert {Path(p) for p, _ in data.samples} == expected
        for path, label in data.samples:
            folder = Path(path).relative_to(ugly_folder.root / split).parts[0]
            assert names[label] == unicodedata.normalize("NFC", folder)


def test_a_notebook_checkpoint_folder_is_not_a_third_class(tmp_path):
    """The reported case: train/.ipynb_checkpoints/ with one PNG and an empty val/.ipynb_checkpoints/."""
    for split in ("train", "val"):
        for index, name in enumerate(("a", "b")):
            (tmp_path / split / name).mkdir(parents=True)
            Image.fromarray(picture(index)).save(tmp_path / split / name / "x.png")
        (tmp_path / split / ".ipynb_checkpoints").mkdir()
    Image.fromarray(picture(9)).save(tmp_path / "train" / ".ipynb_checkpoints" / "x-checkpoint.png")
    train, val, names = load_image_folders(tmp_path)
    assert names == ["a", "b"] and len(train) == 2 and len(val) == 2


def test_class_names_that_truly_differ_are_listed_both_ways(tmp_path):
    for split, classes in (("train", ("cat", "dog", "émeu")), ("val", ("cat", "dgo", "émeu"))):
        for name in classes:
            folder = tmp_path / split / unicodedata.normalize("NFD", name)
            folder.mkdir(parents=True)
            Image.fromarray(picture(0)).save(folder / "x.png")
    with pytest.raises(DataError) as info:
        load_image_folders(tmp_path)
    message = str(info.value)
    assert "val/ lacks 'dog'" in message and "val/ has 'dgo' that train/ lacks" in message
    assert "émeu" not in message and "\n" not in message


def test_a_class_of_hidden_files_only_is_empty(tmp_path):
    for split in ("train", "val"):
        for name in ("a", "b"):
            (tmp_path / split / name).mkdir(parents=True)
            Image.fromarray(picture(0)).save(tmp_path / split / name / ("._x.png" if name == "b" else "x.png"))
    with pytest.raises(DataError, match=r"class folder\(s\) with no images in .*train: b "):
        load_image_folders(tmp_path)


def test_training_eval_and_predict_see_the_same_picture_in_every_mode(ugly_folder, make_config):
    """Oracle: each file, in each path, gives the tensor its expected RGB version gives, within 1/255."""
    cfg = folder_config(make_config, ugly_folder.root)
    data = build_data(cfg, torch.device("cpu"))
    spec = cfg.data.eval_spec(cfg.model.img_size)
    predict_tf = preprocess(spec)
    tolerance = 1.01 / 255 / min(spec["std"])  # one level of 8 bits, after normalisation
    paths = {"train": data.train_loader.dataset, "val": data.val_loader.dataset}  # val: vit-eval and figures
    for split, dataset in paths.items():
        for index, (path, label) in enumerate(dataset.base.samples):
            reference = Image.fromarray(ugly_folder.expected[Path(path)])
            image, got_label, unreadable = dataset[index]
            assert unreadable == -1
            assert got_label == label
            torch.testing.assert_close(image, dataset.transform(reference), rtol=0, atol=tolerance, msg=path)
            predicted = predict_tf(read_image(path))
            torch.testing.assert_close(predicted, predict_tf(reference), rtol=0, atol=tolerance, msg=path)


def test_predict_reads_rgba_palette_and_16_bit_files_as_their_rgb_twins(tmp_path, make_config):
    cfg = folder_config(make_config, tmp_path)
    written = write_every_mode(tmp_path, picture(11))
    model = cfg.model.build(3).eval()
    ckpt = {"class_names": ["a", "b", "c"], "preprocess": cfg.data.eval_spec(cfg.model.img_size)}
    trained = Trained(model, cfg, tmp_path / "made.pt", "model", None, ckpt)
    files = sorted(str(p) for p in written)
    results = predict(trained, files, top_k=3)
    for path, result in zip(files, results):
        Image.fromarray(written[Path(path)]).save(tmp_path / "twin.png")
        (twin,) = predict(trained, [str(tmp_path / "twin.png")], top_k=3)
        got = {t["class"]: t["probability"] for t in result["top"]}
        want = {t["class"]: t["probability"] for t in twin["top"]}
        assert got == pytest.approx(want, abs=1e-3), path
