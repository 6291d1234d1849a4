"""data.decode=gpu's decoding, on the CPU (the same batched code path with device=cpu): which decoder takes each
kind of file, the pixels against the CPU loader's (data/decoding/image.py `open_rgb`), the counts and the one log line, and
images that a decoder refuses. With device=cpu the batched decoder is torchvision's libjpeg-turbo, the library
Pillow decodes with: the pixels are equal, not close (`test_batched_decode_equals_open_rgb_bit_for_bit`)."""

from __future__ import annotations

import logging
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from helpers.jpegs import jpeg, kinds, photo, write_kinds
from vit_train.data.decoding import batched, image as decode
from vit_train.data.decoding.image import IMAGE_ERRORS, ResizeBombError, read_uint8
from vit_train.data.decoding.batched import BatchDecoder, RawImages, collate, encode, upright
from vit_train.data.decoding.jpeg_check import BATCHED, DECODER_ERROR, KINDS, jpeg_kind, route

CPU = torch.device("cpu")


def decoded(paths, monkeypatch=None, check=False):
    """The images of `paths` through encode (a worker), collate and BatchDecoder on the CPU, and the decoder."""
    items = [(encode(p.read_bytes(), str(p), i), 0, -1) for i, p in enumerate(paths)]
    batch, _, _ = collate(items)
    decoder = BatchDecoder(CPU, "train", check=check)
    return decoder(batch), decoder


@pytest.mark.parametrize("size", [(37, 53), (8, 8), (101, 7), (64, 48)])
def test_batched_decode_equals_open_rgb_bit_for_bit(tmp_path, size):
    files = {name: (data, kind) for name, (data, kind) in kinds().items() if kind in BATCHED}
    rgb = photo(*size, seed=3)
    files["odd_size"] = (jpeg(rgb, quality=75), "JPEG")
    paths = []
    for name, (data, _) in files.items():
        (tmp_path / f"{name}.jpg").write_bytes(data)
        paths.append(tmp_path / f"{name}.jpg")
    images, decoder = decoded(paths)
    assert all(KINDS[encode(p.read_bytes(), p.name).kind] in BATCHED for p in paths)
    for path, image in zip(paths, images):
        assert torch.equal(image, read_uint8(path)), path.name
    assert set(decoder.counts) <= set(BATCHED)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_each_exif_orientation_turns_as_pillow_does(tmp_path, orientation):
    """nvJPEG never reads EXIF (sglang#33464, DALI#2660): the batched path turns the pixels as data/decoding/image.py does."""
    path = tmp_path / "phone.jpg"
    path.write_bytes(jpeg(photo(20, 33), exif=gpu_decode_exif(orientation)))
    assert route(path.read_bytes(), "phone.jpg").orientation == orientation
    (image,), _ = decoded([path])
    assert torch.equal(image, read_uint8(path))
    assert image.shape[1:] == ((33, 20) if orientation >= 5 else (20, 33))


def gpu_decode_exif(orientation):
    tags = Image.Exif()
    tags[0x0112] = orientation
    return tags.tobytes()


def test_every_kind_is_routed_decoded_as_the_cpu_path_and_counted(tmp_path, caplog):
    made = write_kinds(tmp_path)
    readable = {name: path for name, (path, kind) in made.items() if kind is not None}
    for name, (path, kind) in made.items():
        if kind is None:  # truncated, zero bytes: the CPU decoder refuses them too (data.bad_images)
            with pytest.raises(IMAGE_ERRORS):
                encode(path.read_bytes(), name)
            with pytest.raises(IMAGE_ERRORS):
                decode.open_rgb(path)
        else:
            assert KINDS[encode(path.read_bytes(), name).kind] == kind, name
    caplog.set_level(logging.INFO, logger="vit_train")
    images, decoder = decoded(list(readable.values()))
    for (name, path), image in zip(readable.items(), images):
        assert torch.equal(image, read_uint8(path)), name
    expected = {}
    for name in readable:
        expected[made[name][1]] = expected.get(made[name][1], 0) + 1
    assert dict(decoder.counts) == expected
    decoded_again = decoder(collate([(encode(p.read_bytes(), str(p)), 0, -1) for p in readable.values()])[0])
    assert len(decoded_again) == len(readable)
    said = [r.getMessage() for r in caplog.records if "data.decode=gpu" in r.getMessage()]
    assert len(said) == 1 and "cmyk.jpg (CMYK/YCCK JPEG)" in said[0]  # once, naming the first
    decoder.report(3)
    epoch = [r.getMessage() for r in caplog.records if r.getMessage().startswith("epoch 3:")]
    assert epoch == ["epoch 3: 10 train images decoded by the CPU decoder, not the batched decoder on cpu "
                     "(data.decode=gpu): 2 CMYK/YCCK JPEG, 2 RGB-coded JPEG, 2 PNG, 2 WebP, 2 GIF"]
    assert not decoder.counts and decoder.total["PNG"] == 2


