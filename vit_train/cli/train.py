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
import shutil
import sys
from pathlib import Path
from typing import Any

import hydra
import hydra.core.utils as hydra_core_utils
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.object_type import ObjectType
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from vit_train.cli import torchrun
from vit_train.cli.arguments import (apply_overrides, check_composed, check_override_keys, check_writable, chosen_options,
                                     is_multirun, is_resume_path, read_override, resumed_keys, resumes_existing,
                                     typed_config)
from vit_train.config import Config, config_dir as _config_dir, run_dir_of
from vit_train.errors import ConfigError, RunStopped, UserError, exit_with
from vit_train.outputs import rundir
from vit_train.outputs.rundir import RunDirBusy
from vit_train.runtime.logs import EarlyRecords, QuietStdout
from vit_train.schema.config import OPTION_GROUPS, ignored_keys, override_keys
from vit_train.schema.legacy import rename_old_keys
from vit_train.schema.typed import BASES, chooser, option_class, options, section_keys

def _output_subdir(resume: object, run_dir: str) -> str | None:
    """.hydra/, unless the directory already holds a run (its record of how it started is kept: a
    finished sweep job whose checkpoints were deleted still has its results.json), or this is not the
    first of several processes (rank 0 keeps the record)."""
    held = (Path(run_dir) / "checkpoints").is_dir() or (Path(run_dir) / "results.json").is_file()
    if resumes_existing(resume) or held or os.environ.get("RANK", "0") != "0":
        return None
    return ".hydra"


# hydra.run.dir and hydra.output_subdir read these, so `resume=PATH` runs in PATH's own directory
# and leaves the .hydra/ record of the original run as it was. A missing PATH gets a fresh
# directory (removed again when the run is refused), never a new folder at PATH.
OmegaConf.register_new_resolver("vit_run_dir", lambda resume, default: str(run_dir_of(resume))
                                if resumes_existing(resume) else default, replace=True)
OmegaConf.register_new_resolver("vit_output_subdir", _output_subdir, replace=True)


def register_options() -> None:
    """The typed schema as Hydra's nodes, the one source of defaults: `schema` holds the shared sections
    (configs/train.yaml lists it first), and each option of the data, aug and objective groups is the node
    schema/<group>/<name>, which the option's YAML (configs/<group>/<name>.yaml) lists first: its section holds
    that option's keys only (`vit-train --cfg job` shows them), so a key of another option is refused. Run
    again for an option registered after this module was imported (your own, docs/extending.md)."""
    store = ConfigStore.instance()
    # the option sections hold the keys every option of the group has (each option's node fills in its own), so
    # that the composed config keeps the schema's order whichever node sets a key first; the key that picks the
    # option is null until an option's node sets it (a YAML without its /schema/<group>/<name> line is refused)
    store.store(name="schema", node={k: {f: None if f == chooser(k) else v[f] for f in section_keys(BASES[k])}
                                     if k in OPTION_GROUPS else v for k, v in Config().to_dict().items()})
    for group in OPTION_GROUPS:
        for name, cls in options(group).items():
            store.store(group=f"schema/{group}", name=name, package="_global_", node=cls.composed())


register_options()
RENAMED: list[str] = []  # this command line's old spellings, renamed before Hydra read it (logged with the config)


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
        if not resumes_existing(OmegaConf.select(cfg, "resume", default=None)) and torchrun.unused(run_dir):
            shutil.rmtree(run_dir, ignore_errors=True)  # a run that never started leaves no directory
        exit_with("vit-train", error)


hydra_core_utils._save_config = _save_hydra_record  # run_job calls it by this module-level name


def written(overrides: Any) -> list[str]:
    """Command-line overrides as they were written: Hydra's record of them (a ListConfig) read without resolving
    the interpolations they hold (`trainer.epochs=${oops}` is said in one line by `typed_config`, not raised here)."""
    return [str(o) for o in (OmegaConf.to_container(overrides, resolve=False) if OmegaConf.is_config(overrides)
                             else overrides)]


