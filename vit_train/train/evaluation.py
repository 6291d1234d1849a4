"""Evaluating a run while it trains: the model (and its EMA) on the val set, as the run's objective scores
it; the better of the two decides best.pt (the raw model wins a tie). A stop signal that ends an
evaluation's loader drops that evaluation in every process (`cut_short`); the resumed run does it first.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

import torch

from vit_train.data.first_batches import FirstBatches
from vit_train.runtime import distributed
from vit_train.runtime.preemption import CompileInterrupted, StopRequest
from vit_train.train import sharding
from vit_train.train.batches import UntilStop
from vit_train.train.compiling import StaticBatch

if TYPE_CHECKING:
    from vit_train.train.run import Run

log = logging.getLogger("vit_train")


def evaluate(run: Run, stop: StopRequest | None = None) -> dict[str, float] | None:
    """Evaluates the model (and its EMA) on the val set as the run's objective scores it; best.pt follows
    whichever of the two scores better in the objective's direction (the raw model wins a tie).
    Returns None, having logged and recorded nothing, when `stop` cut it short (`cut_short`), or ended the
    first pass of a compiled model while it compiled. That pass's seconds go to `run.compile_seconds["eval"]`."""
    state = run.state
    during = contextlib.nullcontext() if stop is None else stop.during(f"the evaluation of step {state.step}")
    compiling = isinstance(run.eval_model, StaticBatch) and run.eval_model.seconds is None  # its first pass compiles
    if compiling and run.ctx.is_main:
        log.info("compiling the evaluation (the model at one batch shape)")
    if compiling and stop is not None:  # a stop signal ends it at once: it is left for the resumed run
        during = stop.interruptible(f"compiling the evaluation of step {state.step}")
    try:
        metrics = _evaluate(run, stop, during)
    except CompileInterrupted:
        stop.agree(stop.received or 0)
        log.warning(
            "%s ended the evaluation of step %d while it compiled: it is left for the resumed run, which does it first",
            stop.name,
            state.step,
        )
        return None
    if compiling and metrics is not None:
        run.compile_seconds["eval"] = sum(
            m.seconds or 0.0 for m in (run.eval_model, run.eval_ema) if isinstance(m, StaticBatch)
        )
    return metrics


def _evaluate(run: Run, stop: StopRequest | None, during) -> dict[str, float] | None:
    """`evaluate` under `during` (what a stop signal does meanwhile)."""
    state, objective = run.state, run.cfg.objective
    progress, metric, limit = (
        run.cfg.trainer.progress and run.ctx.is_main,
        objective.metric,
        run.cfg.trainer.limit_val_batches,
    )
    distributed.broadcast_buffers(run.model, run.ema)  # every process evaluates the model rank 0 saves (BatchNorm)
    with (
        run.window.paused(),
        sharding.gathered(run.cfg, run.model, run.ema),
        during,
    ):  # FSDP: no collective per val batch
        val = FirstBatches(run.data.val_loader, limit)  # trainer.limit_val_batches: a partial validation, said so
        passes = UntilStop(val, stop)
        metrics = objective.evaluate(
            run.eval_model,
            passes,
            run.device,
            run.amp_dtype,
            run.cfg,
            progress,
            confusion=bool(run.cfg.trainer.viz_every),
        )  # every rank: the sum is a collective
        if cut_short(run, passes, stop):
            return None
        if val.partial:
            metrics["val_images"] = int(distributed.sum_all(torch.tensor(float(val.images), device=run.device)).item())
        scores, ema_metrics = {"model": metrics[metric]}, None
        if run.ema is not None:
            passes = UntilStop(FirstBatches(run.data.val_loader, limit), stop)
            ema_metrics = objective.evaluate(run.eval_ema, passes, run.device, run.amp_dtype, run.cfg, progress)
            if cut_short(run, passes, stop):
                return None
            if val.partial:
                ema_metrics["val_images"] = metrics["val_images"]
            metrics[f"ema_{metric}"] = scores["ema"] = ema_metrics[metric]
        if run.visuals is not None:
            run.visuals.after_eval(run.model, state.step, metrics.pop("confusion", None))
        val_row = {k: v for k, v in metrics.items() if not k.startswith("ema_")}
        run.logger.scalars("val", state.step, val_row)
        if ema_metrics is not None:
            run.logger.scalars("val_ema", state.step, ema_metrics)
        run.evaluated.clear()  # the callbacks' on_eval_end: both rows as "split/name"
        run.evaluated.update({f"val/{k}": v for k, v in val_row.items()})
        run.evaluated.update({f"val_ema/{k}": v for k, v in (ema_metrics or {}).items()})
    state.record_eval(metric, scores, partial=val.partial)
    run.latest.clear()
    run.latest.update(metrics)  # this attempt's latest evaluation: results.json's final_*
    best = objective.score_text(state.best_score) if state.best_score is not None else "none"
    log.info(
        "step %d (epoch %.2f): %s (best %s, %s)%s",
        state.step,
        state.epochs_done,
        objective.eval_text(metrics, ema_metrics, classes=len(run.data.class_names)),
        best,
        state.best_source,
        f"; a partial validation: {metrics['val_images']} images, the first {val.limit} of {val.total} val "
        f"batches (trainer.limit_val_batches={limit})"
        if val.partial
        else "",
    )
    return metrics


def cut_short(run: Run, passes: UntilStop, stop: StopRequest | None) -> bool:
    """Whether a stop signal ended an evaluation pass early in any process; then every process drops the
    evaluation and agrees to stop at this step (one collective each, in every process alike)."""
    if stop is None or not distributed.max_all(int(passes.cut), run.device):
        return False
    stop.agree(distributed.max_all(stop.received or 0, run.device))
    if run.ctx.is_main:
        log.warning(
            "%s ended the evaluation at step %d with its loader's workers: it is left for the resumed run, "
            "which does it first",
            stop.name,
            run.state.step,
        )
    return True
