"""What vit-eval reports: metrics, per-class accuracy, the confusion matrix and figures, written as
one evaluation's files.

Where they go (`eval_dir`): the run's `eval/` for an evaluation of the run's own val set at the size
it was trained at, `eval/<what changed>/` (e.g. `eval/model.img_size=48/`) for any other, or `out=`.
The folder holds one evaluation: the new files are renamed over the earlier evaluation's (its
metrics.json names them), metrics.json last, and only then are the earlier figures the new evaluation
does not list removed; a kill at any point leaves every file the old one or the complete new one and
every figure a metrics.json lists present (`write_evaluation`), and metrics.json says what was evaluated.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vit_train.checkpoint import check_classes
from vit_train.config import Config, run_dir_of
from vit_train.errors import ConfigError
from vit_train.extras import available
from vit_train.outputs.places import FREE_SPACE, check_output_folder, fsync_dir, fsync_file, os_error_of, place_error
from vit_train.runtime.device import autocast_dtype, pick_device
from vit_train.schema.typed import options
from vit_train.tools.inference import Weights, load_for_inference
from vit_train.viz.figures import first_images, save_figure

log = logging.getLogger("vit_train")

STALE = ".vit-eval-stale.json"  # the earlier figures a replacement removes once its metrics.json is in place
NAMED_SECTIONS = ("model", "data", "trainer")  # what vit-eval may change; of trainer, only the precision names a folder


def changed_keys(saved: dict, cfg: Config) -> dict[str, Any]:
    """{"section.key": value} of the model/data/trainer keys in which `cfg` differs from the checkpoint's
    `saved` config (both read through the schema, so a key added since the run was saved is no change)."""
    before = Config.from_saved({**saved, "resume": None}).to_dict()
    after = cfg.to_dict()
    return {
        f"{section}.{key}": value
        for section in NAMED_SECTIONS
        for key, value in after[section].items()
        if before[section].get(key) != value
    }


def eval_dir(ckpt_path: Path, changed: dict[str, Any], same: set[str] = frozenset()) -> Path:
    """The run's eval/ folder (of the run `ckpt_path` belongs to: a checkpoint, or a file in the run's
    export/), or eval/<changes>/ when what is evaluated changed: each changed key that names one (not one
    of `same`, the data set's keys that change how its images are read, not which: `all_loading_keys`; of
    trainer.* only trainer.precision) as key=value, joined by ','.
    A value with characters other than letters, digits and ._+- (a path) keeps its last part, those
    characters as '_', and the name gets 8 hex digits of the exact values, so two roots never share it."""
    named = {
        k: v for k, v in changed.items() if k not in same and (not k.startswith("trainer.") or k == "trainer.precision")
    }
    if (
        ckpt_path.parent.name == "export"
    ):  # a file or Hub folder vit-export wrote (run/export/x.safetensors, run/export/best-hf)
        run_dir = ckpt_path.parent.parent
    else:  # a Hub folder elsewhere is a file here: eval/ goes beside it, never into the folder timm reads
        run_dir = ckpt_path.parent if ckpt_path.is_dir() else run_dir_of(str(ckpt_path))
    base = run_dir / "eval"  # a file vit-export wrote: its run's eval/ too
    if not named:
        return base
    exact = ",".join(f"{k}={v}" for k, v in named.items())
    readable = ",".join(f"{k}={_readable(v)}" for k, v in named.items())
    if readable != exact or len(readable) > 100:
        readable = f"{readable[:100]}-{hashlib.sha256(exact.encode()).hexdigest()[:8]}"
    return base / readable


def _readable(value: Any) -> str:
    text = str(value)
    if "/" in text:
        text = Path(text).name or text
    return re.sub(r"[^A-Za-z0-9._+-]", "_", text)


def previous_files(out: Path) -> list[Path]:
    """The files of the evaluation written to `out` before: its metrics.json first, then the PNG figures
    it lists; nothing else (`out=` may be a folder that holds other things). Raises ConfigError (one
    line) when `out` holds a metrics.json of another tool (no "checkpoint" key), or one that is not a
    regular file (a FIFO, which reading would block on; a folder): nothing there is replaced or removed."""
    previous = out / "metrics.json"
    try:
        mode = os.stat(previous).st_mode
    except OSError:
        return []
    if not stat.S_ISREG(mode):
        raise ConfigError(f"{previous} is not a regular file (a folder, a FIFO or a device); give another out= folder")
    try:
        before = json.loads(previous.read_text())
    except (OSError, ValueError):
        return [previous]
    if not isinstance(before, dict) or "checkpoint" not in before or not isinstance(before.get("figures", []), list):
        raise ConfigError(
            f"{out} holds a metrics.json that vit-eval did not write; give another out= folder, so "
            f"that nothing of another tool's is replaced or removed"
        )
    figures = [out / Path(str(name)).name for name in before.get("figures", [])]
    return [previous] + [f for f in figures if f.suffix == ".png" and f.is_file()]  # vit-eval writes PNGs only


def clear_previous(out: Path) -> None:
    """Remove the files of the evaluation written to `out` before (`previous_files`), nothing else.
    Raises ConfigError as `previous_files` does, removing nothing."""
    for path in previous_files(out):
        path.unlink(missing_ok=True)


def evaluate_checkpoint(
    path: str | Path,
    overrides: dict | None = None,
    weights: Weights = "auto",
    attention_images: int = 8,
    out_dir: str | Path | None = None,
    progress: bool = True,
    unwritten: Callable[[dict], None] | None = None,
) -> dict[str, Any]:
    """Evaluate a checkpoint on its val set (or another with the same classes, or at another
    model.img_size: `overrides`, a nested dict); write metrics.json and the figures to `out_dir`
    (default: `eval_dir`), replacing the evaluation written there before (`clear_previous`); returns
    the metrics, with what was evaluated (checkpoint, step, weights, img_size, overrides). `unwritten`: called
    with the results (no "out_dir", "figures" empty) when writing them fails, before the error is raised, so
    the numbers can still be shown (vit-eval prints them)."""
    trained = load_for_inference(path, weights, overrides)  # a run directory: its best.pt (trained.path)
    model, cfg = trained.model, trained.cfg
    changed = changed_keys(trained.checkpoint["config"], cfg)
    out = Path(out_dir) if out_dir else eval_dir(trained.path, changed, cfg.data.all_loading_keys())
    check_output_folder(out, "out")  # a read-only, missing or file-blocked place is said before the evaluation
    previous_files(out)  # and another tool's metrics.json there
    objective = cfg.objective
    device = pick_device(cfg.trainer.device)
    data = cfg.data.build(cfg, device, labels=objective.reads_labels)
    if objective.reads_labels:  # an MAE checkpoint evaluates on any images: it read no labels
        check_classes(trained.checkpoint, data.class_names)
    model.to(device)
    # the run's own evaluation (objectives/): a classifier's with its confusion matrix, MAE's reconstruction loss
    metrics = objective.evaluate(
        model, data.val_loader, device, autocast_dtype(cfg.trainer.precision, device), cfg, progress, confusion=True
    )
    what = {
        "checkpoint": str(trained.path),
        "step": trained.step,
        "weights": trained.source,
        "objective": objective.name,
        "data": cfg.data.name,
        "data_root": cfg.data.location(),
        "img_size": cfg.model.img_size,
        "trained_img_size": trained.trained_size,
        "overrides": changed,
    }
    figures = {}
    if attention_images > 0 and not available("matplotlib"):
        log.warning("figures skipped: they need matplotlib (pip install 'vit-train[viz]')")
    elif attention_images > 0:
        images, labels = first_images(data.val_loader, attention_images)
        figures = objective.figures(model, images, labels, data.class_names, data.stats, metrics.get("confusion"))
    return write_evaluation(out, {**what, **objective.evaluation(metrics, data.class_names)}, figures, unwritten)


def evaluation_text(results: dict[str, Any], what: str) -> str:
    """vit-eval's text of `results` (evaluate_checkpoint's), as the objective that trained the checkpoint reads
    them, starting with `what` was evaluated."""
    return options("objective")[results["objective"]].report(results, what)


def write_evaluation(
    out: Path, results: dict[str, Any], figures: dict, unwritten: Callable[[dict], None] | None = None
) -> dict[str, Any]:
    """`figures` ({name: matplotlib figure}) as `out`/<name>.png and `results` as `out`/metrics.json;
    returns the results with "figures" (the PNGs' paths) and "out_dir".

    Every file is first written and fsynced under a temporary name; only then are the new ones renamed
    over the earlier evaluation's (`previous_files`), metrics.json last (the commit point: it lists the
    figures), the folder fsynced, and the earlier figures the new evaluation does not list removed (named
    first in STALE, so that a vit-eval killed before removing them has the next one remove them). A kill
    at any point leaves each file the old one or the complete new one, every figure a metrics.json lists
    present, and with the new metrics.json every figure new. A write that fails (a full disk, a read-only
    folder) removes the temporary files and leaves the earlier evaluation as it was, and removes the
    folders it made for `out` (none left empty): OutputError, one line naming the file, after `unwritten`
    (when given) got the results."""
    made = [folder for folder in (out, *out.parents) if not folder.exists()]  # deepest first
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        error = place_error(e, out, f"{FREE_SPACE} (out=)", "give another out=")  # while its folders stand
        _unwritten(results, unwritten, made)
        raise error from None
    earlier = previous_files(out)
    _remove_leftovers(out, earlier)
    results = {**results, "figures": [str(out / f"{name}.png") for name in figures]}
    finals = {out / f"{name}.png" for name in figures} | {out / "metrics.json"}
    stale = [path for path in earlier if path not in finals]  # earlier figures the new evaluation does not list
    staged: list[tuple[Path, Path]] = []  # (temporary, final)
    try:
        if stale:  # named before the commit point: a vit-eval killed after it has the next one remove them
            (out / STALE).write_text(json.dumps([path.name for path in stale]) + "\n")
        for name, fig in figures.items():
            staged.append((out / f".{name}.tmp.png", out / f"{name}.png"))  # the suffix tells matplotlib the format
            save_figure(fig, staged[-1][0])
            fsync_file(staged[-1][0])
        staged.append((out / "metrics.json.tmp", out / "metrics.json"))
        staged[-1][0].write_text(json.dumps(results, indent=2) + "\n")
        fsync_file(staged[-1][0])
    except Exception as e:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        (out / STALE).unlink(missing_ok=True)
        failed = os_error_of(e)
        if failed is None:
            raise
        error = place_error(failed, staged[-1][1] if staged else out, f"{FREE_SPACE} (out=)", "give another out=")
        _unwritten({**results, "figures": []}, unwritten, made)  # after the line: it names the place's free space
        raise error from None
    for tmp, final in staged:  # renames and removals only from here: no write that a full disk can refuse
        os.replace(tmp, final)  # over the earlier file of that name: a reader finds the old one or the new one
    fsync_dir(out)  # metrics.json, renamed last, is the commit point
    if stale:
        for path in stale:
            path.unlink(missing_ok=True)
        (out / STALE).unlink(missing_ok=True)
    return {**results, "out_dir": str(out)}


def _remove_leftovers(out: Path, listed: list[Path]) -> None:
    """Remove what a killed vit-eval left in `out`: its temporary files, and the earlier figures it had
    not yet removed (named in STALE) that the metrics.json there (`listed`: `previous_files`) does not list."""
    for left in [*out.glob(".*.tmp.png"), out / "metrics.json.tmp"]:
        left.unlink(missing_ok=True)
    record = out / STALE
    if not record.is_file():
        return
    with contextlib.suppress(OSError, ValueError, TypeError):
        for name in json.loads(record.read_text()):
            path = out / Path(str(name)).name
            if path.suffix == ".png" and path not in listed:  # vit-eval's PNGs only, never a listed one
                path.unlink(missing_ok=True)
    record.unlink(missing_ok=True)


def _unwritten(results: dict[str, Any], unwritten: Callable[[dict], None] | None, made: list[Path]) -> None:
    """After a failed write: remove the folders made for it that are empty (deepest first), then hand the
    results to `unwritten`."""
    for folder in made:
        with contextlib.suppress(OSError):  # not empty, or never made
            folder.rmdir()
    if unwritten is not None:
        unwritten(results)
