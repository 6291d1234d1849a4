"""Which config changes a resumed run may make (docs/resuming.md has the table): `check_compatible` refuses a
change that makes the checkpoint's state mean something else, `check_data_position` one that would reorder the
epoch a run resumes in the middle of, `check_own_run` a run directory whose files name more than one run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vit_train.config.schema import Config
from vit_train.config.unused_keys import VIT_ONLY
from vit_train.errors import CheckpointError, ConfigError
from vit_train.objectives import section_owner
from vit_train.outputs.identity import mixed_runs, mixed_text, run_id_of
from vit_train.train.state import TrainState, stream_layout


def check_own_run(path: Path, ckpt: dict, run_dir: Path) -> None:
    """Refuse (CheckpointError, one line, nothing touched) to resume in a run directory whose files name
    more than one run (outputs/identity.py `mixed_runs`): another run's checkpoint copied in (as last.pt,
    a step file or best.pt) would be continued here, or kept beside this run's; resuming another run's
    file into a directory that holds a run would overwrite it. Checkpoints written before run ids were
    kept are not checked."""
    inside = path.resolve().parent == (run_dir / "checkpoints").resolve()
    found = mixed_runs(run_dir, path, run_id_of(ckpt))
    if found is None:
        return
    strangers, own, mine = found
    if not inside and str(path) in strangers:  # resume=<another run's file> into a directory that holds a run
        raise CheckpointError(f"{path} is run {strangers[str(path)][:8]}'s checkpoint, but {run_dir} holds run "
                              f"{own[:8]}'s files ({', '.join(mine)}): continued there it would overwrite them; "
                              f"resume it in a new directory (hydra.run.dir=<a new directory>)")
    raise CheckpointError(f"{mixed_text(run_dir, strangers, own, mine)}; move {', '.join(strangers)} out of {run_dir} "
                          f"(to continue that run: resume=<its file> hydra.run.dir=<a new directory>), then resume")


def check_data_position(state: TrainState, saved: dict, cfg: Config, train_images: int) -> None:
    """Make sure a run resumed in the middle of an epoch continues that epoch's permutation.

    The position is kept in images (`sample_in_epoch`), so a changed data.batch_size continues
    from the same image (data/sampler.py). What would reorder the epoch's permutation (another
    training-set size, data.repeated_aug or seed) is refused with a ConfigError: images would be
    skipped or trained on twice. `saved` is the checkpoint's config; a checkpoint written before
    positions were counted in images gets its position from its own batch size."""
    if state.batch_in_epoch and not state.sample_in_epoch:  # an older checkpoint: position in batches
        batch = saved["data"]["batch_size"]
        state.sample_in_epoch, state.epoch_end = state.batch_in_epoch * batch, train_images // batch * batch
    if not state.sample_in_epoch:
        return  # at an epoch's boundary: the next epoch is a new permutation anyway
    before = {"data.repeated_aug": saved["data"].get("repeated_aug", 1), "seed": saved.get("seed", 0)}
    now = {"data.repeated_aug": cfg.data.repeated_aug, "seed": cfg.seed}
    changed = [f"the training set holds {train_images} images, not {state.train_images}"] if (
        state.train_images and state.train_images != train_images) else []
    changed += [f"{key} is {now[key]}, not {before[key]}" for key in before if now[key] != before[key]]
    changed += _stream_changes(state, saved, cfg)
    if changed:
        end = state.step - (-(state.epoch_end - state.sample_in_epoch) // saved["data"]["batch_size"])
        # (not trainer.max_steps=<end>: the warmup and cosine schedule would be fitted to that shorter run)
        cap = cfg.trainer.max_steps
        raise_cap = f" with trainer.max_steps raised to at least {end} (it is {cap})" if cap and cap < end else ""
        raise ConfigError(f"cannot resume in the middle of epoch {state.epoch + 1} ({state.sample_in_epoch} of its "
                          f"{state.epoch_end} images trained on): {' and '.join(changed)}, which reorders the epoch; "
                          f"resume with the saved settings past the epoch's end at step {end} (it writes "
                          f"checkpoints/step_{end:08d}.pt){raise_cap}, then resume from that file with the change, "
                          f"or start a new run from these weights with model.pretrained=<the checkpoint>")


def _stream_changes(state: TrainState, saved: dict, cfg: Config) -> list[str]:
    """What a webdataset epoch's stream plan depends on and a resume in its middle changed: the number of processes,
    of loader workers, data.batch_size, data.shuffle_buffer (each cuts or shuffles the stream otherwise), the
    index's training shards (names, sample counts: the same total in another layout is another stream) or classes."""
    if cfg.data.name != "webdataset" or saved.get("data", {}).get("name") != "webdataset":
        return []
    was, now = state.stream_layout or {}, stream_layout(cfg)
    changed = [f"{what} is {now[key]}, not {was[key]}" for key, what in (
        ("world_size", "the number of processes"), ("loader_workers", "the loader worker count (data.num_workers, "
                                                     "0 counting as 1)")) if key in was and now[key] != was[key]]
    for key in ("batch_size", "shuffle_buffer"):
        before, after = saved["data"].get(key), getattr(cfg.data, key)
        if before is not None and before != after:
            changed.append(f"data.{key} is {after}, not {before}")
    if "train_index" in was and now.get("train_index") != was["train_index"]:
        changed.append(f"the training shards of {cfg.data.root} are not those the epoch began with (index.json lists "
                       f"other shard names, sample counts or classes: fingerprint {now.get('train_index')}, not "
                       f"{was['train_index']}; put those shards back)")
    return changed


