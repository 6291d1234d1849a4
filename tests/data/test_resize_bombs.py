"""Resize bombs (a user report): an image within the image-bomb pixel limit whose resize to the model's input would
not be (an extreme aspect ratio: 20000x3 with its shorter side resized to 256 is 1706666x256 pixels) ended vit-train
with a MemoryError. It is an image bomb like the others: refused before decoding (data/decoding/image.py, once preprocess.py's
transforms are built or unpickled in a loader worker) and handed to the unreadable-image policy through every door:
training on image folders, WebDataset shards and Hugging Face datasets (skip: replaced and said; error and val: one
line), vit-eval and vit-predict (one line, exit 2). The pixel limit is lowered to LIMIT so that the images stay tiny
(1x6000 pixels: 6,000 decoded, 18x108000 once resized for a 16-pixel model)."""

import io
import logging
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.transforms import v2

import vit_train.data.decoding.image as decode
from helpers.configs import TINY_MODEL, aug, tiny_config
from helpers.images import write_image_folder
from helpers.in_process import run_main
from helpers.shards import write_shards
from vit_train.cli.commands import eval_main, predict_main
from vit_train.data.datasets import TransformedDataset
from vit_train.data.decoding.image import decode_rgb, decode_with_format, open_rgb
from vit_train.data.preprocess import eval_transform, spec
from vit_train.data.sources.imagefolder_files import UnlabelledImages
from vit_train.data.transforms import build_transforms
from vit_train.errors import DataError
from vit_train.train.trainer import train

LIMIT = 100_000  # Image.MAX_IMAGE_PIXELS in these tests (89,478,485 by default)
STATS = ((0.5,) * 3, (0.25,) * 3)
CLASSES = ("c0", "c1")  # as helpers/shards.py names its classes: one checkpoint reads every door


