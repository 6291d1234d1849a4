"""Pre-emption: SIGTERM, SIGINT and SIGUSR1 ask the training loop to checkpoint and stop.

Clusters send SIGTERM (or, with `--signal`, SIGUSR1) some time before they kill a job; Ctrl-C
sends SIGINT. The handler only sets a flag, which the loop reads between steps, so the checkpoint
always holds a whole step. A second Ctrl-C stops at once, without a checkpoint. A handler that
was installed before (a cluster tool's) is called once the loop has stopped.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from contextlib import contextmanager
from typing import Iterator

log = logging.getLogger("vit_train")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


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

    def __enter__(self) -> "StopRequest":
        self._pid = os.getpid()
        if threading.current_thread() is threading.main_thread():  # Python allows handlers only there
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
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
        self.received = signum
        if not self.deferred:
            self.signum = signum
        if self.speaks:
            log.warning("received %s: %s (Ctrl-C again to stop at once)", signal.Signals(signum).name, self.plan())

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
