"""`healthd trigger` and `healthd status` as commands: arguments in, output and an exit
code out, Ctrl-C handled.

Exit codes of `trigger`: the Nagios convention over all nodes (0 PASS, 1 WARN,
2 ERR/EVICT, 3 UNKNOWN: a node that was refused, never answered or could not be
asked counts as UNKNOWN); 3 as well when the API cannot be reached; 64 for a bad
command line or request (nothing is written), a selector the API server cannot
parse included; 78 for an unusable config or kubeconfig. `status` exits 0 (also
when Ctrl-C ends `--watch`), and 3, 64 or 78 for the same causes as `trigger`.
Usage errors (64) are `UsageError`s: healthd.cli prints them after the usage.

`-o table|wide|json|yaml` picks the output (healthd.util.output). Output that is not a
terminal gets no progress line and no redraws: `trigger` prints one line per node
as it answers, `status --watch` prints a frame only when something in it changed
(ages moving is not a change).
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TextIO

import anyio

from healthd.config import Config, config_or_exit
from healthd.fleet import render
from healthd.fleet.sources import Snapshot, follow, read_snapshot
from healthd.fleet.status import VERDICTS, agent_nodes, build
from healthd.fleet.targets import Resolved, TargetError, Targets, busy_nodes, resolve
from healthd.fleet.trigger import (
    FleetTrigger,
    NodeOutcome,
    Plan,
    Report,
    RequestError,
    plan_request,
)
from healthd.kube.client import Kube
from healthd.kube.conventions import Keys
from healthd.kube.errors import KubeError
from healthd.kube.objects import PODS, items_of
from healthd.kube.shapes import Pod
from healthd.util.durations import parse_duration
from healthd.util.exits import EX_CONFIG, ExitError, UsageError
from healthd.util.output import WIDE, dump, is_document

EX_UNREACHABLE = 3  # UNKNOWN under the Nagios convention (trigger and status alike)
HTTP_BAD_REQUEST = 400
DEFAULT_TIMEOUT_S = 300.0
EXCLUSIVE_TIMEOUT_S = 7200.0  # a deep diagnostic: scheduling plus up to an hour of tests
REDRAW_EVERY_S = 30.0  # ages move even when nothing changes
SETTLE_S = 0.3  # a burst of changes is drawn once
CLEAR_SCREEN = "\x1b[H\x1b[2J"


async def _connect(args: argparse.Namespace) -> Kube:
    try:
        return await Kube.connect(args.kubeconfig, context=args.context)
    except KubeError as exc:
        raise ExitError(str(exc), EX_CONFIG) from exc


def _cannot_read(what: str, exc: KubeError, selector: str | None) -> ExitError:
    """Reading the nodes failed: a label selector the API server cannot parse is a
    mistake on the command line (64); anything else, an API that cannot be read (3)."""
    if selector and exc.status == HTTP_BAD_REQUEST:
        return UsageError(f"--selector {selector!r}: {exc.message}")
    return ExitError(f"cannot {what}: {exc}", EX_UNREACHABLE)


# -- trigger ---------------------------------------------------------------------------


def _timeout(args: argparse.Namespace, plan: Plan) -> float:
    if args.timeout is None:
        return EXCLUSIVE_TIMEOUT_S if plan.exclusive else DEFAULT_TIMEOUT_S
    try:
        return parse_duration(args.timeout)
    except ValueError as exc:
        raise UsageError(f"--timeout: {exc}") from None


def _prepare(args: argparse.Namespace, config: Config) -> tuple[Plan, Targets, float]:
    """Everything that can be checked before touching the API."""
    if args.batch is not None and args.batch < 1:
        raise UsageError("--batch must be at least 1")
    keys = Keys(config.label_prefix, config.own_prefix)
    try:
        plan = plan_request(args.checks, keys, config)
        targets = Targets.from_args(selector=args.selector, nodes=args.nodes, job=args.job,
                                    namespace=args.namespace)
    except (RequestError, TargetError) as exc:
        raise UsageError(str(exc)) from None
    return plan, targets, _timeout(args, plan)


async def _refusals(kube: Kube, keys: Keys, plan: Plan, resolved: Resolved,
                    force: bool) -> dict[str, str]:
    if not plan.exclusive or force:
        return {}
    busy = await busy_nodes(kube, keys, resolved.nodes)
    needs = ", ".join(plan.exclusive)
    return {node: f"{needs} needs every GPU of the node: {why} (--force-queue asks anyway)"
            for node, why in busy.items()}


async def _agentless(kube: Kube, config: Config, resolved: Resolved) -> frozenset[str]:
    """Target nodes without a running agent pod (empty when the pods cannot be read:
    this only sharpens the message for nodes that do not answer)."""
    peers = config.agent.peers
    try:
        pods = await kube.list(PODS, peers.namespace, label_selector=peers.label_selector)
    except KubeError:
        return frozenset()
    running = agent_nodes(items_of(pods, Pod))
    return frozenset(n for n in resolved.nodes if n not in running)


async def trigger_command(args: argparse.Namespace, *, out: TextIO = sys.stdout,
                          err: TextIO = sys.stderr,
                          stop: anyio.Event | None = None) -> int:
    """`healthd trigger`; `stop` set (Ctrl-C) ends issuing and waiting."""
    config = config_or_exit(args.config)
    plan, targets, timeout_s = _prepare(args, config)
    keys = Keys(config.label_prefix, config.own_prefix)
    async with await _connect(args) as kube:
        try:
            resolved = await resolve(kube, targets)
            refused = await _refusals(kube, keys, plan, resolved, args.force_queue)
            agentless = await _agentless(kube, config, resolved)
        except TargetError as exc:
            raise UsageError(str(exc)) from None
        except KubeError as exc:
            raise _cannot_read("read the target nodes", exc, args.selector) from None
        if not resolved.nodes and not resolved.missing:
            raise ExitError(f"no node matches: {targets.describe()}", EX_UNREACHABLE)
        engine = FleetTrigger(kube, plan, resolved, keys=keys, batch=args.batch,
                              timeout_s=timeout_s, wait=args.wait or args.batch is not None,
                              refused=refused, agentless=agentless,
                              on_progress=_progress_to(err),
                              on_answer=_answers_to(out, err, args.output))
        report = await _run_interruptible(engine, stop)
    _print_report(report, args.output, out, err)
    return report.exit_code


async def _run_interruptible(engine: FleetTrigger, stop: anyio.Event | None) -> Report:
    async with anyio.create_task_group() as group:
        if stop is not None:
            async def interrupt_on_stop() -> None:
                await stop.wait()
                engine.interrupt()

            group.start_soon(interrupt_on_stop)
        report = await engine.run()
        group.cancel_scope.cancel()
    return report


def _progress_to(err: TextIO) -> Callable[[Report], None]:
    if not err.isatty():
        return lambda report: None

    def show(report: Report) -> None:
        err.write("\r\x1b[K" + render.progress_line(report))
        err.flush()

    return show


def _answers_to(out: TextIO, err: TextIO, output: str) -> Callable[[NodeOutcome], None]:
    """When the output is not a terminal (a pipe, a log), progress is a line per
    node on stderr as it answers, so stdout holds the table alone (a terminal has
    the progress line)."""
    if out.isatty() or err.isatty():
        return lambda outcome: None

    def show(outcome: NodeOutcome) -> None:
        err.write(render.answer_line(outcome) + "\n")
        err.flush()

    return show


def _print_report(report: Report, output: str, out: TextIO, err: TextIO) -> None:
    if err.isatty():
        err.write("\r\x1b[K")
    if is_document(output):
        out.write(dump(render.trigger_json(report), output) + "\n")
    else:
        out.write(render.trigger_table(report, wide=output == WIDE) + "\n")


# -- status ----------------------------------------------------------------------------


def _verdicts(text: str | None) -> list[str] | None:
    if not text:
        return None
    wanted = [v.strip().upper() for v in text.split(",") if v.strip()]
    wrong = [v for v in wanted if v not in VERDICTS]
    if wrong or not wanted:
        raise UsageError(f"--verdict {text!r}: choose among {', '.join(VERDICTS)}")
    return wanted


def in_namespace(config: Config, namespace: str | None) -> Config:
    """`config` with healthd's namespace (`-n`) where status looks: the agent pods and
    the controller's Lease."""
    if not namespace:
        return config
    agent, controller = config.agent, config.controller
    return config.model_copy(update={
        "namespace": namespace,
        "agent": agent.model_copy(update={
            "peers": agent.peers.model_copy(update={"namespace": namespace})}),
        "controller": controller.model_copy(update={
            "election": controller.election.model_copy(update={"namespace": namespace})}),
    })


