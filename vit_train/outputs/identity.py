"""The identity of weights, as data: the run id made at a run's start, and the comparisons every door
for weights makes (objectives/weights_in.py): class names, and whether a checkpoint in a run
directory belongs to that run. The architecture half of the record is models/architecture.py's.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import torch


def new_run_id() -> str:
    """A run's id: 32 hex digits (uuid4), made when a run starts fresh and kept across its resumes."""
    return uuid.uuid4().hex


def class_difference(theirs: list[str], ours: list[str], there: str = "there", here: str = "here") -> str | None:
    """None when the two class lists are equal (same names, same order); else the first difference in
    words: "class 0 is 'bar' there and 'circle' here" or the counts when one list is a prefix of the other
    (`there`, `here`: the words for the two sides)."""
    theirs, ours = [str(c) for c in theirs], [str(c) for c in ours]
    if theirs == ours:
        return None
    for index, (a, b) in enumerate(zip(theirs, ours)):
        if a != b:
            moved = f"; '{b}' is class {theirs.index(b)} {there}" if b in theirs else f"; '{b}' is not among those {there}"
            return (f"class {index} is '{a}' {there} and '{b}' {here}{moved} ({len(theirs)} classes {there}, "
                    f"{len(ours)} {here})")
    return f"{len(theirs)} classes {there}, {len(ours)} {here} (the first {min(len(theirs), len(ours))} agree)"


def shown_classes(names: list[str], limit: int = 5) -> str:
    """A class list in a log line: [bar, circle, square] or its first `limit` names and the count."""
    names = [str(n) for n in names]
    return "[" + ", ".join(names[:limit]) + (f", ... {len(names)} in all" if len(names) > limit else "") + "]"


def run_id_of(ckpt: dict[str, Any]) -> str | None:
    """The run id a checkpoint records (None before run ids were kept)."""
    return ckpt.get("run_id") or (ckpt.get("identity") or {}).get("run_id")


def recorded_run_ids(run_dir: Path, besides: Path) -> dict[str, str]:
    """{file: run id} of what `run_dir` records of its own run, other than the checkpoint `besides`:
    results.json's run_id and the run ids of its other checkpoints (another file than `besides`: best.pt
    and step files are usually hard links to a last.pt version). Unreadable files are passed over."""
    found: dict[str, str] = {}
    try:
        rid = json.loads((run_dir / "results.json").read_text()).get("run_id")
        if isinstance(rid, str):
            found["results.json"] = rid
    except (OSError, ValueError, AttributeError):
        pass
    folder = run_dir / "checkpoints"
    for path in sorted(folder.glob("*.pt")) if folder.is_dir() else []:
        try:
            if besides.exists() and os.path.samefile(path, besides):
                continue
            ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception:  # a damaged or foreign file: resume passes over those itself
            continue
        rid = run_id_of(ckpt) if isinstance(ckpt, dict) else None
        if rid:
            found[f"checkpoints/{path.name}"] = rid
    return found
