"""A sweep job's console lines carry the job's number: `[job 3] step 20 (epoch 1.00): ...`.

The parallel launcher (hydra/launcher=parallel) runs jobs side by side in worker processes that
share one terminal, so their lines interleave; like torchrun's `[rank0]:` and SLURM's
`srun --label`, every line a job prints (its log records, progress lines, warnings, errors) starts
with its tag. train.log is the job's own and is not tagged. Hydra's launcher names each job's
overrides under the same number (`#3 : optim.lr=...`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import multiprocessing
import re
import sys
from collections.abc import Iterator
from typing import IO

LINE_BREAK = re.compile(r"(\r\n|\n|\r)")


class TaggedStream(io.TextIOBase):
    """A text stream that writes `tag` before every line it passes on to `stream`: at the start,
    after each newline, and after a carriage return (a redrawn progress bar keeps its tag). A tag is
    written only when text follows, so a line's end never leaves a dangling tag.

    `live`: whether it may say it is a terminal (when `stream` is one); a job running beside others
    says no, so progress comes as whole lines (runtime/progress.py), not bars redrawn over each other.
    """

    def __init__(self, stream: IO[str], tag: str, live: bool = True):
        super().__init__()
        self.stream, self.tag, self.live, self.at_line_start = stream, tag, live, True

    def write(self, text: str) -> int:
        out = []
        for i, part in enumerate(LINE_BREAK.split(text)):
            if i % 2:  # a line break
                out.append(part)
                self.at_line_start = True
            elif part:
                if self.at_line_start:
                    out.append(self.tag)
                    self.at_line_start = False
                out.append(part)
        self.stream.write("".join(out))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.live and bool(getattr(self.stream, "isatty", lambda: False)())

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", "utf-8")


def side_by_side() -> bool:
    """Whether this job runs in a worker process (the parallel launcher), where other jobs may print
    at the same time; the basic launcher runs jobs one after another in the main process."""
    return multiprocessing.parent_process() is not None


@contextlib.contextmanager
def tagged_console(job: int, live: bool | None = None) -> Iterator[None]:
    """For the job's duration, sys.stdout, sys.stderr and the log handlers that write to them put
    `[job N] ` before each line. `live` (default: not `side_by_side()`): see TaggedStream."""
    live = not side_by_side() if live is None else live
    tag = f"[job {job}] "
    before = sys.stdout, sys.stderr
    tagged = {id(s): TaggedStream(s, tag, live) for s in before}
    handlers = [
        h
        for name in (None, "vit_train")
        for h in logging.getLogger(name).handlers
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler) and id(h.stream) in tagged
    ]
    streams = [h.stream for h in handlers]
    sys.stdout, sys.stderr = (tagged[id(s)] for s in before)
    for handler in handlers:
        handler.setStream(tagged[id(handler.stream)])
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = before
        for handler, stream in zip(handlers, streams, strict=True):
            handler.setStream(stream)
