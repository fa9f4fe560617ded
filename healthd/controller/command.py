"""`healthd controller` as a process: config, logging, the API client, the HTTP
endpoint, signals and exit codes.

Exit codes: 0 after SIGTERM/SIGINT (every activity is cancelled at once; the leader
then hands its Lease over, waiting 2 s at most, so the process ends well within
Kubernetes' grace period); 78 (EX_CONFIG) for a config or kubeconfig that cannot be
used, with the field or file named; 1 when the controller cannot start otherwise
(the HTTP port is taken).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Awaitable, Callable

import anyio
from prometheus_client import CollectorRegistry

from healthd.config import Config, add_config_argument, config_or_exit
from healthd.controller.controller import Controller, default_identity
from healthd.controller.metrics import ControllerMetrics
from healthd.kube.arguments import add_kube_arguments
from healthd.kube.client import Kube
from healthd.kube.errors import KubeError
from healthd.util.exits import EX_CONFIG, EX_SOFTWARE, ExitError
from healthd.util.http import add_http_port_argument, serve_http
from healthd.util.logs import add_log_level_argument, configure_logging

log = logging.getLogger(__name__)



def effective_config(args: argparse.Namespace) -> Config:
    """The config file (or defaults) with the command line's overrides applied."""
    config = config_or_exit(args.config)
    updates: dict[str, object] = {}
    if args.dry_run:
        updates["dry_run"] = True
    if args.http_port is not None:
        updates["http_port"] = args.http_port
    if updates:
        config = config.model_copy(
            update={"controller": config.controller.model_copy(update=updates)})
    return config


async def run_until_signal(main: Callable[[], Awaitable[None]]) -> None:
    """Run `main` until SIGTERM or SIGINT, then cancel it (its `finally` blocks
    clean up, each bounded)."""
    async with anyio.create_task_group() as group:

        async def on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    log.info("received %s: stopping", signal.Signals(signum).name)
                    group.cancel_scope.cancel()
                    break

        group.start_soon(on_signal)
        await main()
        group.cancel_scope.cancel()


async def serve(config: Config, kubeconfig: str | None, context: str | None = None) -> None:
    """Connect, serve /metrics /healthz /readyz, and run the controller."""
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry)
    try:
        kube = await Kube.connect(kubeconfig, context=context)
    except KubeError as exc:
        raise ExitError(str(exc), EX_CONFIG) from exc
    async with kube:
        controller = Controller(config, kube=kube, metrics=metrics)
        try:
            server = serve_http(config.controller.http_port, registry,
                                healthy=lambda: (True, ""), ready=controller.ready)
            async with server as port:
                log.info("controller %s on %s; metrics on port %d", controller.identity,
                         kube.host, port)
                await controller.run()
        except OSError as exc:
            raise ExitError(str(exc), EX_SOFTWARE) from exc


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    add_kube_arguments(parser)
    parser.add_argument("--dry-run", action="store_true", help="decide and log, write nothing")
    add_http_port_argument(parser)
    add_log_level_argument(parser)


def run(args: argparse.Namespace) -> int:
    """The `healthd controller` subcommand."""
    try:
        config = effective_config(args)
        configure_logging(args.log_level, default_identity(config))
        try:
            anyio.run(run_until_signal, lambda: serve(config, args.kubeconfig, args.context))
        except BaseExceptionGroup as group:
            leaf = _leaf(group)
            if isinstance(leaf, ExitError):
                raise leaf from None
            raise
    except ExitError as exc:
        print(f"healthd: {exc}", file=sys.stderr)
        return exc.code
    return 0
