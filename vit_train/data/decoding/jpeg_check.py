"""Which encoded images the batched JPEG decoder may take (data.decode=gpu), read from the header alone.

The batched decoder (torchvision.io.decode_jpeg: nvJPEG on a GPU, libjpeg-turbo on the CPU) takes a file only
where it decodes it as the one CPU decoder (decoding/image.py `open_rgb`) does, up to the decoders' own rounding: an
8-bit Huffman-coded JPEG, baseline or progressive, grey or YCbCr in a chroma subsampling nvJPEG knows, with its
end-of-image marker. Everything else is a fallback, decoded on the CPU by decoding/image.py in the loader worker:

- another format under any name (a PNG, WebP or GIF saved as .jpg: the content decides, never the name);
- CMYK and YCCK JPEGs (4 components; nvJPEG refuses them), and RGB-coded ones (an Adobe marker saying "no
  colour transform", or components named R, G, B), which a decoder that assumes YCbCr would colour wrongly;
- a chroma subsampling nvJPEG lacks (it raises "unknown chroma subsampling");
- 12-bit, arithmetic-coded, lossless or extended-sequential JPEGs;
- a stream with no end-of-image marker after its first scan (truncated: the CPU decoder refuses it, so it goes
  to data.bad_images as with data.decode=cpu, where nvJPEG might have decoded a grey half-image without a word);
- markers this check cannot follow, and an EXIF block Pillow cannot read (the CPU decoder decides).

EXIF orientation is read here (as `decode.to_rgb` reads it) and applied after the batched decode
(decoding/batched.py `upright`). A header that Pillow refuses, an image bomb and a resize bomb raise one of
decode.IMAGE_ERRORS here, as decoding would: an unreadable image.
"""

from __future__ import annotations

from dataclasses import dataclass

from vit_train.data.decoding import image as decode

BATCHED = ("JPEG", "progressive JPEG")  # kinds the batched decoder takes (progressive: nvJPEG decodes it alone)
FALLBACKS = (
    "PNG",
    "WebP",
    "GIF",
    "another format",
    "CMYK/YCCK JPEG",
    "RGB-coded JPEG",
    "chroma subsampling nvJPEG lacks",
    "12-bit, arithmetic, lossless or extended JPEG",
    "no end-of-image marker (truncated)",
    "markers out of order",
    "unreadable EXIF",
)
DECODER_ERROR = "refused by the batched decoder"  # found in the training process (decoding/batched.py), not here
KINDS = BATCHED + FALLBACKS + (DECODER_ERROR,)  # a kind's number is its place here
FORMATS = {"PNG": "PNG", "WEBP": "WebP", "GIF": "GIF"}

SOI, SOS, EOI, APP14 = 0xD8, 0xDA, b"\xff\xd9", 0xEE
BASELINE, PROGRESSIVE = 0xC0, 0xC2  # the start-of-frame markers the batched decoder takes
FRAMES = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
# Luma sampling factors (h, v) with chroma at 1x1: nvJPEG's 4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1 and 4:1:0
SUBSAMPLINGS = {(1, 1), (2, 1), (2, 2), (1, 2), (4, 1), (4, 2)}
TURNS = {2, 3, 4, 5, 6, 7, 8}  # EXIF orientations Pillow's exif_transpose turns (others: left as stored)


@dataclass(frozen=True)
class Route:
    """Where an image is decoded: `kind` is its place in KINDS (batched when below len(BATCHED)); `orientation`
    the EXIF orientation to apply after a batched decode (1: as stored)."""

    kind: int
    orientation: int = 1

    @property
    def batched(self) -> bool:
        return self.kind < len(BATCHED)


def route(data: bytes, name: str) -> Route:
    """Where the encoded image `data` (named `name` in errors) is decoded. Raises one of decode.IMAGE_ERRORS where
    the CPU decoder would refuse it from its header (not an image, an image bomb, a resize bomb)."""
    with decode.header(data, name) as image:
        if image.format not in ("JPEG", "MPO"):  # MPO: a phone's multi-picture JPEG; its first picture is read
            return Route(KINDS.index(FORMATS.get(image.format, "another format")))
        try:
            orientation = image.getexif().get(decode.ORIENTATION, 1)
        except decode.IMAGE_ERRORS:
            orientation = None
    if type(orientation) is not int:  # damaged, or a value of another type: as the CPU decoder takes it
        return Route(KINDS.index("unreadable EXIF"))
    kind = jpeg_kind(data)
    return Route(KINDS.index(kind), orientation if kind in BATCHED and orientation in TURNS else 1)


def jpeg_kind(data: bytes) -> str:
    """The KINDS entry of JPEG bytes, from their markers: a BATCHED kind or the FALLBACKS reason."""
    frame, scan, adobe_transform = _markers(data)
    if scan is None:
        return "markers out of order" if frame == () else "no end-of-image marker (truncated)"
    if frame is None:
        return "markers out of order"
    marker, precision, components = frame
    if marker not in (BASELINE, PROGRESSIVE) or precision != 8:
        return "12-bit, arithmetic, lossless or extended JPEG"
    if len(components) == 4:
        return "CMYK/YCCK JPEG"
    if len(components) == 3:
        ids = tuple(c[0] for c in components)
        if adobe_transform == 0 or ids == (82, 71, 66):  # libjpeg reads these as RGB, not YCbCr
            return "RGB-coded JPEG"
        (_, *luma), (_, *cb), (_, *cr) = components
        if tuple(cb) != (1, 1) or tuple(cr) != (1, 1) or tuple(luma) not in SUBSAMPLINGS:
            return "chroma subsampling nvJPEG lacks"
    elif len(components) != 1:
        return "another format"
    if data.find(EOI, scan) < 0:  # in entropy-coded data 0xFF is always stuffed: FFD9 is the end marker only
        return "no end-of-image marker (truncated)"
    return "progressive JPEG" if marker == PROGRESSIVE else "JPEG"


def _markers(data: bytes) -> tuple[tuple | None, int | None, int | None]:
    """(the first frame header as (marker, precision, [(component id, h, v), ...]) or None, where the first scan
    header starts or None, the Adobe marker's colour transform or None), walking the marker segments up to the
    first scan: the data ending first gives no scan; a byte where a marker should be gives frame () and no scan."""
    frame, adobe, i = None, None, 2
    if data[:2] != b"\xff\xd8":
        return (), None, None
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return (), None, adobe
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == SOI or 0xD0 <= marker <= 0xD7 or marker == 0x01:  # markers without a length
            i += 2
            continue
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        segment = data[i + 4 : i + 2 + length]
        if marker == SOS:
            return frame, i, adobe
        if marker in FRAMES and frame is None and len(segment) >= 6:
            count = segment[5]
            components = [
                (segment[6 + 3 * c], segment[7 + 3 * c] >> 4, segment[7 + 3 * c] & 15)
                for c in range(count)
                if 7 + 3 * c < len(segment)
            ]
            frame = (marker, segment[0], components)
        if marker == APP14 and segment[:5] == b"Adobe" and len(segment) >= 12:
            adobe = segment[11]
        i += 2 + length
    return frame, None, adobe
