"""What crosses a restart, in one place: what a checkpoint holds, as plain tensors and primitives (docs/resuming.md,
'What is in a checkpoint': `checkpoint_state`), and how each part goes back into the run's objects: the weights and
the EMA's (`restore_weights`, `restore_ema`), the optimiser, the scaler, the RNGs and the loop's position (`restore`,
state.py), the objective's own state and the train row's window (`restore_loop`). A checkpoint of an earlier version
is read as this version writes it (`upgraded`, `position_from_batches`).
"""

from __future__ import annotations

import logging
import platform
from collections.abc import Sequence
from typing import Any

import torch
import torchvision
from torch import nn
from torch.optim.swa_utils import AveragedModel

from vit_train import __version__
from vit_train.checkpoint.optimizer import load_optimizer_state
from vit_train.checkpoint.scores import checkpoint_best
from vit_train.checkpoint.state import TrainState, restore_rng, rng_state
from vit_train.errors import CheckpointError
from vit_train.models.architecture import identity
from vit_train.outputs.weights import strip_wrappers
from vit_train.runtime import distributed
from vit_train.schema.config import Config

log = logging.getLogger("vit_train")

FORMAT_VERSION = 1  # what versions()["format"] says; a file of another format is refused when read (files.py)
REQUIRED_KEYS = ("model", "optimizer", "scheduler", "epoch", "step", "batch_in_epoch", "config", "class_names")