def test_subsamplings_nvjpeg_lacks_and_other_codings_go_to_the_cpu():
    """nvJPEG raises "unknown chroma subsampling" (torchvision decode_jpegs_cuda.cpp): read from the frame
    header, with the other frames it does not batch (12-bit, arithmetic, lossless)."""
    data = bytearray(jpeg(photo(16, 16), subsampling=2))  # 4:2:0: Y 2x2, Cb 1x1, Cr 1x1
    start = data.index(b"\xff\xc0")
    assert jpeg_kind(bytes(data)) == "JPEG"
    cb = start + 4 + 6 + 3 + 1  # marker, length, precision/size/count, Y's three bytes, Cb's id
    for sampling in (0x21, 0x12):  # chroma at 2x1 or 1x2 of the luma grid: no nvJPEG subsampling
        data[cb] = sampling
        assert jpeg_kind(bytes(data)) == "chroma subsampling nvJPEG lacks"
    data[cb] = 0x11
    data[start + 4 + 6 + 1] = 0x31  # luma 3x1
    assert jpeg_kind(bytes(data)) == "chroma subsampling nvJPEG lacks"
    data[start + 4 + 6 + 1] = 0x22
    for frame in (0xC1, 0xC3, 0xC9):  # extended, lossless, arithmetic
        data[start + 1] = frame
        assert jpeg_kind(bytes(data)) == "12-bit, arithmetic, lossless or extended JPEG"


def test_the_header_check_refuses_image_and_resize_bombs_as_decoding_does(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(Image.DecompressionBombError):
        route(jpeg(photo(16, 16)), "big.jpg")
    monkeypatch.undo()
    strip = jpeg(photo(4, 2000))
    decode.check_resizes(256)
    try:
        monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1_000_000)
        with pytest.raises(ResizeBombError):
            route(strip, "strip.jpg")
        raw = RawImages(NoImages(), 256)
        decode.check_resizes(None)
        pickle.loads(pickle.dumps(raw))  # a spawned worker unpickles it: the check is set again
        with pytest.raises(ResizeBombError):
            route(strip, "strip.jpg")
    finally:
        decode.check_resizes(None)


class NoImages:
    samples: list = []


def test_one_stream_the_batched_decoder_refuses_does_not_lose_the_batch(tmp_path, monkeypatch):
    """One bad stream fails nvJPEG's whole batched call (DALI#211, #306): each image is then decoded alone and
    the one it refuses by the CPU decoder, counted as such."""
    paths = [tmp_path / f"{i}.jpg" for i in range(4)]
    for i, path in enumerate(paths):
        path.write_bytes(jpeg(photo(10 + i, 12, seed=i)))
    refused = paths[2].read_bytes()
    real = batched.batched_decode

    def picky(data, device):
        if any(d.numel() == len(refused) and bytes(d.numpy()) == refused for d in data):
            raise RuntimeError("Error while decoding JPEG images: nvjpeg status 6")
        return real(data, device)

    monkeypatch.setattr(batched, "batched_decode", picky)
    images, decoder = decoded(paths)
    assert all(torch.equal(image, read_uint8(p)) for image, p in zip(images, paths))
    assert decoder.counts == {"JPEG": 3, DECODER_ERROR: 1}


def test_an_image_neither_decoder_reads_is_none(tmp_path, monkeypatch):
    path = tmp_path / "x.jpg"
    path.write_bytes(jpeg(photo(10, 12)))
    item = encode(path.read_bytes(), str(path), 0)
    monkeypatch.setattr(batched, "batched_decode", lambda data, device: (_ for _ in ()).throw(RuntimeError("x")))
    monkeypatch.setattr(decode, "decode_rgb", lambda data, name: (_ for _ in ()).throw(OSError("broken data stream")))
    decoder = BatchDecoder(CPU, "train")
    assert decoder(collate([(item, 0, -1)])[0]) == [None]


def test_wrong_pixels_from_the_batched_decoder_are_named_in_one_line(tmp_path, monkeypatch, caplog):
    """A hardware decoder that reported success and wrote nothing gave black training images
    (LichtFeld-Studio#1924): the first batch is checked against the CPU decoder."""
    paths = [tmp_path / f"{i}.jpg" for i in range(3)]
    for i, path in enumerate(paths):
        path.write_bytes(jpeg(photo(16, 16, seed=i)))
    real = batched.batched_decode

    def first_black(data, device):
        return [x if i else torch.zeros_like(x) for i, x in enumerate(real(data, device))]

    monkeypatch.setattr(batched, "batched_decode", first_black)
    caplog.set_level(logging.INFO, logger="vit_train")
    _, decoder = decoded(paths, check=True)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "0.jpg" in warned[0] and "use data.decode=cpu" in warned[0]
    assert decoder.first_difference > 50


def test_the_check_measures_no_difference_on_the_cpu(tmp_path):
    paths = [tmp_path / f"{i}.jpg" for i in range(3)]
    for i, path in enumerate(paths):
        path.write_bytes(jpeg(photo(16, 20, seed=i)))
    _, decoder = decoded(paths, check=True)
    assert decoder.first_difference == 0.0


def test_upright_is_pillows_exif_transpose_for_every_orientation():
    rgb = photo(5, 7)
    for orientation in range(1, 9):
        image = Image.fromarray(rgb)
        tags = image.getexif()
        tags[0x0112] = orientation
        image.info["exif"] = tags.tobytes()
        from PIL import ImageOps

        expected = np.asarray(ImageOps.exif_transpose(image))
        turned = upright(torch.from_numpy(rgb.copy()).permute(2, 0, 1), orientation)
        assert np.array_equal(turned.permute(1, 2, 0).numpy(), expected), orientation
