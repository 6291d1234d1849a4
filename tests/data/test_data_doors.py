"""The doors of data=webdataset, data=hf and vit-shards (issue 25 follow-up): index.json, each local shard
(in data.root or named by a brace pattern), parquet files and every file save_to_disk wrote are read only
when they are regular files; a FIFO, socket, device, folder or link loop there is named in one line, never
waited on (a FIFO opened for reading blocks until a writer comes: a run would hang before its first step).
Calls that could block run in a thread with a deadline, and every FIFO gets a writer at the end, so a
regression fails rather than hangs (the pattern of test_special_doors.py). Also: vit-shards probes a kept
image's format through data/decoding/image.py (one decode, the same checks), and decode_rgb's errors name the image."""

import io
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.shards import png, write_shards
from helpers.special_files import DEADLINE, KINDS, fifos, make_special, within  # noqa: F401 (fifos: a fixture)
from vit_train.data.decoding import image as decode
from vit_train.data.decoding.image import decode_rgb, decode_with_format
from vit_train.data.shards.index import Missing, load_index, read_samples
from vit_train.errors import DataError

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs and sockets are POSIX")

def replace_with(path: Path, kind: str) -> None:
    path.unlink()
    make_special(path, kind)


def refused(call, *args, match: str) -> str:
    with pytest.raises(DataError, match=match) as e:
        within(DEADLINE, call, *args)
    assert "\n" not in str(e.value)
    return str(e.value)


# ---- data=webdataset

@pytest.mark.parametrize("kind", KINDS)
def test_an_index_that_is_not_a_regular_file_is_named(tmp_path, fifos, kind):
    write_shards(tmp_path, [4], [2])
    replace_with(tmp_path / "index.json", kind)
    refused(load_index, str(tmp_path), match=rf"^{tmp_path}/index\.json is {kind}, not a regular file; data=webdataset "
                                             r"reads the shards' index there")


@pytest.mark.parametrize("kind", KINDS)
def test_a_local_shard_that_is_not_a_regular_file_is_named(tmp_path, fifos, kind):
    write_shards(tmp_path, [4, 4], [2])
    replace_with(tmp_path / "train-000001.tar", kind)
    refused(load_index, str(tmp_path), match=rf"^the train shard {tmp_path}/train-000001\.tar is {kind}, not a regular "
                                             r"file; replace it")
    elsewhere = tmp_path / "elsewhere"  # named by a brace pattern (plain paths and file: URLs)
    elsewhere.mkdir()
    for name in ("val-000000.tar", "train-000000.tar"):
        shutil.copy(tmp_path / name, elsewhere / name)
    make_special(elsewhere / "train-000001.tar", kind)
    for pattern in (f"{elsewhere}/train-{{000000..000001}}.tar", f"file:{elsewhere}/train-{{000000..000001}}.tar"):
        refused(load_index, str(tmp_path), pattern, match=rf"^the train shard {elsewhere}/train-000001\.tar is {kind}")


def test_a_shard_swapped_for_a_fifo_after_the_index_was_read_is_unreadable_not_waited_on(tmp_path, fifos):
    pytest.importorskip("webdataset.tariterators")  # the reader's first import is not part of the deadline
    write_shards(tmp_path, [3, 3], [2])
    index = load_index(str(tmp_path))
    replace_with(tmp_path / "train-000001.tar", "a FIFO")
    got = within(DEADLINE, lambda: list(read_samples(index.train.urls[1], "train-000001.tar", 0, 3)))
    assert [offset for offset, _ in got] == [0, 1, 2] and all(isinstance(raw, Missing) for _, raw in got)
    assert got[0][1].reason == (f"train-000001.tar cannot be read past sample 0 (NotRegularFile: {tmp_path}/"
                                f"train-000001.tar is a FIFO, not a regular file)")


def test_pipe_urls_are_not_taken_for_local_files(tmp_path):
    write_shards(tmp_path, [3], [2])
    index = load_index(str(tmp_path), f"pipe:cat {tmp_path}/train-{{000000..000000}}.tar")
    assert len(list(read_samples(index.train.urls[0], "train-000000.tar", 0, 3))) == 3


# ---- data=hf

datasets_missing = pytest.mark.skipif(__import__("importlib").util.find_spec("datasets") is None,
                                      reason="the datasets package")


def hf_split(n: int):
    import datasets

    cells = [{"bytes": png(i, "train"), "path": None} for i in range(n)]
    return datasets.Dataset.from_dict({"image": cells, "label": [i % 2 for i in range(n)]}, features=datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])}))


def load_hf(root: Path):
    from vit_train.data.sources.hf import load_hf_splits

    return load_hf_splits(root, "image", "label", "train", None)


