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
whichever part found it (argparse, or a command raising `healthd.exits.UsageError`).
Every command whose reader goes away early (`healthd check | head -1`) stops quietly
with 141, the status a shell gives a writer stopped by SIGPIPE.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import signal
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from typing import NoReturn

import anyio

import checks
from checks.base import CheckContext, CheckResult, Peer, Severity
from checks.kernel_log import KernelLog
from checks.probes import Probes
from checks.snapshot import DRIVER_NOT_FOUND, NvmlGpuSource
from healthd import __version__
from healthd.config import Config, ConfigError, load_config
from healthd.exits import EX_CONFIG, ExitError, UsageError, UsageParser, port_number
from healthd.fleet.arguments import add_fleet_parsers
from healthd.once import Report, node_name, plan, run_planned
from healthd.output import WIDE, add_output_argument, dump, is_document
from healthd.report import render_problems, render_results
from healthd.selection import SelectionError, parse_selection
from healthd.termination import write_summary

EX_BROKEN_PIPE = 128 + signal.SIGPIPE  # what a shell reports for a writer whose reader left


def _fail(message: str, code: int) -> NoReturn:
    print(f"healthd: {message}", file=sys.stderr)
    sys.exit(code)


def _check_help() -> str:
    lines = ["checks (`all` = every non-exclusive one):"]
    for name, cls in checks.REGISTRY.items():
        arg = f":{cls.ARG.upper()}" if cls.ARG else ""
        lines.append(f"  {name + arg:<14} {cls.DESCRIPTION}")
    return "\n".join(lines)


def _add_kube_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", metavar="FILE", help="default: $KUBECONFIG or in-cluster")
    parser.add_argument("--context", metavar="NAME",
                        help="the kubeconfig context to use (default: its current-context)")


def build_parser() -> argparse.ArgumentParser:
    parser = UsageParser(prog="healthd", description="GPU node health for Kubernetes")
    parser.add_argument("--version", action="version", version=f"healthd {__version__}")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=UsageParser
    )

    check = sub.add_parser(
        "check",
        help="run health checks on this machine, once",
        epilog=_check_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument(
        "--checks", default="all", help="comma-separated, e.g. remapped,power or dcgm:3"
    )
    check.add_argument(
        "--sim", metavar="SPEC", help="run on a simulated machine (YAML file or bundled name)"
    )
    check.add_argument("--config", metavar="FILE", help="healthd config YAML")
    check.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="NAME=ADDR[,ADDR]",
        help="a peer for the ping check (repeatable)",
    )
    add_output_argument(check)
    check.add_argument(
        "--termination-log",
        metavar="PATH",
        help="also write a compact JSON summary (4096 bytes at most) to PATH",
    )

    agent = sub.add_parser("agent", help="run the node agent (DaemonSet): check, publish, serve")
    agent.add_argument("--config", metavar="FILE", help="healthd config YAML")
    _add_kube_arguments(agent)
    agent.add_argument("--sim", metavar="SPEC", help="run on a simulated machine (YAML or name)")
    agent.add_argument("--sim-control", metavar="FILE",
                       help="with --sim: apply the JSON-line changes appended to FILE "
                            "(docs/machine-spec.md)")
    agent.add_argument("--node", metavar="NAME", help="this node's name (default: NODE_NAME)")
    agent.add_argument("--http-port", type=port_number, metavar="N",
                       help="/metrics, /healthz, /readyz")
    agent.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING"))

    ctl = sub.add_parser(
        "controller", help="run the cluster controller: AppWrapper resets, slack lending"
    )
    ctl.add_argument("--config", metavar="FILE", help="healthd config YAML")
    _add_kube_arguments(ctl)
    ctl.add_argument("--dry-run", action="store_true", help="decide and log, write nothing")
    ctl.add_argument("--http-port", type=port_number, metavar="N",
                     help="/metrics, /healthz, /readyz")
    ctl.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING"))

    from healthd.demo.command import add_arguments as add_demo_arguments

    add_demo_arguments(sub.add_parser(
        "demo", help="the whole system on a simulated cluster, playing a scenario"))

    config = sub.add_parser("config", help="configuration tools")
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    validate = config_sub.add_parser(
        "validate", help="validate a config file, print the effective config"
    )
    validate.add_argument("file")

    add_fleet_parsers(sub)
    from healthd.record_command import add_arguments as add_record_arguments

    add_record_arguments(sub.add_parser(
        "record", help="write this machine's GPU state as a machine spec (replay with --sim)"))
    sub.add_parser("version", help="print the version")
    return parser


def parse_peers(values: Sequence[str]) -> list[Peer]:
    """`--peer NAME=ADDR[,ADDR]`: a peer's IPv4/IPv6 addresses (the ping check pings
    addresses, never names); UsageError for anything else."""
    peers = []
    for value in values:
        name, sep, addresses = value.partition("=")
        addrs = [a.strip() for a in addresses.split(",") if a.strip()]
        if not sep or not name.strip() or not addrs:
            raise UsageError(f"bad --peer {value!r}: expected NAME=ADDR[,ADDR]")
        for addr in addrs:
            try:
                ipaddress.ip_address(addr)
            except ValueError:
                raise UsageError(f"bad --peer {value!r}: {addr!r} is not an IPv4 or IPv6 "
                                 "address") from None
        peers.append(Peer(name.strip(), addrs))
    return peers


