"""Where vit-shards writes (out=): what is refused before the data set is read, the folder the shards go
into, and the swap that replaces an earlier set only once the new one is whole.

Three cases (docs/data.md, "vit-shards"):
- a fresh out=: the shards are written there, index.json last;
- an out= whose index.json lacks the splits asked for (splits=train, then splits=val): the new split's
  shards are written beside the others and the index, holding every split, is rewritten last (atomically);
- overwrite=true: the new set is written into a staging folder inside out= and swapped in only when
  complete, so a failure (a full disk) leaves the earlier set whole.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from vit_train.config import Config
from vit_train.data.decoding.regular import not_regular
from vit_train.errors import ConfigError, OutputError
from vit_train.outputs.places import fsync_dir

INDEX = "index.json"
STAGING = ".vit-shards-staging"  # inside out=: a rename away from its place, on the same file system
SPLITS = ("train", "val")


class Target:
    """Where one vit-shards run writes: `folder` (out= or its staging folder), the index already there
    that the new splits are added to (`added_to`, else None), and the earlier files `old` that go."""

    def __init__(self, out: Path, overwrite: bool, added_to: dict | None, old: list[Path]):
        self.out, self.overwrite, self.added_to, self.old = out, overwrite, added_to, old
        self.folder = out / STAGING if overwrite and old else out
        self.created = not os.path.lexists(out)  # made by this run: removed again after a failure


def refuse_inside_source(cfg: Config, out: Path) -> None:
    """ConfigError when out= is inside a folder the data set is read from (its `read_folders`): a folder in
    an image folder's train/ or val/ would become a class, a folder in a Hugging Face dataset's folder a split
    or its files."""
    target = Path(os.path.realpath(out))
    for folder in cfg.data.read_folders():
        if target == folder or folder in target.parents:
            raise ConfigError(
                f"out={out} is inside {folder}, which data={cfg.data.name} reads (the shards would "
                f"become part of the data set); choose an out= outside it"
            )


def refuse_used(out: Path, splits: list[str], overwrite: bool) -> Target:
    """The Target of writing `splits` into `out`. Refuses (ConfigError, one line) a file, FIFO or other
    non-folder as `out`, and an `out` holding shards or an index unless `overwrite` or the index lacks
    every split asked for (then they are added to it)."""
    if os.path.lexists(out) and not out.is_dir():
        kind = not_regular(out) or "a file"
        raise ConfigError(
            f"out={out} is {kind if kind != 'missing' else 'a broken link'}; give a folder for the shards"
        )
    if not out.is_dir():
        return Target(out, overwrite, None, [])
    tars = sorted(p for p in out.glob("*.tar") if p.name.split("-")[0] in SPLITS)
    has_index = os.path.lexists(out / INDEX)
    if overwrite or not (tars or has_index):
        return Target(out, overwrite, None, tars + ([out / INDEX] if has_index else []))
    index = _read_index(out / INDEX) if has_index else None
    if index is None:
        first = tars[0].name if tars else INDEX
        raise ConfigError(
            f"out={out} already holds shards or an {INDEX} ({first}, {len(tars) + has_index} in "
            f"all); choose another out= or add overwrite=true to replace them"
        )
    there = [s for s in splits if s in index["splits"]]
    if there:
        raise ConfigError(
            f"out={out} already holds split {there[0]!r} (its {INDEX} lists "
            f"{', '.join(index['splits'])}); choose another out=, give splits= only splits it "
            f"lacks to add them, or add overwrite=true to replace the set"
        )
    listed = {s["name"] for split in index["splits"].values() for s in split["shards"]}
    return Target(out, False, index, [p for p in tars if p.name.split("-")[0] in splits and p.name not in listed])


def _read_index(path: Path) -> dict | None:
    """The index at `path` when it is one vit-shards wrote (format, classes, splits with shard lists)."""
    try:
        if not_regular(path) is not None:
            return None
        with open(path) as f:
            index = json.load(f)
        splits = index["splits"]
        if (
            index.get("format") == "vit-train webdataset"
            and isinstance(index.get("classes"), list)
            and all(
                isinstance(s["shards"], list) and all(isinstance(x["name"], str) for x in s["shards"])
                for s in splits.values()
            )
        ):
            return index
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def prepare(target: Target, classes: list[str]) -> None:
    """Make the folder the shards are written into (after the data set was read: one that cannot be read
    leaves nothing behind); remove stray shards of the splits being added (listed by no index). Raises
    ConfigError when the data set's classes differ from those of the index the splits are added to."""
    if target.added_to is not None and list(target.added_to["classes"]) != list(classes):
        raise ConfigError(
            f"out={target.out} holds shards of other classes ({_short(target.added_to['classes'])} vs "
            f"{_short(classes)}); add splits only from the data set the others came from, or choose "
            f"another out="
        )
    try:
        if target.folder != target.out:
            shutil.rmtree(target.folder, ignore_errors=True)  # left by a run killed before its swap
        target.folder.mkdir(parents=True, exist_ok=True)
        if target.added_to is not None:
            for path in target.old:
                path.unlink()
        probe = target.folder / ".vit-shards-probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise OutputError(
            f"cannot write into out={target.out} ({e.strerror or e}); choose a folder you can write to"
        ) from None


