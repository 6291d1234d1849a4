"""Errors caused by the user's input: the CLI prints their message on one line and exits 2."""


class UserError(Exception):
    """Bad input (config, data, checkpoint); the message says what is wrong and what to do."""


class ConfigError(UserError):
    """A config key, value or combination that cannot run."""


class DataError(UserError):
    """A data set that is missing, incomplete or in the wrong layout."""


class CheckpointError(UserError):
    """A checkpoint that is missing, unreadable or does not fit the config."""


class RunStopped(Exception):
    """The run stopped before its end (a stop signal, diverging losses); `exit_code` is for the CLI."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code
