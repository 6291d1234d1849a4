"""The training loop: build the run, maybe resume, train with periodic eval/checkpoint/log, finish.

`train(cfg, run_dir)` is the whole run; read it top to bottom. It takes a plain typed `Config`
(no Hydra), so tests and notebooks call it directly. `build_run` (run.py) makes the `Run`
(everything the run is made of); `save`, `evaluate` (evaluation.py) and `finish` take it. The step is
`step.train_step`, the batches come from `batches.batches`, the loss from the run's objective
(`cfg.objective`, objectives/), and the checkpoint to resume from from `resume.find_start`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.contrib.logging import logging_redirect_tqdm

from vit_train.callbacks.base import RunInfo
from vit_train.checkpoint import (
    TrainState,
    checkpoint_state,
    run_checkpoints,
    save_run_checkpoint,
    short_of_space,
    shown,
)
from vit_train.config import Config
from vit_train.errors import RunStopped, UserError
from vit_train.objectives.base import unsaved_state
from vit_train.outputs import rundir
from vit_train.outputs.metrics import output_error, results_summary, write_results
from vit_train.runtime import distributed
from vit_train.runtime.logs import EarlyRecords
from vit_train.runtime.preemption import CompileInterrupted, StopRequest
from vit_train.train import sharding
from vit_train.train.batches import batches
from vit_train.train.evaluation import evaluate
from vit_train.train.lp_ft import fine_tune_all, lp_ft_results
from vit_train.train.resume import (
    check_compatible,
    complete_interrupted_save,
    find_start,
    how_to_train_longer,
    resume_auto_found_nothing,
)
from vit_train.train.run import Run, build_run, describe
from vit_train.train.step import diverged_message, step_seed, train_step
from vit_train.train.throughput import log_train

log = logging.getLogger("vit_train")


def due(step: int, every: int | None) -> bool:
    return bool(every) and step % every == 0


def train(
    cfg: Config,
    run_dir: str | Path,
    overrides: Sequence[str] = (),
    resume_from: tuple[Path, dict] | None = None,
    lock: rundir.RunLock | None = None,
    sweep_job: tuple[str, int] | None = None,
) -> dict[str, Any]:
    """Train as `cfg` says, writing checkpoints and logs under `run_dir`; returns the results summary.

    `resume_from`: the (path, checkpoint) `cfg.resume` names, when the caller has found it already with
    `resume.find_start` (the command line does for resume=PATH, for its config): it is not looked up again.
    Otherwise `cfg.resume` (a path, or `auto`: the newest checkpoint in `run_dir`) is looked up here.
    `lock`: the run directory's lock (rundir.py) when the caller holds it (the command line, a sweep
    job, torchrun's rank 0); it stays held. Without one, rank 0 takes it for the run and frees it.
    `sweep_job`: (the sweep's directory name, the job's number) for a sweep's job: its callbacks' group and trial.
    Raises RunDirBusy when another process holds `run_dir`, and CheckpointError/ConfigError for a
    resumed config that changes what the checkpoint means (resume.check_compatible), both before
    touching anything in it.
    Raises RunStopped when a stop signal or diverging losses end the run early (after writing
    results.json, and for a signal a checkpoint to resume from). Any other error once the run is
    built (a full disk, bad data) is written to train.log and to results.json (status `failed`,
    `error` the reason) before it is raised; train.log's handler is removed however the run ends.
    """
    run_dir = Path(run_dir)
    own_lock = lock is None and os.environ.get("RANK", "0") == "0"  # under torchrun rank 0 holds it for all
    # EarlyRecords: what is logged before train.log exists (the lock, the checkpoint search, the build) goes there too
    with EarlyRecords(), rundir.locked(run_dir) if own_lock else contextlib.nullcontext():
        started = time.time()
        ckpt_path, ckpt = resume_from or find_start(cfg.resume, run_dir) or (None, None)
        changes = check_compatible(ckpt, cfg, ckpt_path, overrides) if ckpt else []
        run = build_run(cfg, run_dir, overrides, ckpt, started)
        if cfg.resume == "auto" and ckpt is None and run.ctx.is_main:
            log.warning(resume_auto_found_nothing(run_dir))
        try:
            if ckpt:
                log.info("resumed from %s at epoch %d, step %d", ckpt_path, run.state.epoch + 1, run.state.step)
                if run.ctx.is_main:
                    complete_interrupted_save(Path(ckpt_path), run_dir, run.state, cfg.trainer.keep_last)
                for change in changes if run.ctx.is_main else []:  # said once, not by every process
                    log.warning("changed since the checkpoint: %s", change)
            else:
                run.logger.config(cfg.to_dict(), step=0)
            describe(run)
            for line in run.data.start_warnings if run.ctx.is_main else ():  # e.g. images far smaller than the input
                log.warning("%s", line)
            short = short_of_space(run_dir, run.model, cfg.optim.moments, run.ema, cfg.trainer.keep_last)
            if short and run.ctx.is_main:  # said now, not after the first epoch's work
                log.warning("%s", short)  # WARNING says "warning" in train.log; the console shows the message
            run.callbacks.on_train_start(run_info(run, ckpt is not None, sweep_job))
            if ckpt and run.state.step < run.total_steps:  # (a finished run's last evaluation is done again below)
                stopped = decided_stop(run)  # a run that stopped early stays stopped (until its settings change)
                if stopped is not None:
                    log.info(
                        "the run already stopped early at step %d: %s; to train on, change the callback that stopped "
                        "it (e.g. raise callbacks.early_stopping.patience or change .target) or leave it out of "
                        "callbacks=[...], with resume=%s",
                        run.state.step,
                        stopped or "a callback's should_stop",
                        run_dir,
                    )
                    return finish(run, "stopped_early", stopped)
            return loop(run)
        except RunStopped:  # diverged or stopped by a signal: finish() has recorded it
            raise
        except Exception as e:
            error = output_error(e, run_dir)  # a full disk met anywhere: one line
            record_failure(run, error)
            if error is not e:
                raise error from None
            raise
        finally:
            run.logger.close()


def loop(run: Run) -> dict[str, Any]:
    """The training loop, its periodic eval/checkpoint/log and its end; returns the results summary."""
    state, t, run_dir = run.state, run.cfg.trainer, run.run_dir
    with logging_redirect_tqdm(), StopRequest(deferred=run.ctx.enabled) as stop:
        if eval_pending(run):
            log.info("evaluating step %d first: a stop signal came before its evaluation was done", state.step)
            reason = evaluate_and_save(run, stop)
            if reason is not None:
                return finish(run, "stopped_early", reason)
        for images, targets in batches(run, stop):
            compiling = run.cfg.trainer.compile and "step" not in run.compile_seconds  # the first step compiles
            before = dataclasses.replace(state) if compiling else None
            if state.advance(run.data.train_sampler):  # the step is counted here, once
                run.data.epoch_done(state.epoch)
            if state.step == run.lp_steps + 1 > 1:  # LP-FT: the head alone trained steps 1..lp_steps
                fine_tune_all(run)
            if run.ctx.enabled:  # dropout, drop path, MAE's masks: each process its own draws, a function of the step
                torch.manual_seed(step_seed(run.cfg.seed, state.step, run.ctx.rank))
            lr = max(run.scheduler.get_last_lr())  # the rate this step trains with (the head's under layer decay)
            started = time.perf_counter()
            if compiling:
                log.info(
                    "compiling the training step (torch.compile: a minute or more the first time, seconds from "
                    "Inductor's cache)"
                )
            try:
                with stop.interruptible("compiling the training step") if compiling else contextlib.nullcontext():
                    train_step(run, images, targets)
            except CompileInterrupted:
                run.compile_seconds["step"] = time.perf_counter() - started  # compiled so far: results.json says it
                stopped_compiling(run, stop, before)
            if compiling and "step" in run.compile_seconds:
                said_compiled(run, "step")
                run.progress.restart_clock(after=1)  # the bar's s/step leaves the compiling step out, as images/s
            evaluating = state.step >= run.total_steps or eval_due(run)
            saving = evaluating or state.batch_in_epoch == 0 or due(state.step, t.ckpt_every)
            if due(state.step, t.log_every) or state.step == run.total_steps:
                run.skips.settle(state)
                log_train(run.logger, run.progress, run.window, state, lr, run.scaler, run.loss.terms())
            elif saving:  # counts kept on the device: read before a checkpoint, which must not keep a diverged run
                run.skips.settle(state)
            if state.bad_in_a_row >= t.max_bad_steps:
                finish(run, "diverged")
                raise RunStopped(diverged_message(state, run_dir), exit_code=3)
            run.callbacks.on_step_end(state.step)
            if evaluating:
                reason = evaluate_and_save(run, stop)
                if reason is not None and state.step < run.total_steps:  # its checkpoint is written: the run ends
                    run.progress.update()  # the epoch's bar counts this step and closes before the closing lines
                    run.progress.close()
                    return finish(run, "stopped_early", reason)
            elif saving:
                save(run)
        if not run.latest and not stop:  # resumed a run that had already finished
            log.info(
                "the run already reached its last step (%d); %s",
                run.total_steps,
                how_to_train_longer(t, run.total_steps),
            )
            evaluate_and_save(run, stop)
        if stop:
            save(run)
            finish(run, "interrupted")
            command = "torchrun <the same options> -m vit_train" if run.ctx.enabled else "vit-train"
            raise RunStopped(
                f"stopped by {stop.name} at step {state.step}; {run_dir / 'checkpoints' / 'last.pt'} "
                f"holds it; continue with: {command} resume={run_dir}",
                stop.exit_code,
            )
    return finish(run, "completed")


def eval_due(run: Run) -> bool:
    """Whether the step just taken is evaluated (every trainer.eval_every steps, else at each epoch's end);
    the last step always is."""
    state, every = run.state, run.cfg.trainer.eval_every
    if run.lp_steps and state.step == run.lp_steps:  # LP-FT's probe, scored before the whole network trains
        return True
    return due(state.step, every) if every else state.batch_in_epoch == 0


def eval_pending(run: Run) -> bool:
    """Whether the resumed step was due an evaluation that a stop signal left undone (`evaluate_and_save`);
    the last step's is done by the finished-run path of `loop`."""
    state, last = run.state, run.state.last_eval
    return 0 < state.step < run.total_steps and eval_due(run) and (last is None or last["step"] != state.step)


def evaluate_and_save(run: Run, stop: StopRequest) -> str | None:
    """The evaluation due at this step, the callbacks' on_eval_end and their decision to stop, then last.pt (and
    best.pt when it set a new best), which holds the callbacks' state after it. Returns the reason to stop now
    (every process gets it: `decided_stop`), or None. A stop signal that has ended the val loader's workers (one
    sent to the whole process group) abandons it: nothing of it is logged or kept, the stop's checkpoint holds
    the step, and the resumed run evaluates that step first (`eval_pending`). A signal that leaves the loader
    working lets it finish."""
    compiling = "eval" not in run.compile_seconds
    reason = None
    if evaluate(run, stop) is not None:
        if compiling and "eval" in run.compile_seconds:
            said_compiled(run, "eval")
        run.callbacks.on_eval_end(run.state.step, run.evaluated)
        reason = decided_stop(run)
        save(run, best=run.state.best_step == run.state.step)
    return reason


def decided_stop(run: Run) -> str | None:
    """Rank 0's callbacks' reason to stop now (`should_stop`), known to every process (one collective when there
    are several: the others run no callbacks and get "" for a reason); None to go on."""
    reason = run.callbacks.should_stop() if run.ctx.is_main else None
    if run.ctx.enabled and not distributed.max_all(int(reason is not None), run.device):
        return None
    if run.ctx.enabled and reason is None:
        return ""  # rank 0 stops: so does this process (rank 0 writes results.json with the reason)
    return reason


def run_info(run: Run, resumed: bool, sweep_job: tuple[str, int] | None) -> RunInfo:
    """What the callbacks are told when the run (or this attempt) starts."""
    cfg = run.cfg
    return RunInfo(
        run_dir=run.run_dir,
        config=cfg.to_dict(),
        name=cfg.name,
        tags=list(cfg.tags),
        run_id=run.state.run_id,
        step=run.state.step,
        total_steps=run.total_steps,
        resumed=resumed,
        group=sweep_job[0] if sweep_job else None,
        trial=sweep_job[1] if sweep_job else None,
        objective_metric=cfg.objective.metric,
        higher_is_better=cfg.objective.higher_is_better,
    )


def save(run: Run, best: bool = False) -> None:
    """last.pt (and best.pt), written by rank 0 once every process is here; the weights are the same on each."""
    run.skips.settle(run.state)
    run.state.set_wall_seconds(run.earlier_seconds + time.time() - run.started)
    with run.window.paused():
        distributed.barrier()
        gathered = sharding.full_states(
            run.model, run.optimizer, run.ema
        )  # FSDP: every process sends rank 0 its shards
        if run.ctx.is_main:
            warn_unsaved_state(run)
            ckpt = checkpoint_state(
                run.model,
                run.optimizer,
                run.scheduler,
                run.scaler,
                run.ema,
                run.state,
                run.cfg,
                run.overrides,
                run.data.class_names,
                run.loss,
                gathered,
                run.window,
                run.callbacks.state_dict(),
            )
            run.logger.sync()  # the rows up to this step reach the disk before the checkpoint that will not log them again
            save_run_checkpoint(ckpt, run.run_dir / "checkpoints", run.cfg.trainer.keep_last, best)
            run.callbacks.on_checkpoint(run.state.step, run.run_dir / "checkpoints" / "last.pt", best)
        distributed.barrier()


def warn_unsaved_state(run: Run) -> None:
    """Once a run: the line naming what the objective's loss keeps on itself that its checkpoint would not hold
    (objectives/base.py `unsaved_state`)."""
    if run.loss_built["said"]:
        return
    changed = unsaved_state(run.loss, run.loss_built["attributes"])
    if changed:
        run.loss_built["said"] = True
        log.warning(
            "objective=%s's loss changed %s since it was built, but its state_dict() keeps nothing: a "
            "resumed run would start %s afresh and train otherwise than this one; return %s from "
            'state_dict() and restore %s in load_state_dict() (docs/extending.md, "State across a '
            'restart")',
            run.cfg.objective.name,
            ", ".join(changed),
            "it" if len(changed) == 1 else "them",
            "it" if len(changed) == 1 else "them",
            "it" if len(changed) == 1 else "them",
        )


def results(run: Run, status: str, error: str | None = None, stop_reason: str | None = None) -> dict[str, Any]:
    """results.json's contents now: how the run ended, the objective's numbers, the times."""
    state, objective = run.state, run.cfg.objective
    seconds = time.time() - run.started
    return results_summary(
        status,
        state,
        objective.name,
        objective.results_of(state.best_of(objective.metric), run.latest),
        run.latest,
        seconds,
        run.run_dir,
        all_attempts=run.earlier_seconds + seconds,
        error=error,
        compile_seconds=sum(run.compile_seconds.values()) if run.compile_seconds else None,
        name=run.cfg.name,
        tags=list(run.cfg.tags),
        stop_reason=stop_reason,
    ) | (lp_ft_results(run) if run.lp_steps else {})


def finish(run: Run, status: str, stop_reason: str | None = None) -> dict[str, Any]:
    """results.json (rank 0), the callbacks' on_train_end and the closing log line; returns the results.
    `stop_reason`: why a callback ended the run (status `stopped_early`)."""
    state = run.state
    run.skips.settle(state)
    _, images, train_seconds = run.window.read()  # steps since the last train row count for images/s too
    state.add_trained(images, train_seconds)
    if status == "stopped_early" and run.ctx.is_main:
        log.info("stopped early at step %d: %s", state.step, stop_reason)
    summary = results(run, status, stop_reason=stop_reason or None)
    if run.ctx.is_main:
        write_results(run.run_dir, summary)
        run.callbacks.on_train_end(summary, status)
    best = (
        "not evaluated"
        if state.best_score is None
        else f"best {shown(state.best_metric, state.best_score)} (step {state.best_step})"
    )
    if state.best_partial:  # the best score, not only the last evaluation, was a partial validation's
        best += (
            f" on a partial validation ({summary['val_images']} images, trainer.limit_val_batches)"
            if summary["val_images"]
            else " on a partial validation (trainer.limit_val_batches)"
        )
    log.info(
        "%s: %s, %d steps (%d skipped), %.0f images/s, %.0f s; outputs in %s",
        status,
        best,
        state.step,
        state.skipped_steps,
        summary["images_per_s"] or 0,
        summary["wall_seconds"],
        run.run_dir,
    )
    return summary


def said_compiled(run: Run, what: str) -> None:
    """The seconds trainer.compile spent on `what` ("step": the first training step; "eval": the first evaluation)
    in the log and metrics.jsonl (split "compile"), once per attempt; images/s and MFU leave them out."""
    seconds = run.compile_seconds[what]
    run.logger.scalars("compile", run.state.step, {f"{what}_seconds": seconds})
    if what == "step" and run.compiled is not None and not run.compiled.active:  # the line above it said why
        log.info("%.1f s went to compiling the training step, which failed; left out of images/s and MFU", seconds)
        return
    log.info(
        "compiled the %s in %.1f s (%s)",
        "training step" if what == "step" else "evaluation",
        seconds,
        "left out of images/s and MFU" if what == "step" else "its first pass, compilation included",
    )


def stopped_compiling(run: Run, stop: StopRequest, before: TrainState) -> None:
    """A stop signal ended the first step's compilation (StopRequest.interruptible): the run stops where the last
    checkpoint (or the start) left it. Nothing trained since (the step being compiled may be half applied in
    memory, so nothing is saved); results.json says `interrupted`. Raises RunStopped."""
    for field in dataclasses.fields(TrainState):
        setattr(run.state, field.name, getattr(before, field.name))
    run.skips.reset(run.state)
    finish(run, "interrupted")
    kept = run_checkpoints(run.run_dir)
    command = "torchrun <the same options> -m vit_train" if run.ctx.enabled else "vit-train"
    again = "".join(f" {change}" for change in run.resumed_with)  # nothing saved them: the line repeats them
    then = (
        f"{kept[0]} holds step {run.state.step}; continue with: {command} resume={run.run_dir}{again}"
        if kept
        else "nothing was trained; start it again with the same command"
    )
    raise RunStopped(f"stopped by {stop.name} while compiling the training step: {then}", stop.exit_code)


def record_failure(run: Run, error: Exception) -> None:
    """A run that failed (a full disk, bad data, a bug): the reason in train.log and, where it can still be
    written, results.json with status `failed` and `error` (its numbers up to the failure)."""
    reason = str(error) if isinstance(error, UserError) else f"{type(error).__name__}: {error}".strip()
    run.logger.note_error(reason if isinstance(error, UserError) else traceback.format_exc().rstrip())
    if not run.ctx.is_main:
        return
    try:
        summary = results(run, "failed", error=reason)
        write_results(run.run_dir, summary)
    except UserError as e:  # the disk that stopped the run may refuse this too
        log.warning("%s", e)
        return
    try:
        run.callbacks.on_train_end(summary, "failed")
    except Exception as e:  # noqa: BLE001 - the run's own error is the one raised
        log.warning("a callback's on_train_end failed after the run failed: %s: %s", type(e).__name__, e)
