"""A run's log records before its train.log exists: kept, then written there first (no torch here, so
the command line uses it before the config is known to be valid)."""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger("vit_train")


class EarlyRecords(logging.Handler):
    """Keeps the `vit_train` logger's records from the start of a run (the command line's warnings,
    the CPU threads, what model.pretrained loaded, the distillation teacher, ...) until train.log's
    handler exists (RunLogger), so train.log has every record the console printed. The console prints
    them once, as it would anyway. A context manager: attached to the logger on entry, detached on exit
    (the records, if not handed over, are dropped). Nested, the inner one joins the outer (`with` binds
    the outer), so the records the command line kept before train() and those of the build go to
    train.log together, in their order. Entering sets the logger to INFO when it has no level (as a
    run does anyway), so the INFO records before the build are kept too."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.joined = False  # entered inside another one: that one collects, this one does nothing

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def hand_to(self, handler: logging.Handler) -> None:
        """Stop collecting and pass the records so far, in order, to `handler` (which keeps their times)."""
        log.removeHandler(self)
        for record in self.records:
            if record.levelno >= handler.level:
                handler.handle(record)
        self.records.clear()

    def __enter__(self) -> EarlyRecords:
        outer = next((h for h in log.handlers if isinstance(h, EarlyRecords)), None)
        if outer is not None:
            self.joined = True
            return outer
        if log.level == logging.NOTSET:
            log.setLevel(logging.INFO)
        log.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.joined:
            return
        log.removeHandler(self)
        self.records.clear()


class QuietStdout:
    """Standard output for a training run (`sys.stdout = QuietStdout(sys.stdout)`): a failed write (a
    full disk, /dev/full, a closed pipe) is said once on stderr instead of a traceback per log line,
    and what is written after it is dropped; the run goes on, and train.log keeps every line. Anything
    else is the wrapped stream's (tqdm and logging see it as the console)."""

    def __init__(self, stream):
        self._stream = stream
        self.failed = False

    def write(self, text: str) -> int:
        if not self.failed:
            self._guarded(self._stream.write, text)
        return len(text)

    def flush(self) -> None:
        if not self.failed:
            self._guarded(self._stream.flush)

    def _guarded(self, call, *args) -> None:
        try:
            call(*args)
        except (OSError, ValueError) as e:  # ValueError: the stream was closed
            self.failed = True
            why = getattr(e, "strerror", None) or str(e) or type(e).__name__
            try:
                print(
                    f"vit-train: warning: cannot write to standard output ({why}); its lines are dropped from "
                    f"here on, train.log keeps them",
                    file=sys.stderr,
                )
            except (OSError, ValueError):
                pass
            try:  # the unwritten rest of the buffer goes nowhere, so the exit does not fail on it again
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, self._stream.fileno())
                os.close(devnull)
            except (OSError, ValueError, AttributeError):
                pass

    def __getattr__(self, name: str):
        return getattr(self._stream, name)
