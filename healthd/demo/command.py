"""`healthd demo`: the whole system on a simulated cluster, one command.

    healthd demo [--scenario FILE|NAME] [--nodes N] [-o table|wide|json|yaml] [--serve PORT]

Starts the demo cluster (healthd.demo.cluster), plays the scenario
(healthd.demo.player) and shows it: a live screen on a terminal, a line log
elsewhere, then a summary (with the scenario's timings); `--output json` prints the
result instead (the timeline of observed states, the Events, the steps, the marks
and timings; `-o yaml` the same as YAML;
`wide` adds each node's findings, last on-demand answer and blamed networks to the
final table, also on a terminal). `--serve PORT` keeps the
emulated API on PORT and every component running after the story, prints a
kubeconfig and the /metrics addresses, and stops on Ctrl-C.

Exit codes: 0 every expectation held; 1 one failed (the message names the step,
the expectation and what was seen); 64 a usage error (a port out of range, a node
count the scenario cannot be played on: fewer than it needs, or more than 64); 78
a scenario that cannot be played (the message names the field).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import anyio

from healthd.demo.scenario import (
    DEFAULT_SCENARIO,
    Scenario,
    ScenarioError,
    build_config,
    bundled_scenarios,
    check_fits,
    load_scenario,
    measure,
    minimum_nodes,
)
from healthd.demo.view import LiveView, line, summary
from healthd.util.exits import UsageError, port_number
from healthd.util.output import WIDE, add_output_argument, dump, is_document

if TYPE_CHECKING:
    from healthd.demo.cluster import DemoCluster
    from healthd.demo.player import Recorder

EX_FAILED = 1
EX_CONFIG = 78
MAX_NODES = 64  # what a scenario may ask for, too
Hold = Callable[["DemoCluster"], Awaitable[None]]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `healthd demo` options (healthd.cli builds the subcommand with them)."""
    parser.add_argument("--scenario", default=DEFAULT_SCENARIO, metavar="FILE|NAME",
                        help=f"a scenario YAML or a bundled one: {', '.join(bundled_scenarios())}")
    parser.add_argument("--nodes", type=int, metavar="N",
                        help=f"simulated GPU nodes, up to {MAX_NODES} and at least what the "
                             "scenario needs (default: the scenario's, 3)")
    add_output_argument(parser)
    parser.add_argument("--serve", type=port_number, metavar="PORT",
                        help="keep the emulated API on PORT (and /metrics) up after the story")


class _Sink(logging.Handler):
    """Log records as text lines for the live screen (they would tear it)."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.lines = lines
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@contextmanager
def _logging(live_lines: list[str] | None) -> Iterator[None]:
    """Errors go to stderr (what the components warn about shows as Events already),
    or, with warnings, to the live screen when there is one."""
    root = logging.getLogger()
    handler: logging.Handler = _Sink(live_lines) if live_lines is not None \
        else logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING if live_lines is not None else logging.ERROR)
    if live_lines is None:  # a line on stderr says who says it
        handler.setFormatter(logging.Formatter("healthd demo: %(name)s: %(levelname)s: "
                                               "%(message)s"))
    before = root.level
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(before)


def result_of(scenario: Scenario, nodes: int, rec: Recorder, failure: object | None,
              duration_s: float) -> dict[str, Any]:
    """The JSON result: verdict, failure, steps, the timeline of states, the Events."""
    done = [s for s in rec.steps if s["result"] == "done"]  # one record per step
    return {"scenario": scenario.name, "description": scenario.description, "nodes": nodes,
            "passed": failure is None, "failure": str(failure) if failure else None,
            "duration_s": round(duration_s, 2), "step_count": len(scenario.steps),
            "steps_done": [s["index"] for s in done], "steps": rec.steps,
            "marks": rec.marks, "timings": measure(scenario.timings, rec.marks),
            "timeline": rec.timeline, "events": rec.log.events}


async def play(scenario: Scenario, *, nodes: int, stream: TextIO, live: bool = False,
               lines: bool = True, serve_port: int | None = None, hold: Hold | None = None,
               notices: TextIO | None = None) -> dict[str, Any]:
    """Run the cluster, play `scenario`, return the result; with `serve_port`, then
    print where the cluster is (to `notices`, default `stream`) and call
    `hold(cluster)` (default: wait for Ctrl-C) before stopping."""
    # Imported here: the agent, controller and simulation stay out of other commands.
    from healthd.demo.cluster import running_cluster
    from healthd.demo.player import Player, Recorder

    config = build_config(scenario)
    view = LiveView(stream, scenario.name) if live else None

    def on_line(t: float, text: str) -> None:
        if view is not None:
            view.add_line(t, text)
        elif lines:
            print(line(t, text), file=stream, flush=True)

    with _logging(view.logs if view else None):
        async with running_cluster(scenario, config, nodes=nodes,
                                   port=serve_port or 0) as cluster:
            rec = Recorder(cluster, on_line=on_line)
            async with anyio.create_task_group() as group:
                group.start_soon(rec.sample_forever)
                if view is not None:
                    group.start_soon(view.run, rec)
                started = anyio.current_time()
                failure: object = None  # a player.Failure, or why the story was cut short
                with anyio.move_on_after(scenario.time_limit) as limit:
                    failure = await Player(cluster, scenario, rec).play()
                if limit.cancelled_caught:
                    failure = f"the story did not end within time_limit {scenario.time_limit:g} s"
                rec.sample()
                if view is not None:
                    view.draw(rec)
                group.cancel_scope.cancel()
            result = result_of(scenario, nodes, rec, failure, anyio.current_time() - started)
            if serve_port is not None:
                print(summary(result), file=notices or stream, flush=True)
                await _serve(cluster, notices or stream, hold)
    return result


async def _serve(cluster: DemoCluster, stream: TextIO, hold: Hold | None) -> None:
    """Print where the cluster is and hold it; the kubeconfig's folder goes with it."""
    with tempfile.TemporaryDirectory(prefix="healthd-demo-") as folder:
        await _serve_from(cluster, stream, hold, Path(folder))


