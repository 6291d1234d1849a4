"""data=webdataset's index and shard reading: data.root/index.json (written by vit-shards) lists each split's
shards and their sample counts, so an epoch's length and the classes are known before any shard is read.

The format (docs/data.md, 'WebDataset shards'): {"format": "vit-train webdataset", "version": 1, "classes":
[...], "image_size": [H, W] or null, "source": {...}, "splits": {"train": {"samples": N, "shards": [{"name":
"train-000000.tar", "samples": n, "bytes": b}, ...]}, "val": {...}}}. A shard holds, per sample, "<key>.jpg|
jpeg|png|webp" (the encoded image) and "<key>.cls" (the class index as ASCII decimal), members of one sample
next to each other in any order; other members (.json, .txt) are ignored.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vit_train.data.decoding.regular import not_regular, open_regular
from vit_train.errors import DataError
from vit_train.extras import require

INDEX = "index.json"
FORMAT, VERSION = "vit-train webdataset", 1
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
# What reading a tar stream raises when the shard is cut short or damaged (a truncated file, a dropped connection)
READ_ERRORS = (tarfile.TarError, OSError, EOFError, ValueError)


@dataclass(frozen=True)
class Split:
    """One split's shards in index order: names, sample counts, where each is read from (a path or URL);
    `short_side`: the stored images' shorter side at most, in pixels (vit-shards short_side=N), or None."""

    name: str
    shards: list[str]
    counts: list[int]
    urls: list[str]
    short_side: int | None = None

    @property
    def samples(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True)
class ShardIndex:
    classes: list[str]
    image_size: tuple[int, int] | None
    train: Split
    val: Split


def load_index(root: str, train_shards: str | None = None, val_shards: str | None = None) -> ShardIndex:
    """data.root's index.json, checked, with each shard's URL: data.train_shards / data.val_shards (a brace
    URL or a `pipe:` command, expanded by braceexpand) when given, else the file next to the index.

    Raises DataError (one line) for a missing or malformed index, a listed shard that is not there, or a
    shard URL pattern that expands to another count of shards or in another order than the index's."""
    require("webdataset", "data=webdataset", needs="the webdataset package")
    path = Path(root).expanduser() / INDEX
    kind = not_regular(path)
    if kind == "missing":
        raise DataError(
            f"{path} does not exist; data=webdataset reads the shards' index there (vit-shards writes "
            f"it with the shards: vit-shards data=<a data set> out={Path(root).expanduser()})"
        )
    if kind is not None:  # a FIFO would block the run, a device never end
        raise DataError(
            f"{path} is {kind}, not a regular file; data=webdataset reads the shards' index there: "
            f"replace it with the index.json vit-shards wrote"
        )
    try:
        with open_regular(path) as f:
            index = json.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(
            f"{path} is not a readable JSON index ({type(e).__name__}: {e}); write it again with vit-shards"
        ) from None
    what = f"{path} is not a vit-train shard index"
    if not isinstance(index, dict) or index.get("format") != FORMAT or index.get("version") != VERSION:
        raise DataError(f'{what} (it needs "format": "{FORMAT}", "version": {VERSION}); write it with vit-shards')
    classes = index.get("classes")
    if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes):
        raise DataError(f'{what}: "classes" must be a non-empty list of class names; write it with vit-shards')
    blank = [i for i, c in enumerate(classes) if not c.strip()]
    twice = sorted({c for c in classes if classes.count(c) > 1})
    if blank or twice:
        which = f"class {blank[0]} has an empty name" if blank else f"the class name {twice[0]!r} appears twice"
        raise DataError(f"{what}: {which}; every class needs its own name (write the index again with vit-shards)")
    size = index.get("image_size")
    splits = index.get("splits") if isinstance(index.get("splits"), dict) else {}
    train, val = (_split(path, splits, name, root, url) for name, url in (("train", train_shards), ("val", val_shards)))
    return ShardIndex(list(classes), tuple(size) if isinstance(size, list) and len(size) == 2 else None, train, val)


def _split(path: Path, splits: dict, name: str, root: str, pattern: str | None) -> Split:
    entry = splits.get(name)
    shards = entry.get("shards") if isinstance(entry, dict) else None
    bad = f"{path} lists no valid {name} split"
    if entry is None:
        there = ", ".join(sorted(map(str, splits))) or "none"
        raise DataError(
            f"{path} has no {name} split (its splits: {there}); add it beside them: vit-shards "
            f"<the source's data=... data.root=...> splits={name} out={path.parent}"
        )
    if not isinstance(shards, list) or not shards:
        raise DataError(f'{bad} (splits.{name}.shards: a list of {{"name", "samples"}}); write it with vit-shards')
    names, counts = [], []
    for shard in shards:
        ok = isinstance(shard, dict) and isinstance(shard.get("name"), str) and "/" not in shard["name"]
        if not ok or not _count(shard.get("samples")):
            raise DataError(
                f'{bad}: shard entry {shard!r} needs a plain file "name" and a "samples" count (an integer >= 0)'
            )
        if shard["name"] in names:
            raise DataError(
                f"{bad}: the shard {shard['name']} is listed twice; list each shard once (write the index "
                f"again with vit-shards)"
            )
        names.append(shard["name"])
        counts.append(shard["samples"])
    if not _count(entry.get("samples", 0)) or entry.get("samples", sum(counts)) != sum(counts):
        raise DataError(
            f"{bad}: splits.{name}.samples is {entry['samples']} but its shards hold {sum(counts)}; "
            f"write the index again with vit-shards"
        )
    if not sum(counts):
        raise DataError(f"{bad}: its shards hold no samples")
    side = entry.get("short_side")
    if side is not None and not (_count(side) and side > 0):
        raise DataError(
            f"{bad}: splits.{name}.short_side is {side!r}, not a number of pixels (an integer >= 1, or "
            f"null for images stored at their size); write the index again with vit-shards"
        )
    return Split(name, names, counts, _urls(path, name, names, root, pattern), side)


