"""Command-line entry points (the only module that imports Hydra).

`vit-train [overrides]` reads its command line once (compose.py `read`: Hydra's flags, the arguments' checks,
Hydra's composition of configs/train.yaml with the overrides against the typed schema, nodes.py), then hands it to
Hydra, which runs the task with the typed `Config` found there and `trainer.train`. `resume=PATH` continues that
run in its own directory, from the config saved in its checkpoint (found once, in `read`), with any new key
overrides applied on top; `--cfg job` prints that config, however the flag is spelled.

`vit-train -m ...` runs a sweep: each job (sweep.run_job) returns its objective (`sweep.objective`) to the
sweeper; at the end `SweepSummary` writes the sweep's summary and exits 1 if any job did not complete.

Hydra's public callbacks do the rest: `RunRecords` takes the run (or sweep) directory's lock before Hydra writes
there and writes each job's record (.hydra/), never half written. They hold no class state: the lock this
process took on a run directory waits in `HELD`, keyed by that directory, for the task that runs there.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from vit_train.cli import torchrun
from vit_train.cli.arguments import check_writable, resumes_existing
from vit_train.cli.compose import CommandLine, Run, read, run_config, show
from vit_train.cli.flags import shows_config
from vit_train.cli.nodes import register_options  # noqa: F401 (the schema's nodes in ConfigStore; run again for your own option)
from vit_train.config import config_dir as _config_dir
from vit_train.errors import RunStopped, UserError, exit_with
from vit_train.outputs import rundir
from vit_train.outputs.rundir import RunDirBusy
from vit_train.runtime.logs import EarlyRecords, QuietStdout

HELD: dict[Path, rundir.RunLock] = {}  # run directory -> the lock RunRecords took on it, until its task takes it


def written(overrides: Any) -> list[str]:
    """Command-line overrides as they were written: Hydra's record of them (a ListConfig) read without resolving
    the interpolations they hold (`trainer.epochs=${oops}` is said in one line by the schema's check, not raised here)."""
    return [
        str(o)
        for o in (OmegaConf.to_container(overrides, resolve=False) if OmegaConf.is_config(overrides) else overrides)
    ]


def prepared(run: Run, renamed: list[str]) -> tuple[Any, list[str], tuple[Path, dict] | None]:
    """(config, overrides, the checkpoint to resume) of `run`, for the trainer; logs its warning lines once (rank 0)
    and each old spelling renamed."""
    if os.environ.get("RANK", "0") == "0":
        for line in renamed + run.warnings:
            logging.getLogger("vit_train").warning("%s", line)  # no "warning: ": train.log's [WARNING] says it
    return run.config, run.overrides, run.start


def _train_app(cfg: DictConfig, command: CommandLine) -> float:
    if sys.stdout is not None and not isinstance(sys.stdout, QuietStdout):
        sys.stdout = QuietStdout(sys.stdout)  # stdout on a full disk or a closed pipe: one warning, the run goes on
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout, force=True)
    with EarlyRecords():  # every line the console prints from here is written to train.log too, once it exists
        return _run_or_job(cfg, command)


