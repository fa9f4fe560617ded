"""Exit statuses of the healthd commands, and the error that carries one to `main`.

Each command (`healthd agent`, `healthd controller`, `healthd trigger`/`status`)
raises `ExitError` wherever it learns it cannot go on, and its `main` turns it into
the message and the status. The numbers follow sysexits.h where one fits: 64 for a
bad command line, 73 for an output file that cannot be created, 78 for a config or
kubeconfig that cannot be used. A `UsageError`
(64) reaches `healthd.cli.main`, which prints it after the subcommand's usage, as
argparse does for the mistakes it finds itself. `UsageParser` is argparse with that
status, for every command line healthd has (the emulator's included).
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

EX_SOFTWARE = 1
EX_USAGE = 64
EX_CANTCREAT = 73  # an output file that cannot be created
EX_CONFIG = 78


class ExitError(Exception):
    """A message for the user and the exit status that goes with it."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class UsageError(ExitError):
    """A mistake on the command line that argparse cannot see (an unknown check, a
    bad duration): exit 64, printed after the usage of the subcommand."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EX_USAGE)


class UsageParser(argparse.ArgumentParser):
    """argparse exits 2 on a usage error, which reads as ERR under the Nagios
    convention; usage errors exit 64 (EX_USAGE) instead, after the usage."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"healthd: {message}", file=sys.stderr)
        sys.exit(EX_USAGE)


MAX_PORT = 65535


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free one) to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: expected a number") from None
    if not 0 <= port <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"invalid port {port}: expected 0 to {MAX_PORT}")
    return port
