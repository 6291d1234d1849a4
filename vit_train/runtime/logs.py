"""A run's log records before its train.log exists: kept, then written there first (no torch here, so
the command line uses it before the config is known to be valid)."""

from __future__ import annotations

import logging

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