def why(width: int = 1, height: int = 6000, side: int = 18) -> str:
    """data/decoding/image.py's words for a width x height image resized to a shorter side of `side` (a 16-pixel model: 18)."""
    new = (side, side * height // width) if width <= height else (side * width // height, side)
    return (f"ResizeBombError: {width}x{height} pixels, resized to the model's input (shorter side {side}), would be "
            f"{new[0]}x{new[1]} = {new[0] * new[1]} pixels, over the limit of {LIMIT} (an image bomb); crop it to a "
            f"less extreme aspect ratio, or remove it")


def png(size=(1, 6000), colour=(90, 20, 200)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(autouse=True)
def lowered_limit(monkeypatch):
    """LIMIT, and no resize check left over from an earlier test's transforms (data/decoding/image.py's is per process)."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", LIMIT)
    monkeypatch.setattr(decode, "_resize_side", None, raising=False)


@pytest.mark.parametrize("size", [(1, 6000), (6000, 1)], ids=["tall", "wide"])
def test_a_resize_over_the_limit_is_refused_when_decoded_and_normal_images_are_as_before(tmp_path, size):
    path = tmp_path / "bomb.png"
    path.write_bytes(png(size))
    assert np.asarray(open_rgb(path)).shape == (size[1], size[0], 3)  # within the limit, and nothing resizes it yet
    evaluate = eval_transform(spec(16, False, STATS))  # Resize(18), CenterCrop(16): 18x108000 > LIMIT
    for read in (lambda: open_rgb(path), lambda: decode_rgb(png(size), "shard.tar:bomb.png")):
        with pytest.raises(Image.DecompressionBombError) as refused:
            read()
        assert f"{type(refused.value).__name__}: {refused.value}" == why(*size)
    assert decode_with_format(png(size), "x")[0].size == size  # vit-shards stores images as they are: no resize
    # images whose resize fits give the pixels they gave before: the same transforms, the same tensors
    plain = v2.Compose([v2.Resize(18, antialias=True), v2.CenterCrop(16), v2.ToImage(), v2.RGB(),
                        v2.ToDtype(torch.float32, scale=True), v2.Normalize(*STATS)])
    rng = np.random.default_rng(0)
    for shape in [(20, 20, 3), (90, 3, 3), (3, 300, 3)]:  # 90x3 resizes to 540x18: within the limit
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).save(tmp_path / "ok.png")
        assert torch.equal(evaluate(open_rgb(tmp_path / "ok.png")), plain(open_rgb(tmp_path / "ok.png")))


def test_a_loader_worker_checks_the_resize_however_it_was_started(tmp_path, monkeypatch):
    """A spawned worker (macOS's default, forkserver alike) inherits nothing: unpickling either transform sets
    the check. At the default limit, as a real worker has it: 1x1400 resized to 256 (a 224-pixel model) is 91.8 M."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 89_478_485)
    Image.new("RGB", (1, 1400)).save(tmp_path / "bomb.png")
    Image.new("RGB", (30, 20)).save(tmp_path / "ok.png")
    for name in ("basic", "none"):
        for transform in build_transforms(aug(name), 224, STATS, None):
            decode._resize_side = None  # what a fresh process has
            pickle.loads(pickle.dumps(transform))
            with pytest.raises(Image.DecompressionBombError, match=r"^1x1400 pixels, .* = 91750400 pixels, over"):
                open_rgb(tmp_path / "bomb.png")
    train_tf, _ = build_transforms(aug("basic"), 224, STATS, None)  # RandomResizedCrop: refused all the same
    decode._resize_side = None
    images = UnlabelledImages([tmp_path / "bomb.png", tmp_path / "ok.png"])
    loader = DataLoader(TransformedDataset(images, train_tf), batch_size=2, num_workers=1,
                        multiprocessing_context="spawn")
    batch, _, unreadable = next(iter(loader))
    assert batch.shape == (2, 3, 224, 224) and unreadable.tolist() == [0, -1]  # the bomb replaced by ok.png


def write_data(door: str, root, bad: tuple[str, int] | None = None) -> str | None:
    """A data set of `door` at root: classes c0, c1; 8 train and 4 val images (20x20 files, 8x8 shard and dataset
    PNGs), image `bad` = (split, index) a 1x6000 PNG. Returns the name the unreadable-image policy gives that image."""
    if door == "imagefolder":
        write_image_folder(root, {"train": 4, "val": 2}, classes=CLASSES)
        if bad is None:
            return None
        split, i = bad
        path = root / split / CLASSES[i % 2] / f"{i // 2}.png"
        path.write_bytes(png())
        return str(path)
    if door == "webdataset":
        write_shards(root, [8], [4], classes=2,
                     members=lambda split, i, key: [(f"{key}.png", png()), (f"{key}.cls", str(i % 2).encode())]
                     if (split, i) == bad else None)
        return None if bad is None else f"{bad[0]}-000000.tar:{bad[0]}_{bad[1]:08d}.png"
    import datasets

    def rows(split: str, n: int):
        cells = [{"bytes": png() if (split, i) == bad else png((8, 8), (40 * i, 0, 0)), "path": None} for i in range(n)]
        features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=list(CLASSES))})
        return datasets.Dataset.from_dict({"image": cells, "label": [i % 2 for i in range(n)]}, features=features)

    datasets.DatasetDict(train=rows("train", 8), validation=rows("val", 4)).save_to_disk(str(root))
    return None if bad is None else f"{root} {'validation' if bad[0] == 'val' else 'train'}[{bad[1]}]"


DOORS = ["imagefolder", "webdataset", "hf"]


def door_config(door: str, root, **data):
    if door == "hf":
        pytest.importorskip("datasets")
    if door == "webdataset":
        pytest.importorskip("webdataset")
    return tiny_config(data={"name": door, "root": str(root), "batch_size": 4, "num_workers": 0,
                             "max_bad_fraction": 0.5, **data},
                       trainer={"epochs": 1, "log_every": 1}, aug={"name": "none"})  # aug=none: train images resized


@pytest.mark.parametrize("door", DOORS)
def test_training_replaces_a_resize_bomb_under_skip_and_says_it(tmp_path, caplog, door):
    cfg = door_config(door, tmp_path / "data", bad_images="skip")
    name = write_data(door, tmp_path / "data", ("train", 3))
    caplog.set_level(logging.WARNING, "vit_train")
    assert train(cfg, tmp_path / "run")["status"] == "completed"
    said = [r.getMessage() for r in caplog.records if "replaced" in r.getMessage()]
    what = "sample" if door == "webdataset" else "image"
    assert said == [f"unreadable train {what} replaced: {name} ({why()})",
                    f"epoch 1: 1 unreadable train {what} replaced (1 distinct so far)"]


