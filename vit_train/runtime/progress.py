"""Progress: a tqdm bar on a terminal; plain periodic lines in a log (SLURM, CI, `> file`).

An epoch's bar counts the steps the run will take in it, against the epochs it will reach
(`epoch_span`: a trainer.max_steps cap ends the count where the run ends); epochs count from 1,
in the bar and in the log's resume line alike.

A bar redraws itself with carriage returns, which a file keeps: the log of a long run fills with
megabytes of half-lines (Lightning #6647 and #8975 report it). When stderr is not a terminal,
`progress_bar` returns a `LineProgress` instead: the same figures as one whole line at most every
`LINE_INTERVAL` seconds and at the end of each epoch. An evaluation gets no progress lines there:
its result is logged. Other commands' counts (vit-shards' images) go through `progress_items`, the
same way: a bar on a terminal, lines in a log.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from tqdm.auto import tqdm

LINE_INTERVAL = 60.0  # seconds between progress lines in a non-interactive log


class LineProgress:
    """The part of tqdm's interface the loop uses (`update`, `set_postfix`, `close`), as whole lines:
    `epoch 2/5: 78/156 steps (50%), 0.41 s/step, img_s=156, loss=0.8964, lr=1.54e-03, wait=3%`.

    `set_postfix` only keeps the figures (it never prints: a log gets no line per log step);
    `update` prints once `interval` seconds of `clock` have passed since the last line; `close`
    prints the last line, once, if a step was made since the start and the last line. `unit`: what is
    counted; other than a step, its rate is per second unless one takes longer
    (`vit-shards train: 40/48 images (83%), 212.5 images/s`).
    """

    def __init__(
        self,
        total: int,
        desc: str,
        initial: int = 0,
        interval: float = LINE_INTERVAL,
        file: IO[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        unit: str = "step",
    ):
        self.total, self.desc, self.n, self.interval, self.clock = total, desc, initial, interval, clock
        self.unit = unit
        self.file = file if file is not None else sys.stderr
        self.start_n, self.started = initial, clock()
        self.last_line, self.postfix, self.closed, self.shown_n = self.started, {}, False, initial

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.clock() - self.last_line >= self.interval:
            self.print_line()

    def set_postfix(self, ordered_dict: dict[str, Any] | None = None, refresh: bool = True, **kwargs: Any) -> None:
        self.postfix = {**(ordered_dict or {}), **kwargs}

    def print_line(self) -> None:
        self.last_line, self.shown_n = self.clock(), self.n
        done, elapsed = self.n - self.start_n, self.last_line - self.started
        if self.unit == "step" or done and done < elapsed:  # a second or more each
            rate = f", {elapsed / done:.2f} s/{self.unit}" if done else ""
        else:
            rate = f", {done / elapsed:.1f} {self.unit}s/s" if done and elapsed > 0 else ""
        share = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        figures = "".join(f", {k}={v}" for k, v in self.postfix.items())
        print(f"{self.desc}: {self.n}/{self.total} {self.unit}s{share}{rate}{figures}", file=self.file, flush=True)

    def close(self) -> None:
        if not self.closed and self.n != self.shown_n:
            self.print_line()
        self.closed = True

    def restart_clock(self, after: int = 0) -> None:
        """Rates from now on, the next `after` steps left out too (a step that compiled)."""
        self.start_n, self.started = self.n + after, self.clock()


def interactive(stream: IO[str] | None = None) -> bool:
    """Whether `stream` (stderr) is shown live: a terminal, or a Jupyter notebook's output (where
    tqdm.auto draws a widget, though its isatty() is False)."""
    stream = stream if stream is not None else sys.stderr
    return bool(getattr(stream, "isatty", lambda: False)()) or type(stream).__module__.startswith("ipykernel")


def epoch_span(epoch: int, done: int, left: int, run_left: int, steps_per_epoch: int) -> tuple[int, int]:
    """What an epoch's bar counts against: (the steps of this epoch the run will have taken at the
    bar's end, the number of the run's last epoch), both as the run will actually go.

    `epoch`: the epoch (0-based; the bar shows `epoch + 1`); `done`: its steps taken already (a
    resumed run); `left`: its steps still to come; `run_left`: the run's steps still to come (the
    trainer.max_steps cap included); `steps_per_epoch`: the steps of each later epoch. A 20-step run
    of 78-step epochs shows `epoch 1/1: 20/20`, not `epoch 1/10: 20/78`; a run of whole epochs
    shows its trainer.epochs.
    """
    beyond = max(run_left - left, 0)
    later = -(-beyond // steps_per_epoch) if steps_per_epoch else 0
    return done + min(left, run_left), epoch + 1 + later


def progress_bar(total: int, desc: str, enabled: bool, initial: int = 0) -> Any:
    """A tqdm bar of `total` steps on a terminal, `LineProgress` in a log; a silent one when not `enabled`."""
    if enabled and not interactive():
        return LineProgress(total, desc, initial, interval=LINE_INTERVAL)
    return tqdm(total=total, initial=initial, desc=desc, disable=not enabled, dynamic_ncols=True, leave=False)


class EpochProgress:
    """A run's progress, one `progress_bar` per epoch (`begin` ... `close`), kept in one object the run holds
    from its start: the loop's log lines reach the epoch's bar through it (`set_postfix`)."""

    def __init__(self, enabled: bool):
        self.enabled, self.bar = enabled, progress_bar(0, "", False)

    def begin(self, total: int, desc: str, initial: int = 0) -> None:
        self.bar = progress_bar(total, desc, self.enabled, initial=initial)

    def update(self, n: int = 1) -> None:
        self.bar.update(n)

    def set_postfix(self, **kwargs: Any) -> None:
        self.bar.set_postfix(**kwargs)

    def close(self) -> None:
        self.bar.close()

    def restart_clock(self, after: int = 0) -> None:
        """The bar's rate (s/step) from now on, the next `after` steps left out too: a step that compiled is not
        a training step's time (its images/s leaves it out too)."""
        if isinstance(self.bar, LineProgress):
            self.bar.restart_clock(after)
        elif not getattr(self.bar, "disable", True):  # tqdm: rate = (n - initial) / (now - start_t)
            self.bar.initial, self.bar.start_t = self.bar.n + after, self.bar._time()


def progress_items(iterable: Iterable, total: int, desc: str, enabled: bool, unit: str = "image") -> Iterator:
    """The items of `iterable` (`total` of them), counted: a tqdm bar on a terminal; in a log (`> file`, CI)
    whole `LineProgress` lines, at most one every `LINE_INTERVAL` seconds and one once all are through (none
    when the iteration stops early: the error that stopped it is the last line); nothing when not `enabled`."""
    if not enabled:
        yield from iterable
    elif interactive():
        yield from tqdm(iterable, total=total, desc=desc, unit=unit)
    else:
        lines = LineProgress(total, desc, interval=LINE_INTERVAL, unit=unit)
        for item in iterable:
            yield item
            lines.update()
        lines.close()


def progress_iter(iterable: Iterable, desc: str, enabled: bool) -> Iterable:
    """`iterable` with a tqdm bar on a terminal; as it is in a log (an evaluation logs its result)."""
    if enabled and interactive():
        return tqdm(iterable, desc=desc, leave=False, dynamic_ncols=True)
    return iterable