def checkpoint_state(
    model: nn.Module,
    optimizer,
    scheduler,
    scaler,
    ema: AveragedModel | None,
    state: TrainState,
    cfg: Config,
    overrides: Sequence[str],
    class_names: list[str],
    loss: Any = None,
    gathered: tuple | None = None,
    window: Any = None,
    callbacks: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything a resumed run needs, as plain tensors and primitives; the objective's `loss`'s own state (its
    `state_dict`: MAE's mask counter, the distillation teacher's identity) under "objective", the train row's
    `window` since the last row (train/throughput.py `TrainWindow`'s sums, with the loss's `window_state`) under
    "train_window" so that a resume logs the uninterrupted run's row. `gathered`: a sharded run's (model,
    optimiser, EMA) state dicts, gathered whole (train/sharding.py `full_states`). `callbacks`: the run's callbacks'
    state ({name: state_dict()}, callbacks/runner.py) under "callbacks"."""
    weights, moments, averaged = gathered or (
        model.state_dict(),
        optimizer.state_dict(),
        ema.state_dict() if ema is not None else None,
    )
    return {  # weights under the names timm reads, whatever wraps the model
        "model": strip_wrappers(weights),
        "optimizer": moments,
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(),
        "ema": saved_ema(averaged),
        **state.checkpoint_fields(),
        "stream_layout": cfg.data.stream_layout(distributed.context().world_size),
        "rng": rng_state(),
        "config": cfg.to_dict(),
        "overrides": list(overrides),
        "class_names": list(class_names),
        "identity": identity(cfg.to_dict(), class_names, state.run_id),  # what the weights are, for every door
        "preprocess": cfg.data.eval_spec(cfg.model.img_size),
        "versions": versions(),
        "cpu_threads": torch.get_num_threads(),  # a resume takes the same count (runtime/cpu.py): exact on the CPU
        "objective": loss.state_dict() if loss is not None else None,
        **(
            {"train_window": {**window.state_dict(), "terms": loss.window_state() if loss is not None else None}}
            if window is not None
            else {}
        ),
        "callbacks": dict(callbacks or {}),
    }


def restore_loop(ckpt: dict | None, loss: Any, window: Any) -> None:
    """The objective's own state into `loss` (its `load_state_dict`, which refuses what does not match) and the
    train row's window since the last row into `window` and the loss's terms (`checkpoint_state`); a fresh run
    (`ckpt` None) gives them None, and a checkpoint written before windows were kept an empty window."""
    saved = ckpt or {}
    loss.load_state_dict(saved.get("objective"))
    terms = (saved.get("train_window") or {}).get("terms")
    if terms:
        loss.load_window(terms)  # the train row's window continues, the objective's terms too
    window.load_state_dict(saved.get("train_window"))


def versions() -> dict[str, str]:
    return {
        "vit_train": __version__,
        "torch": str(torch.__version__),
        "torchvision": str(torchvision.__version__),
        "python": platform.python_version(),
        "format": str(FORMAT_VERSION),
    }


def upgraded(ckpt: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint as this version writes it, whatever version wrote it: checkpoints written before `best_score`
    kept the best score as `best_top1` or `best_loss` (a shallow copy is returned; the file's dict is not changed).
    Positions counted in batches (before `sample_in_epoch`) need the data: `position_from_batches`."""
    if ckpt.get("best_score") is not None or not ({"best_top1", "best_loss"} & set(ckpt)):
        return ckpt
    found = checkpoint_best(ckpt)
    ckpt = {k: v for k, v in ckpt.items() if k not in ("best_top1", "best_loss")}
    if found is not None:
        ckpt["best_metric"], ckpt["best_score"] = found
    return ckpt


def position_from_batches(state: TrainState, batch_size: int, train_images: int) -> None:
    """A checkpoint written before positions were counted in images: its position from its batch size (the
    saved config's) and the training set's size now."""
    if state.batch_in_epoch and not state.sample_in_epoch:
        state.sample_in_epoch, state.epoch_end = (
            state.batch_in_epoch * batch_size,
            train_images // batch_size * batch_size,
        )


def ema_weights(ema_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model's state dict inside an AveragedModel's (keys 'module.*', plus its 'n_averaged'), without
    the names of any wrapper inside it (an EMA of a compiled or DDP-wrapped model: `strip_wrappers`)."""
    return strip_wrappers({k.removeprefix("module."): v for k, v in ema_state.items() if k.startswith("module.")})


def saved_ema(ema_state: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor] | None:
    """An AveragedModel's state dict as a checkpoint keeps it: 'module.' + the plain model's names (the names
    timm reads, whatever wrapped the averaged model), and its 'n_averaged'. None stays None."""
    if ema_state is None:
        return None
    extra = {k: v for k, v in ema_state.items() if k == "n_averaged"}
    return {**{f"module.{k}": v for k, v in ema_weights(ema_state).items()}, **extra}


def restore_weights(ckpt: dict, model: nn.Module) -> None:
    """The checkpoint's weights into the whole (not yet sharded) model; CheckpointError when they do not fit."""
    try:
        model.load_state_dict(strip_wrappers(ckpt["model"]))
    except (RuntimeError, ValueError, KeyError) as e:
        raise CheckpointError(f"the checkpoint's weights do not fit this model: {str(e).splitlines()[0]}") from None


def restore_ema(ckpt: dict, ema: AveragedModel | None) -> None:
    """The checkpoint's EMA weights into `ema` (built from the model once its weights are restored); without them
    (the run had no EMA) the EMA starts from the model's current weights, said in the log."""
    if ema is None:
        return
    if ckpt.get("ema"):
        ema.load_state_dict(saved_ema(ckpt["ema"]))
    else:
        log.warning("the checkpoint has no EMA weights; the EMA starts from the current weights")


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
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(
            f"the checkpoint's optimiser state does not fit this model ({str(e).splitlines()[0]}): "
            f"the file is damaged or another model's; resume from another checkpoint of the run, or "
            f"start a new run from its weights with model.pretrained=<the checkpoint>"
        ) from None
    for group, hyper in zip(optimizer.param_groups, configured, strict=True):
        group.update(hyper)
    if ckpt.get("scaler"):
        scaler.load_state_dict(ckpt["scaler"])
    restore_rng(ckpt["rng"])
    return TrainState.from_checkpoint(ckpt)
