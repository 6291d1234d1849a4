"""The training loop: build the run, maybe resume, train with periodic eval/checkpoint/log, finish.

`train(cfg, run_dir)` is the whole run; read it top to bottom. It takes a plain typed `Config`
(no Hydra), so tests and notebooks call it directly. `build_run` (run.py) makes the `Run`
(everything the run is made of); `save`, `evaluate` and `finish` take it. The step is `step.train_step`, the
batches come from `batches.batches`, and the loss from the run's objective (`objectives.py`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import traceback
from pathlib import Path
from typing import Any, Sequence

import torch
from tqdm.contrib.logging import logging_redirect_tqdm

from vit_train.runtime import distributed
from vit_train.outputs import rundir
from vit_train.train.batches import UntilStop, batches
from vit_train.outputs.checkpoint import (find_resume_checkpoint, repair_run_checkpoints, run_checkpoints,
                                           save_run_checkpoint, short_of_space)
from vit_train.config.schema import Config
from vit_train.data.first_batches import FirstBatches
from vit_train.errors import CheckpointError, RunStopped, UserError
from vit_train.objectives import objective_of, objective_terms, objective_window
from vit_train.objectives.score import shown
from vit_train.outputs.metrics import output_error, results_summary, write_results
from vit_train.runtime.logs import EarlyRecords
from vit_train.runtime.preemption import StopRequest
from vit_train.train import sharding
from vit_train.train.run import Run, build_run
from vit_train.train.resume_checks import check_compatible, check_own_run
from vit_train.train.state import checkpoint_state
from vit_train.train.step import diverged_message, train_step
from vit_train.train.throughput import log_train

log = logging.getLogger("vit_train")


def due(step: int, every: int | None) -> bool:
    return bool(every) and step % every == 0


def train(cfg: Config, run_dir: str | Path, overrides: Sequence[str] = (),
          resume_from: tuple[Path, dict] | None = None, lock: rundir.RunLock | None = None) -> dict[str, Any]:
    """Train as `cfg` says, writing checkpoints and logs under `run_dir`; returns the results summary.

    `resume_from`: the (path, checkpoint) `cfg.resume` names, when the caller has loaded it already
    (the command line does, for its config): it is not loaded again. Otherwise `cfg.resume` (a path,
    or `auto`: the newest checkpoint in `run_dir`) is loaded here.
    `lock`: the run directory's lock (rundir.py) when the caller holds it (the command line, a sweep
    job, torchrun's rank 0); it stays held. Without one, rank 0 takes it for the run and frees it.
    Raises RunDirBusy when another process holds `run_dir`, and CheckpointError/ConfigError for a
    resumed config that changes what the checkpoint means (resume_checks.check_compatible), both before
    touching anything in it.
    Raises RunStopped when a stop signal or diverging losses end the run early (after writing
    results.json, and for a signal a checkpoint to resume from). Any other error once the run is
    built (a full disk, bad data) is written to train.log and to results.json (status `failed`,
    `error` the reason) before it is raised; train.log's handler is removed however the run ends.
    """
    run_dir = Path(run_dir)
    own_lock = lock is None and os.environ.get("RANK", "0") == "0"  # under torchrun rank 0 holds it for all
    # EarlyRecords: what is logged before train.log exists (the lock, the checkpoint search, the build) goes there too
    with EarlyRecords(), (rundir.locked(run_dir) if own_lock else contextlib.nullcontext()):
        started = time.time()
        ckpt_path, ckpt = resume_from or find_resume_checkpoint(cfg.resume, run_dir, mmap=True) or (None, None)
        if ckpt is None and run_checkpoints(run_dir):
            raise CheckpointError(f"{run_dir} already holds checkpoints; continue that run with resume=auto (or "
                                  f"resume={run_dir}), or start this one in another directory (hydra.run.dir=...)")
        if ckpt:
            check_own_run(Path(ckpt_path), ckpt, run_dir)
        changes = check_compatible(ckpt, cfg.to_dict(), ckpt_path) if ckpt else []
        run = build_run(cfg, run_dir, overrides, ckpt, started)
        if cfg.resume == "auto" and ckpt is None and run.ctx.is_main:
            log.warning(resume_auto_found_nothing(run_dir))
        try:
            if ckpt:
                log.info("resumed from %s at epoch %d, step %d", ckpt_path, run.state.epoch + 1, run.state.step)
                complete_interrupted_save(run, Path(ckpt_path))
                for change in changes if run.ctx.is_main else []:  # said once, not by every process
                    log.warning("changed since the checkpoint: %s", change)
            else:
                run.logger.config(cfg.to_dict(), step=0)
            describe(run)
            short = short_of_space(run_dir, run.model, 1 if cfg.optim.name == "sgd" else 2, run.ema, cfg.trainer.keep_last)
            if short and run.ctx.is_main:  # said now, not after the first epoch's work
                log.warning("%s", short)  # WARNING says "warning" in train.log; the console shows the message
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


def step_seed(seed: int, step: int, rank: int) -> int:
    """The torch seed of process `rank` for optimiser step `step` (counted from 1) with several processes: each
    process draws differently, and a resumed run draws as the uninterrupted one did (a single process instead
    keeps one RNG stream and restores it from the checkpoint)."""
    return seed * 1_000_003 + 7919 * step + rank


def loop(run: Run) -> dict[str, Any]:
    """The training loop, its periodic eval/checkpoint/log and its end; returns the results summary."""
    state, t, run_dir = run.state, run.cfg.trainer, run.run_dir
    with logging_redirect_tqdm(), StopRequest(deferred=run.ctx.enabled) as stop:
        if eval_pending(run):
            log.info("evaluating step %d first: a stop signal came before its evaluation was done", state.step)
            evaluate_and_save(run, stop)
        for images, targets in batches(run, stop):
            if run.ctx.enabled:  # dropout, drop path, MAE's masks: each process its own draws, a function of the step
                torch.manual_seed(step_seed(run.cfg.seed, state.step, run.ctx.rank))
            train_step(run, images, targets)
            if due(state.step, t.log_every) or state.step == run.total_steps:
                run.skips.settle(state)
                log_train(run.logger, run.bar, run.window, state, run.scheduler.get_last_lr()[0], run.scaler,
                          objective_terms(run.objective))
            if state.bad_in_a_row >= t.max_bad_steps:
                finish(run, "diverged")
                raise RunStopped(diverged_message(state, run_dir), exit_code=3)
            if state.step >= run.total_steps or eval_due(run):
                evaluate_and_save(run, stop)
            elif state.batch_in_epoch == 0 or due(state.step, t.ckpt_every):
                save(run)
        if not run.metrics and not stop:  # resumed a run that had already finished
            log.info("the run already reached its last step (%d); %s", run.total_steps, how_to_train_longer(run))
            evaluate_and_save(run, stop)
        if stop:
            save(run)
            finish(run, "interrupted")
            command = "torchrun <the same options> -m vit_train" if run.ctx.enabled else "vit-train"
            raise RunStopped(f"stopped by {stop.name} at step {state.step}; {run_dir / 'checkpoints' / 'last.pt'} "
                             f"holds it; continue with: {command} resume={run_dir}", stop.exit_code)
    return finish(run, "completed")


def eval_due(run: Run) -> bool:
    """Whether the step just taken is evaluated (every trainer.eval_every steps, else at each epoch's end);
    the last step always is."""
    state, every = run.state, run.cfg.trainer.eval_every
    return due(state.step, every) if every else state.batch_in_epoch == 0


def eval_pending(run: Run) -> bool:
    """Whether the resumed step was due an evaluation that a stop signal left undone (`evaluate_and_save`);
    the last step's is done by the finished-run path of `loop`."""
    state, last = run.state, run.state.last_eval
    return 0 < state.step < run.total_steps and eval_due(run) and (last is None or last["step"] != state.step)


def evaluate_and_save(run: Run, stop: StopRequest) -> None:
    """The evaluation due at this step, then last.pt (and best.pt when it set a new best). A stop signal
    that has ended the val loader's workers (one sent to the whole process group) abandons it: nothing
    of it is logged or kept, the stop's checkpoint holds the step, and the resumed run evaluates that
    step first (`eval_pending`). A signal that leaves the loader working lets it finish."""
    if evaluate(run, stop) is not None:
        save(run, best=run.state.best_step == run.state.step)


def complete_interrupted_save(run: Run, path: Path) -> None:
    """A resume from this run's own checkpoint first completes the save a kill may have cut short: its step
    file, best.pt holding the run's best step, the rotation (checkpoint.repair_run_checkpoints). Another
    run's checkpoint (resume=<its file>) is left as it is."""
    folder, state = run.run_dir / "checkpoints", run.state
    if run.ctx.is_main and path.resolve().parent == folder.resolve():
        repair_run_checkpoints(folder, path, state.step, state.best_step if state.best_score is not None else None,
                               run.cfg.trainer.keep_last)


def how_to_train_longer(run: Run) -> str:
    """What to raise so a finished run trains on: trainer.max_steps when that cap ended it, else trainer.epochs."""
    t = run.cfg.trainer
    if t.max_steps is not None and run.total_steps >= t.max_steps:
        return (f"trainer.max_steps={t.max_steps} ended it: raise trainer.max_steps, or set trainer.max_steps=null "
                f"to train all trainer.epochs ({t.epochs})")
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
    return (f"resume=auto: no checkpoint in {run_dir} (hydra.run.dir), so this run starts at step 0; to continue an "
            f"earlier run, give its directory{how}")


def describe(run: Run) -> None:
    """The run's size, device and throughput reference, in the log."""
    cfg, window = run.cfg, run.window
    labels = objective_of(cfg).data_text(len(run.data.class_names))
    strategy = "FSDP: weights, gradients and optimiser state sharded" if sharding.is_sharded(run.model) else "DDP"
    log.info("%s: %.2fM parameters, %s, %d steps (%d per epoch), device %s%s, precision %s", cfg.model.name,
             sum(p.numel() for p in run.model.parameters()) / 1e6, labels, run.total_steps, run.data.steps_per_epoch,
             run.device, f" x {run.ctx.world_size} processes ({strategy})" if run.ctx.enabled else "",
             run.amp_dtype or torch.float32)
    log.info("%.2f GFLOP per training image; peak %s", window.flops_per_image / 1e9,
             f"{window.peak_tflops:g} TFLOP/s (MFU logged)" if window.peak_tflops else
             "unknown (set trainer.peak_tflops to log MFU)")


def save(run: Run, best: bool = False) -> None:
    """last.pt (and best.pt), written by rank 0 once every process is here; the weights are the same on each."""
    run.skips.settle(run.state)
    run.state.wall_seconds = run.earlier_seconds + time.time() - run.started
    with run.window.paused():
        distributed.barrier()
        gathered = sharding.full_states(run.model, run.optimizer, run.ema)  # FSDP: every process sends rank 0 its shards
        if run.ctx.is_main:
            ckpt = checkpoint_state(run.model, run.optimizer, run.scheduler, run.scaler, run.ema, run.state, run.cfg,
                                    run.overrides, run.data.class_names, run.objective, gathered)
            # the next train row's sums (the objective's terms too): a resume logs the uninterrupted run's row
            ckpt["train_window"] = {**run.window.state_dict(), "terms": objective_window(run.objective)}
            sync_logs(run)  # the rows up to this step reach the disk before the checkpoint that will not log them again
            save_run_checkpoint(ckpt, run.run_dir / "checkpoints", run.cfg.trainer.keep_last, best)
        distributed.barrier()


def sync_logs(run: Run) -> None:
    """fsync metrics.jsonl and the TensorBoard event files, then their folders (after a power loss the resume
    keeps the rows up to its checkpoint's step and logs none of them again, so they must be on disk before
    it: their bytes, and their names: a file created, a resume's rewrite renamed into place)."""
    if run.logger.tb is not None:
        run.logger.tb.flush()
    for path in [run.run_dir / "metrics.jsonl", *sorted((run.run_dir / "tb").glob("events.out.tfevents.*"))]:
        with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
            os.fsync(f.fileno())
    for folder in (run.run_dir / "tb", run.run_dir):
        with contextlib.suppress(OSError):  # no tb/ (TensorBoard off); a file system that cannot fsync a folder
            fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def evaluate(run: Run, stop: StopRequest | None = None) -> dict[str, float] | None:
    """Evaluates the model (and its EMA) on the val set as the run's objective scores it; best.pt follows
    whichever of the two scores better in the objective's direction (the raw model wins a tie).
    Returns None, having logged and recorded nothing, when `stop` cut it short (`cut_short`)."""
    state, objective = run.state, objective_of(run.cfg)
    progress, metric, limit = run.cfg.trainer.progress and run.ctx.is_main, objective.METRIC, run.cfg.trainer.limit_val_batches
    during = contextlib.nullcontext() if stop is None else stop.during(f"the evaluation of step {state.step}")
    distributed.broadcast_buffers(run.model, run.ema)  # every process evaluates the model rank 0 saves (BatchNorm)
    with run.window.paused(), sharding.gathered(run.cfg, run.model, run.ema), during:  # FSDP: no collective per val batch
        val = FirstBatches(run.data.val_loader, limit)  # trainer.limit_val_batches: a partial validation, said so
        passes = UntilStop(val, stop)
        metrics = objective.evaluate(run.eval_fn, passes, run.device, run.amp_dtype, run.cfg, progress,
                                     confusion=bool(run.cfg.trainer.viz_every))  # every rank: the sum is a collective
        if cut_short(run, passes, stop):
            return None
        if val.partial:
            metrics["val_images"] = int(distributed.sum_all(torch.tensor(float(val.images), device=run.device)).item())
        scores, ema_metrics = {"model": metrics[metric]}, None
        if run.ema is not None:
            passes = UntilStop(FirstBatches(run.data.val_loader, limit), stop)
            ema_metrics = objective.evaluate(run.ema.module, passes, run.device, run.amp_dtype, run.cfg, progress)
            if cut_short(run, passes, stop):
                return None
            if val.partial:
                ema_metrics["val_images"] = metrics["val_images"]
            metrics[f"ema_{metric}"] = scores["ema"] = ema_metrics[metric]
        if run.visuals is not None:
            run.visuals.after_eval(run.model, state.step, metrics.pop("confusion", None))
        run.logger.scalars("val", state.step, {k: v for k, v in metrics.items() if not k.startswith("ema_")})
        if ema_metrics is not None:
            run.logger.scalars("val_ema", state.step, ema_metrics)
    state.record_eval(metric, scores, partial=val.partial)
    best = objective.score_text(state.best_score) if state.best_score is not None else "none"
    log.info("step %d (epoch %.2f): %s (best %s, %s)%s", state.step, state.epochs_done,
             objective.eval_text(metrics, ema_metrics, classes=len(run.data.class_names)), best, state.best_source,
             f"; a partial validation: {metrics['val_images']} images, the first {val.limit} of {val.total} val "
             f"batches (trainer.limit_val_batches={limit})" if val.partial else "")
    run.metrics = metrics
    return metrics


def cut_short(run: Run, passes: UntilStop, stop: StopRequest | None) -> bool:
    """Whether a stop signal ended an evaluation pass early in any process; then every process drops the
    evaluation and agrees to stop at this step (one collective each, in every process alike)."""
    if stop is None or not distributed.max_all(int(passes.cut), run.device):
        return False
    stop.agree(distributed.max_all(stop.received or 0, run.device))
    if run.ctx.is_main:
        log.warning("%s ended the evaluation at step %d with its loader's workers: it is left for the resumed run, "
                    "which does it first", stop.name, run.state.step)
    return True


def finish(run: Run, status: str) -> dict[str, Any]:
    """results.json (rank 0) and the closing log line; returns the results."""
    state = run.state
    run.skips.settle(state)
    _, images, train_seconds = run.window.read()  # steps since the last train row count for images/s too
    state.images_seen, state.train_seconds = state.images_seen + images, state.train_seconds + train_seconds
    seconds = time.time() - run.started
    results = results_summary(status, state, run.metrics, seconds, run.run_dir,
                              all_attempts=run.earlier_seconds + seconds)
    if run.ctx.is_main:
        write_results(run.run_dir, results)
    best = "not evaluated" if state.best_score is None else \
        f"best {shown(state.best_metric, state.best_score)} (step {state.best_step})"
    if state.best_partial:  # the best score, not only the last evaluation, was a partial validation's
        best += f" on a partial validation ({results['val_images']} images, trainer.limit_val_batches)" \
            if results["val_images"] else " on a partial validation (trainer.limit_val_batches)"
    log.info("%s: %s, %d steps (%d skipped), %.0f images/s, %.0f s; outputs in %s", status, best, state.step,
             state.skipped_steps, results["images_per_s"] or 0, results["wall_seconds"], run.run_dir)
    return results


def record_failure(run: Run, error: Exception) -> None:
    """A run that failed (a full disk, bad data, a bug): the reason in train.log and, where it can still be
    written, results.json with status `failed` and `error` (its numbers up to the failure)."""
    reason = str(error) if isinstance(error, UserError) else f"{type(error).__name__}: {error}".strip()
    run.logger.note_error(reason if isinstance(error, UserError) else traceback.format_exc().rstrip())
    if not run.ctx.is_main:
        return
    seconds = time.time() - run.started
    results = results_summary("failed", run.state, run.metrics, seconds, run.run_dir,
                              all_attempts=run.earlier_seconds + seconds, error=reason)
    try:
        write_results(run.run_dir, results)
    except UserError as e:  # the disk that stopped the run may refuse this too
        log.warning("%s", e)
