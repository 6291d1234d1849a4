"""Pre-emption: SIGTERM, SIGINT and SIGUSR1 ask the training loop to checkpoint and stop.

Clusters send SIGTERM (or, with `--signal`, SIGUSR1) some time before they kill a job; Ctrl-C
sends SIGINT. The handler only sets a flag, which the loop reads between steps, so the checkpoint
always holds a whole step. A second Ctrl-C stops at once, without a checkpoint. A handler that
was installed before (a cluster tool's) is called once the loop has stopped. The same signal again
(a launcher that forwards the signal it sent to the group) is said once.

Work that changes nothing a checkpoint holds and may take minutes (torch.compile compiling the first
step or the first evaluation) runs `interruptible`: a stop signal then ends it at once, raising
`CompileInterrupted` in the training process, which stops without training further.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("vit_train")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
RETRY = 0.05  # seconds between raises of CompileInterrupted until the interrupted work has been left


class CompileInterrupted(BaseException):
    """A stop signal arrived during `StopRequest.interruptible` work (its argument names the work): the work is
    abandoned where it stood. A BaseException, so that no `except Exception` on the way (torch.compile's
    wrappers of compiler errors) turns it into something else."""


def in_pin_memory_thread(args: threading.ExceptHookArgs) -> bool:
    """Whether a thread's uncaught error came from torch's DataLoader pin-memory loop."""
    tb = args.exc_traceback
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(os.path.join("data", "_utils", "pin_memory.py")):
            return True
        tb = tb.tb_next
    return False


class StopRequest:
    """A context manager installing the handlers; true once a stop signal has arrived.

    `deferred` (several processes): a signal only counts once `agree` is called with it, so that
    every process changes its mind at the same step; rank 0 alone says so (one line for all processes,
    whichever of them the signal reached).
    """

    def __init__(self, deferred: bool = False) -> None:
        self.signum: int | None = None  # the stop in effect
        self.received: int | None = None  # the last signal this process got
        self.deferred = deferred
        self._previous: dict[int, object] = {}
        self._pid = os.getpid()  # the process the handlers are for
        self.doing: str | None = None  # work other than a training step in progress (`during`), named in the warning
        self.interrupts: str | None = None  # work a stop signal ends at once (`interruptible`)
        self._alarm = None  # SIGALRM's handler before `_interrupt` armed its retries

    def __enter__(self) -> StopRequest:
        self._pid = os.getpid()
        if threading.current_thread() is threading.main_thread():  # Python allows handlers only there
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        self._thread_hook, threading.excepthook = threading.excepthook, self._thread_error
        return self

    def _thread_error(self, args: threading.ExceptHookArgs) -> None:
        """A loader's pin-memory thread (CUDA, pinned memory) reading from the workers a stop signal to the process
        group has ended dies with a reset connection or a cut pipe (pytorch #28950): the stop is said once, by
        `_handle`, not with that thread's traceback. Any other thread's error is shown as before."""
        if self.received and issubclass(args.exc_type, (OSError, EOFError)) and in_pin_memory_thread(args):
            return
        self._thread_hook(args)

    def __exit__(self, *exc) -> None:
        threading.excepthook = self._thread_hook
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        # A handler that was there before ours (submitit's requeue on SIGUSR1, say) still gets the
        # signal, now that the checkpoint is written. Python's own Ctrl-C handler is not chained.
        previous = self._previous.get(self.signum)
        if callable(previous) and previous is not signal.default_int_handler:
            previous(self.signum, None)

    def _handle(self, signum: int, frame) -> None:
        if os.getpid() != self._pid:
            # A forked copy (a loader worker between its fork and its own handlers, data/__init__.py
            # _worker_signals): the group's signal is the training process's to act on and to say.
            return
        if signum == signal.SIGINT and self.received == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C
        again = signum == self.received  # the group's signal forwarded once more by a launcher: said once
        self.received = signum
        if not self.deferred:
            self.signum = signum
        if self.speaks and not again:
            log.warning(
                "received %s: %s%s",
                signal.Signals(signum).name,
                self.plan(),
                "" if self.interrupts and not self.deferred else " (Ctrl-C again to stop at once)",
            )
        if self.interrupts and not self.deferred:
            self._interrupt()

    def _interrupt(self, *_) -> None:
        """Raise CompileInterrupted in the main thread, now and, until it has left the interruptible work, every
        RETRY seconds (SIGALRM): a signal handler's exception that lands in a weakref callback or a __del__ (dynamo
        runs many) is swallowed there, so one raise is not enough. A swallowed one prints nothing (`_unraisable`)."""
        if signal.getitimer(signal.ITIMER_REAL)[1] == 0:  # not armed yet
            self._alarm = signal.signal(signal.SIGALRM, self._interrupt)
            self._unraisable_hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
            signal.setitimer(signal.ITIMER_REAL, RETRY, RETRY)
        raise CompileInterrupted(self.interrupts)

    def _unraisable(self, unraisable) -> None:
        if not isinstance(unraisable.exc_value, CompileInterrupted):
            self._unraisable_hook(unraisable)

    @contextmanager
    def interruptible(self, doing: str) -> Iterator[None]:
        """Inside, a stop signal ends `doing` at once (CompileInterrupted) instead of waiting for it to finish: for
        work whose result nothing saved depends on (compiling). With several processes (`deferred`) it waits as
        any work does: one process alone leaving a collective would hang the others."""
        before, self.interrupts = self.interrupts, doing
        try:
            if self.signum and not self.deferred:  # stopping already
                raise CompileInterrupted(doing)
            yield
        finally:
            self.interrupts = before
            if self._alarm is not None:  # disarmed as the work is left, however it is left
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, self._alarm)
                sys.unraisablehook, self._alarm = self._unraisable_hook, None

    @contextmanager
    def during(self, doing: str) -> Iterator[None]:
        """Inside, a stop signal's warning names `doing` (e.g. "the evaluation of step 8") as what ends
        before the checkpoint, instead of "this step"."""
        before, self.doing = self.doing, doing
        try:
            yield
        finally:
            self.doing = before

    def plan(self) -> str:
        """What a stop signal arriving now leads to, as the warning says it."""
        if self.interrupts and not self.deferred:
            return f"stopping now: {self.interrupts} is abandoned"
        if self.doing is None:
            return "checkpointing after this step, then stopping"
        return f"checkpointing once {self.doing} ends (or is cut short), then stopping"

    def agree(self, signum: int) -> None:
        """The stop all processes agreed on (the largest signal number any of them received)."""
        if signum and not self.signum:
            self.signum = signum
            if self.received is None and self.speaks:
                log.warning("another process received %s: %s", self.name, self.plan())

    @property
    def speaks(self) -> bool:
        """Whether this process says what a stop signal does: one process alone, or rank 0 of several."""
        return not self.deferred or os.environ.get("RANK", "0") == "0"

    def __bool__(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    @property
    def exit_code(self) -> int:
        """The shell's convention for a process ended by a signal: 128 + its number (SIGTERM 143, SIGINT 130)."""
        return 128 + (self.signum or 0)
