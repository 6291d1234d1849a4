"""LP-FT in one run (model.lp_epochs, model.lp_lr; Kumar et al. 2022, "Fine-Tuning can Distort Pretrained Features"):
the probe stage's length in steps and its lr, the stage the network starts in, the change to the whole network, and
results.json's record of both stages. The stages themselves (which parameters train) are models/probe.py's."""

from __future__ import annotations

import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any, Protocol, cast

from torch import nn

from vit_train.config import Config
from vit_train.errors import ConfigError
from vit_train.models.probe import set_probing
from vit_train.objectives.base import Objective
from vit_train.runtime import distributed

if TYPE_CHECKING:
    from pathlib import Path


class Run(Protocol):
    """What LP-FT reads of train/run.py's Run (a protocol: run.py imports this module)."""

    cfg: Config
    model: nn.Module
    state: Any  # train/state.py's TrainState
    lp_steps: int
    run_dir: Path
    ctx: distributed.Context


log = logging.getLogger("vit_train")


def lp_ft_steps(cfg: Config, steps_per_epoch: int, ckpt: dict | None) -> int:
    """LP-FT's probe stage in steps (model.lp_epochs x the epoch's steps; 0 = off). Raises ConfigError for
    lp_epochs shorter than one step, and for a resume whose data.batch_size differs from the checkpoint's (the
    epochs would count other steps: the change would move, silently re-freezing a network that fine-tunes)."""
    epochs = getattr(cfg.model, "lp_epochs", 0.0)
    steps = round(epochs * steps_per_epoch)
    if epochs and not steps:
        raise ConfigError(
            f"model.lp_epochs={epochs:g} is {epochs * steps_per_epoch:.2g} of a step ({steps_per_epoch} steps an "
            f"epoch): give at least {1 / steps_per_epoch:.2g}, or 0 for no probe stage"
        )
    saved = ckpt["config"].get("data", {}).get("batch_size") if ckpt else None
    if steps and saved is not None and saved != cfg.data.batch_size:
        raise ConfigError(
            f"model.lp_epochs={epochs:g} counts epochs of data.batch_size={saved} in this run: resumed with "
            f"data.batch_size={cfg.data.batch_size} its change from the head alone to the whole network would "
            f"move; resume with data.batch_size={saved}"
        )
    return steps


def lp_ft_lr(cfg: Config) -> float | None:
    """LP-FT's head-alone peak lr: model.lp_lr scaled as optim.lr is (optim.lr_base_batch); None = cfg.lr's."""
    lp_lr = getattr(cfg.model, "lp_lr", None)
    return None if lp_lr is None else lp_lr * cfg.lr / cfg.optim.lr


def start_lp_ft(model: nn.Module, cfg: Config, ctx: distributed.Context, step: int, lp_steps: int, total: int) -> None:
    """LP-FT (model.lp_epochs): `model` (the network the weights load into) in the stage of the step after `step`,
    the plan said once. Raises ConfigError under several processes (DDP reduces the gradients of the parameters
    that train when it is made, so the change would leave the encoder's unreduced)."""
    if ctx.enabled:
        raise ConfigError(
            "model.lp_epochs (LP-FT) runs in one process: DDP reduces only the parameters that train when it is "
            "made, so the network's would go unreduced after the change; run it without torchrun, or set "
            "model.lp_epochs=0"
        )
    set_probing(model, step < lp_steps)
    if not ctx.is_main or step:
        return
    log.log(
        logging.INFO if lp_steps < total else logging.WARNING,
        "LP-FT (model.lp_epochs=%g): steps 1-%d train the head alone on the frozen network (peak lr %g), then the "
        "whole network trains%s; the lr schedule restarts at the change",
        getattr(cfg.model, "lp_epochs", 0.0),
        min(lp_steps, total),
        lp_ft_lr(cfg) or cfg.lr,
        f" (steps {lp_steps + 1}-{total})"
        if lp_steps < total
        else f": never in this run, which ends first, at step {total} (raise trainer.max_steps or trainer.epochs)",
    )
    if not cfg.model.pretrained:
        log.warning("model.lp_epochs probes the features of pre-trained weights, but model.pretrained is not set")


def fine_tune_all(run: Run) -> None:
    """LP-FT's change (model.lp_epochs): from this step the whole network trains, from the probe's head."""
    objective = cast(Objective, run.cfg.objective)  # the chosen option's class: the schema types the section's base
    set_probing(objective.pretrained_target(run.model), False)
    probe = run.state.last_eval if run.state.last_eval and run.state.last_eval["step"] == run.lp_steps else None
    log.info(
        "LP-FT: the head trained alone for %d steps%s; the whole network trains from step %d",
        run.lp_steps,
        f" (val {probe_text(run, probe)})" if probe else "",
        run.state.step,
    )


def probe_text(run: Run, evaluation: dict[str, Any]) -> str:
    """The model's score in `evaluation` (TrainState.last_eval) as the log shows it, e.g. "top1 61.2"."""
    return f"{evaluation['metric']} {evaluation['model']:.4g}"


def lp_ft_results(run: Run) -> dict[str, Any]:
    """results.json's record of LP-FT's two stages: `lp_steps` (the steps that trained the head alone so far), `lp_score` (the objective's metric
    of the val evaluation at that step, from metrics.jsonl, which keeps each row once across resumes; null before
    it), `ft_steps` (the whole network's steps so far)."""
    metric, score = run.cfg.objective.metric, None
    rows = run.run_dir / "metrics.jsonl"
    if run.ctx.is_main and rows.is_file():
        for line in rows.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, AttributeError):  # a torn last line
                row = json.loads(line)
                if row.get("split") == "val" and row.get("step") == run.lp_steps:
                    score = row.get(metric)
    return {
        "lp_steps": min(run.lp_steps, run.state.step),
        "lp_score": score,
        "ft_steps": max(0, run.state.step - run.lp_steps),
    }
