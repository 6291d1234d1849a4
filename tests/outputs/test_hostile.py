"""Hostile or broken files: each is refused with one line (exit 2 from a command), never a traceback,
never code run, never silently used."""

import json
import os
import struct
import zlib
from pathlib import Path

import pytest
import torch
from PIL import Image

from helpers.configs import tiny_config
from helpers.images import write_image_folder
from helpers.runs import command
from vit_train.checkpoint import load_checkpoint
from vit_train.checkpoint import load_weights
from vit_train.data.decoding.image import open_rgb
from vit_train.errors import CheckpointError, DataError
from vit_train.checkpoint import load_failure
from vit_train.objectives.weights_in import load_pretrained
from vit_train.train.trainer import train


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    train(tiny_config(trainer={"max_steps": 1}), run_dir)
    return run_dir / "checkpoints" / "last.pt"


# ---------------------------------------------------------------- pickles


class Exploit:
    def __reduce__(self):
        return (os.system, ("touch /tmp/vit-train-pwned",))


@pytest.mark.parametrize("loader", [load_checkpoint, load_weights], ids=["checkpoint", "weights"])
def test_a_pickled_object_is_named_refused_and_never_run(tmp_path, loader):
    path = tmp_path / "evil.pt"
    torch.save({"model": {"w": Exploit()}}, path)
    with pytest.raises(CheckpointError) as refused:
        loader(path)
    message = str(refused.value)
    assert "posix.system" in message and "refused and never run" in message and "\n" not in message
    assert "weights_only=False" not in message and "weights_only` set to `False" not in message
    assert not Path("/tmp/vit-train-pwned").exists()


@pytest.mark.parametrize("text, name", [
    ("Weights only load failed. ... Unsupported global: GLOBAL posix.system was not an allowed global by default. "
     "Please use `torch.serialization.add_safe_globals([system])`", "posix.system"),  # torch 2.4 to 2.13
    ("Weights only load failed. In PyTorch 2.6, we changed the default value of the `weights_only` argument ... "
     "\n\nTrying to load unsupported GLOBAL posix.system whose module posix is blocked.\n\n", "posix.system"),  # 2.14
])
def test_both_wordings_of_torch_refusal_name_the_object(text, name):
    assert load_failure(Exception(text)) == f"it holds a pickled object, {name}, which was refused and never run"


@pytest.mark.parametrize("content, said", [(b"# My notes\nnot weights\n", "it is not a PyTorch file"),
                                            (b"", "it is empty or cut short")])
@pytest.mark.parametrize("loader", [load_checkpoint, load_weights], ids=["checkpoint", "weights"])
def test_a_file_that_is_no_pytorch_file_is_not_called_a_pickle(tmp_path, loader, content, said):
    """A README or an empty file given as a checkpoint or teacher: no talk of pickled data."""
    path = tmp_path / "README.md"
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as refused:
        loader(path)
    assert said in str(refused.value) and "pickled" not in str(refused.value), refused.value


def test_other_weights_only_refusals_never_echo_the_advice():
    text = "Weights only load failed. Re-running `torch.load` with `weights_only` set to `False` will likely succeed"
    assert "False" not in load_failure(Exception(text + "\n\nUnsupported operand 149"))


# ---------------------------------------------------------------- safetensors


