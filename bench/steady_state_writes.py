"""steady_state_writes: what healthy agents cost the API server at rest.

Several real agents run in this process, each publishing its own Node, all on one
simulated healthy machine (`healthy-8xh100`; the fake NVML is per process, and a
healthy machine is the same for every node), against the API emulator over HTTP.
Their NVML round runs every ROUND_S (the default is 30 s) so a short run covers
many rounds; the other checks keep their defaults. Once every Node carries its
first verdict the request log is cleared, and everything after is steady state:

- writes (POST/PUT/PATCH/DELETE), per node per hour and per round (goal 0);
- reads by kind: watch requests (`watch=true`; a re-watch after the server's
  timeout counts too) against plain GETs and lists, which would mean polling
  (goal: no lists).

    python bench/steady_state_writes.py            # 8 agents, 60 s
    python bench/steady_state_writes.py --quick    # 2 agents, 6 s
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
from common import Goal, main, parser
from prometheus_client import CollectorRegistry

from healthd.agent.agent import Agent
from healthd.config import Config
from healthd.kube.conventions import Keys
from healthd.sim.apiserver import ApiEmulator, RecordedRequest
from healthd.sim.node import simulate

NAME = "steady_state_writes"
ROUND_S = 0.2
NVML_CHECKS = ("gpus", "remapped", "power", "pcie", "ecc", "nvlink", "xid")
READY_WAIT_S = 60.0
KEYS = Keys()


def bench_config() -> Config:
    checks = {name: {"interval": ROUND_S} for name in NVML_CHECKS}
    return Config.model_validate({"checks": checks, "agent": {"xid_window_s": 0.05}})


def node_name(i: int) -> str:
    return f"bench-node-{i}"


def agent_pod(i: int) -> dict[str, Any]:
    """The DaemonSet's pod on node i, as in a cluster: the agent finds its own at start."""
    ip = f"10.0.0.{i + 1}"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"healthd-agent-{i}", "namespace": "healthd-system",
                         "labels": {"app.kubernetes.io/name": "healthd-agent"}},
            "spec": {"nodeName": node_name(i), "containers": [{"name": "agent", "image": "i"}]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}


def classify(request: RecordedRequest) -> str:
    """write, watch, list (a collection GET) or get (one object)."""
    if request.is_write:
        return "write"
    if request.query.get("watch") in ("true", "1", "True"):
        return "watch"
    return "get" if _names_one_object(request.path) else "list"


def _names_one_object(path: str) -> bool:
    """/api/v1/nodes/x or /apis/g/v/namespaces/ns/kind/x (not a collection)."""
    parts = [p for p in path.split("/") if p]
    core = parts[:2] == ["api", "v1"]
    rest = parts[2:] if core else parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        rest = rest[2:]
    return len(rest) >= 2


async def published(api: ApiEmulator, nodes: int) -> None:
    """Until every Node carries a verdict label."""
    with anyio.fail_after(READY_WAIT_S):
        while not all(((api.get("Node", node_name(i)) or {}).get("metadata") or {})
                      .get("labels", {}).get(KEYS.gpuhealth) for i in range(nodes)):
            await anyio.sleep(0.05)


async def run(nodes: int,
              seconds: float) -> tuple[list[RecordedRequest], list[RecordedRequest], float, int]:
    """The start-up and steady-state request logs, how long the latter covers, and
    rounds per agent."""
    with tempfile.TemporaryDirectory() as tmp, simulate("healthy-8xh100") as sim:
        async with ApiEmulator() as api:
            for i in range(nodes):
                api.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node_name(i)},
                          "status": {"capacity": {"nvidia.com/gpu": "8"}}},
                         agent_pod(i))
            kubeconfig = str(api.write_kubeconfig(Path(tmp) / "kubeconfig"))
            agents = [Agent(sim.adapt(bench_config()), node=node_name(i), kubeconfig=kubeconfig,
                            probes=sim.probes(), http_port=0,
                            registry=CollectorRegistry()) for i in range(nodes)]
            async with anyio.create_task_group() as group:
                for agent in agents:
                    group.start_soon(agent.run)
                await published(api, nodes)
                await anyio.sleep(2 * ROUND_S)  # let the first round's last writes land
                startup = api.requests
                api.clear_log()
                start = time.monotonic()
                await anyio.sleep(seconds)
                requests, covered = api.requests, time.monotonic() - start
                rounds = int(agents[0].registry.get_sample_value(
                    "healthd_check_runs_total",
                    {"node": node_name(0), "check": "remapped", "result": "PASS"}) or 0)
                for agent in agents:
                    agent.stop()
    return startup, requests, covered, rounds


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Goal], list[str]]:
    nodes, seconds = (2, 6.0) if args.quick else (8, 60.0)
    startup, requests, covered, rounds = anyio.run(run, nodes, seconds)
    kinds = Counter(classify(r) for r in requests)
    hours = covered / 3600
    writes = kinds.get("write", 0)
    figures: dict[str, Any] = {
        "agents": nodes,
        "steady_seconds": round(covered, 2),
        "nvml_rounds_per_agent": rounds,
        "round_interval_s": ROUND_S,
        "startup_requests_by_kind": dict(Counter(classify(r) for r in startup)),
        "requests_by_kind": dict(kinds),
        "writes_per_node_per_hour": round(writes / nodes / hours, 3),
        "writes_per_node_per_round": round(writes / nodes / max(rounds, 1), 6),
        "lists_per_node_per_hour": round(kinds.get("list", 0) / nodes / hours, 3),
        "gets_per_node_per_hour": round(kinds.get("get", 0) / nodes / hours, 3),
        "write_paths": sorted({f"{r.method} {r.path}" for r in requests if r.is_write}),
        "non_watch_read_paths": sorted({f"{r.method} {r.path}" for r in requests
                                        if classify(r) in ("list", "get")}),
    }
    goals = {
        "writes_per_node_per_hour": Goal(figures["writes_per_node_per_hour"], 0.0),
        "lists_per_node_per_hour": Goal(figures["lists_per_node_per_hour"], 0.0),
    }
    return figures, goals, [
        f"{nodes} agents, NVML round every {ROUND_S:g} s (default 30 s), other checks at "
        f"their defaults; {covered:.0f} s of steady state after every first verdict",
    ]


if __name__ == "__main__":
    sys.exit(main(NAME, measure, parser(__doc__.splitlines()[0]).parse_args()))
