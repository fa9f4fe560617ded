"""label_to_reset: a node labelled EVICT -> the AppWrapper status write that resets
the work on it, at fleet scale.

The real controller (`healthd.controller.Controller`: Lease, caches from list+watch,
eviction reactor, safety rails, lending) runs in this process against the API
emulator over HTTP, on the cluster `reset_cluster` seeds (20 pods per node, 4 of
them GPU pods of 4 different AppWrappers). By default the emulator runs in a
process of its own, as a real API server would (`--emulator own-process`); with
`--emulator in-process` it shares this process and event loop, as it used to, so
every request costs this process twice (`--emulator both` runs each).

Latency: one node at a time turns EVICT (the label and the agent's health
annotation, as the agent writes them); timed from that write to the arrival of
each of its AppWrappers' status PATCH at the server (the request log's clock).
Throughput: 100 other nodes turn EVICT at once; nodes per second until every
AppWrapper on them is reset. The breaker is off (`max_unhealthy: 100%`) and the
rate limit out of the way, as the goals ask; everything else is the default.
Cost: the controller process's own CPU seconds (getrusage) for the burst, from
the label writes until its last Event is posted, per reset and per node; the
requests the server saw; the controller's RSS, and what its caches add.

Run at 500, 1,000 and 5,000 nodes, with the scaling exponent between the ends
(figure ~ N^k). Goals: p99 <= 1 s at 5,000 nodes; >= 100 nodes/s.

    python bench/label_to_reset.py                     # 500, 1000, 5000 nodes
    python bench/label_to_reset.py --quick             # 200 nodes, fewer faults
    python bench/label_to_reset.py --nodes 500 20000 --emulator both
    python bench/label_to_reset.py --nodes 5000 --profile burst.pstats
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import math
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from common import Goal, main, parser, summary
from prometheus_client import CollectorRegistry
from reset_cluster import (
    OTHER_PODS_PER_NODE,
    PODS_PER_AW,
    WRITTEN_BY,
    Cluster,
    InlineCluster,
    ProcessCluster,
    own_cpu_s,
    owners_on,
    pods,
    rss_mib,
)

from healthd.config import Config
from healthd.controller.controller import Controller
from healthd.controller.evictions import BURST_QUIET_S
from healthd.controller.metrics import ControllerMetrics
from healthd.kube.tally import RequestTally

NAME = "label_to_reset"
THROUGHPUT_NODES = 100
WAIT_S = 600.0
P99_GOAL_S = 1.0
RATE_GOAL = 100.0
# No Event for this long after the last reset: the burst is over (its node Events go
# out BURST_QUIET_S after its last reset).
EVENTS_QUIET_S = BURST_QUIET_S + 0.3
WHERE = ("own-process", "in-process")
REAL = "kube-apiserver"
FIRST_REPORTS_S = 150.0  # kubelet-like reports begin 150 s after a node is Ready


def bench_config() -> Config:
    return Config.model_validate({"controller": {
        "breaker": {"max_unhealthy": "100%"},
        "resets": {"rate_per_minute": 1_000_000, "burst": 100_000},
    }})


# -- measuring ------------------------------------------------------------------------

@asynccontextmanager
async def open_cluster(where: str, n: int, other_pods: int,
                       heartbeat: str) -> AsyncIterator[Cluster]:
    if where == "in-process":
        from healthd.sim.apiserver import ApiEmulator  # only this mode has it here
        async with ApiEmulator() as api:
            yield InlineCluster(api, n)
    elif where == REAL:
        from real_api import serve_real  # only this mode needs the control plane
        async with ProcessCluster(n, serve=serve_real, args=(other_pods, heartbeat),
                                  where=REAL, stop_s=120) as real:
            yield real
    else:
        async with ProcessCluster(n, history_limit=max(1000, n)) as remote:
            yield remote


async def run_scale(n: int, faults: int, burst: int, where: str, profile: Path | None,
                    other_pods: int, idle: Idle) -> dict[str, Any]:
    async with open_cluster(where, n, other_pods, idle.heartbeat) as cluster:
        rss_before = rss_mib()
        kube = await cluster.connect()
        kube.tally = RequestTally()  # the controller's own requests, by kind
        controller = Controller(bench_config(), kube=kube, identity="bench",
                                metrics=ControllerMetrics(CollectorRegistry()))
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(controller.run)
                start, cpu_start = time.monotonic(), own_cpu_s()
                with anyio.fail_after(WAIT_S):
                    while not (controller.term and controller.term.caches.synced):
                        await anyio.sleep(0.01)
                synced_s, sync_cpu_s = time.monotonic() - start, own_cpu_s() - cpu_start
                await anyio.sleep(0.5)  # the first evaluation and lending pass
                memory = cache_memory(controller, rss_before)
                idle_figures = await idle_cpu(cluster, idle)
                before = kube.tally.snapshot()
                latencies = await one_at_a_time(cluster, faults)
                await lending_settled(controller)
                await cluster.events_quiet(EVENTS_QUIET_S, WAIT_S)
                single = kube.tally.since(before)
                throughput = await at_once(cluster, burst, profile, controller, kube.tally)
                group.cancel_scope.cancel()
        finally:
            await kube.close()
    return {"nodes": n, "pods": pods(n, other_pods), "appwrappers": n,
            "api_server": cluster.where, "seed_s": round(cluster.seed_s, 2),
            **{key: value for key, value in getattr(cluster, "ready", {}).items()
               if key in ("settle_s", "control_plane_rss_mib")},
            "controller_sync_s": round(synced_s, 3),
            "controller_sync_cpu_s": round(sync_cpu_s, 3), "memory": memory,
            **idle_figures, "latency_s": summary(latencies),
            "single_fault_requests": single.totals(),
            "writes_per_reset_single_fault": single.per(len(latencies)),
            **throughput}


def cache_memory(controller: Controller, rss_before: float) -> dict[str, Any]:
    """The controller's RSS and what its caches hold, per object kind."""
    assert controller.term is not None
    caches = controller.term.caches
    rss = rss_mib()
    stores = {"nodes": caches.nodes, "pods": caches.pods, "appwrappers": caches.appwrappers}
    kib_each = {kind: round(deep_size(store.values()) / max(len(store), 1) / 1024, 2)
                for kind, store in stores.items()}
    return {"controller_rss_mib": round(rss, 1),
            "rss_added_by_sync_mib": round(rss - rss_before, 1),
            "cached": {kind: len(store) for kind, store in stores.items()},
            "kib_per_cached_object": kib_each}