@pytest.mark.parametrize("split", ["train", "val"])
@pytest.mark.parametrize("door", DOORS)
def test_training_stops_at_a_resize_bomb_in_one_line_under_error_and_in_val(tmp_path, door, split):
    cfg = door_config(door, tmp_path / "data", bad_images="error" if split == "train" else "skip")
    name = write_data(door, tmp_path / "data", (split, 1))
    with pytest.raises(DataError) as stopped:
        train(cfg, tmp_path / "run")
    message = str(stopped.value)  # a shard's sample: "train sample NAME (WHY) cannot be read"
    assert "\n" not in message and name in message and f"{why()}" in message and "cannot be read" in message, message
    assert message.startswith("val " if split == "val" else name if door != "webdataset" else "train sample ")


LOWERED = (f"import runpy, sys; from PIL import Image; Image.MAX_IMAGE_PIXELS = {LIMIT}; sys.argv[0] = 'vit-train'; "
           f"runpy.run_module('vit_train', run_name='__main__')")


@pytest.mark.parametrize("bad_images", ["skip", "error"])
def test_vit_train_says_a_resize_bomb_as_its_policy_says_never_a_traceback(tmp_path, bad_images):
    """The command line, with a loader worker (forked: it inherits the lowered limit of LOWERED)."""
    name = write_data("imagefolder", tmp_path / "data", ("train", 3))
    done = subprocess.run([sys.executable, "-c", LOWERED, *TINY_MODEL, "data=imagefolder",
                           f"data.root={tmp_path / 'data'}", "data.batch_size=4", "data.num_workers=1",
                           "data.max_bad_fraction=0.5", "aug=none", f"data.bad_images={bad_images}", "trainer.epochs=1",
                           f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert "Traceback" not in done.stderr + done.stdout and "MemoryError" not in done.stderr, done.stderr[-3000:]
    if bad_images == "skip":
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"unreadable train image replaced: {name} ({why()})" in done.stdout
    else:
        assert done.returncode == 2 and done.stderr.splitlines() == [
            f"vit-train: error: {name} cannot be read ({why()}); fix or remove it, or set data.bad_images=skip to "
            f"replace unreadable images"], done.stderr


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A 2-step micro ViT (16x16) trained on a clean image folder of classes c0, c1."""
    root = tmp_path_factory.mktemp("resize_bombs")
    write_data("imagefolder", root / "data")
    train(door_config("imagefolder", root / "data"), root / "run")
    return root / "run"


@pytest.mark.parametrize("door", DOORS)
def test_vit_eval_stops_at_a_resize_bomb_in_one_line(run_dir, tmp_path, monkeypatch, capsys, door):
    door_config(door, tmp_path)  # skips a door whose extra is missing
    name = write_data(door, tmp_path / "data", ("val", 2))
    status, out, err = run_main(eval_main, monkeypatch, capsys, f"ckpt={run_dir}", f"data={door}",
                                f"data.root={tmp_path / 'data'}", "data.batch_size=4", f"out={tmp_path / 'eval'}",
                                "attention.images=0")
    assert status == 2 and err.count("\n") == 1 and out == "", err
    assert err.startswith(f"vit-eval: error: val {'sample' if door == 'webdataset' else 'image'} {name} ") and (
        why() in err and "cannot be read" in err), err


def test_vit_predict_stops_at_a_resize_bomb_in_one_line(run_dir, tmp_path, monkeypatch, capsys):
    photos = tmp_path / "photos"
    photos.mkdir()
    Image.new("RGB", (40, 30)).save(photos / "a.png")
    (photos / "b.png").write_bytes(png())
    status, out, err = run_main(predict_main, monkeypatch, capsys, f"ckpt={run_dir}", f"images=[{photos / 'a.png'}]")
    assert status == 0 and out.startswith(f"{photos / 'a.png'}: "), err  # an ordinary image: predicted
    for given in (photos / "b.png", photos):
        status, out, err = run_main(predict_main, monkeypatch, capsys, f"ckpt={run_dir}", f"images=[{given}]")
        assert status == 2 and out == "" and err.splitlines() == [
            f"vit-predict: error: {photos / 'b.png'} cannot be read as an image ({why()})"], err
