"""Resuming a run: the one door that finds the checkpoint to continue from (`find_start`), which config
changes a resumed run may make (docs/resuming.md has the table: `check_compatible` refuses a change that
makes the checkpoint's state mean something else, `check_data_position` one that would reorder the epoch
a run resumes in the middle of), completing a save a kill cut short, and what the log says about it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vit_train.checkpoint import (
    TrainState,
    find_resume_checkpoint,
    mixed_runs,
    mixed_text,
    position_from_batches,
    repair_run_checkpoints,
    run_checkpoints,
    run_id_of,
)
from vit_train.config import Config
from vit_train.errors import CheckpointError, ConfigError
from vit_train.schema import legacy
from vit_train.schema.config import OPTION_GROUPS
from vit_train.schema.sections import TrainerConfig


def find_start(resume: str | None, run_dir: Path) -> tuple[Path, dict] | None:
    """The checkpoint a run in `run_dir` continues from, loaded (mapped: a machine's processes share one copy),
    or None for a fresh start: `resume` null, `auto` (the newest readable checkpoint of `run_dir`; none there
    starts fresh), a run directory or a file (vit_train/checkpoint/). Raises CheckpointError (one line, nothing
    touched) for a fresh start in a directory that holds checkpoints, and for a checkpoint of another run than
    the directory's (`check_own_run`). The command line calls it for resume=PATH (it needs the saved config),
    train() for the rest: once per run."""
    found = find_resume_checkpoint(resume, run_dir, mmap=True)
    if found is None and run_checkpoints(run_dir):
        raise CheckpointError(
            f"{run_dir} already holds checkpoints; continue that run with resume=auto (or "
            f"resume={run_dir}), or start this one in another directory (hydra.run.dir=...)"
        )
    if found is not None:
        check_own_run(Path(found[0]), found[1], run_dir)
    return found


def check_own_run(path: Path, ckpt: dict, run_dir: Path) -> None:
    """Refuse (CheckpointError, one line, nothing touched) to resume in a run directory whose files name
    more than one run (checkpoint/identity.py `mixed_runs`): another run's checkpoint copied in (as last.pt,
    a step file or best.pt) would be continued here, or kept beside this run's; resuming another run's
    file into a directory that holds a run would overwrite it. Checkpoints written before run ids were
    kept are not checked."""
    inside = path.resolve().parent == (run_dir / "checkpoints").resolve()
    found = mixed_runs(run_dir, path, run_id_of(ckpt))
    if found is None:
        return
    strangers, own, mine = found
    if not inside and str(path) in strangers:  # resume=<another run's file> into a directory that holds a run
        raise CheckpointError(
            f"{path} is run {strangers[str(path)][:8]}'s checkpoint, but {run_dir} holds run "
            f"{own[:8]}'s files ({', '.join(mine)}): continued there it would overwrite them; "
            f"resume it in a new directory (hydra.run.dir=<a new directory>)"
        )
    raise CheckpointError(
        f"{mixed_text(run_dir, strangers, own, mine)}; move {', '.join(strangers)} out of {run_dir} "
        f"(to continue that run: resume=<its file> hydra.run.dir=<a new directory>), then resume"
    )


def check_data_position(state: TrainState, ckpt: dict, cfg: Config, train_images: int, world_size: int) -> None:
    """Make sure a run resumed in the middle of an epoch continues that epoch's permutation.

    The position is kept in images (`sample_in_epoch`), so a changed data.batch_size continues
    from the same image (data/sampler.py). What would reorder the epoch's permutation (another
    training-set size, data.repeated_aug or seed, or what the data set's own order depends on: its
    `position_changes`) is refused with a ConfigError: images would be skipped or trained on twice. A
    checkpoint written before positions were counted in images gets its position from its own batch size."""
    saved = legacy.upgrade_saved(ckpt["config"])
    position_from_batches(state, saved["data"]["batch_size"], train_images)
    if not state.sample_in_epoch:
        return  # at an epoch's boundary: the next epoch is a new permutation anyway
    before = {"data.repeated_aug": saved["data"].get("repeated_aug", 1), "seed": saved.get("seed", 0)}
    now = {"data.repeated_aug": cfg.data.repeated_aug, "seed": cfg.seed}
    changed = (
        [f"the training set holds {train_images} images, not {state.train_images}"]
        if (state.train_images and state.train_images != train_images)
        else []
    )
    changed += [f"{key} is {now[key]}, not {before[key]}" for key in before if now[key] != before[key]]
    changed += cfg.data.position_changes(saved["data"], ckpt.get("stream_layout"), world_size)
    if changed:
        end = state.step - (-(state.epoch_end - state.sample_in_epoch) // saved["data"]["batch_size"])
        # (not trainer.max_steps=<end>: the warmup and cosine schedule would be fitted to that shorter run)
        cap = cfg.trainer.max_steps
        raise_cap = f" with trainer.max_steps raised to at least {end} (it is {cap})" if cap and cap < end else ""
        raise ConfigError(
            f"cannot resume in the middle of epoch {state.epoch + 1} ({state.sample_in_epoch} of its "
            f"{state.epoch_end} images trained on): {' and '.join(changed)}, which reorders the epoch; "
            f"resume with the saved settings past the epoch's end at step {end} (it writes "
            f"checkpoints/step_{end:08d}.pt){raise_cap}, then resume from that file with the change, "
            f"or start a new run from these weights with model.pretrained=<the checkpoint>"
        )


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for k, v in d.items():
        if isinstance(v, dict):
            flat.update(_flatten(v, f"{prefix}{k}."))
        else:
            flat[f"{prefix}{k}"] = v
    return flat


def config_changes(saved: dict, current: dict) -> list[tuple[str, Any, Any]]:
    """(key, saved value, current value) for every key that differs, `resume` aside."""
    old, new = _flatten(saved), _flatten(current)
    keys = sorted(set(old) | set(new))
    return [(k, old.get(k), new.get(k)) for k in keys if k != "resume" and old.get(k) != new.get(k)]


def _unread(saved: dict) -> set[str]:
    """The dotted keys the saved run's choices did not read (a ResNet's model.embed_dim): changing one changes nothing."""
    try:
        cfg = Config.from_dict(saved)
    except ConfigError:  # a saved config today's checks refuse: every key counts
        return set()
    return {f"{name}.{key}" for name, section in cfg.sections().items() for key, _, _ in section.ignored(cfg)}


def refusal(cfg: Config, key: str, saved_value: Any, saved_keys: dict[str, Any], unread: set[str]) -> str | None:
    """Why the resumed config `cfg` may not have `key` changed from `saved_value`, or None: the refused keys are
    each section's own (`refused_on_resume`, the option chosen now); a key the checkpoint's config lacks (newer
    than it: its default ran) or its run did not read may change."""
    if key not in saved_keys or key in unread or "." not in key:
        return None
    section, leaf = key.split(".", 1)
    owner = cfg.sections().get(section)
    return owner.resume_refusal(leaf, saved_value) if owner is not None else None


def check_compatible(
    ckpt: dict, cfg: Config, path: Any = "<the checkpoint>", overrides: Sequence[str] | None = None
) -> list[str]:
    """Refuse, before any work, a resumed config that changes what the checkpoint's state means.

    `ckpt` is the loaded checkpoint (its "config", of this version's layout or an earlier one's), `cfg` the
    resumed run's config, `path` the checkpoint's file, named in the message, `overrides` the command line's
    (None: not known), which the advice reads to say where a change comes from (`_keep_advice`). Raises
    CheckpointError (one line: each refused key with its saved and new value, why, and what to do instead).
    Returns the other changes as "key: old -> new" lines, for the log.
    """
    saved = legacy.upgrade_saved(ckpt["config"])
    changes = config_changes(saved, cfg.to_dict())
    saved_keys, unread = _flatten(saved), _unread(saved)
    why = {k: refusal(cfg, k, a, saved_keys, unread) for k, a, _ in changes}
    refused = [(k, a, b) for k, a, b in changes if why[k]]
    if refused:
        what = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in refused)
        reasons = "; ".join(dict.fromkeys(why[k] for k, _, _ in refused))
        keep = " ".join(
            f"{k.partition('.')[0]}={a}" if _group_choice(k, cfg) else f"{k}={cli_value(a)}" for k, a, _ in refused
        )
        raise CheckpointError(
            f"cannot resume {path} with a changed config ({what}): {reasons}; resume with the saved "
            f"settings ({_keep_advice(keep, [k for k, _, _ in refused], cfg, overrides)}), "
            f"{_instead(refused, path, cfg)} (see docs/resuming.md)"
        )
    cfg.objective.check_resume(ckpt.get("objective"), path)  # what its state needs (distill: the same teacher file)
    return [
        f"{k}: {a!r} -> {b!r}"
        + (" (ignored: a resumed run continues from its checkpoint's weights)" if k == "model.pretrained" else "")
        for k, a, b in changes
        if (k, a, b) not in refused
    ]


def _keep_advice(keep: str, keys: list[str], cfg: Config, overrides: Sequence[str] | None) -> str:
    """How to resume with the saved settings `keep` (key=value words) of the refused `keys`. resume=PATH reads the
    run's config from the checkpoint, so dropping the override restores it; resume=auto composes it from the command
    line, where dropping an override gives the default, not the run's value: there `keep` is the advice, said with
    where the change came from (an override the command line gave, or the defaults it composed)."""
    if cfg.resume != "auto":
        return f"drop the override, or give {keep}"
    if overrides is None:
        return f"give {keep}"
    given = [key for key in keys if _overridden(key, overrides)]
    if len(given) == len(keys):
        return f"give {keep} in place of the override"
    if not given:
        return f"give {keep}: resume=auto composes this command's defaults, not the run's settings"
    return f"give {keep}, in place of the override of {', '.join(given)}; the rest come from this command's defaults"


def _overridden(key: str, overrides: Sequence[str]) -> bool:
    """Whether one of the command line's `overrides` sets the dotted `key`: the key itself, a group or section above
    it (model=vit_small, model.depth), or an experiment (which may set any key)."""
    for override in overrides:
        name = override.split("=", 1)[0].lstrip("+~")
        if name == "experiment" or key == name or key.startswith(f"{name}."):
            return True
    return False


def _instead(refused: list[tuple[str, Any, Any]], path: Any, cfg: Config) -> str:
    """What else to do than resume, by the kind of the refused keys: a new run from the weights, when they can load."""
    no_fit = [k for k, _, _ in refused if k.startswith("model.") and type(cfg.model).no_fit(k.removeprefix("model."))]
    if no_fit:
        return (
            f"or start a new run from scratch with the change ({', '.join(no_fit)}: the checkpoint's weights do "
            f"not fit the new architecture, so model.pretrained={path} would not load them either)"
        )
    if any(k.startswith("objective.") and k != "objective.name" for k, _, _ in refused):
        return cfg.objective.restart_hint(path)
    new_head = " model.reset_head=true" if any(k == "data.name" for k, _, _ in refused) else ""
    return f"or start a new run from its weights: vit-train model.pretrained={path}{new_head} <your overrides>"


def _group_choice(key: str, cfg: Config) -> bool:
    """Whether the command line spells `key` as a group choice: an option's name on a run that composes its config
    from the command line (resume=auto: objective=mae), not from the checkpoint (resume=PATH: objective.name=mae)."""
    group, _, leaf = key.partition(".")
    return cfg.resume == "auto" and leaf == "name" and group in OPTION_GROUPS


def cli_value(value: Any) -> str:
    """A value as a command-line override writes it."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def complete_interrupted_save(path: Path, run_dir: Path, state: TrainState, keep_last: int) -> None:
    """A resume from this run's own checkpoint first completes the save a kill may have cut short: its step
    file, best.pt holding the run's best step, the rotation (checkpoint/saving.py `repair_run_checkpoints`). Another
    run's checkpoint (resume=<its file>) is left as it is."""
    folder = run_dir / "checkpoints"
    if path.resolve().parent == folder.resolve():
        repair_run_checkpoints(
            folder, path, state.step, state.best_step if state.best_score is not None else None, keep_last
        )


