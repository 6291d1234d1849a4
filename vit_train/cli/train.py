"""Command-line entry points (the only module that imports Hydra).

`vit-train [overrides]` composes configs/train.yaml with the overrides, validates it into a typed
`Config` and hands it to `trainer.train`. `resume=PATH` continues that run in its own directory,
from the config saved in its checkpoint, with any new key overrides applied on top.

`vit-train -m ...` runs a sweep: each job (sweep.run_job) returns its objective (`sweep.objective`)
to the sweeper; at the end `SweepSummary` writes the sweep's summary and exits 1 if any job did not
complete.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import hydra
import hydra.core.utils as hydra_core_utils
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from vit_train.cli import torchrun
from vit_train.outputs import rundir
from vit_train.config.schema import Config, config_dir as _config_dir, known_keys, run_dir_of, unknown_key_message
from vit_train.config.checks import LOSSES
from vit_train.errors import ConfigError, RunStopped, UserError, exit_with
from vit_train.extras import require
from vit_train.outputs.rundir import RunDirBusy
from vit_train.runtime.logs import EarlyRecords, QuietStdout
from vit_train.config.unused_keys import override_keys

GROUPS = ("model", "data", "aug", "optim", "schedule", "trainer", "objective", "experiment", "hparams_search", "hydra")
# Optional Hydra plugins a command line may ask for (extras.py names the extra that installs each).
PLUGINS = {"hparams_search=optuna": "hydra_plugins.hydra_optuna_sweeper",
           "hydra/sweeper=optuna": "hydra_plugins.hydra_optuna_sweeper",
           "hydra/launcher=joblib": "hydra_plugins.hydra_joblib_launcher",
           "hydra/launcher=parallel": "hydra_plugins.hydra_joblib_launcher",
           "hydra/launcher=slurm": "hydra_plugins.hydra_submitit_launcher"}


def _is_resume_path(resume: object) -> bool:
    return resume not in (None, "auto", "null", "")


def _resumes_existing(resume: object) -> bool:
    return _is_resume_path(resume) and Path(str(resume)).expanduser().exists()


def _output_subdir(resume: object, run_dir: str) -> str | None:
    """.hydra/, unless the directory already holds a run (its record of how it started is kept: a
    finished sweep job whose checkpoints were deleted still has its results.json), or this is not the
    first of several processes (rank 0 keeps the record)."""
    held = (Path(run_dir) / "checkpoints").is_dir() or (Path(run_dir) / "results.json").is_file()
    if _resumes_existing(resume) or held or os.environ.get("RANK", "0") != "0":
        return None
    return ".hydra"


# hydra.run.dir and hydra.output_subdir read these, so `resume=PATH` runs in PATH's own directory
# and leaves the .hydra/ record of the original run as it was. A missing PATH gets a fresh
# directory (removed again when the run is refused), never a new folder at PATH.
OmegaConf.register_new_resolver("vit_run_dir", lambda resume, default: str(run_dir_of(resume))
                                if _resumes_existing(resume) else default, replace=True)
OmegaConf.register_new_resolver("vit_output_subdir", _output_subdir, replace=True)


# The typed schema is the one source of defaults: configs/train.yaml lists this node first, so every
# key of every section exists whatever group option is chosen (each YAML sets only what differs), and
# `aug=autoaug aug.switch_prob=0.3` or `data=shapes data.bad_images=error` are settable overrides.
ConfigStore.instance().store(name="schema", node=Config().to_dict())


def _save_hydra_record(cfg: DictConfig, filename: str, output_dir: Path) -> None:
    """Hydra's writer of a run's (or a sweep job's) .hydra/*.yaml, through write_atomic: never half
    written; a full disk or a read-only place stops in one line, exit 2, a fresh run directory removed."""
    from vit_train.outputs.places import place_error, write_atomic

    path = Path(output_dir) / filename
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, OmegaConf.to_yaml(cfg))
    except OSError as e:
        error = place_error(e, path, "free some space, then run the same command again",
                            "give a writable hydra.run.dir=... (hydra.sweep.dir=... for -m)")
        run_dir = path.parent.parent
        if not _resumes_existing(OmegaConf.select(cfg, "resume", default=None)) and torchrun.unused(run_dir):
            shutil.rmtree(run_dir, ignore_errors=True)  # a run that never started leaves no directory
        exit_with("vit-train", error)


hydra_core_utils._save_config = _save_hydra_record  # run_job calls it by this module-level name


def parse_override(arg: str, sweep: bool = False) -> tuple[str, object]:
    """(key, value) of one `key=value` argument, read by Hydra's override grammar in every command.

    Raises ConfigError, one line naming the argument and the quoting that works, for a value the
    grammar refuses ('#', '=', '[', '~', non-ASCII letters unquoted) and, unless `sweep`, for a
    comma-separated value (Hydra's sweep syntax).
    """
    from hydra.errors import HydraException

    key, _, text = arg.partition("=")
    try:
        override = OverridesParser.create().parse_override(arg)
    except HydraException as e:
        found = re.search(r"(?:token recognition error at: |mismatched input )'(.)", str(e))
        why = f"{found.group(1)!r} needs quotes" if found else str(e).strip().splitlines()[0]
        raise ConfigError(f"cannot read the argument {arg!r} ({why}); quote the value, e.g. {quoted(key, text)} "
                          f"(see docs/troubleshooting.md, 'Quoting paths')") from None
    if override.is_sweep_override() and not sweep:
        raise ConfigError(f"{arg!r} is a sweep over several values (a ',' separates them); quote one value that holds "
                          f"a comma, e.g. {quoted(key, text)}, or add -m to sweep")
    return override.get_key_element().lstrip("+~"), override.value()


def quoted(key: str, text: str) -> str:
    """`key=text` quoted for Hydra and for the shell: "key='text'", or 'key=["a","b"]' for a list."""
    if text.startswith("[") and text.endswith("]"):
        items = [item.strip().strip("'\"") for item in text[1:-1].split(",")] if text[1:-1].strip() else []
        inner = ",".join('"' + item.replace('"', '\\"') + '"' for item in items)
        return "'" + f"{key}=[{inner}]".replace("'", "'\\''") + "'"
    body = (text[1:-1] if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"" else text).replace("'", "\\'")
    return '"' + f"{key}='{body}'".replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`") + '"'


def is_multirun(args: list[str]) -> bool:
    """Whether a vit-train command line runs a sweep (-m, --multirun, or an Optuna search)."""
    return "-m" in args or "--multirun" in args or any(a.startswith("hparams_search=") for a in args)


def check_override_keys(args: list[str], sweeps: bool = True) -> None:
    """Refuse command-line keys the schema does not know, naming the closest valid key, values that
    cannot be parsed (naming the quoting that works; with `sweeps` False also a comma-separated
    value, which Hydra reads as a sweep), and plugins that are not installed, naming the extra that
    installs them."""
    valid = known_keys()
    for arg in args:
        if arg in PLUGINS:
            require(PLUGINS[arg], arg, needs="a Hydra plugin that is not installed")
        if arg.startswith("-") or "=" not in arg:
            continue
        key, _ = parse_override(arg, sweep=sweeps)
        if key in GROUPS or "/" in key or key.split(".")[0] == "hydra":  # group choices and Hydra's own keys
            continue
        if key not in valid:
            raise ConfigError(unknown_key_message(key, valid))


def check_writable(args: list[str]) -> None:
    """Refuse, before Hydra creates it, a run or sweep directory that cannot be written (a read-only
    working directory, say), naming the key that moves it."""
    multirun = is_multirun(args)
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    given = [a.split("=", 1)[1] for a in args if a.startswith(key + "=")]
    resume = [a.split("=", 1)[1] for a in args if a.startswith("resume=")]
    if given:
        target = Path(given[-1])
    elif not multirun and resume and _resumes_existing(resume[-1]):
        target = run_dir_of(resume[-1])
    else:
        target = Path("outputs/multirun" if multirun else "outputs")
    folder = target.absolute()
    while not folder.exists():
        folder = folder.parent
    kind = "sweep" if multirun else "run"
    if not folder.is_dir():  # a file (or a FIFO) where the directory or one above it would be
        raise ConfigError(f"cannot create the {kind} directory {target}: {folder} is not a folder; give "
                          f"another one with {key}=/path/to/dir")
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        where = f"the {kind} directory {target} cannot be written" if folder == target.absolute() else \
            f"cannot create the {kind} directory {target} in {folder}"
        raise ConfigError(f"{where} ({e.strerror}); give a writable one with {key}=/path/to/dir, or run from a "
                          f"writable directory") from None


def apply_overrides(saved: dict, overrides: list[str]) -> dict:
    """The saved config with key=value overrides applied; group choices cannot change on resume."""
    cfg = OmegaConf.create(saved)
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.key_or_group
        if key == "resume":
            continue
        if key in GROUPS:
            raise ConfigError(f"'{override.input_line}' picks a config group, but a resumed run keeps its saved "
                              f"config; override single keys (e.g. trainer.epochs=300) or start a new run")
        OmegaConf.update(cfg, key, override.value(), merge=True)
    return OmegaConf.to_container(cfg)


def compose_config(cfg: DictConfig) -> tuple[Config, list[str], tuple[Path, dict] | None]:
    """The typed config for this run, the command-line overrides that made it, and for `resume=PATH`
    the (path, checkpoint) it names, loaded once here for its config and handed to the trainer (which
    finds resume=auto's itself, in the run directory); logs one warning per key the options ignore."""
    overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith("resume=")]
    if _is_resume_path(cfg.resume):
        from vit_train.outputs.checkpoint import find_resume_checkpoint

        from vit_train.train.state import check_own_run

        run_dir = Path(HydraConfig.get().runtime.output_dir)
        path, ckpt = find_resume_checkpoint(cfg.resume, run_dir, mmap=True)
        check_own_run(Path(path), ckpt, run_dir)  # whose checkpoint: said before any other check of the config
        plain = apply_overrides(ckpt["config"], overrides)
        plain["resume"] = cfg.resume
        config, overrides = Config.from_dict(plain), list(ckpt.get("overrides", [])) + overrides
        resume_from = (path, ckpt)
    else:
        config, resume_from = Config.from_dict(OmegaConf.to_container(cfg, resolve=True)), None
    from vit_train.objectives import check_objective, ignored_keys  # torch: only once the config itself is valid

    check_objective(config)  # what the objective cannot train is refused before anything is written
    if os.environ.get("RANK", "0") == "0":
        for line in ignored_keys(config, override_keys(overrides)):
            logging.getLogger("vit_train").warning("%s", line)  # no "warning: ": train.log's [WARNING] says it
    return config, overrides, resume_from


@hydra.main(version_base="1.3", config_path=_config_dir(), config_name="train")
def _train_app(cfg: DictConfig) -> float:
    if sys.stdout is not None and not isinstance(sys.stdout, QuietStdout):
        sys.stdout = QuietStdout(sys.stdout)  # stdout on a full disk or a closed pipe: one warning, the run goes on
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout, force=True)
    with EarlyRecords():  # every line the console prints from here is written to train.log too, once it exists
        return _run_or_job(cfg)


def _run_or_job(cfg: DictConfig) -> float:
    """One run (or one sweep job): compose, validate and train; a user error exits 2 in one line."""
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "RANK" not in os.environ:
        from vit_train.runtime.distributed import from_slurm

        from_slurm()  # several SLURM tasks without torchrun: the variables torchrun would set
    if hydra_cfg.mode == RunMode.MULTIRUN:
        return _sweep_job(cfg, run_dir, list(hydra_cfg.overrides.task), hydra_cfg.job.num)
    lock = RunDirLock.hand_over()  # rank 0's, taken before Hydra wrote into the directory; None on other ranks
    try:
        config, overrides, resume_from = compose_config(cfg)
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # torchrun: rank 0's run directory for every process
            run_dir, lock = torchrun.shared_run_dir(config, run_dir, lock)
        from vit_train.train.trainer import train  # torch is imported only once the config is known to be valid

        results = train(config, run_dir, overrides, resume_from, lock=lock)
    except UserError as e:
        if not isinstance(e, RunDirBusy) and not _resumes_existing(cfg.resume) and torchrun.unused(run_dir):
            shutil.rmtree(run_dir)  # a run refused before it started leaves no empty directory behind
        exit_with("vit-train", e)
    except RunStopped as e:
        print(f"vit-train: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:  # a second Ctrl-C: stop at once, keeping the last checkpoint
        print("vit-train: interrupted", file=sys.stderr)
        sys.exit(130)
    finally:
        if lock is not None:
            lock.release()  # the run is over (the process may go on: a test, a notebook)
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from vit_train.runtime import distributed

            distributed.cleanup()
    return results["best_top1"]


class RunDirLock(Callback):
    """Takes the run directory's lock (the sweep directory's for a sweep) before Hydra writes into
    it: a second vit-train into a directory in use exits 2 naming the holder and changes nothing
    there. The run's lock goes to `_train_app` (`hand_over`), which passes it to the trainer (with
    torchrun, rank 0 holds it for all processes); each sweep job locks its own directory (sweeps/job.py)."""

    _run_lock: rundir.RunLock | None = None  # taken in on_run_start, handed over once
    _sweep_lock: rundir.RunLock | None = None  # held until the process ends (the summary is written last)

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        if os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0":
            RunDirLock._run_lock = self._lock(Path(os.path.abspath(str(OmegaConf.select(config, "hydra.run.dir")))))

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        RunDirLock._sweep_lock = self._lock(Path(os.path.abspath(str(OmegaConf.select(config, "hydra.sweep.dir")))))

    @staticmethod
    def hand_over() -> rundir.RunLock | None:
        """The run directory's lock that on_run_start took (None if it took none), to its one owner."""
        lock, RunDirLock._run_lock = RunDirLock._run_lock, None
        return lock

    @staticmethod
    def _lock(path: Path) -> rundir.RunLock:
        try:  # any failure ends the run here: Hydra would turn an exception into a warning and run unlocked
            return rundir.acquire(path)
        except RunDirBusy as e:
            print(f"vit-train: error: {e}", file=sys.stderr)
            sys.exit(2)
        except OSError as e:
            print(f"vit-train: error: cannot lock {path} ({e}); give the run a directory it can write "
                  f"(hydra.run.dir=... or hydra.sweep.dir=...)", file=sys.stderr)
            sys.exit(2)


def _sweep_job(cfg: DictConfig, run_dir: Path, overrides: list[str], job: int) -> float:
    """One job of a sweep (sweep.run_job): its objective, or NaN when it failed (the sweep goes on)."""
    from vit_train.sweeps.job import run_job

    return run_job(lambda: compose_config(cfg), run_dir, overrides, job, str(cfg.sweep.objective))


class SweepSummary(Callback):
    """Before a sweep: its objective is one its jobs report. After it: the summary table (printed,
    summary.csv, summary.md), TensorBoard HParams, and exit status 1 when any job did not complete."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        from vit_train.objectives import named

        objective, name = str(OmegaConf.select(config, "sweep.objective")), str(OmegaConf.select(config, "objective.name"))
        try:
            scored = named(name)
        except ConfigError as e:
            exit_with("vit-train", e)
        if not scored.HIGHER_IS_BETTER and objective not in LOSSES:  # jobs report a loss, no top-1
            exit_with("vit-train", ConfigError(
                f"objective={name} jobs report a {scored.BEST_TEXT} and no top-1, so sweep.objective={objective} "
                f"would be empty for every job: add sweep.objective=best_loss sweep.direction=minimize"))

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from vit_train.sweeps.summary import incomplete_jobs, summarize

        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        try:
            rows = summarize(sweep_dir, str(config.sweep.objective), str(config.sweep.direction))
        except UserError as e:  # the sweep directory full or read-only by now: one line, the jobs' records kept
            exit_with("vit-train", e)
        incomplete = incomplete_jobs(sweep_dir, rows)
        if incomplete:
            print(f"vit-train: {incomplete}", file=sys.stderr)
            sys.exit(1)


def train_main() -> None:
    try:
        check_override_keys(sys.argv[1:], sweeps=is_multirun(sys.argv[1:]))
        if not {"--cfg", "-c", "--help", "-h", "--info", "--hydra-help"} & set(sys.argv[1:]):
            check_writable(sys.argv[1:])
    except ConfigError as e:
        exit_with("vit-train", e)
    _train_app()
