"""vit-shards short_side=N: pre-resized shards (as FFCV and DeiT's data pipelines store ImageNet). An image whose
shorter side is longer than N is stored resized to it, aspect kept, by evaluation's resize (so shards written at
evaluation's resize side, stored losslessly, evaluate to the folder's pixels); smaller ones are stored as they are;
the side is recorded per split in index.json; a run whose crop or evaluation needs more than the stored side says
so in one line."""

from __future__ import annotations

import io
import json
import logging
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from helpers.configs import build_data, tiny_config
from helpers.shards import write_shards as write_raw_shards
from vit_train.config import Config
from vit_train.data.decoding.image import decode_rgb
from vit_train.errors import DataError
from vit_train.tools.shards import webp_is_lossy, webp_like, write_shards


def _noise(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def _members(out: Path, split: str) -> list[tuple[str, bytes]]:
    index = json.loads((out / "index.json").read_text())
    found = []
    for shard in index["splits"][split]["shards"]:
        with tarfile.open(out / shard["name"]) as tar:
            found += [(m.name, tar.extractfile(m).read()) for m in tar.getmembers() if not m.name.endswith(".cls")]
    return found


def encoded_as(image: Image.Image, jpeg: bytes) -> Image.Image:
    """`image` encoded with the quantization tables and chroma subsampling of the JPEG file `jpeg`, decoded."""
    from PIL import JpegImagePlugin

    with Image.open(io.BytesIO(jpeg)) as source:
        tables, sampling = source.quantization, JpegImagePlugin.get_sampling(source)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", qtables=[tables[0], tables[1]], subsampling=sampling)
    return decode_rgb(buffer.getvalue(), "oracle")


def _folder_cfg(root: Path, **data) -> Config:
    """data=imagefolder on `root`, a val/ of one image added where the test writes train/ only."""
    for folder in [] if (root / "val").exists() else sorted((root / "train").iterdir()):
        (root / "val" / folder.name).mkdir(parents=True)
        _noise(8, 8, 99).save(root / "val" / folder.name / "0.png")
    return Config.from_dict({"data": {"name": "imagefolder", "root": str(root), **data}, "model": {"img_size": 16}})


# (file name, format, (width, height)), short_side 20: the stored size, torchvision's Resize of the shorter side
# (the longer side int(20 * long / short)), and the member's extension
CASES = [("wide.jpg", "JPEG", (60, 40), (30, 20), "jpg"),
         ("tall.png", "PNG", (41, 100), (20, 48), "png"),
         ("lossy.webp", "WEBP", (25, 30), (20, 24), "webp"),
         ("bitmap.bmp", "BMP", (33, 33), (20, 20), "png"),
         ("small.jpg", "JPEG", (19, 50), (19, 50), "jpg"),  # the shorter side at most 20: kept as it is
         ("exact.png", "PNG", (20, 35), (20, 35), "png")]


def test_each_image_is_stored_at_its_shorter_side_resized_as_pillow_resizes_and_in_its_own_format(tmp_path):
    root = tmp_path / "src"
    for i, (name, fmt, size, _, _) in enumerate(CASES):
        for split in ("train", "val"):
            (root / split / "a").mkdir(parents=True, exist_ok=True)
            _noise(*size, seed=i).save(root / split / "a" / name, format=fmt)
    index = write_shards(_folder_cfg(root), tmp_path / "out", ["train", "val"], progress=False, short_side=20)
    assert index["splits"]["train"]["short_side"] == index["splits"]["val"]["short_side"] == 20
    assert json.loads((tmp_path / "out" / "index.json").read_text())["splits"]["val"]["short_side"] == 20
    files = sorted(CASES)  # the folder's listing is sorted by name
    for (member, data), (name, fmt, size, stored, ext) in zip(_members(tmp_path / "out", "train"), files):
        source = root / "train" / "a" / name
        assert member.endswith(f".{ext}"), (name, member)
        got = decode_rgb(data, member)
        assert got.size == stored, name
        if stored == size:  # not resized: the file's bytes kept
            assert data == source.read_bytes(), name
            continue
        expected = decode_rgb(source.read_bytes(), name).resize(stored, Image.Resampling.BILINEAR)  # the oracle
        if ext == "jpg":  # re-encoded as the source was: its quantization tables and chroma subsampling
            assert np.array_equal(np.asarray(got), np.asarray(encoded_as(expected, source.read_bytes()))), name
        elif name == "lossy.webp":  # re-encoded lossy, at no more bytes per pixel than its source (shards.webp_like)
            assert webp_is_lossy(data) and len(data) / (stored[0] * stored[1]) <= \
                source.stat().st_size / (size[0] * size[1]), name
            assert np.array_equal(np.asarray(got), np.asarray(decode_rgb(webp_like(expected, source.read_bytes()),
                                                                         name))), name
        else:  # png, lossless webp: the resized pixels exactly
            assert np.array_equal(np.asarray(got), np.asarray(expected)), name


@pytest.mark.parametrize("image_format", ["png", "webp"])
def test_shards_at_the_evaluation_resize_side_evaluate_to_the_folders_pixels(tmp_path, image_format):
    """img_size 16: evaluation resizes the shorter side to int(16 / 0.875) = 18 and centre-crops 16. Stored at
    short_side=18 losslessly, the val batches of the shards equal the folder's, bit for bit."""
    pytest.importorskip("webdataset")
    root = tmp_path / "src"
    sizes = [(40, 30), (31, 77), (18, 18), (64, 64), (17, 25)]
    for split in ("train", "val"):
        for i, size in enumerate(sizes):
            (root / split / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
            _noise(*size, seed=i).save(root / split / f"c{i % 2}" / f"{i}.png")
    write_shards(_folder_cfg(root), tmp_path / "out", ["train", "val"], progress=False, image_format=image_format,
                 short_side=18)
    data = {name: tiny_config(data={"name": name, "root": str(where), "batch_size": 2, "num_workers": 0})
            for name, where in (("imagefolder", root), ("webdataset", tmp_path / "out"))}
    batches = {name: list(build_data(c, torch.device("cpu")).val_loader) for name, c in data.items()}
    assert sum(len(y) for _, y in batches["webdataset"]) == len(sizes)
    for (x, y), (x_ref, y_ref) in zip(batches["webdataset"], batches["imagefolder"], strict=True):
        assert torch.equal(y, y_ref) and torch.equal(x, x_ref)


def test_workers_write_the_same_resized_shards_as_one_process(tmp_path):
    root = tmp_path / "src"
    for i in range(6):
        (root / "train" / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        _noise(30 + i, 50, seed=i).save(root / "train" / f"c{i % 2}" / f"{i}.jpg", quality=90)
    for workers in (0, 2):
        write_shards(_folder_cfg(root), tmp_path / f"w{workers}", ["train"], progress=False, workers=workers,
                     short_side=24, shard_size=4)
    names = sorted(p.name for p in (tmp_path / "w0").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "w2").iterdir())
    assert all((tmp_path / "w0" / n).read_bytes() == (tmp_path / "w2" / n).read_bytes() for n in names)


def test_an_image_bomb_is_refused_before_it_is_resized(tmp_path, monkeypatch, caplog):
    """The pixel limit holds before any resize: a claimed size over it is an unreadable image (data.bad_images)."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 2x the limit is an error in Pillow
    root = tmp_path / "src"
    (root / "train" / "a").mkdir(parents=True)
    _noise(20, 20, 0).save(root / "train" / "a" / "ok.png")
    _noise(50, 50, 1).save(root / "train" / "a" / "bomb.png")  # 2500 pixels
    with caplog.at_level(logging.WARNING, "vit_train"):
        index = write_shards(_folder_cfg(root), tmp_path / "out", ["train"], progress=False, short_side=10)
    assert index["splits"]["train"]["samples"] == 1
    assert any("bomb.png" in r.getMessage() and "left out" in r.getMessage() for r in caplog.records)


def _index_with_sides(tmp_path: Path, train: int | None, val: int | None) -> Path:
    root = tmp_path / "shards"
    write_raw_shards(root, [8, 8], [4])
    index = json.loads((root / "index.json").read_text())
    index["splits"]["train"]["short_side"], index["splits"]["val"]["short_side"] = train, val
    index["image_size"] = None  # not the small-images warning's business here
    (root / "index.json").write_text(json.dumps(index))
    return root


def _stored_warnings(tmp_path: Path, root: Path, caplog, aug: str = "basic") -> list[str]:
    from vit_train.train.trainer import train

    cfg = tiny_config(data={"name": "webdataset", "root": str(root), "batch_size": 4, "num_workers": 0,
                            "shuffle_buffer": 4}, trainer={"max_steps": 1}, aug={"name": aug})
    caplog.clear()
    with caplog.at_level(logging.INFO, "vit_train"):
        assert train(cfg, tmp_path / "run")["status"] == "completed"
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "short_side" in r.getMessage()]
    assert all(line in (tmp_path / "run" / "train.log").read_text() for line in said)
    return said


@pytest.mark.parametrize("train_side, val_side, said", [
    (None, None, None),
    (18, 18, None),  # img_size 16: the crop needs 16, evaluation's resize 18
    (64, 64, None),
    (12, 18, "the train shards hold images of a shorter side of at most 12 px, less than a training crop of "
             "model.img_size=16, so those images are upscaled from fewer pixels than the source had; write the "
             "shards again with vit-shards short_side=16 or more (or none)"),
    (16, 17, "the val shards hold images of a shorter side of at most 17 px, less than evaluation's resize to 18 "
             "(then the centre crop to 16), so those images are upscaled from fewer pixels than the source had; "
             "write the shards again with vit-shards short_side=18 or more (or none)"),
    (8, 8, "the train shards hold images of a shorter side of at most 8 px, less than a training crop of "
           "model.img_size=16; the val shards hold images of a shorter side of at most 8 px, less than evaluation's "
           "resize to 18 (then the centre crop to 16), so those images are upscaled from fewer pixels than the "
           "source had; write the shards again with vit-shards short_side=18 or more (or none)"),
])
def test_a_run_says_in_one_line_when_its_crop_or_evaluation_needs_more_than_the_stored_side(
        tmp_path, caplog, train_side, val_side, said):
    pytest.importorskip("webdataset")
    root = _index_with_sides(tmp_path, train_side, val_side)
    assert _stored_warnings(tmp_path, root, caplog) == ([] if said is None else [f"data=webdataset: {said}"])


@pytest.mark.parametrize("train_side, said", [
    (18, None),
    (16, "the train shards hold images of a shorter side of at most 16 px, less than training's resize to 18 "
         "(aug=none, then the centre crop to 16), so those images are upscaled from fewer pixels than the source "
         "had; write the shards again with vit-shards short_side=18 or more (or none)"),
])
def test_aug_none_reads_training_images_at_evaluations_resize_and_says_so_from_its_transform(
        tmp_path, caplog, train_side, said):
    """aug=none resizes training images as evaluation does (to 18 at img_size 16), not to the crop's 16."""
    pytest.importorskip("webdataset")
    root = _index_with_sides(tmp_path, train_side, 18)
    assert _stored_warnings(tmp_path, root, caplog, "none") == ([] if said is None else [f"data=webdataset: {said}"])


@pytest.mark.parametrize("short_side, stored", [(100, (64, 48)), (24, (32, 24))])
def test_a_phone_cameras_mpo_jpeg_stays_a_jpeg(tmp_path, short_side, stored):
    """An MPO (a JPEG followed by more pictures, as phone cameras write) is a JPEG to every decoder (its first
    picture): kept as it is when small enough, re-encoded as a JPEG when resized, not turned into a PNG."""
    root = tmp_path / "src"
    (root / "train" / "a").mkdir(parents=True)
    smooth = np.kron(np.random.default_rng(2).integers(0, 256, (6, 8, 3), dtype=np.uint8), np.ones((8, 8, 1), np.uint8))
    first, second = Image.fromarray(smooth), Image.fromarray(255 - smooth)
    first.save(root / "train" / "a" / "phone.jpg", format="MPO", save_all=True, append_images=[second], quality=95)
    with Image.open(root / "train" / "a" / "phone.jpg") as check:
        assert check.format == "MPO" and getattr(check, "n_frames", 1) == 2
    write_shards(_folder_cfg(root), tmp_path / "out", ["train"], progress=False, short_side=short_side)
    (member, data), = _members(tmp_path / "out", "train")
    assert member.endswith(".jpg"), member
    assert decode_rgb(data, member).size == stored
    if stored == (64, 48):
        assert data == (root / "train" / "a" / "phone.jpg").read_bytes()


@pytest.mark.parametrize("side", [0, -3, 1.5, "256", True])
def test_an_index_with_a_bad_short_side_is_refused_in_one_line(tmp_path, side):
    pytest.importorskip("webdataset")
    from vit_train.data.shards.index import load_index

    root = _index_with_sides(tmp_path, side, None)
    with pytest.raises(DataError, match=r"splits.train.short_side is .*, not a number of pixels") as e:
        load_index(str(root))
    assert "\n" not in str(e.value)


def test_an_imagenet_sized_jpeg_is_stored_as_a_jpeg_of_the_shorter_side_asked(tmp_path):
    """What the option is for: a 500x375 photo (ImageNet's typical size) stored at short_side=256, a JPEG of
    341x256 pixels, 0.47x the pixels to decode each epoch."""
    root = tmp_path / "src"
    (root / "train" / "a").mkdir(parents=True)
    coarse = Image.fromarray(np.random.default_rng(0).integers(0, 256, (12, 16, 3), dtype=np.uint8))
    coarse.resize((500, 375), Image.Resampling.BICUBIC).save(root / "train" / "a" / "photo.jpg", quality=90)  # smooth
    write_shards(_folder_cfg(root), tmp_path / "out", ["train"], progress=False, short_side=256)
    (_, data), = _members(tmp_path / "out", "train")
    with Image.open(io.BytesIO(data)) as stored:
        assert stored.format == "JPEG" and stored.size == (341, 256)  # int(256 * 500 / 375) = 341
        with Image.open(root / "train" / "a" / "photo.jpg") as source:
            from PIL import JpegImagePlugin

            assert stored.quantization == source.quantization  # quality 90's tables, not quality 95's
            assert JpegImagePlugin.get_sampling(stored) == JpegImagePlugin.get_sampling(source) == 2  # 4:2:0
    assert len(data) < (root / "train" / "a" / "photo.jpg").stat().st_size  # 0.47 of the pixels, same quality


@pytest.mark.parametrize("mode", ["L", "CMYK"])
def test_a_grayscale_or_cmyk_jpeg_resized_is_stored_as_an_rgb_jpeg_at_quality_95(tmp_path, mode):
    """No luma/chroma pair of tables to keep (one table; four channels): the `jpg` encoding, quality 95 4:4:4."""
    root = tmp_path / "src"
    (root / "train" / "a").mkdir(parents=True)
    smooth = np.kron(np.random.default_rng(3).integers(0, 256, (6, 8, 3), dtype=np.uint8), np.ones((8, 8, 1), np.uint8))
    Image.fromarray(smooth).convert(mode).save(root / "train" / "a" / "x.jpg", quality=80)
    write_shards(_folder_cfg(root), tmp_path / "out", ["train"], progress=False, short_side=24)
    (member, data), = _members(tmp_path / "out", "train")
    expected = decode_rgb((root / "train" / "a" / "x.jpg").read_bytes(), "x.jpg").resize((32, 24),
                                                                                       Image.Resampling.BILINEAR)
    buffer = io.BytesIO()
    expected.save(buffer, format="JPEG", quality=95, subsampling=0)
    assert member.endswith(".jpg") and data == buffer.getvalue()


@pytest.mark.parametrize("image_format", ["source", "png"])
def test_a_phone_photo_turned_by_its_exif_orientation_is_stored_upright_and_read_upright_once(tmp_path, image_format):
    """EXIF orientation 6 (turn 90 degrees clockwise to show): training's decoder turns it; the resized copy holds
    the upright pixels and no orientation tag, so reading it back does not turn it a second time."""
    root = tmp_path / "src"
    (root / "train" / "a").mkdir(parents=True)
    exif = Image.Exif()
    exif[0x0112] = 6
    smooth = np.kron(np.random.default_rng(1).integers(0, 256, (6, 8, 3), dtype=np.uint8), np.ones((8, 8, 1), np.uint8))
    Image.fromarray(smooth).save(root / "train" / "a" / "phone.jpg", quality=95, exif=exif)  # 64x48 as stored
    write_shards(_folder_cfg(root), tmp_path / "out", ["train"], progress=False, short_side=24,
                 image_format=image_format)
    (member, data), = _members(tmp_path / "out", "train")
    upright = decode_rgb((root / "train" / "a" / "phone.jpg").read_bytes(), "phone.jpg")
    assert upright.size == (48, 64)  # turned by the decoder
    got = decode_rgb(data, member)
    assert got.size == (24, 32)  # the upright picture's shorter side to 24
    with Image.open(io.BytesIO(data)) as stored:
        assert stored.getexif().get(0x0112, 1) == 1
    expected = upright.resize((24, 32), Image.Resampling.BILINEAR)
    if member.endswith(".jpg"):
        expected = encoded_as(expected, (root / "train" / "a" / "phone.jpg").read_bytes())
    assert np.array_equal(np.asarray(got), np.asarray(expected))