def _load_config(path: str | None) -> Config:
    try:
        return load_config(path)
    except ConfigError as exc:
        _fail(str(exc), EX_CONFIG)


async def _run_check(args: argparse.Namespace) -> Report:
    config = _load_config(args.config)
    try:
        selection = parse_selection(args.checks, checks.REGISTRY)
        peers = parse_peers(args.peer)
        plan(config, selection)  # a bad argument is a usage error before anything opens
    except (SelectionError, ValueError) as exc:
        raise UsageError(str(exc)) from None

    with ExitStack() as stack:
        gpus = NvmlGpuSource()
        if args.sim:
            from healthd.sim.node import SimulationError, simulate

            try:
                sim = stack.enter_context(simulate(args.sim))
            except SimulationError as exc:
                _fail(str(exc), EX_CONFIG)
            planned = sim.prepare(plan(config, selection, sim.check_probes()))
            ctx = sim.check_context(config, gpus, peers)
        else:
            log = KernelLog()  # everything since boot; no position kept
            stack.callback(log.close)
            planned = plan(config, selection, Probes(kernel_log=log))
            ctx = CheckContext(catalog=config.catalog(), node_name=node_name(config),
                               gpus=gpus, expected_gpus=config.expected_gpus, peers=peers,
                               namespace=config.namespace)
        snapshot = await gpus.snapshot()
        results = await run_planned(planned, ctx)
        await gpus.aclose()
        return Report(
            node=ctx.node_name,
            results=results,
            driver_error=snapshot.driver_error,
            simulated=bool(args.sim),
        )


def cmd_check(args: argparse.Namespace) -> int:
    report = anyio.run(_run_check, args)
    if args.termination_log:
        problem = write_summary(args.termination_log, report.node, report.results)
        if problem:
            print(f"healthd: {problem}", file=sys.stderr)
    if is_document(args.output):
        print(dump(report.to_json(), args.output))
        return report.exit_code
    shown, blocked = report.results, []
    if report.driver_error:  # a simulated driverless node shows what a real one does
        # No GPU stack here: one line for the GPU checks, not a row of UNKNOWN each;
        # the checks that need no GPU (ping, pvc) are shown and judged as usual.
        shown = [r for r in report.results if not _needs_driver(r)]
        blocked = [r.check for r in report.results if _needs_driver(r)]
        if not shown:
            print(f"healthd: {DRIVER_NOT_FOUND}: no GPU checks can run on this machine "
                  "(try `healthd check --sim healthy-8xh100`)", file=sys.stderr)
            return report.exit_code
        if blocked:
            print(f"healthd: {DRIVER_NOT_FOUND}: GPU checks {', '.join(blocked)} cannot run "
                  "on this machine: UNKNOWN", file=sys.stderr)
    wide = args.output == WIDE
    print(render_results(shown, wide=wide))
    print(f"\nProblems:\n{render_problems(shown, wide=wide, cannot_run=blocked)}")
    print(f"\n{report.node}: {report.status.value} (exit {report.exit_code})")
    return report.exit_code


def _needs_driver(result: CheckResult) -> bool:
    """A GPU check that could not run because the machine has no NVIDIA driver."""
    return result.status is Severity.UNKNOWN and result.reason == DRIVER_NOT_FOUND


def cmd_config_validate(args: argparse.Namespace) -> int:
    config = _load_config(args.file)
    print(f"{args.file}: valid")
    print(json.dumps(config.model_dump(mode="json"), indent=2, sort_keys=True))
    return 0


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
            return _run_command(argv)
        finally:
            sys.stdout.flush()  # a reader that left shows here, not at interpreter exit
    except (BrokenPipeError, BaseExceptionGroup) as exc:
        if isinstance(exc, BaseExceptionGroup) and exc.split(BrokenPipeError)[1] is not None:
            raise
        # What is still buffered goes nowhere: no second complaint at interpreter exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EX_BROKEN_PIPE


def _run_command(argv: Sequence[str] | None) -> int:
    """Parse, dispatch, and print a command's ExitError: a usage error after the
    usage of its subcommand, any other as one line."""
    parser = build_parser()
    args = parse_args(parser, argv)
    try:
        return _dispatch(args)
    except UsageError as exc:
        _innermost(parser, args).error(str(exc))
    except ExitError as exc:
        print(f"healthd: {exc}", file=sys.stderr)
        return exc.code


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "version":
        print(f"healthd {__version__}")
        return 0
    if args.command == "config":
        return cmd_config_validate(args)
    if args.command == "controller":
        from healthd.controller.command import run_controller

        return run_controller(args)
    if args.command in ("trigger", "status"):
        from healthd.fleet.command import run_status, run_trigger

        return run_trigger(args) if args.command == "trigger" else run_status(args)
    if args.command == "demo":
        from healthd.demo.command import run_demo

        return run_demo(args)
    if args.command == "record":
        from healthd.record_command import run_record

        return run_record(args)
    if args.command == "agent":
        from healthd.agent.command import run_agent

        if args.sim:  # the simulation adapts the agent; the agent never imports it
            from healthd.sim.node import simulate

            return run_agent(args, simulate=lambda spec: simulate(spec, args.sim_control))
        if args.sim_control:
            raise UsageError("--sim-control needs --sim")
        return run_agent(args)
    return cmd_check(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