def compose_config(cfg: DictConfig) -> tuple[Config, list[str], tuple[Path, dict] | None]:
    """The typed config for this run, the command-line overrides that made it, and for `resume=PATH`
    the (path, checkpoint) it names, found once here (train/resume.py `find_start`) for its config and
    handed to the trainer (which finds resume=auto's itself, in the run directory); logs one warning per
    key the options ignore and per old spelling renamed."""
    overrides = [o for o in written(HydraConfig.get().overrides.task) if not o.startswith("resume=")]
    overrides = [o.removeprefix("++") if o[2:].split(".")[0] in OPTION_GROUPS else o for o in overrides]  # resumed_keys
    if is_resume_path(cfg.resume):
        from vit_train.train.resume import find_start  # whose checkpoint: said before any other check of the config

        path, ckpt = find_start(cfg.resume, Path(HydraConfig.get().runtime.output_dir))
        Config.from_saved({**ckpt["config"], "resume": None}, source=path)  # its own config first: a cause of its own
        plain = apply_overrides(ckpt["config"], overrides)
        plain["resume"] = cfg.resume
        config, overrides = Config.from_dict(plain), list(ckpt.get("overrides", [])) + overrides
        resume_from = (path, ckpt)
    else:
        config, resume_from = typed_config(cfg, HydraConfig.get().runtime.choices, override_keys(overrides)), None
    config.objective.check_run(config)  # what the objective needs (a teacher's file) is refused before anything is written
    if os.environ.get("RANK", "0") == "0":
        for line in RENAMED + ignored_keys(config, override_keys(overrides)):
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
        return _sweep_job(cfg, run_dir, written(hydra_cfg.overrides.task), hydra_cfg.job.num)
    lock = RunDirLock.hand_over()  # rank 0's, taken before Hydra wrote into the directory; None on other ranks
    try:
        config, overrides, resume_from = compose_config(cfg)
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
            print(f"vit-train: {str(e).replace(torchrun.TORCHRUN_COMMAND, launcher) if launcher else e}",
                  file=sys.stderr)
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
        objective = str(OmegaConf.select(config, "sweep.objective"))
        given = [*written(OmegaConf.select(config, "hydra.overrides.hydra", default=[])),
                 *written(OmegaConf.select(config, "hydra.overrides.task", default=[]))]
        try:  # every objective the jobs train (objective=classify,mae sweeps two), each checked
            names = chosen_options(given).get("objective") or [str(OmegaConf.select(config, "objective.name"))]
            classes = {name: option_class("objective", name) for name in names}
        except ConfigError as e:
            self._refuse(e)
        metrics = {cls.metric for cls in classes.values()}  # one score in common: theirs; else none compares
        for name, cls in classes.items():
            if objective in cls.results:
                continue  # a number its jobs never report: each such job's would be empty
            if len(metrics) == 1:
                fix = (f"add sweep.objective=best_{cls.metric}"
                       f"{'' if cls.higher_is_better else ' sweep.direction=minimize'}")
            else:
                fix = (f"sweep one objective at a time ({' and '.join(f'objective={n}' for n in classes)} score "
                       f"different numbers)")
            self._refuse(ConfigError(
                f"objective={name} jobs report {', '.join(cls.results)} in results.json, not {objective}, so "
                f"sweep.objective={objective} would be empty for {'every job' if len(classes) == 1 else 'them'}: {fix}"))
        if len(metrics) > 1:  # each reports it, but not the same thing (classify's final_loss and MAE's)
            self._refuse(ConfigError(
                f"{' and '.join(f'objective={n}' for n in classes)} jobs score different numbers, so "
                f"sweep.objective={objective} would rank unlike things together: sweep one objective at a time"))

    @staticmethod
    def _refuse(error: ConfigError) -> None:
        """Refuse the sweep in one line (exit 2) before its first job, leaving its directory as it was."""
        if RunDirLock._sweep_lock is not None:
            RunDirLock._sweep_lock.undo()
            RunDirLock._sweep_lock = None
        exit_with("vit-train", error)

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


def show_config(args: list[str]) -> None:
    """`--cfg job`: refuse what a run would refuse (exit 2, one line); for `resume=PATH`, print the config the resumed
    run would have (its checkpoint's with the overrides applied, not what the command line alone composes) and
    exit. Otherwise Hydra prints the composed config."""
    resume = [read_override(a).value() for a in args if a.startswith("resume=")]
    if not resume or not is_resume_path(resume[-1]):
        check_composed(args)
        return
    from vit_train.train.resume import find_start

    path, ckpt = find_start(str(resume[-1]), run_dir_of(str(resume[-1])))
    Config.from_saved({**ckpt["config"], "resume": None}, source=path)
    overrides = [a for a in args if "=" in a and not a.startswith(("-", "resume=", "hydra."))]
    config = Config.from_dict({**apply_overrides(ckpt["config"], overrides), "resume": str(resume[-1])})
    print(OmegaConf.to_yaml(config.to_dict()), end="")
    sys.exit(0)


def _list_groups_from_one_copy() -> None:
    """For --help: Hydra (1.3) lists each config group's options through a fresh deep copy of its config repository,
    the ConfigStore with every option's schema node included, about 140 copies that took longer than `import torch`
    (docs/speed.md, "Start-up"). The listing only reads, so one copy per config loader serves it all."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    plain = ConfigLoaderImpl.get_group_options

    def get_group_options(self, group_name, results_filter=ObjectType.CONFIG, config_name=None, overrides=None):
        if config_name is not None or overrides:  # not the listing's call: as Hydra does it
            return plain(self, group_name, results_filter, config_name, overrides)
        if "_vit_listing" not in self.__dict__:
            self._vit_listing = self._parse_overrides_and_create_caching_repo(None, [])[1]
        return self._vit_listing.get_group_options(group_name, results_filter)

    ConfigLoaderImpl.get_group_options = get_group_options


def train_main() -> None:
    launcher, sys.argv[1:] = torchrun.launcher_options(sys.argv[1:])  # vit-train --nproc_per_node=N ...: torchrun's
    given = list(sys.argv[1:])
    try:
        sys.argv[1:], renamed = rename_old_keys(sys.argv[1:])  # mae.mask_ratio=... is objective.mask_ratio=... now
        RENAMED[:] = renamed
        if is_multirun(sys.argv[1:]) and {"--cfg", "-c"} & set(sys.argv[1:]):
            raise ConfigError("--cfg shows one run's config, not a sweep's: drop -m/--multirun and give each swept "
                              "key one value")
        check_override_keys(sys.argv[1:], sweeps=is_multirun(sys.argv[1:]))
        if {"--cfg", "-c"} & set(sys.argv[1:]):
            show_config(sys.argv[1:])  # checked as a run would be; a resumed run's own, printed here
        sys.argv[1:] = resumed_keys(sys.argv[1:])
        if not {"--cfg", "-c", "--help", "-h", "--info", "--hydra-help"} & set(sys.argv[1:]):
            check_writable(sys.argv[1:])
    except ConfigError as e:
        exit_with("vit-train", e)
    if launcher and not {"--cfg", "-c", "--help", "-h", "--info", "--hydra-help"} & set(given):
        torchrun.launch(launcher, given)  # checked here once; each process reads the command line again
    if {"--help", "-h", "--hydra-help"} & set(given):
        _list_groups_from_one_copy()
    _train_app()
