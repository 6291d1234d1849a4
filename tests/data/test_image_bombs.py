"""Image bombs of every shape are refused before decoding (issue 23): a file of a few bytes that claims
a huge width x height in its PNG, JPEG, GIF, TIFF, WebP or BMP header (a palette image too), PNG text
or colour-profile chunks that inflate to more than Pillow's limits, a BMP claiming a huge palette;
many-frame GIF/TIFF/APNG files read their first frame only; malformed EXIF neither stops the read nor
prints a warning from every loader worker. Each bomb goes through decode.open_rgb (files: training,
vit-eval, vit-predict) and decode_rgb (encoded bytes: shards, dataset cells) alike."""

import io
import struct
import warnings
import zlib

import numpy as np
import pytest
from PIL import Image, features

import vit_train.data.decoding.image as decode
from vit_train.data.decoding.image import IMAGE_ERRORS, UnreadableImage, decode_rgb, open_rgb
from vit_train.data.sources.imagefolder_files import load_image_folders
from helpers.images import write_image_folder

LIMIT = Image.MAX_IMAGE_PIXELS  # 89,478,485 pixels by default: data/decoding/image.py keeps it, strict


def encoded(fmt: str, mode: str = "RGB", size=(8, 8), **save) -> bytes:
    out = io.BytesIO()
    Image.new(mode, size, 80).save(out, fmt, **save)
    return out.getvalue()


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_claiming(width: int, height: int, mode: str = "RGB") -> bytes:
    """An 8x8 PNG whose IHDR says width x height (the CRC made right): Pillow sees the claim at open."""
    data = encoded("PNG", mode)
    return data[:8] + png_chunk(b"IHDR", struct.pack(">II", width, height) + data[24:29]) + data[33:]


def png_with(*chunks: bytes) -> bytes:
    """An 8x8 PNG with `chunks` after its IHDR."""
    data = encoded("PNG")
    return data[:33] + b"".join(chunks) + data[33:]


def jpeg_claiming(width: int, height: int) -> bytes:
    data = bytearray(encoded("JPEG"))
    sof = data.find(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def gif_claiming(width: int, height: int) -> bytes:
    data = bytearray(encoded("GIF", "P"))
    data[6:10] = struct.pack("<HH", width, height)  # the logical screen
    frame = data.find(b"\x2c")  # the image descriptor
    data[frame + 5:frame + 9] = struct.pack("<HH", width, height)
    return bytes(data)


def tiff_claiming(width: int, height: int) -> bytes:
    """A hand-made uncompressed greyscale TIFF whose one strip is 64 bytes."""
    tags = [(256, 4, 1, width), (257, 4, 1, height), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 1), (273, 4, 1, 8),
            (277, 3, 1, 1), (278, 4, 1, height), (279, 4, 1, 64)]
    ifd = struct.pack("<H", len(tags)) + b"".join(struct.pack("<HHII", *t) for t in tags) + b"\0\0\0\0"
    return b"II*\0" + struct.pack("<I", 8 + 64) + b"\0" * 64 + ifd


def webp_claiming(width: int, height: int) -> bytes:
    """A lossless WebP whose VP8L header (14-bit width-1 and height-1) says width x height."""
    data = bytearray(encoded("WEBP", lossless=True))
    header = data.find(b"VP8L") + 9  # after the chunk's size and the 0x2f signature
    old = struct.unpack("<I", data[header:header + 4])[0]
    new = (old & ~((1 << 28) - 1)) | ((width - 1) & 0x3FFF) | (((height - 1) & 0x3FFF) << 14)
    data[header:header + 4] = struct.pack("<I", new)
    return bytes(data)


def bmp_claiming(width: int, height: int) -> bytes:
    data = bytearray(encoded("BMP"))
    data[18:26] = struct.pack("<ii", width, height)
    return bytes(data)


SIZE_BOMBS = {
    "png_100k_square": lambda: png_claiming(100_000, 100_000),
    "png_just_over_the_limit": lambda: png_claiming(9_500, 9_500),  # 90.25 M: Pillow alone would only warn
    "png_palette": lambda: png_claiming(60_000, 60_000, "P"),
    "jpeg": lambda: jpeg_claiming(65_000, 65_000),
    "gif": lambda: gif_claiming(65_535, 65_535),
    "tiff": lambda: tiff_claiming(100_000, 100_000),
    "webp": lambda: webp_claiming(16_384, 16_384),
    "bmp": lambda: bmp_claiming(50_000, 50_000),
}