def _run_or_job(cfg: DictConfig, command: CommandLine) -> float:
    """One run (or one sweep job): the command line's run (a job's composed here), trained; a user error exits 2
    in one line."""
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "RANK" not in os.environ:
        from vit_train.runtime.distributed import from_slurm

        from_slurm()  # several SLURM tasks without torchrun: the variables torchrun would set
    if hydra_cfg.mode == RunMode.MULTIRUN:
        return _sweep_job(cfg, command, run_dir, written(hydra_cfg.overrides.task), hydra_cfg.job.num)
    lock = HELD.pop(Path(os.path.abspath(run_dir)), None)  # rank 0's, taken before Hydra wrote there; else None
    try:
        config, overrides, resume_from = prepared(command.run, command.renamed)
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # torchrun: rank 0's run directory for every process
            run_dir, lock = torchrun.shared_run_dir(config, run_dir, lock)
        from vit_train.train.trainer import train  # torch is imported only once the config is known to be valid

        results = train(config, run_dir, overrides, resume_from, lock=lock)
    except UserError as e:
        if not isinstance(e, RunDirBusy) and not resumes_existing(cfg.resume):
            torchrun.remove_unused(run_dir)  # a run refused before it started leaves no directory behind
        elif lock is not None:
            lock.restore()  # a refused resume leaves the lock file as it was, its holder record too
        exit_with("vit-train", e)
    except RunStopped as e:
        if os.environ.get("RANK", "0") == "0":  # one line for all processes (they stopped at the same step)
            launcher = os.environ.get(torchrun.LAUNCHER)  # `vit-train --nproc_per_node=N` started them: its command
            print(
                f"vit-train: {str(e).replace(torchrun.TORCHRUN_COMMAND, launcher) if launcher else e}", file=sys.stderr
            )
        sys.exit(e.exit_code)
    except KeyboardInterrupt:  # a second Ctrl-C: stop at once, keeping the last checkpoint
        if os.environ.get("RANK", "0") == "0":
            print("vit-train: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception:  # an error in the code (Hydra prints its traceback, exit 1); a started run recorded it
        if not resumes_existing(cfg.resume):
            torchrun.remove_unused(run_dir)  # one that failed before it started (building it) leaves no directory
        raise
    finally:
        if lock is not None:
            lock.release()  # the run is over (the process may go on: a test, a notebook)
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from vit_train.runtime import distributed

            distributed.cleanup()
    return results.get(config.sweep.objective)


def _sweep_job(cfg: DictConfig, command: CommandLine, run_dir: Path, overrides: list[str], job: int) -> float:
    """One job of a sweep (sweep.run_job): its objective, or when it has none (failed, refused, diverged) the worst
    value for sweep.direction, -inf or inf, so the sweep goes on: the Optuna sweeper (hydra-optuna-sweeper 1.2)
    hands a NaN to Optuna, which refuses it, and the whole study ended in a traceback; a worst value is a trial
    the sampler learns from. The summary lists the job as failed either way. Its config is Hydra's composition for
    it (each swept value was checked before the sweep began, compose.py `read`)."""
    import math

    from vit_train.sweeps.job import run_job

    choices = HydraConfig.get().runtime.choices
    value = run_job(
        lambda: prepared(run_config(overrides, cfg, choices), command.renamed),
        run_dir,
        overrides,
        job,
        str(cfg.sweep.objective),
    )
    if math.isnan(value):
        return -math.inf if cfg.sweep.direction == "maximize" else math.inf
    return value


def record_subdir(resume: object, run_dir: str) -> str | None:
    """Where in `run_dir` the job's record goes: .hydra/, unless the directory already holds a run (its record of
    how it started is kept: a finished sweep job whose checkpoints were deleted still has its results.json), or
    this is not the first of several processes (rank 0 keeps the record)."""
    held = (Path(run_dir) / "checkpoints").is_dir() or (Path(run_dir) / "results.json").is_file()
    if resumes_existing(resume) or held or os.environ.get("RANK", "0") != "0":
        return None
    return ".hydra"


class RunRecords(Callback):
    """The run directory's lock and Hydra's record of each job, through Hydra's callbacks (its own writer of the
    record is off: hydra.output_subdir is null). Before Hydra writes into a run (or sweep) directory the lock is
    taken: a second vit-train into a directory in use exits 2 naming the holder and changes nothing there. The
    run's lock waits in `HELD` for the task, which passes it to the trainer (with torchrun, rank 0 holds it for
    all processes); each sweep job locks its own directory (sweeps/job.py), the sweep's lock is held to the end.
    Each job's .hydra/config.yaml, hydra.yaml and overrides.yaml are written whole (write_atomic); a full disk or
    a read-only place stops in one line, exit 2, a fresh run directory removed."""

    def __init__(self) -> None:
        self.sweep_lock: rundir.RunLock | None = None  # held until the sweep's summary is written

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0":
            path = Path(os.path.abspath(str(OmegaConf.select(config, "hydra.run.dir"))))
            HELD[path] = self._lock(path)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.sweep_lock = self._lock(Path(os.path.abspath(str(OmegaConf.select(config, "hydra.sweep.dir")))))

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        run_dir = Path(config.hydra.runtime.output_dir)
        subdir = record_subdir(OmegaConf.select(config, "resume", default=None), str(run_dir))
        if subdir is None:
            return
        task = OmegaConf.masked_copy(config, [k for k in config if k != "hydra"])
        for name, part in (
            ("config.yaml", task),
            ("hydra.yaml", OmegaConf.masked_copy(config, ["hydra"])),
            ("overrides.yaml", config.hydra.overrides.task),
        ):
            self._record(config, run_dir / subdir / name, part)

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        lock = HELD.pop(Path(os.path.abspath(str(OmegaConf.select(config, "hydra.run.dir")))), None)
        if lock is not None:  # the task never took it (Hydra refused to start it)
            lock.release()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.sweep_lock is not None:
            self.sweep_lock.release()
            self.sweep_lock = None

    @staticmethod
    def _record(config: DictConfig, path: Path, part: Any) -> None:
        from vit_train.outputs.places import place_error, write_atomic

        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, OmegaConf.to_yaml(part))
        except OSError as e:
            error = place_error(
                e,
                path,
                "free some space, then run the same command again",
                "give a writable hydra.run.dir=... (hydra.sweep.dir=... for -m)",
            )
            run_dir = path.parent.parent
            if not resumes_existing(OmegaConf.select(config, "resume", default=None)) and torchrun.unused(run_dir):
                HELD.pop(Path(os.path.abspath(run_dir)), None)
                shutil.rmtree(run_dir, ignore_errors=True)  # a run that never started leaves no directory
            exit_with("vit-train", error)

    @staticmethod
    def _lock(path: Path) -> rundir.RunLock:
        try:  # any failure ends the run here: Hydra would turn an exception into a warning and run unlocked
            return rundir.acquire(path)
        except RunDirBusy as e:
            print(f"vit-train: error: {e}", file=sys.stderr)
            sys.exit(2)
        except OSError as e:
            print(
                f"vit-train: error: cannot lock {path} ({e}); give the run a directory it can write "
                f"(hydra.run.dir=... or hydra.sweep.dir=...)",
                file=sys.stderr,
            )
            sys.exit(2)


