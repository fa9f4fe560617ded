"""Exit statuses of the healthd commands, and the error that carries one to `main`.

Each command (`healthd agent`, `healthd controller`, `healthd trigger`/`status`)
raises `ExitError` wherever it learns it cannot go on, and its `main` turns it into
the message and the status. The numbers follow sysexits.h where one fits: 64 for a
bad command line, 78 for a config or kubeconfig that cannot be used.
"""

from __future__ import annotations

from healthd.config import Config, ConfigError, load_config

EX_SOFTWARE = 1
EX_USAGE = 64
EX_CONFIG = 78


class ExitError(Exception):
    """A message for the user and the exit status that goes with it."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def config_or_exit(path: str | None) -> Config:
    """The config file (or the defaults); ExitError(EX_CONFIG) naming what is wrong."""
    try:
        return load_config(path)
    except ConfigError as exc:
        raise ExitError(str(exc), EX_CONFIG) from exc