async def status_command(args: argparse.Namespace, *, out: TextIO = sys.stdout,
                         clock: Callable[[], float] = time.time) -> int:
    """`healthd status`: once, or (`--watch`) redrawn on every change until cancelled."""
    config = in_namespace(config_or_exit(args.config), args.namespace)
    verdicts = _verdicts(args.verdict)

    def frame(snap: Snapshot) -> Frame:
        doc = build(snap, config, now=clock(), selector=args.selector, verdicts=verdicts)
        if is_document(args.output):
            text = dump(doc, args.output, compact=args.watch)
        else:
            text = render.status_text(doc, wide=args.output == WIDE)
        return Frame(text, json.dumps(steady_part(doc), sort_keys=True))

    async with await _connect(args) as kube:
        try:  # with --watch too: a bad selector or no API at the start is an answer
            snap = await read_snapshot(kube, config, args.selector)
        except KubeError as exc:
            raise _cannot_read("list nodes", exc, args.selector) from None
        if args.watch:
            await _watch(kube, config, args.selector, frame, out)
            return 0
        out.write(frame(snap).text + "\n")
    return 0


@dataclass(frozen=True)
class Frame:
    """One drawing of the status, and what it says apart from moving ages."""

    text: str
    meaning: str


def steady_part(doc: Any) -> Any:
    """The status document without what moves with the clock alone (ages, the time
    of the view, the Lease's renewals): two views that differ only there say the same."""
    if isinstance(doc, dict):
        return {k: steady_part(v) for k, v in doc.items()
                if not k.endswith("_age_s") and k not in ("generated_at", "renewed")}
    if isinstance(doc, list):
        return [steady_part(v) for v in doc]
    return doc


