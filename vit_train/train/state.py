"""What a run carries across a restart: the loop's position, the EMA, every RNG's state, the
objective's state, the checkpoint's contents, and which config changes a resumed run may make
(`check_compatible`, `check_data_position`; docs/resuming.md has the table).

outputs/checkpoint.py only writes, reads and finds the files.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import InitVar, asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from vit_train.outputs.checkpoint import versions
from vit_train.config.schema import Config
from vit_train.config.unused_keys import VIT_ONLY
from vit_train.models.architecture import identity
from vit_train.outputs.identity import mixed_runs, mixed_text, run_id_of
from vit_train.errors import CheckpointError, ConfigError
from vit_train.data.preprocess import eval_spec
from vit_train.data.shard_index import train_fingerprint
from vit_train.data.webdataset import loader_workers
from vit_train.runtime import distributed
from vit_train.objectives import Objective, objective_state, section_owner
from vit_train.objectives.score import better, checkpoint_best, winner
from vit_train.train.sharding import load_optimizer_state

log = logging.getLogger("vit_train")


@dataclass
class TrainState:
    epoch: int = 0  # epochs completed
    step: int = 0  # optimiser steps completed (skipped ones included)
    batch_in_epoch: int = 0  # batches of the current epoch already trained on
    sample_in_epoch: int = 0  # positions of the epoch's permutation already trained on (images, all processes)
    epoch_end: int = 0  # the position where the current epoch ends (data/sampler.py); 0 before it begins
    train_images: int = 0  # the size of the training set the current epoch permutes; 0 before the first
    best_score: Optional[float] = None  # the objective's best val score so far (best.pt's); None before the first eval
    best_metric: str = ""  # what best_score is: the objective's METRIC, "top1" (%, higher is better) or "loss" (lower)
    best_step: int = 0
    best_source: str = "model"  # which weights scored best_score: "model" or "ema"
    best_partial: bool = False  # best_score came from a partial validation (trainer.limit_val_batches)
    last_eval: Optional[dict] = None  # the latest evaluation: {"step", "metric": "top1"|"loss", "model", "ema"}
    skipped_steps: int = 0  # steps whose update was skipped for a non-finite loss or gradient norm
    bad_in_a_row: int = 0
    images_seen: int = 0  # training images processed, and the seconds they took: for images/s
    train_seconds: float = 0.0
    wall_seconds: float = 0.0  # wall time of every attempt of the run, up to this checkpoint
    run_id: str = ""  # made when the run starts fresh, kept across resumes (outputs/identity.py); "" = not yet
    # data=webdataset: what the epoch's stream plan was made for, {"world_size", "loader_workers", "train_index"}
    # (train_index: shard_index.train_fingerprint of the shards' index; absent in older checkpoints); else None
    stream_layout: Optional[dict] = None
    # checkpoints written before best_score kept these two: read into best_score (__post_init__)
    best_top1: InitVar[Optional[float]] = None
    best_loss: InitVar[Optional[float]] = None

    def __post_init__(self, best_top1: float | None, best_loss: float | None) -> None:
        if self.best_score is None:
            legacy = checkpoint_best({"best_top1": best_top1, "best_loss": best_loss})
            if legacy is not None:
                self.best_metric, self.best_score = legacy

    def record_eval(self, metric: str, scores: dict[str, float], partial: bool = False) -> str:
        """One evaluation's `scores` {"model": ..., "ema"?: ...} for `metric`: the better of the two (the
        model wins a tie) becomes the best score when it beats it. A `partial` validation (a share of the
        val set, trainer.limit_val_batches) is compared only with partial ones: a full validation's score
        replaces a partial best, a partial one never replaces a full best. Returns which weights won."""
        source = winner(metric, scores)
        self.last_eval = {"step": self.step, "metric": metric, **scores,  # weights=auto (vit-eval/predict/export)
                          **({"partial": True} if partial else {})}
        current = self.best_score if self.best_metric == metric else None
        if current is not None and partial != self.best_partial:
            new = not partial and math.isfinite(scores[source])  # the full validation's score wins, whatever it is
        else:
            new = better(metric, scores[source], current)
        if new:
            self.best_score, self.best_metric, self.best_partial = scores[source], metric, partial
            self.best_step, self.best_source = self.step, source
        return source

    def best_of(self, metric: str) -> float | None:
        """The best score if it is `metric`'s, else None (results.json's best_top1 and best_loss)."""
        return self.best_score if self.best_metric == metric else None

    def checkpoint_fields(self) -> dict[str, Any]:
        """The state as a checkpoint keeps it: every field, plus best_top1 (-1 when none) and best_loss
        (inf when none) written from the one best score, as checkpoints always had them."""
        top1, loss = self.best_of("top1"), self.best_of("loss")
        return {**asdict(self), "best_top1": -1.0 if top1 is None else top1,
                "best_loss": float("inf") if loss is None else loss}

    @property
    def epochs_done(self) -> float:
        """Epochs trained, with the current one's fraction: 1.38 = one epoch and 38% of the next."""
        return self.epoch + (self.sample_in_epoch / self.epoch_end if self.epoch_end else 0.0)


