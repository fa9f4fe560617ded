"""The `healthd` command line.

    healthd check [--checks LIST] [--sim SPEC] [--config FILE] [--peer NAME=ADDR[,ADDR]]
                  [-o table|wide|json|yaml] [--termination-log PATH]
    healthd agent [--config FILE] [--kubeconfig FILE] [--context NAME] [--sim SPEC]
                  [--sim-control FILE] [--node NAME] [--http-port N]
    healthd controller [--config FILE] [--kubeconfig FILE] [--context NAME] [--dry-run]
                       [--http-port N]
    healthd trigger (--selector S | --nodes N1,N2 | --job [NS/]APPWRAPPER [-n NS]) --checks LIST
                    [--batch N] [--wait] [--timeout D] [--force-queue] [-o FORMAT]
    healthd status [--selector S] [--verdict V] [--watch] [-n NS] [-o FORMAT]
    healthd demo [--scenario FILE|NAME] [--nodes N] [-o FORMAT] [--serve PORT]
    healthd record [--output FILE] [--include xid-window=D|pciebw|dcgm] [--redact] [--sim SPEC]
    healthd config validate FILE
    healthd version | healthd --version

Exit codes of `healthd check` follow the Nagios convention: 0 PASS, 1 WARN, 2 ERR or
EVICT, 3 UNKNOWN; 64 for a usage error (unknown check, bad argument), 78 for a bad
config or machine spec. A usage error prints the usage of the subcommand it is in,
whichever part found it (argparse, or a command raising `healthd.util.exits.UsageError`).
Every command whose reader goes away early (`healthd check | head -1`) stops quietly
with 141, the status a shell gives a writer stopped by SIGPIPE.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from healthd import __version__
from healthd.util.exits import ExitError, UsageError, UsageParser

EX_BROKEN_PIPE = 128 + signal.SIGPIPE  # what a shell reports for a writer whose reader left


@dataclass(frozen=True)
class Command:
    """One `healthd` subcommand: its help line, and where its arguments and its run
    live (`module:function`). Only the chosen command's modules are imported, so
    `healthd agent` does not load the demo. `simulated`: it takes `--sim`, and `run`
    gets the simulated machine's opener (the simulation adapts the product; the
    product never imports it)."""

    name: str
    help: str
    arguments: str
    run: str
    simulated: bool = False


COMMANDS: tuple[Command, ...] = (
    Command("check", "run health checks on this machine, once",
            "healthd.check.command:add_arguments", "healthd.check.command:run",
            simulated=True),
    Command("agent", "run the node agent (DaemonSet): check, publish, serve",
            "healthd.agent.command:add_arguments", "healthd.agent.command:run",
            simulated=True),
    Command("controller", "run the cluster controller: AppWrapper resets, slack lending",
            "healthd.controller.command:add_arguments", "healthd.controller.command:run"),
    Command("demo", "the whole system on a simulated cluster, playing a scenario",
            "healthd.demo.command:add_arguments", "healthd.demo.command:run"),
    Command("config", "configuration tools",
            "healthd.config.command:add_arguments", "healthd.config.command:run"),
    Command("trigger", "run on-demand checks on many nodes through their agents",
            "healthd.fleet.arguments:add_trigger_arguments", "healthd.fleet.command:run_trigger"),
    Command("status", "the fleet's GPU health and the controller's view, from the API",
            "healthd.fleet.arguments:add_status_arguments", "healthd.fleet.command:run_status"),
    Command("record", "write this machine's GPU state as a machine spec (replay with --sim)",
            "healthd.record.command:add_arguments", "healthd.record.command:run"),
    Command("gpu-reset", "reset GPUs in place (nvidia-smi --gpu-reset), as a repair Job does",
            "healthd.repair.command:add_arguments", "healthd.repair.command:run",
            simulated=True),
    Command("version", "print the version", "healthd.cli:_no_arguments", "healthd.cli:_version"),
)
BY_NAME = {command.name: command for command in COMMANDS}


def _resolve(target: str) -> Callable[..., Any]:
    module, _, function = target.partition(":")
    found: Callable[..., Any] = getattr(importlib.import_module(module), function)
    return found


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    """`healthd version` takes none."""


def _version(args: argparse.Namespace) -> int:
    print(f"healthd {__version__}")
    return 0


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The `healthd` parser: every command by name and help; the arguments of the one
    `argv` names (all of them when `argv` is None)."""
    parser = UsageParser(prog="healthd", description="GPU node health for Kubernetes")
    parser.add_argument("--version", action="version", version=f"healthd {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=UsageParser)
    chosen = _chosen(argv)
    for command in COMMANDS:
        subparser = sub.add_parser(command.name, help=command.help)
        if chosen is None or command.name == chosen:
            _resolve(command.arguments)(subparser)
    return parser


def _chosen(argv: Sequence[str] | None) -> str | None:
    """The command `argv` names (its first word that is one), None: build them all."""
    if argv is None:
        return None
    return next((word for word in argv if word in BY_NAME), None)


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse `argv`; an argument no subcommand knows is that subcommand's usage error
    (argparse would blame the top-level parser and print its usage instead)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        _innermost(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _innermost(parser: argparse.ArgumentParser,
               args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the subcommand `args` chose."""
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(args, action.dest or "", None)
            if chosen in action.choices:
                return _innermost(action.choices[chosen], args)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `healthd` command and return its exit status. Output whose reader went
    away early (`| head`) ends any command quietly with EX_BROKEN_PIPE."""
    try:
        try:
            return _run_command(sys.argv[1:] if argv is None else argv)
        finally:
            sys.stdout.flush()  # a reader that left shows here, not at interpreter exit
    except (BrokenPipeError, BaseExceptionGroup) as exc:
        if isinstance(exc, BaseExceptionGroup) and exc.split(BrokenPipeError)[1] is not None:
            raise
        # What is still buffered goes nowhere: no second complaint at interpreter exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EX_BROKEN_PIPE


def _run_command(argv: Sequence[str]) -> int:
    """Parse, run, and print a command's ExitError: a usage error after the usage of
    its subcommand, any other as one line."""
    parser = build_parser(argv)
    args = parse_args(parser, argv)
    command = BY_NAME[args.command]
    try:
        run = _resolve(command.run)
        if command.simulated:
            return int(run(args, simulate=_simulation(args)))
        return int(run(args))
    except UsageError as exc:
        _innermost(parser, args).error(str(exc))
    except ExitError as exc:
        print(f"healthd: {exc}", file=sys.stderr)
        return exc.code


Opener = Callable[[str], AbstractContextManager[Any]]


def _simulation(args: argparse.Namespace) -> Opener | None:
    """The opener of the simulated machine `--sim` names (following `--sim-control`,
    where the command has it); None without `--sim`."""
    control = getattr(args, "sim_control", None)
    if not args.sim:
        if control:
            raise UsageError("--sim-control needs --sim")
        return None
    from healthd.sim.node import simulate

    return lambda spec: simulate(spec, control)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
