"""Where a run's numbers go: TensorBoard, metrics.jsonl, results.json and train.log."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from torch.utils.tensorboard import SummaryWriter

from vit_train.errors import OutputError
from vit_train.outputs import places
from vit_train.outputs.integrity import write_failure
from vit_train.runtime.logs import EarlyRecords  # train/run.py's name for it

log = logging.getLogger("vit_train")
FREE_SPACE = "free some space, then continue with resume=auto"


class RunLogger:
    """Writes one run's metrics, one row per (split, step) whatever stopped earlier attempts.

    On resume at step S it drops what an earlier attempt logged after S (and a fresh start drops
    all of an earlier attempt's rows), in metrics.jsonl and in every TensorBoard event file; a row for a (split, step) that is already logged is not written again (a finished
    run resumed re-evaluates its last step without logging it twice).
    """

    def __init__(
        self,
        run_dir: Path,
        resume_step: int | None = None,
        early: EarlyRecords | None = None,
        tensorboard: bool = True,
        listeners: Sequence[Callable[[str, int, dict[str, float]], None]] = (),
    ):
        """`early`: the records logged while the run was built (before train.log existed); they are
        written first to train.log, in their order, and the buffer stops collecting. `tensorboard`: write the
        event files in tb/ (logger=[tensorboard]); without it no tb/ folder is made (an earlier attempt's events
        are still cut at the resumed step). `listeners`: called with each row once it is written (the run's
        callbacks, callbacks/runner.py)."""
        self.run_dir = run_dir
        self.jsonl, self.events = run_dir / "metrics.jsonl", run_dir / "tb"
        self.listeners = list(listeners)
        with writing(self.jsonl):
            self.logged = self._truncate_jsonl(resume_step or 0)
        self.tb: SummaryWriter | None = None
        with writing(self.events):
            if resume_step is None:  # a fresh start discards an earlier attempt's events
                for old in self.events.glob("events.out.tfevents.*"):
                    old.unlink()
            elif self.events.is_dir():  # and a resume those after its step, in every file: purge_step relies on file
                drop_events_after(self.events, resume_step)  # names sorting by time, and two in one second by pid
            if tensorboard:
                quiet_event_writer_errors()
                self.tb = SummaryWriter(str(self.events))
        self.file_handler = QuietFileHandler(run_dir / "train.log")
        self.file_handler.setFormatter(logging.Formatter("[%(asctime)s][%(levelname)s] %(message)s"))
        if early is not None:  # handed over and detached at once: no record lost or written twice
            early.hand_to(self.file_handler)
        log.addHandler(self.file_handler)
        if log.level == logging.NOTSET:
            log.setLevel(logging.INFO)

    def _truncate_jsonl(self, step: int) -> set[tuple[str, int]]:
        """Keep the rows up to `step` (a torn last line from a kill is dropped); returns their (split, step)."""
        if not self.jsonl.exists():
            return set()
        kept = []
        for line in self.jsonl.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
                if row["step"] <= step:
                    kept.append(row)
            except (ValueError, KeyError, TypeError):  # half a line written when the process was killed
                continue
        write_atomic(self.jsonl, "".join(json.dumps(row) + "\n" for row in kept))
        return {(row["split"], row["step"]) for row in kept}

    def scalars(self, split: str, step: int, values: dict[str, float]) -> None:
        if (split, step) in self.logged:
            return
        self.logged.add((split, step))
        if self.tb is not None:
            with writing(self.events):
                for name, value in values.items():
                    self.tb.add_scalar(f"{split}/{name}", value, step)
        plain = {k: v if math.isfinite(v) else None for k, v in values.items()}  # NaN is not JSON
        with writing(self.jsonl), open(self.jsonl, "a") as f:
            f.write(json.dumps({"split": split, "step": step, **plain}) + "\n")
        for listener in self.listeners:  # the row as written, once: the callbacks' on_metrics
            listener(split, step, dict(values))

    def sync(self) -> None:
        """fsync metrics.jsonl and the TensorBoard event files, then their folders (after a power loss the resume
        keeps the rows up to its checkpoint's step and logs none of them again, so they must be on disk before
        it: their bytes, and their names: a file created, a resume's rewrite renamed into place)."""
        if self.tb is not None:
            self.tb.flush()
        for path in [self.jsonl, *sorted(self.events.glob("events.out.tfevents.*"))]:
            with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
                os.fsync(f.fileno())
        for folder in (self.events, self.run_dir) if self.events.is_dir() else (self.run_dir,):
            with contextlib.suppress(OSError):  # a file system that cannot fsync a folder
                places.fsync_dir(folder)

    def note_error(self, message: str) -> None:
        """`message` as an error in train.log only (the command line prints it once itself)."""
        self.file_handler.handle(log.makeRecord(log.name, logging.ERROR, __file__, 0, message, None, None))

    def config(self, config: dict[str, Any], step: int) -> None:
        """The run's config in full to train.log and TensorBoard (Text tab); one line on the console
        saying where it is (it is about 90 lines: printed at every start it buried the log)."""
        text = yaml.safe_dump(config, sort_keys=False)
        if self.tb is not None:
            with writing(self.events):
                self.tb.add_text("config", "    " + text.replace("\n", "\n    "), step)  # indented: shown as code
        self.file_handler.handle(
            log.makeRecord(log.name, logging.INFO, __file__, 0, "config:\n%s", (text.rstrip(),), None)
        )
        composed = self.run_dir / ".hydra" / "config.yaml"
        log.info(
            "config: in %s%s%s",
            self.run_dir / "train.log",
            f", {composed}" if composed.is_file() else "",
            " and TensorBoard's Text tab" if self.tb is not None else "",
        )

    def close(self) -> None:
        try:
            if self.tb is not None:
                self.tb.close()
        except OSError as e:  # the events' disk is full: said once, the run's own error (if any) stays the one raised
            log.warning(
                "TensorBoard events after %s were lost: %s", self.events, write_failure(e, self.events, 0, None)
            )
        log.removeHandler(self.file_handler)
        self.file_handler.close()


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """A failed write of one of the run's files or folders (a full disk, a quota) becomes an OutputError naming it."""
    try:
        yield
    except OSError as e:  # a full disk or quota: free space; a read-only remount, lost permission: make it writable
        raise places.place_error(e, path, FREE_SPACE, "make it writable, then continue with resume=auto") from None


def output_error(error: Exception, run_dir: Path) -> Exception:
    """`error` as the run reports it: a full disk or quota met in a write not named otherwise (figures in
    TensorBoard, say) becomes one OutputError naming the run directory; anything else is kept."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return OutputError(
            f"could not write in {run_dir}: {write_failure(error, run_dir / 'x', 0, None)}; {FREE_SPACE}"
        )
    return error


def quiet_event_writer_errors() -> None:
    """TensorBoard's writer thread prints a traceback when its disk is full, then the same error is raised
    in the training thread at the next call (and reported there in one line): the thread's print is dropped."""
    previous = threading.excepthook
    if getattr(previous, "quiets_event_writer", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if not (isinstance(args.exc_value, OSError) and type(args.thread).__name__ == "_AsyncWriterThread"):
            previous(args)

    hook.quiets_event_writer = True
    threading.excepthook = hook


def drop_events_after(tb_dir: Path, step: int) -> None:
    """Rewrite each TensorBoard event file in `tb_dir` without its events after `step` and without
    restart markers (what SummaryWriter's purge_step writes, which TensorBoard applies in file-name
    order), through a temporary file renamed over it. Files with nothing to drop are left as they are."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    def keep(record: bytes) -> bool:
        event = Event.FromString(record)
        return event.HasField("file_version") or (not event.HasField("session_log") and event.step <= step)

    for path in sorted(tb_dir.glob("events.out.tfevents.*")):
        records = list(RawEventFileLoader(str(path)).Load())  # a record torn by a kill ends the file
        kept = [r for r in records if keep(r)]
        if len(kept) == len(records):
            continue
        tmp = tb_dir / "rewrite.tmp"  # not an event file name: TensorBoard never reads it
        with open(tmp, "wb") as f:
            writer = RecordWriter(f)
            for record in kept:
                writer.write(record)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        places.fsync_dir(tb_dir)  # the rewritten file's name durable too: a power loss keeps one or the other


class NullLogger:
    """What processes other than rank 0 log with: nothing (rank 0 writes the run's files)."""

    tb = None

    def scalars(self, split: str, step: int, values: dict[str, float]) -> None:
        pass

    def sync(self) -> None:
        pass

    def note_error(self, message: str) -> None:
        pass

    def config(self, config: dict[str, Any], step: int) -> None:
        pass

    def close(self) -> None:
        pass


class QuietFileHandler(logging.FileHandler):
    """train.log; a failed write (a full disk) is said once on stderr, not as a traceback per record."""

    failed = False

    def handleError(self, record: logging.LogRecord) -> None:
        if not self.failed:
            self.failed = True
            print(
                f"vit-train: warning: cannot write {self.baseFilename} (the disk may be full); it misses "
                f"records from here on",
                file=sys.stderr,
            )

    def close(self) -> None:
        try:
            super().close()
        except OSError:  # its last records could not be flushed: handleError has said so, or the run's error will
            self.handleError(None)
            self.stream = None


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write `text` to `path` through `<path>.tmp`, fsynced, renamed over `path` and the folder fsynced
    (outputs/places.py): `path` is never half written, and once this returns it survives a power
    loss. Raises OSError, the temporary file removed and `path` as it was."""
    places.write_atomic(path, text)


def write_results(run_dir: Path, results: dict[str, Any]) -> None:
    with writing(run_dir / "results.json"):
        write_atomic(run_dir / "results.json", json.dumps(results, indent=2) + "\n")


def results_summary(
    status: str,
    state,
    objective: str,
    scores: dict[str, Any],
    metrics: dict[str, float],
    wall_seconds: float,
    run_dir: Path,
    all_attempts: float | None = None,
    error: str | None = None,
    compile_seconds: float | None = None,
    name: str = "",
    tags: list[str] | None = None,
    stop_reason: str | None = None,
) -> dict[str, Any]:
    """results.json: how the run ended and its numbers. `state` is the run's TrainState; `objective` its
    objective's name and `scores` that objective's own numbers (its `results_of`: best and final scores, null
    before an evaluation); `metrics` the last evaluation's. `wall_seconds` is this attempt's, `all_attempts`
    adds the earlier attempts' (each up to its last checkpoint); `error` says why a `failed` run stopped;
    `compile_seconds` what trainer.compile spent compiling in this attempt (None: nothing was compiled), which
    images_per_s leaves out; `name` and `tags` the config's; `stop_reason` why a `stopped_early` run ended (a
    callback's sentence, callbacks/base.py `should_stop`)."""
    return {
        "status": status,
        "stop_reason": stop_reason,
        "run_id": state.run_id,  # made at the run's start, kept across resumes
        "name": name,
        "tags": list(tags or []),  # the config's: what the user called the run
        "objective": objective,
        **scores,
        "best_step": state.best_step,
        "best_source": state.best_source,
        # trainer.limit_val_batches: the last evaluation covered only these val images (not the val set's score)
        "val_partial": "val_images" in metrics,
        "val_images": metrics.get("val_images"),
        "best_partial": state.best_partial,  # the best score is a partial validation's (trainer.limit_val_batches)
        "epochs": state.epochs_done,
        "steps": state.step,
        "skipped_steps": state.skipped_steps,
        "images_per_s": state.images_seen / state.train_seconds if state.train_seconds else None,
        "wall_seconds": wall_seconds,
        "wall_seconds_all_attempts": wall_seconds if all_attempts is None else all_attempts,
        "compile_seconds": compile_seconds,
        "error": error,
        "run_dir": str(run_dir),
    }