def merged(target: Target, index: dict) -> dict:
    """`index` (the splits just written) with the splits of the index they are added to, if any."""
    if target.added_to is None:
        return index
    old = target.added_to
    same = old.get("image_size") is not None and old.get("image_size") == index["image_size"]
    return {
        **index,
        "image_size": index["image_size"] if same else None,
        "splits": {**old["splits"], **index["splits"]},
    }


def abandon(target: Target, writers: list = ()) -> None:
    """After a failure (a full disk, a val image that cannot be read after train was written, Ctrl-C): every
    shard this run wrote removed (each SplitWriter's `abandon`), the staging folder too (the earlier set
    untouched), and out= itself where this run made it and nothing else is in it: a re-run after the fix
    starts as the first did, with no overwrite=true."""
    for writer in writers:
        writer.abandon()
    if target.folder != target.out:
        shutil.rmtree(target.folder, ignore_errors=True)
    if target.created:
        try:
            target.out.rmdir()
        except OSError:
            pass


def failure_note(target: Target) -> str:
    """What a failed write leaves, for its one line."""
    if target.folder != target.out:
        return f"the earlier set in {target.out} is kept as it was"
    if target.added_to is not None:
        return f"{INDEX} still lists only {', '.join(target.added_to['splits'])}; the new shards are removed"
    return "the shards written are removed"


def finish(target: Target, index: dict) -> None:
    """Write `index` last (a temporary file renamed into place) and, for overwrite=true, swap the staged
    set in: the old index goes first, then the old shards, the new shards are renamed in, the new index last."""
    if target.folder == target.out:
        write_index(target.folder, index)
        return
    try:
        write_index(target.folder, index)
    except OutputError as e:
        abandon(target)
        raise OutputError(f"{str(e).split(' (the shards')[0]}; {failure_note(target)}") from None
    out, staged = target.out, target.folder
    try:
        (out / INDEX).unlink(missing_ok=True)  # first: while shards are swapped, no index says they are whole
        for path in target.old:
            if path.name != INDEX:
                path.unlink(missing_ok=True)
        for path in sorted(staged.iterdir()):
            if path.name != INDEX:
                os.replace(path, out / path.name)
        os.replace(staged / INDEX, out / INDEX)
        fsync_dir(out)
        staged.rmdir()
    except OSError as e:
        raise OutputError(
            f"cannot move the new shards from {staged} into {out} ({e.strerror or e}); the new set "
            f"is whole in {staged}: move its files into {out} by hand"
        ) from None


def write_index(folder: Path, index: dict) -> None:
    """`folder`/index.json written through a temporary file, fsynced, renamed into place."""
    tmp = folder / (INDEX + ".tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(index, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / INDEX)
        fsync_dir(folder)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OutputError(
            f"cannot write {folder / INDEX} ({e.strerror or e}); free space or choose another out= "
            f"(the shards are there, but without {INDEX} they are not read as a set)"
        ) from None


def _short(names: list[str]) -> str:
    return ", ".join(map(str, names[:5])) + (", ..." if len(names) > 5 else "")
