"""`healthd agent` as a process: config, logging, the simulated machine (when the
CLI hands one in), signals, exit codes.

Exit codes: 0 after SIGTERM/SIGINT (the agent stopped cleanly, within
`agent.shutdown_flush_s` plus the time checks take to die: well under 10 s);
78 (EX_CONFIG) for a config, machine spec or kubeconfig that cannot be used, with
the field or file named; 1 when the agent cannot start otherwise (the HTTP port is
taken). A second signal during shutdown ends the process at once.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from typing import Protocol

import anyio

from checks.probes import Probes
from healthd.agent.agent import Agent
from healthd.config import Config, add_config_argument, config_or_exit
from healthd.kube.arguments import add_kube_arguments
from healthd.kube.errors import KubeError
from healthd.util.exits import EX_CONFIG, EX_SOFTWARE, ExitError
from healthd.util.http import add_http_port_argument
from healthd.util.logs import add_log_level_argument, configure_logging

log = logging.getLogger(__name__)

HARD_STOP_S = 9.0  # after a signal: the process ends by then, flushed or not


class SimulatedMachine(Protocol):
    """What the agent needs of a simulated machine (healthd.sim.node.SimulatedNode)."""

    @property
    def node(self) -> str:
        """The machine's node name."""
        ...

    def probes(self) -> Probes:
        """Its stand-ins for what checks measure with."""
        ...

    def adapt(self, config: Config) -> Config:
        """`config` pointed at the simulated hardware."""
        ...


Simulate = Callable[[str], AbstractContextManager[SimulatedMachine]]


def resolve_node_name(config: Config, node: str | None, sim: SimulatedMachine | None) -> str:
    """--node, else NODE_NAME (the config), else the simulated machine's, else the host."""
    return node or config.node_name or (sim.node if sim else "") or socket.gethostname()


async def run_until_signal(agent: Agent) -> None:
    """Run the agent until SIGTERM or SIGINT, then stop it gracefully."""
    async with anyio.create_task_group() as group:

        async def on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    log.info("received %s: stopping", signal.Signals(signum).name)
                    agent.stop()
                    group.cancel_scope.deadline = anyio.current_time() + HARD_STOP_S
                    break
                async for _ in signals:  # a second signal: stop now
                    group.cancel_scope.cancel()

        group.start_soon(on_signal)
        await agent.run()
        group.cancel_scope.cancel()


def _startup_error(exc: BaseException) -> BaseException:
    """The error that stopped the agent, out of its task groups: an ExitError when
    it is one we can explain, else the original."""
    leaf = exc
    while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
        leaf = leaf.exceptions[0]
    if isinstance(leaf, KubeError):
        return ExitError(str(leaf), EX_CONFIG)
    if isinstance(leaf, OSError):
        return ExitError(str(leaf), EX_SOFTWARE)
    return exc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    add_kube_arguments(parser)
    parser.add_argument("--sim", metavar="SPEC",
                        help="run on a simulated machine (YAML or name)")
    parser.add_argument("--sim-control", metavar="FILE",
                        help="with --sim: run on the machine FILE names (its clock and "
                             "files outlive the process) and apply the JSON-line changes "
                             "appended to FILE (docs/machine-spec.md)")
    parser.add_argument("--node", metavar="NAME", help="this node's name (default: NODE_NAME)")
    add_http_port_argument(parser)
    add_log_level_argument(parser)


def run(args: argparse.Namespace, simulate: Simulate | None = None) -> int:
    """The `healthd agent` subcommand; on the machine `simulate(args.sim)` opens when
    given (a ValueError from it is a spec that cannot be used)."""
    try:
        with ExitStack() as stack:
            config = config_or_exit(args.config)
            sim = None
            if simulate is not None:
                try:
                    sim = stack.enter_context(simulate(args.sim))
                except ValueError as exc:
                    raise ExitError(str(exc), EX_CONFIG) from exc
            node = resolve_node_name(config, args.node, sim)
            configure_logging(args.log_level, node)
            agent = Agent(sim.adapt(config) if sim else config, node=node,
                          kubeconfig=args.kubeconfig, context=args.context,
                          probes=sim.probes() if sim else None,
                          http_port=args.http_port)
            try:
                anyio.run(run_until_signal, agent)
            except Exception as exc:
                raise _startup_error(exc) from exc
    except ExitError as exc:
        print(f"healthd: {exc}", file=sys.stderr)
        return exc.code
    return 0
