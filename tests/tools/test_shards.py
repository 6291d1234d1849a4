"""vit-shards: the shards and index.json it writes read back as the same pixels and labels as the
source (an ugly image folder, CIFAR, shapes); shard sizes; refusals in one line; a writer killed or
out of space mid-way leaves no index.json, so a half set is never read as whole."""

import errno
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.images import write_cifar10, write_image_folder
from helpers.in_process import run_main
from helpers.ugly_folder import write_ugly_folder
from vit_train.cli.commands import shards_main
from vit_train.config import Config
from vit_train.data.decoding.image import decode_rgb, open_rgb
from vit_train.data.sources.shapes import generate_shapes
from vit_train.tools import shards
from vit_train.tools.shards import write_shards


def read_split(out: Path, split: str) -> list[tuple[str, str, bytes, int]]:
    """(key, extension, image bytes, label) of every sample of `split`, in the index's shard order;
    checks the contract's member order (image, then .cls) and the index's per-shard counts and sizes."""
    index = json.loads((out / "index.json").read_text())
    samples = []
    for shard in index["splits"][split]["shards"]:
        path = out / shard["name"]
        assert path.stat().st_size == shard["bytes"]
        with tarfile.open(path) as tar:
            members = tar.getmembers()
            assert len(members) == 2 * shard["samples"]
            for image, label in zip(members[::2], members[1::2]):
                key, ext = image.name.split(".")
                assert label.name == f"{key}.cls" and ext in ("jpg", "png", "webp")
                samples.append((key, ext, tar.extractfile(image).read(), int(tar.extractfile(label).read())))
    assert len(samples) == index["splits"][split]["samples"]
    return samples


def cfg(**data) -> Config:
    return Config.from_dict({"data": data, "model": {"img_size": 16}})


def pixels(data: bytes) -> np.ndarray:
    return np.asarray(decode_rgb(data, "test"))


@pytest.mark.parametrize("image_format", ["source", "png", "webp"])
def test_an_ugly_image_folder_round_trips_to_the_same_pixels_and_labels(tmp_path, image_format):
    ugly = write_ugly_folder(tmp_path / "src")
    from vit_train.data.sources.imagefolder_files import load_image_folders

    train, val, classes = load_image_folders(ugly.root)
    index = write_shards(cfg(name="imagefolder", root=str(ugly.root)), tmp_path / "out", ["train", "val"],
                         shard_size=7, image_format=image_format, progress=False)
    assert index["classes"] == classes == ugly.classes
    for split, base in (("train", train), ("val", val)):
        got = read_split(tmp_path / "out", split)
        assert [key for key, *_ in got] == [f"{split}_{i:08d}" for i in range(len(base))]
        for (key, ext, data, label), (path, target) in zip(got, base.samples):
            assert label == target
            assert np.array_equal(pixels(data), ugly.expected[Path(path)]), path
            assert np.array_equal(pixels(data), np.asarray(open_rgb(path)))
            if image_format != "source":
                assert ext == image_format  # png and webp (lossless): the same pixels
            elif Path(path).suffix.lower() in (".jpg", ".jpeg", ".png", ".webp"):
                assert data == Path(path).read_bytes()  # kept as it is


def test_image_size_is_recorded_when_every_image_has_one_size(tmp_path):
    root = write_image_folder(tmp_path / "src", {"train": 3, "val": 1}, size=(12, 8))
    index = write_shards(cfg(name="imagefolder", root=str(root)), tmp_path / "out", ["train", "val"], progress=False)
    assert index["image_size"] == [8, 12]  # [H, W]
    assert json.loads((tmp_path / "out" / "index.json").read_text()) == index


def test_cifar_round_trips_to_the_same_pixels_and_labels_as_png(tmp_path):
    written = write_cifar10(tmp_path / "cifar", per_batch=3)
    write_shards(cfg(name="cifar10", root=str(tmp_path / "cifar"), download=False), tmp_path / "out",
                 ["train", "val"], shard_size=4, progress=False)
    for split, batches in (("train", [f"data_batch_{i}" for i in range(1, 6)]), ("val", ["test_batch"])):
        images = np.concatenate([written[b][0] for b in batches]).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        labels = sum((written[b][1] for b in batches), [])
        got = read_split(tmp_path / "out", split)
        assert [ext for _, ext, _, _ in got] == ["png"] * len(labels)
        assert [label for *_, label in got] == labels
        assert all(np.array_equal(pixels(data), image) for (_, _, data, _), image in zip(got, images))