def deep_size(objects: Any) -> int:
    """Bytes of the JSON-shaped objects (dicts, lists, strings, numbers), each counted
    once however often it is referenced."""
    seen: set[int] = set()
    total = 0
    stack = list(objects)
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list):
            stack.extend(obj)
    return total


@dataclass(frozen=True)
class Idle:
    """How idle CPU is measured: over `seconds`, starting no earlier than `from_s`
    after every node was Ready (the real API server's nodes heartbeating as
    `heartbeat` says: kwok's stage, or a kubelet's Lease and 5-minute reports)."""

    seconds: float
    heartbeat: str = "kwok"
    from_s: float = 0.0
    profile: Path | None = None  # a CPU-time cProfile of the window, written here


async def idle_cpu(cluster: Cluster, idle: Idle) -> dict[str, Any]:
    """% of a core the controller uses with nothing to do (watches open), and the
    Node writes (watch events) the server saw meanwhile."""
    settled_at = getattr(cluster, "ready", {}).get("settled_at")
    if settled_at is not None:
        await anyio.sleep(max(0.0, settled_at + idle.from_s - time.time()))
    counted = await cluster.counts()
    profiler = cProfile.Profile(time.thread_time) if idle.profile else None
    cpu = own_cpu_s()
    if profiler:
        profiler.enable()
    await anyio.sleep(idle.seconds)
    cpu = own_cpu_s() - cpu
    if profiler and idle.profile:
        profiler.disable()
        profiler.dump_stats(idle.profile)
    after = await cluster.counts()
    writes = after.get("node_modified", 0) - counted.get("node_modified", 0)
    by = {key.removeprefix(WRITTEN_BY): round((n - counted.get(key, 0)) / idle.seconds, 1)
          for key, n in after.items() if key.startswith(WRITTEN_BY)}
    return {"idle_cpu_pct_of_core": round(100 * cpu / idle.seconds, 2),
            "idle_s": idle.seconds, "heartbeat": idle.heartbeat,
            "idle_node_writes_per_s": round(writes / idle.seconds, 1),
            "idle_node_writes_per_s_by_writer": {k: v for k, v in by.items() if v},
            "idle_cpu_us_per_node_write": round(1e6 * cpu / writes) if writes else None}