@datasets_missing
@pytest.mark.parametrize("kind", KINDS)
def test_a_parquet_file_that_is_not_a_regular_file_is_named(tmp_path, fifos, kind):
    root = tmp_path / "ds"
    hf_split(4).to_parquet(str(root / "data" / "train-00000-of-00001.parquet"))
    hf_split(4).to_parquet(str(root / "data" / "validation-00000-of-00001.parquet"))
    make_special(root / "data" / "train-00001-of-00001.parquet", kind)
    refused(load_hf, root, match=rf"^{root}/data/train-00001-of-00001\.parquet is {kind}, not a parquet file \(a "
                                 r"regular file\); replace it")


@datasets_missing
@pytest.mark.parametrize("where", ["dataset_dict.json", "train/state.json", "train/dataset_info.json", "arrow",
                                   "split folders: validation/state.json"])
@pytest.mark.parametrize("kind", ["a FIFO", "a character device", "a folder"])
def test_a_save_to_disk_file_that_is_not_a_regular_file_is_named(tmp_path, fifos, where, kind):
    import datasets

    root = tmp_path / "ds"
    parts = datasets.DatasetDict(train=hf_split(4), validation=hf_split(2))
    if where.startswith("split folders"):  # a folder of per-split Dataset folders, no dataset_dict.json
        for name, part in parts.items():
            part.save_to_disk(str(root / name))
        where = where.split(": ")[1]
    else:
        parts.save_to_disk(str(root))
    target = next((root / "train").glob("*.arrow")) if where == "arrow" else root / where
    replace_with(target, kind)
    refused(load_hf, root, match=rf"^{target} is {kind}, not a save_to_disk (index|file|Arrow file) \(a regular file\)")


@datasets_missing
def test_an_image_path_cell_naming_a_fifo_is_an_unreadable_image(tmp_path, fifos):
    from vit_train.data.sources.hf import HFImages

    import torch

    os.mkfifo(tmp_path / "x.png")
    images = HFImages([{"image": "x.png"}], "image", torch.zeros(1, dtype=torch.int64), "ds train", tmp_path)
    assert within(DEADLINE, images.describe_unreadable, 0) == f"NotRegularFile: {tmp_path}/x.png is a FIFO, not a regular file"


# ---- vit-shards and data/decoding/image.py

def test_vit_shards_reads_a_folder_image_swapped_for_a_fifo_as_unreadable(tmp_path, fifos):
    from vit_train.tools.shards import _encode_one

    class Folder:  # an image folder's listing, as vit-shards reads it
        samples = [(str(tmp_path / "a.png"), 0)]

        def __len__(self):
            return 1

    os.mkfifo(tmp_path / "a.png")
    assert within(DEADLINE, _encode_one, Folder(), 0, "source") == (f"NotRegularFile: {tmp_path}/a.png is a FIFO, not a "
                                                          f"regular file")


def test_vit_shards_probes_a_kept_image_through_the_decoder_once(tmp_path, monkeypatch):
    from vit_train.tools.shards import encoded

    path = tmp_path / "a.jpg"
    Image.fromarray(np.full((8, 8, 3), 90, np.uint8)).save(path, format="JPEG")

    class Folder:
        samples = [(str(path), 0)]

    opened = []
    real = Image.open
    monkeypatch.setattr(Image, "open", lambda fp, *a, **k: opened.append(fp) or real(fp, *a, **k))
    ext, data, size = encoded(Folder(), 0, "source")
    assert (ext, data, size) == ("jpg", path.read_bytes(), (8, 8))
    assert len(opened) == 1  # data/decoding/image.py's one open: its pixel limit and checks, not a second bare Image.open


def test_vit_shards_refuses_an_image_over_the_strict_pixel_limit(tmp_path, monkeypatch):
    from vit_train.tools.shards import encoded

    path = tmp_path / "big.png"
    Image.fromarray(np.zeros((10, 10, 3), np.uint8)).save(path)

    class Folder:
        samples = [(str(path), 0)]

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 60)  # 100 pixels: under Pillow's 2x error, over the limit
    with pytest.raises(Image.DecompressionBombError, match="vit-train refuses images over this limit"):
        encoded(Folder(), 0, "source")


def test_decode_rgb_errors_name_the_image_not_a_bytesio_object():
    with pytest.raises(decode.IMAGE_ERRORS) as e:
        decode_rgb(b"not an image", "train-000003.tar:train_00000123.jpg")
    assert str(e.value) == "cannot identify image file 'train-000003.tar:train_00000123.jpg'"
    with pytest.raises(decode.IMAGE_ERRORS) as e:
        decode_with_format(b"\x89PNG\r\n\x1a\n" + bytes(20), "ds train[3]")
    assert "BytesIO" not in str(e.value) and "'ds train[3]'" in str(e.value)
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((4, 6, 3), np.uint8)).save(buffer, format="WEBP", lossless=True)
    image, fmt = decode_with_format(buffer.getvalue(), "x")
    assert (image.mode, image.size, fmt) == ("RGB", (6, 4), "WEBP")
