"""The identity of weights, as data: the run id made at a run's start, and the comparisons every door
for weights makes (weights.py `open_weights`, a resume): class names, and whether a checkpoint in a run
directory belongs to that run; the record an export carries for one set of a checkpoint's weights. The
architecture half of the record is models/architecture.py's.
"""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from vit_train.checkpoint.files import read_archive
from vit_train.errors import CheckpointError


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
    for index, (a, b) in enumerate(zip(theirs, ours, strict=False)):
        if a != b:
            moved = (
                f"; '{b}' is class {theirs.index(b)} {there}" if b in theirs else f"; '{b}' is not among those {there}"
            )
            return (
                f"class {index} is '{a}' {there} and '{b}' {here}{moved} ({len(theirs)} classes {there}, "
                f"{len(ours)} {here})"
            )
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
            ckpt = read_archive(path, mmap=True)
        except Exception:  # a damaged or foreign file: resume passes over those itself
            continue
        rid = run_id_of(ckpt) if isinstance(ckpt, dict) else None
        if rid:
            found[f"checkpoints/{path.name}"] = rid
    return found


def mixed_runs(run_dir: Path, path: Path, run_id: str | None) -> tuple[dict[str, str], str, list[str]] | None:
    """Whether `run_dir` holds files of more than one run, counting the checkpoint `path` (run id `run_id`)
    taken from it or offered to it: None when they agree (or record no ids), else ({file: run id} of the
    files of another run than the directory's, the directory's run id, its own files). The directory's
    run is the one its results.json names, else the one most of its checkpoints name."""
    inside = path.resolve().parent == (run_dir / "checkpoints").resolve()
    taken = f"checkpoints/{path.name}" if inside else str(path)
    ids = {taken: run_id, **recorded_run_ids(run_dir, besides=path)}
    ids = {where: rid for where, rid in ids.items() if rid}
    if len(set(ids.values())) < 2:
        return None
    counts = Counter(rid for where, rid in ids.items() if where != "results.json" and (inside or where != taken))
    own = ids.get("results.json") or counts.most_common(1)[0][0]
    return ({w: r for w, r in ids.items() if r != own}, own, [w for w, r in ids.items() if r == own])


def mixed_text(run_dir: Path, strangers: dict[str, str], own: str, mine: list[str]) -> str:
    """`mixed_runs`' finding in words: which files are another run's."""
    named, theirs = ", ".join(strangers), next(iter(strangers.values()))
    return (
        f"{run_dir} holds files of two runs: {named} {'is' if len(strangers) == 1 else 'are'} run {theirs[:8]}'s, "
        f"{', '.join(mine)} run {own[:8]}'s: another run's checkpoint was put here"
    )


def check_classes(ckpt: dict, class_names: list[str]) -> None:
    """Refuse data whose classes differ from the checkpoint's (known only once the data is loaded; a resumed
    run and vit-eval's report both check): CheckpointError, one line."""
    difference = class_difference(list(ckpt["class_names"]), list(class_names), "saved", "in the data now")
    if difference is not None:
        raise CheckpointError(
            f"the checkpoint does not fit this data (classes: {len(ckpt['class_names'])} saved, "
            f"{len(class_names)} in the data now: {difference.split(' (')[0]}); use "
            f"the data it was trained on, or start a new run from its weights "
            f"(model.pretrained=<the checkpoint> model.reset_head=true)"
        )


def weights_identity(ckpt: dict[str, Any], source: str) -> dict[str, Any] | None:
    """A checkpoint's identity record (contents.py writes it; models/architecture.py `identity`) for
    one set of its weights: with "weights" (`source`), "step" and "score" (`eval_score`). None for a
    checkpoint written before the record (the door for weights rebuilds it from the config)."""
    if not ckpt.get("identity"):
        return None
    record = {**ckpt["identity"], "weights": source}
    if "step" not in record:  # a checkpoint's record; an export's says its step and score already
        record.update(step=ckpt.get("step"), score=eval_score(ckpt, source))
    return record


def eval_score(ckpt: dict[str, Any], source: str) -> dict[str, Any] | None:
    """{"metric", "value", "step"} of the weights `source` ("model" or "ema") at a checkpoint's last
    evaluation (`last_eval`), None when it records none."""
    last = ckpt.get("last_eval") or {}
    if source in last:  # "partial": scored on a share of the val set (trainer.limit_val_batches)
        return {
            "metric": last.get("metric") or "top1",
            "value": last[source],
            "step": last.get("step"),
            **({"partial": True} if last.get("partial") else {}),
        }
    return None