def _count(value) -> bool:
    """A sample count as JSON must give it: an integer >= 0 (not true, 1.5 or "5")."""
    return type(value) is int and value >= 0


def _urls(path: Path, split: str, names: list[str], root: str, pattern: str | None) -> list[str]:
    if pattern is None:
        folder = Path(root).expanduser()
        kinds = {n: not_regular(folder / n) for n in names}
        _refuse_special(split, {str(folder / n): k for n, k in kinds.items()})
        missing = [n for n, kind in kinds.items() if kind is not None]
        if missing:
            raise DataError(
                f"{len(missing)} {split} shard(s) listed in {path} are not in {folder}: "
                f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}; copy them there, or "
                f"give data.{split}_shards=<their brace URL or pipe: command>"
            )
        return [str(folder / n) for n in names]
    from braceexpand import braceexpand  # webdataset's dependency

    urls = list(braceexpand(pattern))
    key = f"data.{split}_shards"
    if len(urls) != len(names):
        raise DataError(
            f"{key}={pattern} expands to {len(urls)} shard(s), but {path} lists {len(names)} {split} "
            f"shards; give a pattern with one URL per listed shard (e.g. {{000000..{len(names) - 1:06d}}})"
        )
    for url, name in zip(urls, names, strict=True):
        if name not in url:
            raise DataError(
                f"{key}={pattern}: the URL {url} does not name {name}, which {path} lists in its place; "
                f"the pattern must list the index's shards in the index's order"
            )
    kinds = {local: not_regular(local) for local in map(local_path, urls) if local is not None}
    _refuse_special(split, kinds)
    missing = [local for local, kind in kinds.items() if kind in ("missing", "a broken link")]
    if missing:
        raise DataError(
            f"{len(missing)} {split} shard(s) that {key}={pattern} names do not exist: "
            f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}; copy them there, or fix {key}"
        )
    return urls


def local_path(url: str) -> str | None:
    """The file a shard URL reads when it is a local path (plain or file:), else None (pipe:, http:, s3:, ...)."""
    if url.startswith("file:"):
        return url[5:]
    scheme = url.split(":", 1)[0] if ":" in url else ""
    return url if not scheme or len(scheme) == 1 or "/" in scheme else None  # (a Windows drive letter: a path)


def _refuse_special(split: str, kinds: dict[str, str | None]) -> None:
    """DataError naming the first local shard that is a FIFO, socket, device, folder or link loop (opening a FIFO
    blocks the run until a writer comes; a device never ends); a missing one is said by the caller or the read."""
    special = {p: k for p, k in kinds.items() if k is not None and k != "missing" and k != "a broken link"}
    if special:
        path, kind = next(iter(special.items()))
        more = f" ({len(special)} such {split} shards)" if len(special) > 1 else ""
        raise DataError(
            f"the {split} shard {path} is {kind}, not a regular file{more}; replace it with the shard "
            f"file the index lists"
        )


def train_fingerprint(root: str) -> str | None:
    """A short hash of data.root's index.json as the training stream depends on it: the train split's shard
    names and sample counts, in order, and the class names. None when the index cannot be read (a resume then
    compares nothing; load_index refuses such an index before any training)."""
    path = Path(root).expanduser() / INDEX
    try:
        with open_regular(path) as f:
            index = json.loads(f.read().decode("utf-8"))
        shards = [[shard["name"], shard["samples"]] for shard in index["splits"]["train"]["shards"]]
        layout = json.dumps({"classes": index["classes"], "train": shards}, sort_keys=True)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None
    return hashlib.sha256(layout.encode("utf-8")).hexdigest()[:16]


@dataclass
class Missing:
    """A sample that could not be read (a truncated shard, a read error, a sample without an image)."""

    key: str
    reason: str