def build_ema(model: nn.Module, decay: float | None, ckpt: dict | None) -> AveragedModel | None:
    """An EMA of the weights (and buffers), restored from the checkpoint when it has one."""
    if decay is None:
        return None
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)
    if ckpt and ckpt.get("ema"):
        ema.load_state_dict(ckpt["ema"])
    elif ckpt:
        log.warning("the checkpoint has no EMA weights; the EMA starts from the current weights")
    return ema


def checkpoint_state(model: nn.Module, optimizer, scheduler, scaler, ema: AveragedModel | None, state: TrainState,
                     cfg: Config, overrides: Sequence[str], class_names: list[str],
                     objective: Objective | None = None, gathered: tuple | None = None) -> dict[str, Any]:
    """Everything a resumed run needs, as plain tensors and primitives (see docs/resuming.md, 'What is in a checkpoint');
    `objective`'s own state (MAE's mask counter, the distillation teacher's identity) under "objective".
    `gathered`: a sharded run's (model, optimiser, EMA) state dicts, gathered whole (sharding.full_states)."""
    weights, moments, averaged = gathered or (model.state_dict(), optimizer.state_dict(),
                                              ema.state_dict() if ema is not None else None)
    return {
        "model": weights, "optimizer": moments, "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(), "ema": averaged, **state.checkpoint_fields(),
        "stream_layout": stream_layout(cfg),
        "rng": rng_state(),
        "config": cfg.to_dict(), "overrides": list(overrides), "class_names": list(class_names),
        "identity": identity(cfg.to_dict(), class_names, state.run_id),  # what the weights are, for every door
        "preprocess": eval_spec(cfg),
        "versions": versions(),
        "cpu_threads": torch.get_num_threads(),  # a resume takes the same count (runtime/cpu.py): exact on the CPU
        "objective": objective_state(objective) if objective is not None else None,
    }


def restore_weights(ckpt: dict, model: nn.Module) -> None:
    """The checkpoint's weights into the whole (not yet sharded) model; CheckpointError when they do not fit."""
    try:
        model.load_state_dict(ckpt["model"])
    except (RuntimeError, ValueError, KeyError) as e:
        raise CheckpointError(f"the checkpoint's weights do not fit this model: {str(e).splitlines()[0]}") from None


def restore(ckpt: dict, model: nn.Module, optimizer, scaler, weights: bool = True) -> TrainState:
    """Load weights (unless `weights` is false: `restore_weights` did), optimiser (sharded or not), scaler
    and RNG states; returns the loop's position.

    The optimiser keeps its saved state (moments, step counts) but takes its hyperparameters
    (weight_decay, betas, eps, momentum, fused) from this run's config, as built: torch's
    `load_state_dict` would put the saved ones back and silently ignore `optim.weight_decay=...` on
    resume. The lr is the schedule's (build_scheduler). Unchanged, they are the saved values.
    """
    configured = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    if weights:
        restore_weights(ckpt, model)
    try:
        load_optimizer_state(model, optimizer, ckpt["optimizer"])
    except (RuntimeError, ValueError, KeyError) as e:
        raise CheckpointError(f"the checkpoint's weights do not fit this model: {str(e).splitlines()[0]}") from None
    for group, hyper in zip(optimizer.param_groups, configured):
        group.update(hyper)
    if ckpt.get("scaler"):
        scaler.load_state_dict(ckpt["scaler"])
    restore_rng(ckpt["rng"])
    return TrainState(**{k: ckpt[k] for k in TrainState.__dataclass_fields__ if k in ckpt})


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


def stream_layout(cfg: Config) -> dict[str, int | str] | None:
    """data=webdataset: the world size and loader worker count (data.num_workers resolved) the epoch's stream
    plan is cut for (data/stream_order.py), and the fingerprint of the index's training shards and classes
    (train_index, when the index can be read); None for other data sets."""
    if cfg.data.name != "webdataset":
        return None
    layout = {"world_size": distributed.context().world_size,
              "loader_workers": max(1, loader_workers(cfg.data.num_workers))}
    fingerprint = train_fingerprint(cfg.data.root)
    return layout if fingerprint is None else {**layout, "train_index": fingerprint}


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


def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng(state: dict[str, Any]) -> None:
    """Restore every RNG; a failure is an error, since the run would silently diverge."""
    try:
        random.setstate(state["python"])
        name, keys, *rest = state["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
        torch.set_rng_state(state["torch"])
        if state["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"the checkpoint's RNG states cannot be restored ({e}); the resumed run would not "
                              f"match the original") from None


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