async def _watch(kube: Kube, config: Config, selector: str | None,
                 frame: Callable[[Snapshot], Frame], out: TextIO) -> None:
    """Draw on every change (a burst once). A terminal is also redrawn now and then
    for the ages; other output gets a frame only when its meaning changed."""
    changed = anyio.Event()
    latest: list[Snapshot] = []
    terminal = out.isatty()
    shown = ""

    def on_change(snap: Snapshot) -> None:
        latest[:] = [snap]
        changed.set()

    async with anyio.create_task_group() as group:
        group.start_soon(follow, kube, config, selector, on_change)
        while True:
            with anyio.move_on_after(REDRAW_EVERY_S if terminal else math.inf):
                await changed.wait()
            await anyio.sleep(SETTLE_S)
            changed = anyio.Event()
            if not latest:
                continue
            drawn = frame(latest[0])
            if drawn.meaning == shown and not terminal:
                continue
            shown = drawn.meaning
            out.write((CLEAR_SCREEN if terminal else "") + drawn.text + "\n")
            out.flush()


# -- the process -----------------------------------------------------------------------


async def _until_sigint(main: Callable[[anyio.Event], Awaitable[int]]) -> int:
    """Run `main(stop)`; the first Ctrl-C sets `stop`, a second one ends the process."""
    stop = anyio.Event()
    async with anyio.create_task_group() as group:
        async def on_sigint() -> None:
            with anyio.open_signal_receiver(signal.SIGINT) as signals:
                async for _ in signals:
                    stop.set()
                    return

        group.start_soon(on_sigint)
        code = await main(stop)
        group.cancel_scope.cancel()
    return code


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _run(main: Callable[[anyio.Event], Awaitable[int]]) -> int:
    """Run a command; its ExitError goes to healthd.cli, which prints it."""
    try:
        try:
            return anyio.run(_until_sigint, main)
        except BaseExceptionGroup as group:  # raised inside a task group
            raise _leaf(group) from None
    except KeyboardInterrupt:
        return 130


def run_trigger(args: argparse.Namespace) -> int:
    """The `healthd trigger` subcommand."""
    return _run(lambda stop: trigger_command(args, stop=stop))


def run_status(args: argparse.Namespace) -> int:
    """The `healthd status` subcommand (Ctrl-C ends `--watch`)."""
    async def main(stop: anyio.Event) -> int:
        async with anyio.create_task_group() as group:
            async def cancel_on_stop() -> None:
                await stop.wait()
                group.cancel_scope.cancel()

            group.start_soon(cancel_on_stop)
            code = await status_command(args)
            group.cancel_scope.cancel()
            return code
        return 0  # Ctrl-C ended --watch: the way out of it, not a failure

    return _run(main)