def read_samples(
    url: str, shard: str, first: int, stop: int, count: int | None = None, labels: bool = True
) -> Iterator[tuple[int, dict | Missing]]:
    """(offset, {ext: bytes, "__key__": key} or Missing) of the samples at offsets first..stop-1 of the
    shard at `url`, in order; samples before `first` are passed over (read, never kept or decoded).

    A shard that ends early or cannot be read further gives Missing for the rest of the range (the
    unreadable-image policy decides); so does its last sample when the shard ends early and that sample lacks
    its image (or, with `labels`, its .cls): a cut between a sample's members. When `stop` is the index's
    `count` for the shard, one more tar header is read: a shard holding more samples than the index says
    raises DataError naming both counts. A `pipe:` command that fails (exit status not 0) raises DataError."""
    from webdataset.gopen import gopen
    from webdataset.tariterators import base_plus_ext, tar_file_iterator

    offset, group, key = 0, {}, None
    stream, reason, extra = None, None, False
    local = local_path(url)
    try:
        stream = open_regular(local) if local is not None else gopen(url)  # a file swapped for a FIFO: no wait
        for member in tar_file_iterator(stream):
            prefix, ext = base_plus_ext(member["fname"])
            if prefix is None:
                continue
            if key is not None and prefix != key:
                # a sample past the index's count: the last one is not given (a loader may ask for no more), the
                # rest are counted, then the shard is refused
                extra = extra or (offset + 1 >= stop and stop == count)
                if offset >= first and not extra:
                    yield offset, {**group, "__key__": key}
                offset, group = offset + 1, {}
                if offset >= stop and not extra:
                    return
            key = prefix
            if offset >= first and not extra:
                group[ext.lower()] = member["data"]
        if extra:
            raise DataError(
                f"{shard} holds {offset + 1} samples but index.json says {count}; rewrite the index "
                f"with vit-shards (or write the shards and index again) so that every sample is read"
            )
        if key is not None:
            cut = offset + 1 < stop and (image_of(group)[0] is None or (labels and "cls" not in group))
            if offset >= first and not cut:
                yield offset, {**group, "__key__": key}
            offset += 0 if cut else 1
        if offset < stop:
            reason = f"{shard} ends after {offset} samples (truncated?)"
    except READ_ERRORS as e:
        _check_pipe(url, stream)
        if extra:
            raise DataError(
                f"{shard} holds more than the {count} samples index.json says; rewrite the index with "
                f"vit-shards (or write the shards and index again) so that every sample is read"
            ) from None
        why = re.sub(r" @ <[^>]*>", "", str(e).splitlines()[0] if str(e) else "")[:120]  # webdataset adds the stream
        reason = f"{shard} cannot be read past sample {offset} ({type(e).__name__}: {why})"
    finally:
        _close(stream)
    for lost in range(max(offset, first), stop):
        yield lost, Missing(f"{shard}#{lost}", reason or "")


def _check_pipe(url: str, stream) -> None:
    proc = getattr(stream, "proc", None)
    if proc is None:
        return
    status = proc.wait()
    if status < 0 and _run_stopping(-status):  # the signal reached the run's process group: not the command's fault
        raise DataError(
            f"reading the shard command {url[5:]!r} ended because this run received "
            f"{signal.Signals(-status).name} and is stopping; resume the run to continue from its last "
            f"checkpoint"
        )
    if status != 0:
        raise DataError(
            f"the shard command {url[5:]!r} failed (exit status {status}); run it in a shell to see why, "
            f"and fix data.train_shards/val_shards"
        )


def _run_stopping(signum: int) -> bool:
    """True when this process received stop signal `signum` (runtime/preemption.py's StopRequest handles it)."""
    try:
        handler = signal.getsignal(signum)
    except ValueError:  # not a signal number
        return False
    return getattr(getattr(handler, "__self__", None), "received", None) is not None


def _close(stream) -> None:
    """Close a shard stream, also one left before its end (a pipe's command is ended, not waited for)."""
    if stream is None:
        return
    proc = getattr(stream, "proc", None)
    if proc is not None and proc.poll() is None:
        proc.kill()
    try:
        stream.close()
    except OSError:
        pass
    if proc is not None:
        proc.wait()


def label_of(sample: dict, classes: int, where: str) -> int:
    """The sample's class index from its .cls member; DataError (one line) when absent or out of range."""
    raw = sample.get("cls")
    if raw is None:
        raise DataError(
            f"{where} has no .cls member (its class index); every training and val sample needs one "
            f"(write the shards with vit-shards)"
        )
    if not re.fullmatch(rb"\s*[0-9]+\s*", raw):  # int() would also take "+2", "0_1", non-ASCII digits
        raise DataError(
            f"{where}.cls holds {raw[:20]!r}, not a class index (ASCII decimal digits); write the shards again"
        )
    label = int(raw)
    if not 0 <= label < classes:
        raise DataError(
            f"{where}.cls is {label}, outside the index's {classes} classes (0..{classes - 1}); the shards "
            f"and index.json do not belong together"
        )
    return label


def image_of(sample: dict) -> tuple[bytes | None, str]:
    """(the encoded image bytes or None, the member's extension)."""
    for ext in IMAGE_EXTS:
        if ext in sample:
            return sample[ext], ext
    return None, ""


def shard_bytes(split: Split) -> int:
    """Bytes of a split's local shard files (0 for URLs that are not files)."""
    return sum(os.path.getsize(u) for u in split.urls if os.path.isfile(u))