def test_shapes_round_trip_and_shard_sizes_by_count(tmp_path):
    index = write_shards(cfg(name="shapes", train_size=23, val_size=5), tmp_path / "out", ["train", "val"],
                         shard_size=5, progress=False)
    train = index["splits"]["train"]["shards"]
    assert [s["name"] for s in train] == [f"train-{i:06d}.tar" for i in range(5)]
    assert [s["samples"] for s in train] == [5, 5, 5, 5, 3]
    assert [s["samples"] for s in index["splits"]["val"]["shards"]] == [5]
    assert index["image_size"] == [16, 16] and len(index["classes"]) == 10
    images, labels = generate_shapes(23, 16, seed=0)
    got = read_split(tmp_path / "out", "train")
    assert [label for *_, label in got] == labels.tolist()
    assert all(np.array_equal(pixels(d), img.permute(1, 2, 0).numpy()) for (_, _, d, _), img in zip(got, images))


def test_maxsize_starts_a_new_shard_before_a_sample_that_would_pass_it(tmp_path):
    root = write_image_folder(tmp_path / "src", {"train": 6, "val": 1}, pixels=lambda c, i: np.random.default_rng(i)
                              .integers(0, 256, (20 + i, 20, 3), dtype=np.uint8))
    files = [root / "train" / c / f"{i}.png" for c in ("a", "b") for i in range(6)]
    in_tar = [512 + -(-f.stat().st_size // 512) * 512 + 1024 for f in files]  # header + padded data, .cls
    maxsize = in_tar[0] + in_tar[1] + in_tar[2] - 1  # never 3 in a shard, mostly 2
    index = write_shards(cfg(name="imagefolder", root=str(root)), tmp_path / "out", ["train"], maxsize=maxsize,
                         progress=False)
    expected, size = [], maxsize + 1
    for s in in_tar:
        if size + s > maxsize:
            expected.append(0)
            size = 0
        expected[-1], size = expected[-1] + 1, size + s
    assert [s["samples"] for s in index["splits"]["train"]["shards"]] == expected and 2 in expected
    assert index["image_size"] is None  # heights 20..25
    tiny = write_shards(cfg(name="imagefolder", root=str(root)), tmp_path / "out1", ["train"], maxsize=1,
                        progress=False)  # each shard holds at least one sample
    assert [s["samples"] for s in tiny["splits"]["train"]["shards"]] == [1] * 12


def test_the_same_source_gives_the_same_shard_bytes(tmp_path):
    for out in ("a", "b"):
        write_shards(cfg(name="shapes", train_size=6, val_size=2), tmp_path / out, ["train", "val"], progress=False)
    assert all((tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes()
               for n in ("index.json", "train-000000.tar", "val-000000.tar"))


def vit_shards(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    return run_main(shards_main, monkeypatch, capsys, *args, prog="vit-shards")


def test_the_command_writes_and_refuses_an_out_that_holds_shards_unless_overwrite(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    args = ["data=shapes", "data.train_size=6", "data.val_size=2", "model.img_size=16", f"out={out}", "progress=false"]
    code, text, _ = vit_shards(monkeypatch, capsys, *args, "splits=train,val", "shard_size=4")
    assert code == 0 and "6 train samples in 2 shards and 2 val samples in 1 shard (" in text
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code, _, err = vit_shards(monkeypatch, capsys, *args)
    assert code == 2 and err.count("\n") == 1 and "overwrite=true" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing lost
    code, _, _ = vit_shards(monkeypatch, capsys, *args, "overwrite=true", "splits=train")
    assert code == 0 and sorted(p.name for p in out.iterdir()) == ["index.json", "train-000000.tar"]
    code, text, _ = vit_shards(monkeypatch, capsys, *args, "overwrite=true", "short_side=12")
    assert code == 0 and "(10 classes, shorter sides at most 12 px) to" in text, text
    index = json.loads((out / "index.json").read_text())
    assert [index["splits"][s]["short_side"] for s in ("train", "val")] == [12, 12] and index["image_size"] == [12, 12]


@pytest.mark.parametrize("args, words", [
    (["image_format=gif"], "image_format must be one of source, png, jpg, webp"),
    (["splits=[train,test]"], "splits must be train, val or train,val"),
    (["shard_size=0"], "shard_size and maxsize must be >= 1"),
    (["shard_size=abc"], "shard_size (samples) and maxsize (bytes) are numbers"),
    (["data=imagefolder"], "data=imagefolder needs data.root"),
    (["colour=red"], "unknown option 'colour'"),
    (["data=webdataset", "data.root=/nowhere"], "data=webdataset is shards already"),
    (["data=hf", "data.root=/nowhere"], "data.root /nowhere does not exist"),
    (["workers=many"], "workers is a number of processes"),
    (["short_side=0"], "short_side must be a number of pixels >= 1"),
    (["short_side=-5"], "short_side must be a number of pixels >= 1"),
    (["short_side=1.5"], "short_side must be a number of pixels >= 1"),
    (["short_side=true"], "short_side must be a number of pixels >= 1"),
    (["short_side=big"], "short_side must be a number of pixels >= 1"),
])
def test_bad_arguments_end_in_one_line(tmp_path, monkeypatch, capsys, args, words):
    code, _, err = vit_shards(monkeypatch, capsys, "data=shapes", f"out={tmp_path / 'out'}", *args)
    assert code == 2 and err.count("\n") == 1 and words in err, err
    assert not (tmp_path / "out").exists()  # refused before anything is made


def test_an_out_that_cannot_be_made_ends_in_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("x")
    code, _, err = vit_shards(monkeypatch, capsys, "data=shapes", f"out={tmp_path / 'file' / 'out'}")
    assert code == 2 and err.count("\n") == 1 and "cannot write into out=" in err, err
    code, _, err = vit_shards(monkeypatch, capsys, "data=shapes", f"out={tmp_path / 'file'}")
    assert code == 2 and "is a file" in err


def test_a_full_disk_mid_way_leaves_no_index_and_no_partial_shard(tmp_path, monkeypatch, capsys):
    real, calls = tarfile.TarFile.addfile, {"n": 0}

    def addfile(self, info, fileobj=None):
        calls["n"] += 1
        if calls["n"] == 13:  # the 7th sample's image: the 2nd shard of 4 is being written
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, info, fileobj)

    monkeypatch.setattr(tarfile.TarFile, "addfile", addfile)
    out = tmp_path / "out"
    code, _, err = vit_shards(monkeypatch, capsys, "data=shapes", "data.train_size=10", "model.img_size=16",
                              f"out={out}", "shard_size=4", "progress=false")
    assert code == 2 and err.count("\n") == 1 and "No space left on device" in err, err
    assert err.endswith("(the shards written are removed)\n"), err
    assert not out.exists()  # made by this run, and nothing of it left: a re-run starts as the first did


KILLED = """
import os, signal, sys
from vit_train.config import Config
from vit_train.tools import shards
real, n = shards.SplitWriter.add, [0]
def add(self, *args):
    n[0] += 1
    if n[0] == 7:
        os.kill(os.getpid(), signal.SIGKILL)
    real(self, *args)
shards.SplitWriter.add = add
shards.write_shards(Config.from_dict({"data": {"train_size": 10}, "model": {"img_size": 16}}), sys.argv[1],
                    ["train", "val"], shard_size=3, progress=False)
"""


@pytest.mark.slow  # ~15 s: a fresh interpreter imports torch
def test_a_writer_killed_mid_way_leaves_no_index_and_a_rerun_is_refused_until_overwrite(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", KILLED, str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert not (out / "index.json").exists() and (out / "train-000001.tar").exists()
    with pytest.raises(Exception, match="already holds shards"):
        write_shards(cfg(name="shapes", train_size=10), out, ["train", "val"], shard_size=3, progress=False)
    index = write_shards(cfg(name="shapes", train_size=10), out, ["train", "val"], shard_size=3, overwrite=True,
                         progress=False)
    assert index["splits"]["train"]["samples"] == 10 and (out / "index.json").exists()


def test_unreadable_images_are_left_out_under_skip_and_stop_the_writer_under_error(tmp_path, caplog):
    root = write_image_folder(tmp_path / "src", {"train": 3, "val": 1})
    (root / "train" / "a" / "1.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(20))  # truncated
    with pytest.raises(shards.DataError, match=r"1\.png cannot be read \(UnidentifiedImageError: cannot identify image "
                                               r"file '[^']*/train/a/1\.png'\); .*data\.bad_images=skip"):
        write_shards(cfg(name="imagefolder", root=str(root), bad_images="error"), tmp_path / "e", ["train"],
                     progress=False)
    assert not (tmp_path / "e" / "index.json").exists()
    index = write_shards(cfg(name="imagefolder", root=str(root), bad_images="skip"), tmp_path / "s", ["train"],
                         progress=False)
    keys = [key for key, *_ in read_split(tmp_path / "s", "train")]
    assert keys == ["train_00000000", "train_00000002", "train_00000003", "train_00000004", "train_00000005"]
    assert index["splits"]["train"]["samples"] == 5
    assert [r.message for r in caplog.records if "left out" in r.message] == \
        [f"1 unreadable train image(s) left out (data.bad_images=skip): {root / 'train' / 'a' / '1.png'}"]


def test_a_png_named_jpeg_and_names_with_dots_give_clean_keys_that_webdataset_reads_as_samples(tmp_path):
    """ImageNet's n02105855_2933.JPEG is a PNG (soumith/imagenet-multiGPU.torch#43): its member says png.
    Dots in a key split samples wrongly (webdataset#237, datasets#7150): keys never hold the file's name."""
    import webdataset as wds

    root = tmp_path / "src"
    for split in ("train", "val"):
        (root / split / "dog").mkdir(parents=True)
        Image.fromarray(np.full((6, 6, 3), 40, np.uint8)).save(root / split / "dog" / "n02105855_2933.JPEG", "PNG")
        Image.fromarray(np.full((6, 6, 3), 90, np.uint8)).save(root / split / "dog" / "22.05.v2.jpg", quality=90)
    write_shards(cfg(name="imagefolder", root=str(root)), tmp_path / "out", ["train", "val"], progress=False)
    got = read_split(tmp_path / "out", "train")
    assert [(key, ext) for key, ext, _, _ in got] == [("train_00000000", "jpg"), ("train_00000001", "png")]
    samples = list(wds.WebDataset(str(tmp_path / "out" / "train-000000.tar"), shardshuffle=False))
    assert [sorted(k for k in s if not k.startswith("__")) for s in samples] == [["cls", "jpg"], ["cls", "png"]]
    assert [s["__key__"] for s in samples] == ["train_00000000", "train_00000001"]
    assert samples[1]["png"] == (root / "train" / "dog" / "n02105855_2933.JPEG").read_bytes()


def test_a_hugging_face_dataset_round_trips_with_its_bytes_kept(tmp_path):
    datasets = pytest.importorskip("datasets")
    cells = []
    for i in range(5):
        buffer = io.BytesIO()
        Image.fromarray(np.random.default_rng(i).integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(buffer, "PNG")
        cells.append({"bytes": buffer.getvalue(), "path": None})
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["x", "y"])})
    part = datasets.Dataset.from_dict({"image": cells, "label": [0, 1, 1, 0, 1]}, features=features)
    datasets.DatasetDict(train=part, validation=part).save_to_disk(str(tmp_path / "ds"))
    index = write_shards(cfg(name="hf", root=str(tmp_path / "ds")), tmp_path / "out", ["train", "val"], progress=False)
    assert index["classes"] == ["x", "y"] and index["image_size"] == [8, 8]
    got = read_split(tmp_path / "out", "val")
    assert [(ext, data, label) for _, ext, data, label in got] == \
        [("png", c["bytes"], label) for c, label in zip(cells, [0, 1, 1, 0, 1])]


def test_data_webdataset_reads_what_vit_shards_wrote_as_the_folder_reads_it(tmp_path):
    """End to end: the val batches of data=webdataset on the shards equal data=imagefolder's on the source
    (same pixels, labels and order through the same eval transforms), and a run trains on the shards."""
    import torch

    from helpers.configs import tiny_config
    from helpers.images import write_noisy_colours
    from helpers.configs import build_data
    from vit_train.train.trainer import train

    root = write_noisy_colours(tmp_path / "src")
    write_shards(cfg(name="imagefolder", root=str(root)), tmp_path / "out", ["train", "val"], shard_size=10,
                 progress=False)
    data = {name: tiny_config(data={"name": name, "root": str(where), "batch_size": 8, "num_workers": 0})
            for name, where in (("imagefolder", root), ("webdataset", tmp_path / "out"))}
    batches = {name: list(build_data(c, torch.device("cpu")).val_loader) for name, c in data.items()}
    assert [len(b[1]) for b in batches["webdataset"]] == [len(b[1]) for b in batches["imagefolder"]]
    for (x, y), (x_ref, y_ref) in zip(batches["webdataset"], batches["imagefolder"]):
        assert torch.equal(x, x_ref) and torch.equal(y, y_ref)
    results = train(tiny_config(data={"name": "webdataset", "root": str(tmp_path / "out"), "batch_size": 8,
                                      "num_workers": 0}, trainer={"max_steps": 3}), tmp_path / "run")
    assert results["steps"] == 3


def test_worker_processes_write_the_same_shards_and_skip_the_same_images(tmp_path, caplog):
    root = write_image_folder(tmp_path / "src", {"train": 9, "val": 2}, pixels=lambda c, i: (i * 20, 9, 99))
    (root / "train" / "b" / "4.png").write_bytes(b"GIF89a")  # truncated
    for workers in (0, 2):
        write_shards(cfg(name="imagefolder", root=str(root)), tmp_path / f"w{workers}", ["train", "val"], shard_size=4,
                     progress=False, workers=workers)
    assert sorted(p.name for p in (tmp_path / "w2").iterdir()) == sorted(p.name for p in (tmp_path / "w0").iterdir())
    assert all(p.read_bytes() == (tmp_path / "w2" / p.name).read_bytes() for p in (tmp_path / "w0").iterdir())
    assert [len(r.message.split(", ")) for r in caplog.records if "left out" in r.message] == [1, 1]
    with pytest.raises(shards.DataError, match="4.png cannot be read"):
        write_shards(cfg(name="imagefolder", root=str(root), bad_images="error"), tmp_path / "e", ["train"],
                     progress=False, workers=2)


@pytest.mark.parametrize("image_format", ["source", "jpg"])
def test_a_cmyk_jpeg_is_kept_as_it_is_or_re_encoded_from_its_rgb_pixels(tmp_path, image_format):
    """ImageNet holds ~20 CMYK JPEGs (tensorflow/datasets#590, pytorch/vision#6538): kept, the member decodes as
    the file does; re-encoded (jpg), it becomes an RGB JPEG of the pixels training reads."""
    root = tmp_path / "src"
    rgb = np.kron(np.random.default_rng(0).integers(0, 256, (4, 4, 3), dtype=np.uint8), np.ones((8, 8, 1), np.uint8))
    for split in ("train", "val"):
        (root / split / "cat").mkdir(parents=True)
        Image.fromarray(rgb).convert("CMYK").save(root / split / "cat" / "cmyk.jpg", quality=95)
    write_shards(cfg(name="imagefolder", root=str(root)), tmp_path / "out", ["train"], image_format=image_format,
                 progress=False)
    (_, ext, data, _), = read_split(tmp_path / "out", "train")
    source = np.asarray(open_rgb(root / "train" / "cat" / "cmyk.jpg")).astype(int)
    assert ext == "jpg" and Image.open(io.BytesIO(data)).mode == ("CMYK" if image_format == "source" else "RGB")
    if image_format == "source":
        assert np.array_equal(pixels(data), source)
    else:  # Pillow's JPEG of the RGB pixels training reads (quality 95, no chroma subsampling)
        buffer = io.BytesIO()
        Image.fromarray(source.astype(np.uint8)).save(buffer, "JPEG", quality=95, subsampling=0)
        assert data == buffer.getvalue() and np.abs(pixels(data).astype(int) - source).mean() < 2


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("data, inside", [("imagefolder", "train/zz"), ("imagefolder", "val"), ("hf", "shards")])
def test_an_out_inside_the_folders_the_source_is_read_from_is_refused_before_anything_is_made(
        tmp_path, monkeypatch, capsys, data, inside):
    """out=data.root/train/zz would add a class folder zz to the source (tester #13)."""
    root = write_image_folder(tmp_path / "src", {"train": 2, "val": 1})
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    code, _, err = vit_shards(monkeypatch, capsys, f"data={data}", f"data.root={root}", f"out={root / inside}")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"out={root / inside} is inside {root / inside.split('/')[0] if data == 'imagefolder' else root}, " \
           f"which data={data} reads" in err and "choose an out= outside it" in err, err
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before


def test_a_fifo_as_out_is_named_a_fifo(tmp_path, monkeypatch, capsys):
    os.mkfifo(tmp_path / "fifo")
    code, _, err = vit_shards(monkeypatch, capsys, "data=shapes", f"out={tmp_path / 'fifo'}")
    assert code == 2 and err.count("\n") == 1 and f"out={tmp_path / 'fifo'} is a FIFO; give a folder" in err, err


def test_a_split_the_index_lacks_is_added_beside_the_others_and_the_index_rewritten(tmp_path, monkeypatch, capsys):
    """splits=train, then splits=val into the same out= (a newcomer's order): the train shards stay as they
    were, the index lists both as one run writing both would; a split it holds is refused, nothing lost."""
    args = ["data=shapes", "data.train_size=6", "data.val_size=3", "model.img_size=16", "progress=false",
            "shard_size=4"]
    code, _, _ = vit_shards(monkeypatch, capsys, *args, f"out={tmp_path / 'both'}")
    assert code == 0
    out = tmp_path / "out"
    code, _, _ = vit_shards(monkeypatch, capsys, *args, f"out={out}", "splits=train")
    train_only = files(out)
    code, text, _ = vit_shards(monkeypatch, capsys, *args, f"out={out}", "splits=val")
    assert code == 0 and "wrote 3 val samples in 1 shard (10 classes) to " in text and "beside its train split" in text
    assert files(out) == files(tmp_path / "both")  # shards and index byte for byte
    assert all(files(out)[name] == data for name, data in train_only.items() if name != "index.json")
    before = files(out)
    code, _, err = vit_shards(monkeypatch, capsys, *args, f"out={out}", "splits=val")
    assert code == 2 and err.count("\n") == 1 and f"out={out} already holds split 'val' (its index.json lists " \
                                                  "train, val)" in err and "overwrite=true" in err, err
    assert files(out) == before


def test_a_split_added_from_a_data_set_of_other_classes_is_refused(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    root = write_image_folder(tmp_path / "src", {"train": 2, "val": 1}, classes=("a", "b", "c"))
    code, _, _ = vit_shards(monkeypatch, capsys, "data=shapes", "data.train_size=4", f"out={out}", "splits=train",
                            "progress=false")
    before = files(out)
    code, _, err = vit_shards(monkeypatch, capsys, "data=imagefolder", f"data.root={root}", f"out={out}",
                              "splits=val", "progress=false")
    assert code == 2 and err.count("\n") == 1 and f"out={out} holds shards of other classes (" in err, err
    assert "vs a, b, c); add splits only from the data set the others came from" in err
    assert files(out) == before


@pytest.mark.parametrize("failing", [1, 9, 13])
def test_overwrite_on_a_full_disk_keeps_the_earlier_set_whole(tmp_path, monkeypatch, capsys, failing):
    """overwrite=true used to remove index.json and the old shards before the new ones fit: ENOSPC at the
    n-th tar member (the first, one in the 2nd shard, one in val) leaves the earlier set byte for byte."""
    out = tmp_path / "out"
    args = ["data=shapes", "data.train_size=6", "data.val_size=2", "model.img_size=16", f"out={out}", "progress=false"]
    code, _, _ = vit_shards(monkeypatch, capsys, *args, "shard_size=4")
    before = files(out)
    real, calls = tarfile.TarFile.addfile, {"n": 0}

    def addfile(self, info, fileobj=None):
        calls["n"] += 1
        if calls["n"] == failing:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, info, fileobj)

    monkeypatch.setattr(tarfile.TarFile, "addfile", addfile)
    code, _, err = vit_shards(monkeypatch, capsys, *args, "shard_size=2", "overwrite=true")
    assert code == 2 and err.count("\n") == 1 and "No space left on device" in err, err
    assert f"the earlier set in {out} is kept as it was" in err
    assert files(out) == before  # no staging folder left either
    monkeypatch.setattr(tarfile.TarFile, "addfile", real)
    code, _, _ = vit_shards(monkeypatch, capsys, *args, "shard_size=2", "overwrite=true")
    index = json.loads((out / "index.json").read_text())
    assert code == 0 and sorted(files(out)) == ["index.json", *(s["name"] for sp in ("train", "val")
                                                                for s in index["splits"][sp]["shards"])]
    assert [s["samples"] for s in index["splits"]["train"]["shards"]] == [2, 2, 2]


@pytest.mark.parametrize("where", ["fresh", "made", "added"])
def test_a_val_image_that_cannot_be_read_leaves_no_train_shard_and_the_rerun_after_the_fix_needs_no_overwrite(
        tmp_path, where):
    """splits=train,val: train is written whole, then a val image cannot be read (val images are never skipped).
    Whatever this run wrote goes with it (a fresh out=, an empty out= the user made, or one whose index lists
    other splits: what it held stays as it was), so the same command after the fix runs without overwrite=true."""
    root = write_image_folder(tmp_path / "src", {"train": 3, "val": 2})
    (root / "val" / "b" / "1.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(20))  # truncated
    out = tmp_path / "out"
    splits = ["train", "val"]
    before: dict[str, bytes] = {}
    if where == "made":
        out.mkdir()
    elif where == "added":  # a set holding only... nothing of these splits: its index lists none of them
        (tmp_path / "other").mkdir()
        write_image_folder(tmp_path / "other" / "src", {"train": 1, "val": 1})
        write_shards(cfg(name="imagefolder", root=str(tmp_path / "other" / "src")), out, ["train"], progress=False)
        splits = ["val"]
        before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(shards.DataError, match=r"1\.png cannot be read"):
        write_shards(cfg(name="imagefolder", root=str(root)), out, splits, shard_size=2, progress=False)
    if where == "fresh":
        assert not out.exists()
    else:
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    Image.new("RGB", (20, 20)).save(root / "val" / "b" / "1.png")  # the fix
    if where == "added":  # val of another source is refused for its classes only if they differ: same (a, b) here
        index = write_shards(cfg(name="imagefolder", root=str(root)), out, splits, shard_size=2, progress=False)
        assert sorted(index["splits"]) == ["train", "val"] and index["splits"]["val"]["samples"] == 4
    else:
        index = write_shards(cfg(name="imagefolder", root=str(root)), out, splits, shard_size=2, progress=False)
        assert index["splits"]["train"]["samples"] == 6 and index["splits"]["val"]["samples"] == 4


def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """A photo-like RGB image: smooth gradients with some grain (what lossy encoders are for)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], -1)
    return Image.fromarray(np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8))


class _Files:
    def __init__(self, path: Path):
        self.samples = [(str(path), 0)]


@pytest.mark.parametrize("kind, options", [
    ("webp", {"quality": 50}), ("webp", {"quality": 80}), ("webp", {"quality": 95}), ("webp", {"lossless": True}),
    ("webp", {"quality": 80, "exif": Image.Exif().tobytes()}),  # an extended file (VP8X first), lossy
    ("webp", {"lossless": True, "exif": Image.Exif().tobytes()}),
    ("jpg", {"quality": 75}), ("png", {})],
    ids=["webp-q50", "webp-q80", "webp-q95", "webp-lossless", "webp-extended-q80", "webp-extended-lossless", "jpg-q75",
         "png"])
def test_a_pre_resized_image_is_stored_in_its_own_kind_and_costs_no_more_per_pixel_than_its_source(tmp_path, kind,
                                                                                                   options):
    path = tmp_path / f"x.{kind}"
    photo(300, 200).save(path, **options)
    source = path.read_bytes()
    assert (source[12:16] == b"VP8X") == ("exif" in options)
    ext, data, (h, w) = shards.encoded(_Files(path), 0, "source", short_side=100)
    assert (ext, h, w) == (kind, 100, 150)
    resized = shards.pre_resize(open_rgb(path), 100)
    if kind == "png" or options.get("lossless"):  # lossless in, lossless out: the resized pixels themselves
        assert np.array_equal(pixels(data), np.asarray(resized))
        assert not shards.webp_is_lossy(data) if kind == "webp" else True
    else:
        assert len(data) / (h * w) <= len(source) / (300 * 200), (len(data), len(source))
        assert shards.webp_is_lossy(data) if kind == "webp" else True
        assert np.abs(pixels(data).astype(int) - np.asarray(resized)).mean() < 8  # lossy: close, not equal
