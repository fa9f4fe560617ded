"""peer_load: what ping's peers cost, now that the controller publishes bounded peer
sets on the Nodes instead of every agent watching every agent pod.

The real controller (leader, caches, healthd.controller.peering) runs against the API
emulator over HTTP with N GPU nodes, each with an agent pod (half of them also on a
secondary network, net1, as Multus says). Measured:

- the controller's first publication: Node writes (one per node);
- steady state: Node writes while nothing changes (goal 0);
- a DaemonSet rollout (every agent pod replaced by one with a new address, at once):
  the agent pod events the controller's one watch receives, and the peer-set writes,
  each of which is one event on one agent's own Node watch (the only watch an agent
  has); then a few pods replaced one at a time, each settled before the next: the
  writes one replaced pod costs when nothing coalesces them;
- ping's load: the real `ping` check run once for every node on the peers published
  on its Node, with a prober that counts echoes instead of sending them: echoes per
  round and per second (ping every 300 s), and the most peers one agent probes.

Computed beside them, for the design before (each agent watches every agent pod and
pings every other node) and now, at N and at 10,000 nodes, with the formulas in
`formulas` (W networks, c = 3 echoes per address, T = 300 s, k = 16 peers, e = the
pod events per replaced agent pod, measured).

    python bench/peer_load.py            # 200 nodes
    python bench/peer_load.py --quick    # 30 nodes
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import anyio
from common import Goal, main, parser
from prometheus_client import CollectorRegistry

from checks.base import CheckContext, run_check
from checks.catalog import Catalog
from checks.ping import PingCheck
from checks.probes import Echo, Probes
from healthd.blame.peersets import PeerSet, decode
from healthd.config import Config
from healthd.controller.controller import Controller
from healthd.controller.metrics import ControllerMetrics
from healthd.kube.client import Kube
from healthd.kube.conventions import Keys
from healthd.sim.apiserver import ApiEmulator

NAME = "peer_load"
KEYS = Keys()
AGENTS = "healthd-system"
LABEL = {"app.kubernetes.io/name": "healthd-agent"}
PING_INTERVAL_S = 300.0
ECHOES = 3  # ping's default count per address
LARGE = 10_000
SETTLE_S = 2.5
SLOW_PODS = 4  # replaced one at a time, settled in between


def gpu_node(name: str) -> dict[str, Any]:
    capacity = {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {}, "annotations": {}},
            "spec": {}, "status": {"capacity": capacity, "allocatable": capacity}}


def agent_pod(i: int, node: str, generation: int) -> dict[str, Any]:
    ip = f"10.{generation}.{i // 250}.{i % 250 + 1}"
    annotations = {}
    if i % 2 == 0:
        annotations["k8s.v1.cni.cncf.io/network-status"] = json.dumps([
            {"name": "pod", "interface": "eth0", "ips": [ip], "default": True},
            {"name": "healthd-system/net1", "interface": "net1",
             "ips": [f"192.{generation}.{i // 250}.{i % 250 + 1}"]}])
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"healthd-agent-{generation}-{i}", "namespace": AGENTS,
                         "labels": LABEL, "annotations": annotations,
                         "creationTimestamp": f"2026-11-26T0{generation}:00:00Z"},
            "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "i"}]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}


class CountingProber:
    """Counts the echoes ping would send; every one comes back."""

    def __init__(self) -> None:
        self.sent = 0

    async def probe(self, address: str, *, count: int, interval_s: float,
                    timeout_s: float) -> Echo:
        self.sent += count
        return Echo(address, count, (0.2,) * count)


def peer_writes(api: ApiEmulator) -> int:
    return sum(1 for r in api.writes(path=r"/api/v1/nodes/[^/]+")
               if KEYS.peers in json.dumps(r.body or {}))


def published(api: ApiEmulator, nodes: list[str]) -> dict[str, PeerSet]:
    out = {}
    for name in nodes:
        raw = ((api.get("Node", name) or {}).get("metadata", {}).get("annotations") or {}).get(
            KEYS.peers)
        if raw is not None:
            out[name] = decode(raw)
    return out


async def until(condition: Any, within: float) -> None:
    with anyio.fail_after(within):
        while not condition():
            await anyio.sleep(0.05)


async def ping_round(sets: dict[str, PeerSet]) -> tuple[int, int]:
    """(echoes one round of every node's ping sends, most peers one node probes)."""
    prober = CountingProber()
    most = 0
    for name, peer_set in sets.items():
        ctx = CheckContext(catalog=Catalog(), node_name=name, peers=peer_set.peers)
        await run_check(PingCheck({}, probes=Probes(ping=prober)), ctx)
        most = max(most, len(peer_set.probed()), len(peer_set.probed("net1")))
    return prober.sent, most


async def measure_fleet(count: int) -> dict[str, Any]:
    nodes = [f"gpu-{i:05d}" for i in range(count)]
    async with ApiEmulator() as api:
        api.seed(*[gpu_node(n) for n in nodes], *[agent_pod(i, n, 1) for i, n in enumerate(nodes)])
        kube = Kube(api.async_client(user="healthd-controller"), timeout_s=10)
        config = Config.model_validate({})
        controller = Controller(config, kube=kube, identity="bench",
                                metrics=ControllerMetrics(CollectorRegistry()))
        events = 0
        async with anyio.create_task_group() as group:
            group.start_soon(controller.run)
            started = time.monotonic()
            await until(lambda: len(published(api, nodes)) == count, 120)
            first_s = time.monotonic() - started
            term = controller.term
            assert term is not None
            apply = term.peering.pods.apply

            def counted(event: Any) -> bool:
                nonlocal events
                events += 1
                return apply(event)
            term.peering.pods.apply = counted  # type: ignore[method-assign]
            await anyio.sleep(SETTLE_S)
            first_writes = peer_writes(api)
            api.clear_log()
            await anyio.sleep(SETTLE_S)
            steady_writes = peer_writes(api)
            sets = published(api, nodes)
            echoes, most = await ping_round(sets)

            api.clear_log()
            rolled = time.monotonic()
            for i, node in enumerate(nodes):  # the DaemonSet's rolling update
                api.remove("Pod", f"healthd-agent-1-{i}", AGENTS)
                api.seed(agent_pod(i, node, 2))
            await until(lambda: all(p.addresses[0].startswith("10.2.")
                                    for s in published(api, nodes).values()
                                    for p in s.peers if p.addresses), 300)
            await anyio.sleep(SETTLE_S)
            rollout_s = time.monotonic() - rolled
            rollout_writes, rollout_events = peer_writes(api), events

            # One pod at a time, each change settled before the next: the most a
            # replaced pod costs (its own node's set, and each set that names it).
            api.clear_log()
            for i in range(SLOW_PODS):
                api.remove("Pod", f"healthd-agent-2-{i}", AGENTS)
                api.seed(agent_pod(i, nodes[i], 3))
                await anyio.sleep(SETTLE_S)
            slow_writes = peer_writes(api) / SLOW_PODS
            group.cancel_scope.cancel()
        await kube.close()
    return {"nodes": count, "first_publication_writes": first_writes,
            "first_publication_s": round(first_s, 2),
            "steady_state_writes": steady_writes, "ping_echoes_per_round": echoes,
            "most_peers_per_network": most, "rollout_pod_events_at_controller": rollout_events,
            "rollout_peer_writes": rollout_writes, "rollout_s": round(rollout_s, 1),
            "one_pod_replaced_peer_writes": round(slow_writes, 1)}


def formulas(n: int, k: int, networks: float, events_per_pod: float) -> dict[str, float]:
    """Before (every agent watches every agent pod, pings every other node) and now."""
    return {
        "before_rollout_pod_events_delivered": n * events_per_pod * n,
        "now_rollout_events_delivered_at_most": events_per_pod * n + (k * networks + 1) * n,
        "before_echoes_per_s": n * (n - 1) * networks * ECHOES / PING_INTERVAL_S,
        "now_echoes_per_s": n * min(k, n - 1) * networks * ECHOES / PING_INTERVAL_S,
        "now_rotation_writes_per_hour": n,
    }


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Goal], list[str]]:
    count = 30 if args.quick else args.nodes
    fleet = anyio.run(measure_fleet, count)
    networks = 1.5  # the pod network everywhere, net1 on half the nodes
    per_pod = fleet["rollout_pod_events_at_controller"] / count
    measured_per_s = fleet["ping_echoes_per_round"] / PING_INTERVAL_S
    figures = {
        "measured": {**fleet, "ping_echoes_per_s": round(measured_per_s, 2),
                     "pod_events_per_replaced_pod": round(per_pod, 2)},
        "computed_at_n": formulas(count, 16, networks, per_pod),
        "computed_at_10000": formulas(LARGE, 16, 2, per_pod),
        "formulas": {
            "before_rollout_pod_events_delivered": "N * e * N (N watchers, e*N events each)",
            "now_rollout_events_delivered_at_most": "e * N (the controller's one watch) + "
                                                    "(k * W + 1) * N (peer-set writes, each "
                                                    "one event on one agent's own Node "
                                                    "watch; a fast rollout coalesces them "
                                                    "to about N)",
            "before_echoes_per_s": "N * (N - 1) * W * c / T",
            "now_echoes_per_s": "N * k * W * c / T",
        },
    }
    goals = {
        "steady_state_writes": Goal(fleet["steady_state_writes"], 0),
        "most_peers_per_network": Goal(fleet["most_peers_per_network"], 16),
    }
    notes = [f"{count} nodes on the API emulator; net1 on every other node; ping's defaults "
             f"(3 echoes per address, every {PING_INTERVAL_S:.0f} s)"]
    return figures, goals, notes


if __name__ == "__main__":
    cli = parser(__doc__ or NAME)
    cli.add_argument("--nodes", type=int, default=200, help="GPU nodes (default 200)")
    sys.exit(main(NAME, measure, cli.parse_args()))
