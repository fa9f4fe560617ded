"""A fleet of GPU nodes held in the states healthd has judged, one node per kind of
evidence, for tests that replace healthd's processes under it (a rollout, a Helm
upgrade) and check that nobody can tell from the cluster.

Each `Held` node reaches its state the way a real node does: a fault its machine keeps
showing (from its start: a remap failure, a fabric registration failed, a slow RDMA
port, a hardware slowdown, a failing DCGM diagnostic; or from a moment while the agent
runs: an RDMA port going down), or evidence that comes once (an XID that NVML reports
live, an XID or a fatal SXID the driver writes to the kernel log) and that no later
agent will see again.
`watching` records everything the cluster shows meanwhile; `assert_nothing_moved` says
what moved: a label or condition that changed (even for a moment), a write to healthd's
keys on a Node, a move of the slack queue's lendingLimit, an Event about the nodes or
the queue.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any

from healthd.sim.dcgm import DcgmSim
from healthd.sim.machine import (
    FabricFault,
    FabricSpec,
    GpuFault,
    MachineSpec,
    RdmaPortSpec,
    RdmaSpec,
    RemappedRowsFault,
    load_machine_spec,
)
from tests.deploy.manifests import kubectl
from tests.e2e.healthd import GPU_NODE_LABEL, NAMESPACE, Healthd, eventually
from tests.e2e.kubelet import Container, Kubelet, Machine, agents_replaced
from tests.e2e.mlbatch import KUEUE, SLACK, tutorial
from tests.e2e.recorders import (
    EventLog,
    Recorder,
    condition,
    lending_limit,
    published,
    verdict,
)

Obj = dict[str, Any]
GPUS = 8  # per node
WITHHELD = ("ERR", "EVICT")  # verdicts whose GPUs the slack queue may not lend

# GPU 5 of a simulated 8-GPU machine sits on bus 0x68; NVSwitch 2 on 0x8a.
XID79_GPU5 = ("NVRM: Xid (PCI:0000:68:00): 79, pid='<unknown>', name=<unknown>, "
              "GPU has fallen off the bus.")
FATAL_SXID = ("nvidia-nvswitch2: SXid (PCI:0000:8a:00.0): 12020, Fatal, "
              "Link 46 egress sequence ID error")

# The test clocks (over tests.e2e.healthd.TEST_CONFIG, which the harness's agents
# use): the fleet's other checks quick too, DCGM's periodic diagnostic on (hourly, as
# shipped: it runs at start), and no breaker: the fleet is bad on purpose.
FLEET_CONFIG: Obj = {
    "checks": {"fabric": {"interval": "2s"}, "sxid": {"interval": "2s"},
               "rdma": {"interval": "2s"}, "dcgm": {"enabled": True, "interval": "1h"}},
    "controller": {"breaker": {"max_unhealthy": "100%"}},
}
# Checks that run every few seconds: a new agent whose every one of these has run
# SETTLED_RUNS times is past its first rounds (where a restart's mistakes show).
QUICK_CHECKS = ("gpus", "remapped", "power", "pcie", "ecc", "nvlink", "fabric", "xid", "sxid",
                "rdma")
SETTLED_RUNS = 3
REPLACED_S = 300  # every agent of the fleet replaced and settled, on a busy machine


def hgx(**changes: Any) -> MachineSpec:
    """A healthy HGX H100 node (NVSwitch fabric, eight RoCE NICs) with `changes`."""
    base = load_machine_spec("healthy-8xh100")
    return base.model_copy(update={"fabric": FabricSpec(), **changes})


def _gpu_fault(**fault: Any) -> MachineSpec:
    return hgx(faults=[GpuFault(**fault)])


def _rdma_port(**port: Any) -> MachineSpec:
    return hgx(rdma=RdmaSpec(devices=8, ports=[RdmaPortSpec(device="mlx5_3", **port)]))


@dataclass(frozen=True)
class Held:
    """A node that healthd holds in `verdict` because of `code`."""

    name: str  # names the node, e.g. "xid-nvml"
    verdict: str
    code: str | None  # None: a healthy node
    spec: MachineSpec
    evidence: Callable[[Machine], None] | None = None  # what happens while the agent runs


XID_NVML = Held("xid-nvml", "EVICT", "XID_79", hgx(), partial(Machine.emit_xid, gpu=2, code=79))
XID_LOG = Held("xid-log", "EVICT", "XID_79", hgx(), partial(Machine.log, message=XID79_GPU5))
SXID_LOG = Held("sxid-log", "EVICT", "SXID_12020", hgx(),
                partial(Machine.log, message=FATAL_SXID))
DCGM = Held("dcgm", "EVICT", "DCGM_PCIE", hgx(dcgm=DcgmSim(output="v4-fail-pcie")))
REMAP = Held("remap", "EVICT", "REMAP_FAILURE", _gpu_fault(
    gpu=2, remapped_rows=RemappedRowsFault(uncorrectable=8, failure=True)))
FABRIC = Held("fabric", "ERR", "FABRIC_REGISTRATION_FAILED",
              _gpu_fault(gpu=1, fabric=FabricFault(status="UNKNOWN")))
RDMA_DOWN = Held("rdma-down", "ERR", "RDMA_PORT_DOWN", hgx(),
                 partial(Machine.rdma_port, device="mlx5_3", state="DOWN",
                         phys_state="Disabled"))
RDMA_SLOW = Held("rdma-slow", "WARN", "RDMA_RATE_LOW", _rdma_port(rate_gbps=200))
SLOWDOWN = Held("slowdown", "WARN", "HW_SLOWDOWN",
                _gpu_fault(gpu=1, clock_event_reasons=["hw_slowdown"]))
HEALTHY = Held("healthy", "PASS", None, hgx())


def slack_quota(held: Sequence[Held]) -> int:
    """The slack queue's nominal GPUs: what the held nodes withhold, and one node's
    more, so that one node turning PASS (or ERR) moves the lendingLimit."""
    return GPUS * (sum(h.verdict in WITHHELD for h in held) + 1)


def held_codes(node: Obj) -> set[str]:
    """The codes holding the verdict, from the `healthd.io/health` annotation."""
    text = (node["metadata"].get("annotations") or {}).get("healthd.io/health")
    return {h["code"] for h in json.loads(text).get("held", [])} if text else set()


class Fleet:
    """Nodes for `held`, the Kubelet running healthd on them (see kubelet.py)."""

    def __init__(self, healthd: Healthd, kubelet: Kubelet, nodes: dict[str, Held]) -> None:
        self.healthd, self.kubelet, self.nodes = healthd, kubelet, nodes

    def node_of(self, held: Held) -> str:
        return next(n for n, h in self.nodes.items() if h is held)

    def shows(self, node: str) -> str | None:
        """Why `node` does not show what it is held in (None: it does)."""
        held, obj = self.nodes[node], self.healthd.node(node)
        label = (obj["metadata"].get("labels") or {}).get("autopilot.ibm.com/gpuhealth")
        if label != held.verdict:
            return f"{held.name}: label {label}, expected {held.verdict}"
        if held.code is not None and held.code not in held_codes(obj):
            return f"{held.name}: {held.code} is not among the held {sorted(held_codes(obj))}"
        return None

    def holds(self) -> list[str]:
        """What differs from the states the fleet was brought to (empty: nothing)."""
        return [problem for node in self.nodes if (problem := self.shows(node))]

    def lending(self) -> str:
        """The lendingLimit the held states call for."""
        return str(GPUS)

    def agents(self) -> dict[str, Container]:
        """node -> the agent process running there (every node has one)."""
        def running() -> dict[str, Container] | None:
            agents = self.kubelet.agents()
            if all(n in agents and agents[n].program.running() for n in self.nodes):
                return {node: agents[node] for node in self.nodes}
            return None
        found: dict[str, Container] = eventually(running, 90, "an agent running on every node")
        return found


@contextlib.contextmanager
def held_fleet(healthd: Healthd, held: Sequence[Held], root: Path, *,
               config: Obj | None = None) -> Iterator[Fleet]:
    """The nodes, their queues and healthd running on them, each node brought to its
    state; stopped at the end (the nodes are the Healthd's to remove)."""
    suffix = uuid.uuid4().hex[:4]
    nodes = {f"{h.name}-{suffix}": h for h in held}
    healthd.applier.apply(tutorial(slack_gpus=slack_quota(held)))
    healthd.add_nodes(*nodes)
    machines = {node: Machine(node, h.spec, root / node) for node, h in nodes.items()}
    with Kubelet(healthd, machines, root / "kubelet",
                 config={} if config is None else config) as kubelet:
        fleet = Fleet(healthd, kubelet, nodes)
        for node, h in nodes.items():
            kubelet.agent(node)
            eventually(lambda n=node: healthd.label(n), 90,  # type: ignore[misc]
                       f"a first verdict on {h.name}")
            if h.evidence is not None:
                h.evidence(machines[node])
        eventually(lambda: not fleet.holds(), 120, "every node in its state",
                   poll_s=1.0)
        eventually(lambda: _slack_limit(healthd) == fleet.lending(), 60,
                   f"lendingLimit {fleet.lending()}")
        # The controller-manager's node controller sends its own Event about a new
        # node within its monitor period (5 s); it must not land while watching.
        eventually(lambda: _registered(healthd) >= set(nodes), 60,
                   "every node registered by the controller-manager")
        yield fleet


def _registered(healthd: Healthd) -> set[str]:
    """The nodes the controller-manager's node controller has sent RegisteredNode for."""
    return {e.involved_object.name for e in healthd.core.list_event_for_all_namespaces(
        field_selector="involvedObject.kind=Node,reason=RegisteredNode").items}


def _slack_limit(healthd: Healthd) -> str | None:
    group, version = KUEUE
    return lending_limit(healthd.custom.get_cluster_custom_object(
        group, version, "clusterqueues", SLACK))


class Watching:
    """What the cluster showed about a fleet from `watching` on (see the module
    docstring)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        healthd = fleet.healthd
        group, version = KUEUE
        self.nodes = Recorder(healthd.client, healthd.core.list_node, published,
                              names=fleet.nodes, label_selector=f"{GPU_NODE_LABEL}=true")
        self.queue = Recorder(healthd.client, partial(
            healthd.custom.list_cluster_custom_object, group, version, "clusterqueues"),
            lending_limit, names=[SLACK], field_selector=f"metadata.name={SLACK}")
        self.events = EventLog(healthd.core, fleet.nodes, [SLACK])
        self.sent: list[str] = []

    def stop(self) -> None:
        healthd = self.fleet.healthd
        self.nodes.stop({n: published(healthd.node(n)) for n in self.fleet.nodes})
        self.queue.stop({SLACK: _slack_limit(healthd)})
        self.sent = self.events.sent()

    def moved(self) -> list[str]:
        """Everything that moved, in words (empty: nothing did)."""
        out = []
        for node, held in self.fleet.nodes.items():
            shown = self.nodes.values(node)
            labels = _runs([verdict(s) for s in shown])
            if len(labels) > 1:
                out.append(f"{held.name}: label {' -> '.join(map(str, labels))}")
            conditions = _runs([condition(s) for s in shown])
            if len(conditions) > 1:
                out.append(f"{held.name}: GPUUnhealthy {' -> '.join(map(str, conditions))}")
            if len(shown) > 1:
                out.append(f"{held.name}: {len(shown) - 1} writes to healthd's keys "
                           f"({', '.join(_changed_keys(shown))})")
        limits = self.queue.values(SLACK)
        if len(limits) > 1:
            out.append(f"slack lendingLimit {' -> '.join(map(str, limits))}")
        out += [f"Event sent: {text}" for text in self.sent]
        return out


@contextlib.contextmanager
def watching(fleet: Fleet) -> Iterator[Watching]:
    seen = Watching(fleet)
    try:
        yield seen
    finally:
        seen.stop()


def assert_nothing_moved(seen: Watching, what: str) -> None:
    moved = seen.moved()
    assert not moved, f"{what} moved what the cluster shows:\n  " + "\n  ".join(moved)


def rollout_restart(fleet: Fleet, *, times: int = 1) -> None:
    """`kubectl rollout restart daemonset/healthd-agent`, `times` in a row, each time
    until every agent of the fleet runs again as a new process of a new Pod and has
    its first rounds behind it."""
    for _ in range(times):
        before = fleet.agents()
        proc = subprocess.run([kubectl(), "--kubeconfig", str(fleet.healthd.kubeconfig),
                               "rollout", "restart", "daemonset/healthd-agent",
                               "-n", NAMESPACE], capture_output=True, text=True, timeout=60,
                              check=False)
        assert proc.returncode == 0, proc.stderr
        agents_replaced(fleet.kubelet, before, QUICK_CHECKS, SETTLED_RUNS, REPLACED_S)


def _runs(values: list[Any]) -> list[Any]:
    """`values` without consecutive repeats."""
    return [v for i, v in enumerate(values) if i == 0 or values[i - 1] != v]


def _changed_keys(shown: list[Obj]) -> list[str]:
    """Which of healthd's keys changed between consecutive published values."""
    keys: list[str] = []
    for old, new in pairwise(shown):
        for part in ("labels", "annotations"):
            for key in sorted(set(old[part]) | set(new[part])):
                if old[part].get(key) != new[part].get(key) and key not in keys:
                    keys.append(key)
        if old["condition"] != new["condition"] and "GPUUnhealthy" not in keys:
            keys.append("GPUUnhealthy")
    return keys