class SweepSummary(Callback):
    """After a sweep: the summary table (printed, summary.csv, summary.md), TensorBoard HParams, and exit status 1
    when any job did not complete. (That its jobs report its objective was checked before it began, compose.py.)"""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        """Optuna's lines through the root logger, in Hydra's format: its own handler colours them (ANSI codes in
        a file or a CI log) and repeats what the sweeper says."""
        if "optuna" in str(OmegaConf.select(config, "hydra.sweeper._target_", default="")):  # hparams_search=optuna
            import optuna

            optuna.logging.disable_default_handler()
            optuna.logging.enable_propagation()

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from vit_train.sweeps.summary import incomplete_jobs, summarize

        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        try:
            # today's stdout: summarize's default is the one at its import (another, closed one in a caller that
            # redirected it since, as pytest and notebooks do)
            rows = summarize(sweep_dir, str(config.sweep.objective), str(config.sweep.direction), out=sys.stdout)
        except UserError as e:  # the sweep directory full or read-only by now: one line, the jobs' records kept
            exit_with("vit-train", e)
        incomplete = incomplete_jobs(sweep_dir, rows)
        if incomplete:
            print(f"vit-train: {incomplete}", file=sys.stderr)
            sys.exit(1)


def train_main() -> None:
    """vit-train: the command line read and checked once (one line, exit 2, for what it refuses), then run by Hydra
    with the same flags and overrides. `--cfg job` (any spelling) of a resumed run prints that run's config."""
    launcher, argv = torchrun.launcher_options(sys.argv[1:])  # vit-train --nproc_per_node=N ...: torchrun's
    try:
        command = read(argv)
        if command.help is not None:
            print(command.help, end="")
            sys.exit(0)
        if command.flags.cfg and command.run is not None and command.run.start is not None:
            print(show(command), end="")  # the resumed run's config: its checkpoint's, not a fresh composition
            sys.exit(0)
        if not shows_config(command.flags):
            check_writable(command.overrides, command.multirun)
    except UserError as e:  # a refused argument; a resume=PATH without its checkpoint
        exit_with("vit-train", e)
    if launcher and not shows_config(command.flags):
        torchrun.launch(launcher, argv)  # checked here once; each process reads the command line again

    def task(cfg: DictConfig) -> float:
        return _train_app(cfg, command)

    sys.argv[1:] = command.hydra_argv()
    hydra.main(version_base="1.3", config_path=_config_dir(), config_name="train")(task)()