# Config keys whose change would make the checkpoint's state mean something else, each with why. A resumed
# run may change any other key (docs/resuming.md, 'What may change on resume').
SHAPE = "the weights have another shape"
REFUSED_CHANGES = {
    "model.arch": "the weights are another network's",
    "model.img_size": "the position embeddings are for another image size",
    "model.patch_size": SHAPE, "model.embed_dim": SHAPE, "model.depth": SHAPE, "model.num_heads": SHAPE,
    "model.mlp_ratio": SHAPE, "model.qkv_bias": SHAPE, "model.reg_tokens": SHAPE, "model.init_values": SHAPE,
    "model.qk_norm": SHAPE, "model.distilled": SHAPE,
    "model.pool": "the head was trained on another pooled feature",
    "model.pos_embed": "the position embeddings are learned in one and fixed in the other",
    "model.trainable": "the optimiser's state holds other parameters",
    "optim.name": "the optimiser's state (AdamW's two moments, SGD's momentum) does not carry over",
    "optim.layer_decay": "the optimiser's parameter groups differ",
    "data.name": "the classes and the head belong to another data set",
    "objective.name": "the weights, the loss and the best score belong to another objective",
    "mae.decoder_dim": "the decoder has another shape", "mae.decoder_depth": "the decoder has another shape",
    "mae.decoder_heads": "the decoder has another shape",
    "mae.norm_pix_loss": "the decoder was trained to predict other targets, and best_loss would compare both",
    "mae.mask_ratio": "the val reconstruction loss that picks best.pt would measure another task",
    "distill.teacher_arch": "the teacher is another network",
    "distill.type": "the distillation head was trained on other targets",
    "trainer.ema_decay": "the checkpoint's EMA weights would be dropped",  # only on -> off (see _refused)
}


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


# Refused keys whose new value model.pretrained cannot load the checkpoint's weights into either: the door for weights
# (objectives/weights_in.py) refuses every architecture field that changes the function, and models/pretrained.py
# LayerScale, QK-norm or registers that differ; img_size (positions are resized) and model.distilled (head-like) load.
NO_FIT = ("model.arch", "model.embed_dim", "model.patch_size", "model.depth", "model.num_heads", "model.mlp_ratio",
          "model.qkv_bias", "model.pool", "model.pos_embed", "model.init_values", "model.qk_norm", "model.reg_tokens")


def _refused(key: str, new: Any, saved: dict[str, Any]) -> bool:
    if key not in REFUSED_CHANGES or key not in saved:  # a key newer than the checkpoint: its default ran
        return False
    if key.removeprefix("model.") in VIT_ONLY and saved.get("model.arch", "vit") != "vit":
        return False  # a ResNet never read it: the no-effect warning (config/unused_keys.py) says so
    owner = section_owner(key.split(".")[0])  # mae.*, distill.*: their objective's own (objectives/)
    if owner is not None and saved.get("objective.name") != owner:
        return False  # another objective's keys: the run never read them
    return key != "trainer.ema_decay" or new is None  # an EMA may start (from the weights) or change its decay


def check_compatible(ckpt: dict, current: dict, path: Any = "<the checkpoint>") -> list[str]:
    """Refuse, before any work, a resumed config that changes what the checkpoint's state means.

    `ckpt` is the loaded checkpoint (its "config"), `current` the resumed run's config as plain data,
    `path` the checkpoint's file, named in the message. Raises CheckpointError (one line: each refused
    key with its saved and new value, and what to do instead). Returns the other changes as
    "key: old -> new" lines, for the log.
    """
    changes = config_changes(ckpt["config"], current)
    saved = _flatten(ckpt["config"])
    refused = [(k, a, b) for k, a, b in changes if _refused(k, b, saved)]
    if refused:
        what = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in refused)
        why = "; ".join(dict.fromkeys(REFUSED_CHANGES[k] for k, _, _ in refused))
        keep = " ".join(f"{k}={_cli(a)}" for k, a, _ in refused)
        raise CheckpointError(f"cannot resume {path} with a changed config ({what}): {why}; resume with the saved "
                              f"settings (drop the override, or give {keep}), {_instead(refused, path)} "
                              f"(see docs/resuming.md)")
    return [f"{k}: {a!r} -> {b!r}" + (" (ignored: a resumed run continues from its checkpoint's weights)"
                                       if k == "model.pretrained" else "")
            for k, a, b in changes if (k, a, b) not in refused]


def _instead(refused: list[tuple[str, Any, Any]], path: Any) -> str:
    """What else to do than resume, by the kind of the refused keys: a new run from the weights, when they can load."""
    no_fit = [k for k, _, _ in refused if k in NO_FIT]
    if no_fit:
        return (f"or start a new run from scratch with the change ({', '.join(no_fit)}: the checkpoint's weights do "
                f"not fit the new architecture, so model.pretrained={path} would not load them either)")
    new_head = " model.reset_head=true" if any(k == "data.name" for k, _, _ in refused) else ""
    start = f"or start a new run from its weights: vit-train model.pretrained={path}{new_head} <your overrides>"
    if any(k.startswith("mae.") for k, _, _ in refused):
        return (f"or start a new MAE run from its encoder: vit-train objective=mae model.pretrained={path} <your "
                f"overrides> (model.pretrained loads the encoder only; the decoder starts fresh)")
    return start


def _cli(value: Any) -> str:
    """A value as a command-line override writes it."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
