"""Errors caused by the user's input: the commands print their message on one line and exit 2."""

import re
import sys
from typing import NoReturn


class UserError(Exception):
    """Bad input (config, data, checkpoint); the message says what is wrong and what to do.

    Raised in a DataLoader worker, it reaches the training process rebuilt from a message that
    holds the worker's whole traceback (torch's ExceptionWrapper); the message is cut back to the
    original one line.
    """

    def __init__(self, message: str = ""):
        super().__init__(_original(str(message)))


def _original(message: str) -> str:
    if message.startswith("Caught ") and "\nOriginal Traceback" in message:
        last = message.rstrip().splitlines()[-1]
        return re.sub(r"^[\w.]+: ", "", last, count=1)  # "vit_train.errors.DataError: <message>"
    return message


class ConfigError(UserError):
    """A config key, value or combination that cannot run."""


class DataError(UserError):
    """A data set that is missing, incomplete or in the wrong layout."""


class CheckpointError(UserError):
    """A checkpoint that is missing, unreadable or does not fit the config."""


class OutputError(UserError):
    """A run's own file (metrics, TensorBoard events, results) that cannot be written: a full disk, a quota."""


class RunStopped(Exception):
    """The run stopped before its end (a stop signal, diverging losses); `exit_code` is for the CLI."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def exit_with(prog: str, error: UserError) -> NoReturn:
    """What every command does with bad input: one line on stderr, naming the command, and exit status 2."""
    print(f"{prog}: error: {error}", file=sys.stderr)
    sys.exit(2)