def write(tmp_path, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("bomb", sorted(SIZE_BOMBS))
def test_a_huge_size_claimed_in_a_header_is_refused_before_decoding(tmp_path, monkeypatch, bomb):
    if bomb == "webp" and not features.check("webp"):
        pytest.skip("Pillow without WebP")
    data = SIZE_BOMBS[bomb]()
    assert len(data) < 2000  # a small file...
    decoded = []
    monkeypatch.setattr(decode, "to_rgb", lambda image: decoded.append(image) or image)  # reached only after load()
    for read in (lambda: open_rgb(write(tmp_path, f"{bomb}.img", data)), lambda: decode_rgb(data, bomb)):
        with pytest.raises(Image.DecompressionBombError, match="exceeds limit"):  # ...refused by its claim
            read()
    assert decoded == []


@pytest.mark.parametrize("chunks, said", [
    ((png_chunk(b"zTXt", b"k\0\0" + zlib.compress(b"a" * 20_000_000, 9)),), "Decompressed data too large"),
    ((png_chunk(b"iCCP", b"p\0\0" + zlib.compress(b"a" * 20_000_000, 9)),), "Decompressed data too large"),
    ((png_chunk(b"iTXt", b"k\0\1\0\0\0" + zlib.compress(b"a" * 20_000_000, 9)),), "Decompressed data too large"),
    (tuple(png_chunk(b"zTXt", b"k%d\0\0" % i + zlib.compress(b"a" * 1_000_000, 9)) for i in range(70)),
     "Too much memory used in text chunks"),
], ids=["zTXt", "iCCP", "iTXt", "70_zTXt_of_1MB"])
def test_png_text_and_profile_chunks_that_inflate_past_pillows_limits_are_refused(tmp_path, chunks, said):
    """One chunk inflating past PngImagePlugin.MAX_TEXT_CHUNK (1 MB) or all past MAX_TEXT_MEMORY (64 MB)."""
    data = png_with(*chunks)
    assert len(data) < 100_000
    with pytest.raises(ValueError, match=said):
        open_rgb(write(tmp_path, "text.png", data))
    with pytest.raises(ValueError, match=said):
        decode_rgb(data, "text.png")


def test_a_bmp_claiming_a_huge_palette_is_refused(tmp_path):
    data = bytearray(encoded("BMP", "P"))
    data[46:50] = struct.pack("<I", 0x0FFFFFFF)  # biClrUsed
    with pytest.raises(OSError, match="Unsupported BMP Palette size"):
        open_rgb(write(tmp_path, "pal.bmp", bytes(data)))


class CountingReader(io.BufferedReader):
    """A file that remembers the furthest offset any read reached."""

    furthest = 0

    def read(self, size=-1):
        out = super().read(size)
        CountingReader.furthest = max(CountingReader.furthest, self.tell())
        return out

    def readinto(self, buffer):
        out = super().readinto(buffer)
        CountingReader.furthest = max(CountingReader.furthest, self.tell())
        return out


@pytest.mark.parametrize("fmt, mode, frames", [("GIF", "P", 300), ("TIFF", "L", 300), ("PNG", "RGB", 300)])
def test_a_many_frame_file_is_read_to_its_first_frame_only(tmp_path, monkeypatch, fmt, mode, frames):
    rng = np.random.default_rng(0)
    pictures = [Image.fromarray(rng.integers(0, 256, (64, 64), dtype=np.uint8)).convert(mode) for _ in range(frames)]
    path = tmp_path / f"many.{fmt.lower()}"
    pictures[0].save(path, fmt, save_all=True, append_images=pictures[1:])
    size = path.stat().st_size
    assert size > frames * 1000  # incompressible frames: the file holds them all
    monkeypatch.setattr(decode, "open_regular", lambda p: CountingReader(io.FileIO(p)))
    CountingReader.furthest = 0
    image = open_rgb(path)
    assert np.array_equal(np.asarray(image), np.asarray(pictures[0].convert("RGB")))
    assert CountingReader.furthest < 100_000 < size  # the first frame and one buffer, not the other frames


def exif_jpeg(ifd_entries: list[tuple[int, int, int, int]], next_ifd: int = 0) -> bytes:
    ifd = struct.pack("<H", len(ifd_entries)) + b"".join(struct.pack("<HHII", *e) for e in ifd_entries)
    return encoded("JPEG", exif=b"Exif\0\0II*\0" + struct.pack("<I", 8) + ifd + struct.pack("<I", next_ifd))


@pytest.mark.parametrize("entries, next_ifd", [
    ([(0x010E, 2, 0x7FFFFFFF, 26)], 0),  # a description claiming 2 GB, beyond the 64 kB segment
    ([(0x0112, 3, 1, 6)], 8),  # the IFD chain loops back to itself
    ([(0x8769, 4, 1, 8)], 0),  # the EXIF sub-IFD is IFD0 again
    ([(0x0112, 3, 1, 77)], 0),  # an orientation that is none of 1..8
], ids=["huge_count", "ifd_loop", "sub_ifd_loop", "bad_orientation"])
def test_malformed_exif_neither_stops_the_read_nor_warns(tmp_path, entries, next_ifd):
    path = write(tmp_path, "exif.jpg", exif_jpeg(entries, next_ifd))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning would print from every loader worker
        image = open_rgb(path)
    assert image.mode == "RGB" and image.size in ((8, 8),)


def test_a_bomb_in_an_image_folder_is_an_unreadable_image(tmp_path):
    """In a data set, a bomb goes to the unreadable-image policy (data.bad_images, docs/data.md)."""
    write_image_folder(tmp_path, {"train": 2, "val": 1}, classes=("a", "b"))
    train, _, _ = load_image_folders(tmp_path)
    with open(train.samples[1][0], "wb") as f:
        f.write(png_claiming(100_000, 100_000))
    assert train[0][1] == 0
    with pytest.raises(UnreadableImage) as e:
        train[1]
    assert isinstance(e.value.__cause__, IMAGE_ERRORS) and isinstance(e.value.__cause__, Image.DecompressionBombError)
