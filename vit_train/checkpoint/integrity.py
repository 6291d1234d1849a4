"""Is a checkpoint or weights file what was written? The checks of torch's archives, and plain words for why
torch.load refused a file.

- `archive_damage`: every file torch.save writes (since PyTorch 1.6) is a zip archive that stores
  a CRC-32 of each record; torch.load does not check them, so bit rot loads silently. We check them
  all (zipfile.testzip; about 1 GB/s) before a checkpoint or weights file is used.
- `legacy_damage`: the same question for torch.save's legacy (pre-1.6) format, after torch.load failed on it.
- `load_failure`: why torch.load refused a file; for a pickled object, which one, and that it was
  never run.
- `checkpoint_size`: about the bytes a checkpoint of a state takes on disk.
"""

from __future__ import annotations

import re
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any

import torch


def archive_damage(path: Path) -> str | None:
    """None if `path` is a sound zip archive (or not a zip at all), else what is wrong, in a few words."""
    try:
        if not zipfile.is_zipfile(path):
            with open(path, "rb") as f:  # a zip's first record, without the directory a whole zip ends with
                if f.read(4) == b"PK\x03\x04":
                    return "it is cut short: a zip archive (PyTorch's format) without the directory it ends with"
            return None  # the legacy (pre-1.6) torch format or another file type: torch.load judges it
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError, NotImplementedError) as e:
        return f"its zip structure is damaged: {e}"
    if bad is not None:
        return (
            f"the CRC-32 of its record {bad} does not match: bytes changed after it was written (bit rot, a bad copy)"
        )
    return None


LEGACY_MAGIC = b"\x80\x02\x8a\x0a"  # torch.save's pre-1.6 format opens with its magic number, pickled (protocol 2)


def legacy_damage(path: Path, error: BaseException) -> str | None:
    """What is wrong with a file of torch.save's legacy (pre-1.6, non-zip) format that torch.load failed on
    with a reader's error (it ends early or does not parse), in a few words; None for another file or error
    (a refused pickled object, a file of another kind: `load_failure` says those)."""
    if _GLOBAL.search(str(error)) or not isinstance(
        error, (EOFError, OSError, IndexError, ValueError, KeyError, RuntimeError, struct.error)
    ):
        return None
    try:
        with open(path, "rb") as f:
            legacy = f.read(len(LEGACY_MAGIC)) == LEGACY_MAGIC
    except OSError:
        return None
    return (
        f"a legacy-format PyTorch file whose records end early or do not parse ({load_failure(error)})"
        if legacy
        else None
    )


def checkpoint_size(state: Any) -> int:
    """About the bytes torch.save writes for a nested state (dicts, lists, tuples of tensors): the
    tensors' bytes plus ~384 bytes of zip records, alignment and pickle per tensor (measured)."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size() + 384
    if isinstance(state, dict):
        return sum(checkpoint_size(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(checkpoint_size(v) for v in state)
    return 0


_GLOBAL = re.compile(r"unsupported GLOBAL:? (?:GLOBAL )?([\w.]+)", re.IGNORECASE)  # torch 2.4 to 2.14 wordings


def load_failure(error: BaseException) -> str:
    """torch.load's error in a few words; never its advice to load with weights_only=False."""
    text = str(error)
    unsafe = _GLOBAL.search(text)
    if unsafe:
        return f"it holds a pickled object, {unsafe.group(1)}, which was refused and never run"
    if re.search(r"unsupported operand \d+|invalid load key", text, re.IGNORECASE):  # its first byte is no pickle's
        return "it is not a PyTorch file (no checkpoint or saved tensors in it)"
    if isinstance(error, EOFError) or re.search(r"ran out of input|unexpected eof", text, re.IGNORECASE):
        return "it is empty or cut short"
    if isinstance(error, OSError) and error.errno == 22:  # the legacy format's reader seeking past the file's end
        return "it is cut short or damaged: its contents point past its end"
    if "weights only load failed" in text.lower():
        return "it holds pickled data that a weights-only load refuses; it was never run"
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    sentence = first.split(". ")[0]  # torch's messages go on with advice; a cut mid-sentence reads wrong
    return sentence if len(sentence) <= 200 else sentence[:200].rsplit(" ", 1)[0] + " ..."