def raw_safetensors(path, header: dict, data: bytes = b""):
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def test_deeply_nested_safetensors_metadata_is_one_line(tmp_path):
    path = tmp_path / "nested.safetensors"
    raw_safetensors(path, {"__metadata__": {"config": "[" * 100_000 + "]" * 100_000},
                           "pos_embed": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4)
    with pytest.raises(CheckpointError, match="metadata is nested too deeply to be read"):
        load_weights(path)
    model = tiny_config().model.build(10)
    with pytest.raises(CheckpointError, match="nested too deeply"):
        load_pretrained(model, path)


@pytest.mark.parametrize("header, data, message", [
    ({"w": {"dtype": "F32", "shape": [1000000], "data_offsets": [0, 4000000]}}, b"\0" * 4, "not fully covered"),
    ({"w": {"dtype": "X99", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, "unknown variant"),
    ({"__metadata__": {"a": {"b": 1}}}, b"", "expected a string"),
], ids=["offsets-past-the-end", "unknown-dtype", "metadata-not-text"])
def test_malformed_safetensors_headers_are_one_line(tmp_path, header, data, message):
    path = tmp_path / "bad.safetensors"
    raw_safetensors(path, header, data)
    with pytest.raises(CheckpointError, match=f"not a readable safetensors file .*{message}"):
        load_weights(path)


def test_a_huge_header_length_is_refused(tmp_path):
    path = tmp_path / "huge.safetensors"
    path.write_bytes(struct.pack("<Q", 2**62) + b"{}")
    with pytest.raises(CheckpointError, match="header too large"):
        load_weights(path)


@pytest.mark.slow  # ~12 s on 2 cores; bit rot also in test_faults.py
def test_damaged_checkpoints_are_refused_by_every_reader(tmp_path, checkpoint):
    damaged = tmp_path / "damaged.pt"
    data = bytearray(checkpoint.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    model = tiny_config().model.build(10)
    with pytest.raises(CheckpointError, match="is damaged .*CRC-32"):
        load_pretrained(model, damaged)
    for name, args in (("eval", []), ("predict", ["images=[x.png]"]), ("export", ["out=" + str(tmp_path / "m.onnx")])):
        done = command(name, f"ckpt={damaged}", *args)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (name, done.stderr)
        assert done.stderr.count("\n") == 1 and "is damaged" in done.stderr, done.stderr


# ---------------------------------------------------------------- images


def png_claiming(path: Path, width: int, height: int) -> None:
    """A few-hundred-byte PNG whose header claims width x height (a decompression bomb's header)."""
    Image.new("1", (1, 1)).save(path)
    data = bytearray(path.read_bytes())
    ihdr = 8 + 8  # signature, then the IHDR chunk's length and type
    data[ihdr:ihdr + 8] = struct.pack(">II", width, height)
    data[ihdr + 13:ihdr + 17] = struct.pack(">I", zlib.crc32(bytes(data[ihdr - 4:ihdr + 13])))
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("side", [20_000, 10_000], ids=["over-the-error-limit", "between-warning-and-error"])
def test_decompression_bombs_are_refused_before_decoding(tmp_path, side):
    """Pillow errors above 2 x MAX_IMAGE_PIXELS (178.9 M pixels) and only warns between 89.5 M and
    that; 10_000^2 = 100 M pixels would be decoded (300 MB as RGB) after a warning. Both are refused."""
    png_claiming(tmp_path / "bomb.png", side, side)
    with pytest.raises(Image.DecompressionBombError, match="vit-train refuses|exceeds limit"):
        open_rgb(tmp_path / "bomb.png")


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_vit_predict_refuses_a_bomb_in_one_line(tmp_path, checkpoint):
    png_claiming(tmp_path / "bomb.png", 10_000, 10_000)
    Image.new("RGB", (16, 16)).save(tmp_path / "fine.png")
    done = command("predict", f"ckpt={checkpoint}", f"images=[{tmp_path / 'fine.png'},{tmp_path / 'bomb.png'}]")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "bomb.png cannot be read as an image (DecompressionBombError" in done.stderr


def test_bombs_in_an_image_folder_count_as_unreadable(tmp_path, make_config, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 40x40 = 1600 pixels: between the two limits
    write_image_folder(tmp_path, {"train": 2, "val": 2}, pixels=lambda cls, i: (60 * i, 0, 0))
    Image.new("RGB", (40, 40)).save(tmp_path / "train" / "b" / "2.png")
    cfg = make_config(data={"name": "imagefolder", "root": str(tmp_path), "batch_size": 2, "bad_images": "error",
                            "num_workers": 0}, model={"img_size": 16, "patch_size": 8})
    with pytest.raises(DataError, match=r"b/2.png cannot be read \(DecompressionBombError"):
        train(cfg, tmp_path / "run")


def test_a_class_that_becomes_unreadable_mid_run_is_one_line_naming_a_file(tmp_path, make_config, monkeypatch):
    """The folder listing is taken, then every image of class b is damaged (a disk or mount gone bad):
    the loader workers' replacement runs out, and the error reaches the run as one line, not the
    worker's traceback."""
    write_image_folder(tmp_path, {"train": 20, "val": 2}, pixels=lambda cls, i: (10 * i, 0, 0), name="{i:02d}.png")
    from vit_train.data.sources.base import EncodedImages

    build = EncodedImages.build

    def build_then_damage(*args, **kwargs):
        data = build(*args, **kwargs)
        for path in (tmp_path / "train" / "b").iterdir():
            path.write_bytes(b"\0" * 10)
        return data

    monkeypatch.setattr(EncodedImages, "build", build_then_damage)  # the image folder's door to its loaders
    cfg = make_config(data={"name": "imagefolder", "root": str(tmp_path), "batch_size": 4, "num_workers": 2,
                            "max_bad_fraction": 1.0}, model={"img_size": 16, "patch_size": 8})
    with pytest.raises(DataError) as stopped:
        train(cfg, tmp_path / "run")
    message = str(stopped.value)
    assert "\n" not in message and "Traceback" not in message
    assert "16 unreadable images in a row from " + str(tmp_path / "train" / "b") in message


@pytest.mark.slow  # ~11 s on 2 cores; two runs
def test_a_damaged_checkpoint_points_at_another_of_its_run_never_at_itself(tmp_path, make_config):
    from vit_train.train.trainer import train
    train(make_config(trainer={"max_steps": 2}), tmp_path)
    train(make_config(trainer={"max_steps": 3}, resume="auto"), tmp_path)  # last.pt moves on; best.pt may not
    best = min((tmp_path / "checkpoints").glob("step_*.pt"))  # the older version (a hard link, or a copy)
    data = bytearray(best.read_bytes())
    data[len(data) // 2:len(data) // 2 + 16] = bytes(16)  # 16 bytes zeroed in the middle
    best.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(best)
    other = str(refused.value).rpartition("(e.g. ")[2].rstrip(")")
    assert other == str(tmp_path / "checkpoints" / "last.pt") and not os.path.samefile(other, best)
    (tmp_path / "lone.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="use another checkpoint$"):
        load_checkpoint(tmp_path / "lone.pt")

