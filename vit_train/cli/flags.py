"""vit-train's flags are Hydra's: read here with the definitions of Hydra's own parser (hydra.main's argparse,
tests/cli/test_flags.py keeps them equal), so every spelling Hydra accepts (`--cfg job`, `--cfg=job`, `-c job`,
`-cjob`, `-c=job`; `-m`, `--multirun`; `-h`, `--help`; `--info`, `-i config`) means the same to vit-train's checks
as to Hydra. What Hydra would end in a traceback or an argparse usage block is one line here (ConfigError)."""

from __future__ import annotations

import argparse

from vit_train.errors import ConfigError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's usage block and exit 2: one line instead
        hint = (
            "; give the flags before or after all the key=value arguments, not between them"
            if message.startswith("unrecognized arguments")
            else ""
        )
        raise ConfigError(f"{message}{hint} (see vit-train --help)")


def parser() -> argparse.ArgumentParser:
    """Hydra 1.3's command-line flags (hydra/_internal/utils.py `get_args_parser`); --version is only noticed here
    (Hydra prints it)."""
    p = _Parser(prog="vit-train", add_help=False)
    p.add_argument("--help", "-h", action="store_true")
    p.add_argument("--hydra-help", action="store_true")
    p.add_argument("--version", action="store_true")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--cfg", "-c", choices=["job", "hydra", "all"])
    p.add_argument("--resolve", action="store_true")
    p.add_argument("--package", "-p")
    p.add_argument("--run", "-r", action="store_true")
    p.add_argument("--multirun", "-m", action="store_true")
    p.add_argument("--shell-completion", "-sc", action="store_true")
    p.add_argument("--config-path", "-cp")
    p.add_argument("--config-name", "-cn")
    p.add_argument("--config-dir", "-cd")
    p.add_argument("--experimental-rerun")
    p.add_argument(
        "--info",
        "-i",
        const="all",
        nargs="?",
        choices=["all", "config", "defaults", "defaults-tree", "plugins", "searchpath"],
    )
    return p


def read_flags(argv: list[str]) -> argparse.Namespace:
    """The flags and overrides of `argv` as Hydra reads them. ConfigError (one line) where Hydra would stop with a
    usage block or a traceback: an unknown flag or value, two commands at once (--cfg or --info with -m)."""
    flags = parser().parse_args(argv)
    if flags.multirun and (flags.cfg or flags.info):  # Hydra: a ValueError's traceback
        shown = "--cfg shows one run's config" if flags.cfg else "--info shows one run's composition"
        raise ConfigError(f"{shown}, not a sweep's: drop -m/--multirun and give each swept key one value")
    commands = [
        name
        for name, on in (
            ("--run", flags.run),
            ("--multirun", flags.multirun),
            ("--cfg", flags.cfg),
            ("--info", flags.info),
            ("--shell-completion", flags.shell_completion),
        )
        if on
    ]
    if len(commands) > 1:
        raise ConfigError(
            f"{' and '.join(commands)} are two commands: give one of --run, --multirun, --cfg, --info "
            f"and --shell-completion"
        )
    if flags.resolve and not (flags.cfg or flags.help):
        raise ConfigError("--resolve resolves the config --cfg (or --help) shows: give it with --cfg job")
    if flags.package is not None and not flags.cfg:  # Hydra ignores it, and the command trained
        raise ConfigError(f"--package {flags.package} picks the part of the config --cfg shows: give it with --cfg job")
    return flags


def shows_config(flags: argparse.Namespace) -> bool:
    """Whether the command line only shows something (help, a config, Hydra's information) rather than running."""
    return bool(flags.help or flags.hydra_help or flags.cfg or flags.info or flags.version or flags.shell_completion)
