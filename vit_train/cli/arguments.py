"""Reading vit-train's command line before Hydra does: keys the schema does not know, values its override
grammar refuses, plugins not installed and run directories that cannot be written are refused in one line
(ConfigError); `apply_overrides` puts a resumed run's key overrides on its saved config.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from vit_train.config.schema import known_keys, run_dir_of, unknown_key_message
from vit_train.errors import ConfigError
from vit_train.extras import require

GROUPS = ("model", "data", "aug", "optim", "schedule", "trainer", "objective", "experiment", "hparams_search", "hydra")
# Optional Hydra plugins a command line may ask for (extras.py names the extra that installs each).
PLUGINS = {"hparams_search=optuna": "hydra_plugins.hydra_optuna_sweeper",
           "hydra/sweeper=optuna": "hydra_plugins.hydra_optuna_sweeper",
           "hydra/launcher=joblib": "hydra_plugins.hydra_joblib_launcher",
           "hydra/launcher=parallel": "hydra_plugins.hydra_joblib_launcher",
           "hydra/launcher=slurm": "hydra_plugins.hydra_submitit_launcher"}



def is_resume_path(resume: object) -> bool:
    """Whether `resume` names a path (a run directory or a file), not auto or nothing."""
    return resume not in (None, "auto", "null", "")


def resumes_existing(resume: object) -> bool:
    """Whether `resume` names a path that exists (the run continues in its directory)."""
    return is_resume_path(resume) and Path(str(resume)).expanduser().exists()



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
    elif not multirun and resume and resumes_existing(resume[-1]):
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
