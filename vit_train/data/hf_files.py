"""The files of a Hugging Face dataset on local disk (data=hf): a save_to_disk folder opened with every
file it names checked to be a regular file and its errors turned into one line, and the Hub's parquet
layouts (train-*.parquet, data/train-*.parquet, train/*.parquet) found, one layout a split."""

from __future__ import annotations

import json
import os
from pathlib import Path

from vit_train.errors import DataError
from vit_train.data.regular import not_regular, open_regular


# What load_from_disk raises for a malformed folder: a missing or cut-short file (OSError, pyarrow's
# ArrowInvalid, a ValueError), a state.json that is not JSON (JSONDecodeError, a ValueError) or lacks its
# keys (KeyError, TypeError), a split with no Arrow file (IndexError).
SAVED_ERRORS = (OSError, ValueError, KeyError, IndexError, TypeError)


def load_from_disk(datasets, path: Path):
    """`datasets.load_from_disk(path)` (a Dataset or DatasetDict) after checking its files; raises DataError
    (one line naming the folder) for an empty split, a FIFO or other non-regular file, or a malformed folder."""
    empty = empty_split(path)
    if empty is not None:
        raise DataError(f"split folder {empty} of the save_to_disk folder {path} holds no Arrow file (an empty "
                        f"split); save the split with its rows, or remove it and choose another data.val_split")
    check_saved(path)
    try:
        return datasets.load_from_disk(str(path))
    except SAVED_ERRORS as e:
        raise DataError(f"{path} is not a readable save_to_disk folder ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}); save it again or point data.root at "
                        f"another") from None


def empty_split(path: Path) -> Path | None:
    """The split folder (`path` itself or one of a DatasetDict's) whose state.json lists no Arrow file, if any."""
    for state in [path / "state.json", *sorted(path.glob("*/state.json"))]:
        try:
            with open_regular(state) as f:
                files = json.load(f).get("_data_files")
        except (OSError, ValueError, AttributeError):
            continue  # missing, or malformed: load_from_disk says what is wrong with it
        if files == []:
            return state.parent
    return None


def check_regular(path: Path, what: str) -> None:
    """DataError (one line) when `path`, which `datasets` or pyarrow would open, is a FIFO, socket, device,
    folder or link loop: opening a FIFO blocks until a writer comes, a device never ends."""
    kind = not_regular(path)
    if kind is not None and kind != "missing":
        raise DataError(f"{path} is {kind}, not {what} (a regular file); replace it with the file it stands for "
                        f"or remove it")


def check_saved(path: Path) -> None:
    """Every file load_from_disk opens in the save_to_disk folder `path` (dataset_dict.json, each split's
    state.json, dataset_info.json and Arrow files) is a regular file or missing (then `datasets` says so)."""
    if os.path.lexists(path / "dataset_dict.json"):
        check_regular(path / "dataset_dict.json", "a save_to_disk index")
        try:
            with open_regular(path / "dataset_dict.json") as f:
                splits = json.load(f).get("splits", [])
        except (OSError, ValueError, AttributeError):
            return  # load_from_disk says what is wrong with it
        for split in splits if isinstance(splits, list) else []:
            if isinstance(split, str) and (path / split).is_dir():
                check_saved(path / split)
        return
    for name in ("state.json", "dataset_info.json"):
        check_regular(path / name, "a save_to_disk file")
    try:
        with open_regular(path / "state.json") as f:
            files = json.load(f).get("_data_files", [])
    except (OSError, ValueError, AttributeError):
        return
    for entry in files if isinstance(files, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("filename"), str):
            check_regular(path / entry["filename"], "a save_to_disk Arrow file")


def parquet_files(root: Path) -> dict[str, list[Path]]:
    """{split: its parquet files}: SPLIT-*.parquet or SPLIT/*.parquet in `root` or `root/data`.
    Raises DataError when a split's files are in two of these layouts (a copy would read every row twice)."""
    found: dict[str, dict[str, list[Path]]] = {}  # split: {layout: files}
    for folder in (root, root / "data"):
        if not folder.is_dir():
            continue
        for f in sorted(folder.glob("*.parquet")):
            split = f.name.split("-")[0].split(".")[0]
            found.setdefault(split, {}).setdefault(f"{folder}/{split}*.parquet", []).append(f)
        for sub in sorted(p for p in folder.iterdir() if p.is_dir() and p.name != "data"):
            if parts := sorted(sub.glob("*.parquet")):
                found.setdefault(sub.name, {})[f"{sub}/*.parquet"] = parts
    for split, layouts in found.items():
        if len(layouts) > 1:
            raise DataError(f"split {split!r} of {root} has parquet files in two layouts ({' and '.join(layouts)}), "
                            f"so every row would be read twice; keep one layout and move the other out of data.root")
    return {split: files for split, layouts in found.items() for files in layouts.values()}