async def one_at_a_time(cluster: Cluster, faults: int) -> list[float]:
    """Latency samples: nodes in the first half, far enough apart that no
    AppWrapper has pods on two of them."""
    stride = max(PODS_PER_AW + 1, (cluster.n // 2) // faults)
    samples: list[float] = []
    for f in range(faults):
        i = f * stride + PODS_PER_AW
        owners = [name for _, name in owners_on(i, cluster.n)]
        at = await cluster.evict([i])
        times = await cluster.reset_times(owners, WAIT_S)
        samples.extend(times[name] - at for name in owners)
        await anyio.sleep(0.05)
    await cluster.events_quiet(EVENTS_QUIET_S, WAIT_S)
    return samples


async def lending_settled(controller: Controller, wait_s: float = WAIT_S) -> float:
    """Wait until every slack queue, as cached, holds the lendingLimit due (so the
    requests of a burst include its last queue write); the epoch time it did."""
    assert controller.term is not None
    caches, writer = controller.term.caches, controller.term.lending
    with anyio.fail_after(wait_s):
        while any(c.changed for name in controller.config.controller.slack_queues
                  if (queue := caches.clusterqueues.get(name)) is not None
                  for c in writer.model.evaluate(queue)):
            await anyio.sleep(0.02)
    return time.time()


async def at_once(cluster: Cluster, count: int, profile: Path | None,
                  controller: Controller, tally: RequestTally) -> dict[str, Any]:
    """`count` nodes of the second half turn EVICT at once: nodes per second, and
    what the burst cost the controller and the server."""
    first = cluster.n // 2 + PODS_PER_AW
    stride = max(1, (cluster.n - first) // count)
    indexes = [first + k * stride for k in range(count)]
    owners = sorted({name for i in indexes for _, name in owners_on(i, cluster.n)})
    served_before = await cluster.served()  # outside the CPU window: /metrics costs
    requests_before, server_before = await cluster.counts(), await cluster.server_usage()
    sent_before = tally.snapshot()
    # CPU time, not wall time: other processes on the machine must not show up in it.
    profiler = cProfile.Profile(time.thread_time) if profile else None
    cpu_before = own_cpu_s()
    if profiler:
        profiler.enable()
    with GcTime() as collecting:
        at = await cluster.evict(indexes)
        times = await cluster.reset_times(owners, WAIT_S)
        lent = await lending_settled(controller)
        last_event = await cluster.events_quiet(EVENTS_QUIET_S, WAIT_S)
    cpu = own_cpu_s() - cpu_before
    sent = tally.since(sent_before)
    if profiler and profile:
        profiler.disable()
        profiler.dump_stats(profile)
    took = max(max(times.values()) - at, 1e-6)
    requests = _difference(await cluster.counts(), requests_before)
    server_after = await cluster.server_usage()
    served = _difference(await cluster.served(), served_before)
    server_cpu = None if server_before is None or server_after is None else \
        round(server_after["cpu_s"] - server_before["cpu_s"], 3)
    return {"burst_nodes": count, "burst_all_reset_s": round(took, 3),
            "burst_appwrappers_reset": len(owners), "nodes_per_s": round(count / took, 1),
            "appwrapper_resets_per_s": round(len(owners) / took, 1),
            "burst_last_event_s": round(last_event - at, 3),
            "burst_lending_settled_s": round(lent - at, 3),
            "burst_requests": requests,
            "burst_controller_requests": sent.totals(),
            "writes_per_reset_burst": sent.per(len(owners)),
            "burst_server_served": {k: round(v, 1) for k, v in served.items()},
            "server_cpu_ms_per_reset": None if server_cpu is None else
            round(1000 * server_cpu / len(owners), 3),
            "controller_cpu_s": round(cpu, 3),
            "controller_cpu_ms_per_reset": round(1000 * cpu / len(owners), 3),
            "controller_cpu_ms_per_node": round(1000 * cpu / count, 3),
            "controller_gc_s": round(collecting.seconds, 3),
            "server_cpu_s": server_cpu,
            "server_rss_mib": None if server_after is None else round(server_after["rss_mib"], 1)}


class GcTime:
    """CPU seconds the controller's thread spends in the cyclic garbage collector
    (gc.callbacks)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0

    def __enter__(self) -> GcTime:
        gc.callbacks.append(self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._note)

    def _note(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            self.seconds += time.thread_time() - self._started


def _difference(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {key: after[key] - before.get(key, 0) for key in sorted(after)
            if after[key] != before.get(key, 0)}


def exponent(rows: list[dict[str, Any]], key: str) -> float | None:
    """k in figure ~ N^k between the smallest and largest run."""
    a, b = rows[0], rows[-1]
    va, vb = _get(a, key), _get(b, key)
    if va is None or vb is None or va <= 0 or vb <= 0 or a["nodes"] == b["nodes"]:
        return None
    return round(math.log(vb / va) / math.log(b["nodes"] / a["nodes"]), 3)


def _get(row: dict[str, Any], key: str) -> float | None:
    value: Any = row
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value if isinstance(value, (int, float)) else None


SCALED = ("latency_s.p50", "latency_s.p99", "controller_sync_s", "nodes_per_s",
          "controller_cpu_ms_per_reset", "memory.controller_rss_mib",
          "memory.rss_added_by_sync_mib")
PROJECT_TO = 50_000


def scaling(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The exponents between the smallest and largest size, and each figure projected
    to PROJECT_TO nodes along its exponent."""
    exponents = {key: exponent(rows, key) for key in SCALED}
    largest = rows[-1]
    projected: dict[str, float | None] = {}
    for key, k in exponents.items():
        value = _get(largest, key)
        projected[key] = None if k is None or value is None else \
            round(value * (PROJECT_TO / largest["nodes"]) ** k, 3)
    return {"scaling_exponent": exponents, f"projected_to_{PROJECT_TO}_nodes": projected}


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Goal], list[str]]:
    real = args.api == "real"
    default_sizes = ([200] if args.quick else [500, 1000]) if real else \
        ([200] if args.quick else [500, 1000, 5000])
    sizes = sorted(args.nodes or default_sizes)
    faults, burst = (5, 20) if args.quick else (25, THROUGHPUT_NODES)
    faults, burst = args.faults or faults, args.burst or burst
    smallest = 2 * (burst + faults * (PODS_PER_AW + 1))
    if min(sizes) < smallest:
        raise ValueError(f"--nodes must be at least {smallest} (got {min(sizes)}): the "
                         "faults and the burst need nodes that share no AppWrapper")
    modes = (REAL,) if real else WHERE if args.emulator == "both" else (args.emulator,)
    other_pods = OTHER_PODS_PER_NODE if args.pods_per_node is None else \
        args.pods_per_node - PODS_PER_AW
    from_s = args.idle_from_s if args.idle_from_s is not None else \
        FIRST_REPORTS_S if real and args.heartbeat == "lease" else 0.0
    idle = Idle(args.idle_s, args.heartbeat if real else "none", from_s, args.idle_profile)
    figures: dict[str, Any] = {}
    for where in modes:
        rows = []
        for n in sizes:
            profile = args.profile if n == sizes[-1] and where == modes[0] else None
            rows.append(anyio.run(run_scale, n, faults, burst, where, profile, other_pods,
                                  idle))
            gc.collect()  # the next size starts from a clean heap
        key = "scales" if where == modes[0] else f"scales_{where.replace('-', '_')}"
        figures[key] = rows
        if where == modes[0]:
            figures.update(scaling(rows))
    largest = figures["scales"][-1]
    goals = {"latency_p99_s_at_largest": Goal(largest["latency_s"]["p99"], P99_GOAL_S),
             "nodes_per_s_at_largest": Goal(largest["nodes_per_s"], RATE_GOAL, ">=")}
    return figures, goals, [
        f"{faults} single-node faults x {PODS_PER_AW} AppWrappers each, then {burst} nodes "
        "at once; breaker off, rate limit raised, other settings default (settle 0.1 s)",
        *(REAL_NOTES if real else ()),
        "own-process: the emulator serves from a process of its own; controller CPU is "
        "this process's getrusage over the burst (label writes to the last Event, plus "
        f"{EVENTS_QUIET_S} s of quiet); in-process: the emulator shares this process and "
        "event loop, so every request is also served by the core that decides",
    ]


REAL_NOTES = (
    "kube-apiserver: the real control plane of tests/realcluster (etcd, kube-apiserver, "
    "controller-manager, scheduler, kwok running every node and pod) with Kueue's and the "
    "operator's CRDs but neither program; the label writes, the watches that time the "
    "resets and the seeding run in a process of their own; a reset is timed when the "
    "watch event showing phase Resetting arrives there (the server keeps no request "
    "log), so burst_requests counts watch events, not requests; server_cpu_s and "
    "server_rss_mib are kube-apiserver's and etcd's together (/proc); the controller "
    "runs here with admin credentials",
)


if __name__ == "__main__":
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument("--nodes", type=int, nargs="+", help="cluster sizes (default 500 1000 5000)")
    cli.add_argument("--emulator", choices=(*WHERE, "both"), default="own-process",
                     help="where the API emulator runs (default: %(default)s)")
    cli.add_argument("--api", choices=("emulator", "real"), default="emulator",
                     help="the API emulator (default), or the real control plane of "
                          "tests/realcluster (default sizes 500 1000; needs Go or its "
                          "cached build)")
    cli.add_argument("--pods-per-node", type=int,
                     help=f"pods per node, {PODS_PER_AW} of them AppWrapper pods (default "
                          f"{PODS_PER_AW + OTHER_PODS_PER_NODE})")
    cli.add_argument("--faults", type=int, help="single-node faults (default 25, --quick 5)")
    cli.add_argument("--burst", type=int,
                     help=f"nodes EVICT at once (default {THROUGHPUT_NODES}, --quick 20)")
    cli.add_argument("--idle-s", type=float, default=1.0,
                     help="seconds over which idle CPU is measured (default %(default)s; "
                          "kwok's heartbeats need 10 or more to average out)")
    cli.add_argument("--heartbeat", choices=("kwok", "lease"), default="kwok",
                     help="how the real API server's nodes keep alive: kwok's stage (the "
                          "status every 20-45 s) or a kubelet's (a Lease, the status "
                          "every 5 minutes); default %(default)s")
    cli.add_argument("--idle-from-s", type=float,
                     help="start the idle window this long after every node is Ready "
                          f"(default {FIRST_REPORTS_S:.0f} with --heartbeat lease, when "
                          "the first status reports come, else 0)")
    cli.add_argument("--profile", type=Path,
                     help="write a cProfile of the controller during the largest burst here")
    cli.add_argument("--idle-profile", type=Path,
                     help="write a cProfile of the controller during the idle window here "
                          "(the last size's)")
    sys.exit(main(NAME, measure, cli.parse_args()))
