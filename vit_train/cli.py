"""Command-line entry points (the only module that imports Hydra).

`vit-train [overrides]` composes configs/train.yaml with the overrides, validates it into a typed
`Config` and hands it to `trainer.train`. `resume=PATH` continues that run in its own directory,
from the config saved in its checkpoint, with any new key overrides applied on top.
"""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from .config import Config, config_dir as _config_dir, known_keys, unknown_key_message
from .errors import ConfigError, RunStopped, UserError

GROUPS = ("model", "data", "aug", "optim", "schedule", "trainer", "experiment", "hydra")


def _is_resume_path(resume: object) -> bool:
    return resume not in (None, "auto", "null", "")


def run_dir_of(resume: str) -> Path:
    """The run directory a resume path belongs to (a run dir, its checkpoints/ or a file in it)."""
    path = Path(resume).expanduser()
    if path.is_file() or path.suffix == ".pt":
        path = path.parent
    return path.parent if path.name == "checkpoints" else path


def _resumes_existing(resume: object) -> bool:
    return _is_resume_path(resume) and Path(str(resume)).expanduser().exists()


def _output_subdir(resume: object, run_dir: str) -> str | None:
    """.hydra/, unless the directory already holds a run: its record of how it started is kept."""
    return None if _resumes_existing(resume) or (Path(run_dir) / "checkpoints").is_dir() else ".hydra"


# hydra.run.dir and hydra.output_subdir read these, so `resume=PATH` runs in PATH's own directory
# and leaves the .hydra/ record of the original run as it was. A missing PATH gets a fresh
# directory (removed again when the run is refused), never a new folder at PATH.
OmegaConf.register_new_resolver("vit_run_dir", lambda resume, default: str(run_dir_of(resume))
                                if _resumes_existing(resume) else default, replace=True)
OmegaConf.register_new_resolver("vit_output_subdir", _output_subdir, replace=True)


def check_override_keys(args: list[str]) -> None:
    """Refuse command-line keys the schema does not know, naming the closest valid key."""
    valid = known_keys()
    for arg in args:
        if arg.startswith("-") or "=" not in arg:
            continue
        key = arg.split("=", 1)[0].lstrip("+~")
        if key in GROUPS or "/" in key or key.split(".")[0] == "hydra":  # group choices and Hydra's own keys
            continue
        if key not in valid:
            raise ConfigError(unknown_key_message(key, valid))


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


def compose_config(cfg: DictConfig) -> tuple[Config, list[str]]:
    """The typed config for this run, and the command-line overrides that made it."""
    overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith("resume=")]
    if _is_resume_path(cfg.resume):
        from .checkpoint import find_resume_checkpoint

        _, ckpt = find_resume_checkpoint(cfg.resume, Path(HydraConfig.get().runtime.output_dir), mmap=True)
        plain = apply_overrides(ckpt["config"], overrides)
        plain["resume"] = cfg.resume
        return Config.from_dict(plain), list(ckpt.get("overrides", [])) + overrides
    return Config.from_dict(OmegaConf.to_container(cfg, resolve=True)), overrides


@hydra.main(version_base="1.3", config_path=_config_dir(), config_name="train")
def _train_app(cfg: DictConfig) -> float:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout, force=True)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        config, overrides = compose_config(cfg)
        from .trainer import train  # torch is imported only once the config is known to be valid

        results = train(config, run_dir, overrides)
    except UserError as e:
        if not _resumes_existing(cfg.resume) and {p.name for p in run_dir.iterdir()} <= {".hydra"}:
            shutil.rmtree(run_dir)  # a run refused before it started leaves no empty directory behind
        print(f"vit-train: error: {e}", file=sys.stderr)
        sys.exit(2)
    except RunStopped as e:
        print(f"vit-train: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:  # a second Ctrl-C: stop at once, keeping the last checkpoint
        print("vit-train: interrupted", file=sys.stderr)
        sys.exit(130)
    return results["best_top1"]


def train_main() -> None:
    try:
        check_override_keys(sys.argv[1:])
    except ConfigError as e:
        print(f"vit-train: error: {e}", file=sys.stderr)
        sys.exit(2)
    _train_app()
