"""The training batches of a run, from where it stands to its last step, or to an agreed stop.

`batches(run, stop)` owns what happens around the loader, so the loop sees only (images, targets)
on the device: each epoch's order (`TrainState.begin_epoch`, skipping what a resumed run already
trained on), the progress (a bar on a terminal, lines in a log: progress.py), MixUp/CutMix, the first
batch's figure, the narrow handling of a loader that a stop signal ended, and the stop agreement
between processes. It reads the run's position and never writes it: the loop counts each step
(`TrainState.advance`). `UntilStop` is the same narrow handling for an evaluation's loader.
Unreadable images are dealt with inside the loader (data/decoding/unreadable.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sized
from typing import TYPE_CHECKING

import torch

from vit_train.runtime import distributed
from vit_train.runtime.preemption import StopRequest
from vit_train.runtime.progress import epoch_span

if TYPE_CHECKING:
    from vit_train.train.run import Run

# What a loader raises when its worker processes are ended under it (a stop signal to the whole
# process group): a worker's exit (RuntimeError), a reset connection (OSError), a cut pipe (EOFError).
LOADER_ENDED = (RuntimeError, OSError, EOFError)

log = logging.getLogger("vit_train")


def next_batch(loader: Iterator, stop: StopRequest):
    """The loader's next batch; None at its end, or when a stop signal has also ended its workers
    (the last step is whole). The same error without a signal is raised."""
    try:
        return next(loader)
    except StopIteration:
        return None
    except LOADER_ENDED:
        if not stop.received:
            raise
        return None


class UntilStop:
    """The batches of `loader` (an evaluation's), ended early when a stop signal has also ended its
    workers (the whole process group got it: SIGTERM ends workers quietly) instead of raising; `cut`
    then says the pass ended early and its figures cover part of the set. The same loader error
    without a signal is raised. A loader the signal left working (SIGINT, SIGUSR1, no workers) runs on."""

    def __init__(self, loader: Sized, stop: StopRequest | None):
        self.loader, self.stop, self.cut = loader, stop, False

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator:
        self.cut = False
        batches = iter(self.loader)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except LOADER_ENDED:
                if self.stop is None or not self.stop.received:
                    raise
                self.cut = True
                return
            yield batch


def batches(run: Run, stop: StopRequest) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(images, targets) for each step until `run.total_steps` or a stop. The loop advances `run.state` past
    each batch it is given (`TrainState.advance`) before asking for the next, so each epoch ends when the
    position rolls over (`state.batch_in_epoch == 0`); the mix of a batch is drawn from the step before it.
    With several processes the stop is agreed after every fetch, before the step: all processes stop at the
    same step, whichever got the signal, and none waits for a step that another will not take."""
    state, data = run.state, run.data
    sampler = data.train_sampler
    while state.step < run.total_steps and not stop:
        state.begin_epoch(sampler)
        if sampler.left_out and run.ctx.is_main:
            log.warning(
                "%d images of epoch %d are left out: its last batch cannot be shared evenly by %d processes",
                sampler.left_out,
                state.epoch + 1,
                run.ctx.world_size,
            )
        if not sampler.batches_left():  # all that was left of the epoch was left out
            state.end_epoch()
            data.epoch_done(state.epoch)
            continue
        total, last = epoch_span(
            state.epoch,
            state.batch_in_epoch,
            sampler.batches_left(),
            run.total_steps - state.step,
            data.steps_per_epoch,
        )  # as far as the run will go
        run.progress.begin(total, f"epoch {state.epoch + 1}/{last}", initial=state.batch_in_epoch)
        loader = iter(data.train_loader)
        run.window.start()
        try:
            while state.step < run.total_steps:
                fetch = time.perf_counter()
                batch = next_batch(loader, stop)
                run.window.wait(time.perf_counter() - fetch)
                if run.ctx.enabled:
                    stop.agree(distributed.max_all(stop.received or 0, run.device))
                if stop:
                    return
                if batch is None:
                    raise RuntimeError(
                        f"the training loader ended at image {state.sample_in_epoch} of epoch "
                        f"{state.epoch + 1}, which ends at {state.epoch_end}"
                    )
                images, targets = (x.to(run.device, non_blocking=True) for x in batch)
                if run.mix is not None:
                    images, targets = run.mix(images, targets, state.step)
                if run.visuals is not None and not run.visuals.batch_shown:
                    run.visuals.training_batch(images, targets, state.step)
                yield images, targets
                run.progress.update()
                if state.batch_in_epoch == 0:  # the loop's step ended the epoch
                    break
        finally:
            run.window.pause()
            run.progress.close()
