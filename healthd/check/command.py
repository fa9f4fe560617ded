"""`healthd check`: run health checks on this machine, once, and say what they saw.

Exit codes follow the Nagios convention: 0 PASS, 1 WARN, 2 ERR or EVICT, 3 UNKNOWN;
64 for a usage error (unknown check, bad argument), 78 for a bad config or machine
spec.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack
from typing import Protocol

import anyio

import checks
from checks.base import CheckContext, CheckResult, Peer, Severity
from checks.kernel_log import KernelLog
from checks.probes import GpuSource, Probes
from checks.snapshot import DRIVER_NOT_FOUND, NvmlGpuSource
from healthd.check.once import Report, node_name, plan, run_planned
from healthd.check.plans import Planned
from healthd.check.report import render_problems, render_results
from healthd.check.termination import write_summary
from healthd.config import Config, add_config_argument, config_or_exit
from healthd.config.selection import SelectionError, parse_selection
from healthd.util.exits import EX_CONFIG, ExitError, UsageError
from healthd.util.output import WIDE, add_output_argument, dump, is_document


class SimulatedMachine(Protocol):
    """What `healthd check --sim` needs of a simulated machine
    (healthd.sim.node.SimulatedNode)."""

    def check_probes(self) -> Probes:
        """Its stand-ins for what checks measure with."""
        ...

    def prepare(self, planned: Sequence[Planned]) -> list[Planned]:
        """The checks as the machine runs them (a replay runs what it recorded)."""
        ...

    def check_context(self, config: Config, gpus: GpuSource,
                      peers: Sequence[Peer]) -> CheckContext:
        """A round's context on this machine (its node name and GPU count by default)."""
        ...


Simulate = Callable[[str], AbstractContextManager[SimulatedMachine]]


def _check_help() -> str:
    lines = ["checks (`all` = every non-exclusive one):"]
    for name, cls in checks.REGISTRY.items():
        arg = f":{cls.ARG.upper()}" if cls.ARG else ""
        lines.append(f"  {name + arg:<14} {cls.DESCRIPTION}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = _check_help()
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--checks", default="all",
                        help="comma-separated, e.g. remapped,power or dcgm:3")
    parser.add_argument("--sim", metavar="SPEC",
                        help="run on a simulated machine (YAML file or bundled name)")
    parser.add_argument("--sim-control", metavar="FILE",
                        help="with --sim: run on the machine FILE names (healthd agent "
                        "--sim-control), as a diagnostic Job on that node does")
    add_config_argument(parser)
    parser.add_argument("--peer", action="append", default=[], metavar="NAME=ADDR[,ADDR]",
                        help="a peer for the ping check (repeatable)")
    add_output_argument(parser)
    parser.add_argument("--termination-log", metavar="PATH",
                        help="also write a compact JSON summary (4096 bytes at most) to PATH")


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


async def _run_check(args: argparse.Namespace, simulate: Simulate | None) -> Report:
    config = config_or_exit(args.config)
    try:
        selection = parse_selection(args.checks, checks.REGISTRY)
        peers = parse_peers(args.peer)
        plan(config, selection)  # a bad argument is a usage error before anything opens
    except (SelectionError, ValueError) as exc:
        raise UsageError(str(exc)) from None

    with ExitStack() as stack:
        gpus = NvmlGpuSource()
        if simulate is not None:
            try:
                sim = stack.enter_context(simulate(args.sim))
            except ValueError as exc:  # a machine spec that cannot be used
                raise ExitError(str(exc), EX_CONFIG) from None
            planned = sim.prepare(plan(config, selection, sim.check_probes()))
            ctx = sim.check_context(config, gpus, peers)
        else:
            log = KernelLog()  # everything since boot; no position kept
            stack.callback(log.close)
            planned = plan(config, selection, Probes(kernel_log=log))
            ctx = CheckContext(catalog=config.catalog(), node_name=node_name(config),
                               gpus=gpus, expected_gpus=config.expected_gpus, peers=peers,
                               namespace=config.probe_namespace)
        snapshot = await gpus.snapshot()
        results = await run_planned(planned, ctx)
        await gpus.aclose()
        return Report(
            node=ctx.node_name,
            results=results,
            driver_error=snapshot.driver_error,
            simulated=simulate is not None,
        )


def run(args: argparse.Namespace, simulate: Simulate | None = None) -> int:
    """The `healthd check` command, on the machine `simulate(args.sim)` opens when given."""
    report = anyio.run(_run_check, args, simulate)
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