def how_to_train_longer(t: TrainerConfig, total_steps: int) -> str:
    """What to raise so a finished run trains on: trainer.max_steps when that cap ended it, else trainer.epochs."""
    if t.max_steps is not None and total_steps >= t.max_steps:
        return (
            f"trainer.max_steps={t.max_steps} ended it: raise trainer.max_steps, or set trainer.max_steps=null "
            f"to train all trainer.epochs ({t.epochs})"
        )
    return f"raise trainer.epochs (now {t.epochs}) to train longer"


def folders_in(folder: Path) -> list[Path]:
    """The folders in `folder`, none if it cannot be read: a folder removed while it is listed (a busy /tmp,
    a shared scratch space beside the run) is passed over, never an error."""
    try:
        with os.scandir(folder) as entries:
            return [Path(e.path) for e in entries if e.is_dir()]
    except OSError:
        return []


def resume_auto_found_nothing(run_dir: Path) -> str:
    """The line for `resume=auto` in a run directory without checkpoints: where it looked, and how to
    continue an earlier run (naming the newest one beside it, in Hydra's <date>/<time> layout)."""
    others = []
    for day in folders_in(run_dir.parent.parent):
        for other in folders_in(day):
            with contextlib.suppress(OSError):  # a run removed meanwhile, or without a last.pt
                if not other.samefile(run_dir):
                    others.append(((other / "checkpoints" / "last.pt").stat().st_mtime, other))
    how = f", e.g. the newest beside it: vit-train resume={max(others)[1]}" if others else ": resume=<run dir>"
    return (
        f"resume=auto: no checkpoint in {run_dir} (hydra.run.dir), so this run starts at step 0; to continue an "
        f"earlier run, give its directory{how}"
    )