async def _serve_from(cluster: DemoCluster, stream: TextIO, hold: Hold | None,
                      folder: Path) -> None:
    notice = await _notice(cluster, cluster.api.write_kubeconfig(folder / "kubeconfig"))
    if hold is not None:
        print(notice, file=stream, flush=True)
        await hold(cluster)
        return
    # Ctrl-C is caught before the notice says so: a signal sent by whoever reads it
    # always reaches this wait, never the default handler's cancellation on the way.
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        print(notice, file=stream, flush=True)
        async for _ in signals:
            return


async def _notice(cluster: DemoCluster, kubeconfig: Path) -> str:
    """Where the served cluster is and what to try on it."""
    free = await _free_node(cluster)
    diagnose = (f"healthd trigger --kubeconfig {kubeconfig} --nodes {free} --checks dcgm:3 "
                "--wait" if free else "every node's GPUs are busy: a deep diagnostic would "
                "be refused")
    out = ["", "The demo cluster stays up; Ctrl-C stops it.",
           f"  API server  {cluster.api.url}",
           f"  kubeconfig  {kubeconfig}",
           f"  try         kubectl --kubeconfig {kubeconfig} get nodes "
           f"-L {cluster.keys.gpuhealth}",
           f"  status      healthd status --kubeconfig {kubeconfig}",
           f"  diagnose    {diagnose}",
           f"  controller  http://127.0.0.1:{cluster.controller_port}/metrics"]
    out += [f"  {name:<11} http://127.0.0.1:{port}/metrics"
            for name, port in cluster.agent_ports().items()]
    return "\n".join(out)


async def _free_node(cluster: DemoCluster) -> str | None:
    """The first node whose GPUs no pod holds now: where the hint's deep diagnostic
    (`trigger --checks dcgm:3`) will not be refused. None when every node is busy."""
    from healthd.fleet.targets import busy_nodes

    busy = await busy_nodes(cluster.admin, cluster.keys, cluster.nodes)
    return next((node for node in cluster.nodes if node not in busy), None)


def _node_count(scenario: Scenario, asked: int | None) -> int:
    """The cluster's size: `--nodes`, else the scenario's; UsageError for a count the
    scenario cannot be played on."""
    if asked is None:
        return scenario.nodes
    least, why = minimum_nodes(scenario)
    if not least <= asked <= MAX_NODES:
        raise UsageError(f"--nodes {asked}: scenario {scenario.name} plays on {least} to "
                         f"{MAX_NODES} GPU nodes ({why})")
    return asked


def run(args: argparse.Namespace, stream: TextIO | None = None) -> int:
    """The `healthd demo` subcommand; UsageError for a bad command line."""
    stream = stream or sys.stdout
    try:
        scenario = load_scenario(args.scenario)
        nodes = _node_count(scenario, args.nodes)
        check_fits(scenario, nodes, origin=str(args.scenario))
        build_config(scenario)
    except ScenarioError as exc:
        print(f"healthd: {exc}", file=sys.stderr)
        return EX_CONFIG
    as_json, wide = is_document(args.output), args.output == WIDE
    live = not as_json and stream.isatty()
    try:
        result = anyio.run(lambda: play(scenario, nodes=nodes, stream=stream, live=live,
                                        lines=not as_json, serve_port=args.serve,
                                        notices=sys.stderr if as_json else None))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        raise  # the reader of our output left: healthd.cli ends quietly
    except OSError as exc:  # the --serve port is taken, most likely
        print(f"healthd: cannot start the demo cluster: {exc}", file=sys.stderr)
        return EX_FAILED
    if as_json:
        print(dump(result, args.output), file=stream)
    elif args.serve is None:
        print(("" if live else "\n") + summary(result, with_state=not live or wide,
                                                wide=wide), file=stream)
    if not result["passed"]:
        print(f"healthd: scenario {scenario.name} failed: {result['failure']}", file=sys.stderr)
    return 0 if result["passed"] else EX_FAILED
