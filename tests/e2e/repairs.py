"""GPU nodes that healthd repairs on the real control plane: the agents on simulated
machines and both controller replicas run by the e2e Kubelet (kubelet.py), which also
plays the controller's GPU-reset Jobs on the machines; repairs on
(`controller.repair.enabled`), with `REMAP_PENDING` raised to EVICT so that the
AppWrapper on such a node is reset before its GPUs are (docs/configuration.md shows
the override).

`repair_fleet` brings the nodes up, each PASS; `RepairFleet` says what a user sees of
their repairs (the `healthd.io/repair` annotation, the GPU-reset Jobs, the Events on
the Nodes, the leader's metrics) and `watching` records, as it happens, every value
the nodes' verdict, repair state and the slack queue's lendingLimit pass through, and
the Events on the nodes in the order they were sent.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from anyio.from_thread import start_blocking_portal
from kubernetes import client as k8s

from healthd.config.controller import DEFAULT_REPAIR_NAMESPACE
from healthd.kube.client import Kube
from healthd.sim.machine import load_machine_spec
from healthd.sim.remediation import (
    REQUESTS,
    TEMPLATES,
    FakeRebootOperator,
    by_control_file,
    crds,
    template,
)
from tests.e2e.healthd import NAMESPACE, TEST_CONFIG, Healthd, eventually, merge
from tests.e2e.kubelet import GPU_RESETS, Container, Kubelet, Machine
from tests.e2e.mlbatch import KUEUE, SLACK, Workloads, appwrapper, tutorial
from tests.e2e.recorders import Recorder, lending_limit

Obj = dict[str, Any]
REPAIR = "healthd.io/repair"
OPT_OUT = "remediation.medik8s.io/exclude-from-remediation"
GPUHEALTH = "autopilot.ibm.com/gpuhealth"
REMAPPED_GPU = 3  # the GPU whose row remap is pending
REPAIR_CONFIG: Obj = merge(TEST_CONFIG, {
    "codes": {"REMAP_PENDING": {"severity": "EVICT"}},
    "controller": {"repair": {"enabled": True, "validation_timeout": "60s"}},
})
MEDIK8S = "medik8s"  # the namespace of the remediation template and its requests
# The admin's template (`controller.repair.reboot` names it) and what its requests get.
REBOOT_TEMPLATE = {"apiVersion": TEMPLATES.api_version, "kind": TEMPLATES.kind,
                   "namespace": MEDIK8S, "name": "automatic"}
REBOOT_SPEC = {"remediationStrategy": "Automatic"}
# The Events the controller's repairs post on a Node (healthd/controller/repairs.py).
REPAIR_EVENTS = ("RepairWaiting", "GPUReset", "RepairValidating", "RepairSucceeded",
                 "RepairFailed", "RepairHeld", "RebootNeeded", "RebootRequested",
                 "RebootRequestFailed", "RebootDone", "RebootTimedOut",
                 "HardwareInspection", "HardwareInspectionCleared")
REPAIRED_S = 120  # fault to PASS, on a busy 2-core machine


@dataclass
class RepairFleet:
    healthd: Healthd
    kubelet: Kubelet
    operator: FakeRebootOperator | None = None  # with `reboots`

    @property
    def machines(self) -> dict[str, Machine]:
        return self.kubelet.machines

    @property
    def nodes(self) -> list[str]:
        return list(self.machines)

    # -- faults ------------------------------------------------------------------------

    def remap_pending(self, node: str, *, hardware: bool = False) -> None:
        """GPU `REMAPPED_GPU` of `node` remaps a row after an uncorrectable error; the
        remap is pending until the GPU is reset (with `hardware`: for ever, a broken
        GPU that no reset or reboot mends)."""
        self.machines[node].inject(gpu=REMAPPED_GPU, hardware=hardware,
                                   remapped_rows={"uncorrectable": 1, "pending": True})

    def needs_reboot(self, node: str) -> None:
        """The driver asks for a node reboot on GPU `REMAPPED_GPU` of `node` (its
        recovery action, NODE_REBOOT): a GPU reset does not carry it out, a reboot
        does (healthd.sim.repairs)."""
        self.machines[node].inject(gpu=REMAPPED_GPU, recovery_action="NODE_REBOOT")

    def uuid(self, node: str, gpu: int = REMAPPED_GPU) -> str:
        return self.machines[node].spec.uuid(gpu)

    # -- what a user sees --------------------------------------------------------------

    def label(self, node: str) -> str | None:
        return self.healthd.label(node)

    def repair(self, node: str) -> Obj | None:
        """The node's `healthd.io/repair` annotation (None: never repaired)."""
        return repair_of(self.healthd.node(node))

    def state(self, node: str) -> str | None:
        doc = self.repair(node)
        return None if doc is None else str(doc["state"])

    def attempts(self, node: str) -> list[tuple[str, list[str], str]]:
        """(remedy, GPUs, outcome) of each repair attempt the annotation records."""
        doc = self.repair(node) or {}
        return [(a["remedy"], a.get("gpus", []), a["outcome"])
                for a in doc.get("attempts", [])]

    def repaired(self, node: str, attempt: int = 1) -> bool:
        """PASS again, the repair over: its state idle, attempt number `attempt`
        recorded and passed."""
        attempts = self.attempts(node)
        return self.label(node) == "PASS" and self.state(node) == "" and len(
            attempts) >= attempt and attempts[-1][2] == "passed"

    def boot_id(self, node: str) -> str:
        """The boot id the Node reports (status.nodeInfo.bootID)."""
        info = (self.healthd.node(node)["status"].get("nodeInfo") or {})
        return str(info.get("bootID") or "")

    def requests(self) -> list[Obj]:
        """The reboot requests (SelfNodeRemediations) that exist now."""
        listing = self.healthd.custom.list_namespaced_custom_object(
            REQUESTS.group, REQUESTS.version, MEDIK8S, REQUESTS.plural)
        return list(listing["items"])

    def jobs(self) -> list[Obj]:
        """The GPU-reset Jobs for this fleet's nodes."""
        jobs = k8s.BatchV1Api(self.healthd.client).list_namespaced_job(
            DEFAULT_REPAIR_NAMESPACE, label_selector=GPU_RESETS).items
        return [j for j in map(self.healthd.client.sanitize_for_serialization, jobs)
                if j["metadata"].get("annotations", {}).get("healthd.io/node-name")
                in self.machines]

    def reset_pods(self, node: str, phase: str) -> list[Obj]:
        """The GPU-reset pods on `node` in `phase`."""
        pods = self.healthd.core.list_namespaced_pod(
            DEFAULT_REPAIR_NAMESPACE, label_selector=GPU_RESETS,
            field_selector=f"spec.nodeName={node}").items
        return [p for p in map(self.healthd.client.sanitize_for_serialization, pods)
                if p["status"].get("phase") == phase]

    def events(self, node: str, reason: str) -> int:
        """How many times an Event `reason` was sent about `node` (counted again
        included)."""
        listing = self.healthd.core.list_event_for_all_namespaces(
            field_selector=f"involvedObject.kind=Node,involvedObject.name={node},"
                           f"reason={reason}").items
        return sum(e.count or 1 for e in listing)

    def leader(self) -> Container:
        """The controller process that holds the Lease."""
        def holder() -> Container | None:
            name = k8s.CoordinationV1Api(self.healthd.client).read_namespaced_lease(
                "healthd-controller", NAMESPACE).spec.holder_identity
            return next((c for c in self.kubelet.controllers()
                         if c.pod["metadata"]["name"] == name and c.program.running()), None)
        found: Container = eventually(holder, 60, "a running controller holding the Lease")
        return found

    def metric(self, name: str, **labels: str) -> float:
        """A sample of the leader's metrics."""
        return self.leader().sample(name, **labels)


def repair_of(node: Obj) -> Obj | None:
    text = (node["metadata"].get("annotations") or {}).get(REPAIR)
    return json.loads(text) if text else None


@contextlib.contextmanager
def repair_fleet(healthd: Healthd, root: Path, count: int, *, config: Obj | None = None,
                 tag: str = "repair", reboots: bool = False) -> Iterator[RepairFleet]:
    """`count` GPU nodes (healthy 8-GPU machines) with healthd running on them as
    Pods, and the tutorial's queues; returns once every node is PASS and a controller
    leads (in dry run, where none leads: once both replicas are ready). `config` goes
    over REPAIR_CONFIG; with `reboots`, the reboot hand-off (module docstring)."""
    suffix = uuid.uuid4().hex[:4]
    nodes = [f"{tag}-{suffix}-{i}" for i in range(1, count + 1)]
    healthd.applier.apply(tutorial())
    healthd.add_nodes(*nodes)
    spec = load_machine_spec("healthy-8xh100")
    machines = {n: Machine(n, spec.model_copy(update={"node": n}), root / n) for n in nodes}
    config = merge(REPAIR_CONFIG, config or {})
    if reboots:
        install_reboot_template(healthd)
        config = merge(config, {"controller": {"repair": {"reboot": REBOOT_TEMPLATE}}})
        for node in nodes:  # the kubelet's report of the boot it runs in
            healthd.core.patch_node_status(node, {"status": {"nodeInfo": {
                "bootID": f"boot-{uuid.uuid4().hex[:8]}"}}})
    with Kubelet(healthd, machines, root / "kubelet", config=config) as kubelet, \
            reboot_operator(healthd, machines, reboots) as operator:
        fleet = RepairFleet(healthd, kubelet, operator)
        for node in nodes:
            eventually(lambda n=node: healthd.label(n) == "PASS", 90,  # type: ignore[misc]
                       f"PASS on {node}")
        eventually(lambda: len(kubelet.controllers()) == 2
                   and all(c.ready() for c in kubelet.controllers()), 60,
                   "both controller replicas ready")
        if not config["controller"].get("dry_run"):
            fleet.leader()
        yield fleet


def install_reboot_template(healthd: Healthd) -> None:
    """The remediation's kinds (CRDs) in the API server, and the admin's template."""
    healthd.applier.apply([{"apiVersion": "v1", "kind": "Namespace",
                            "metadata": {"name": MEDIK8S}}, *crds()])
    healthd.applier.wait_established(c["metadata"]["name"] for c in crds())
    healthd.applier.apply([template(REBOOT_TEMPLATE["name"], MEDIK8S, REBOOT_SPEC)])


@contextlib.contextmanager
def reboot_operator(healthd: Healthd, machines: dict[str, Machine],
                    running: bool = True) -> Iterator[FakeRebootOperator | None]:
    """The fake reboot operator for `machines`, following the requests in `MEDIK8S`
    as the cluster's administrator, in a thread of its own (None unless `running`);
    at the end, the requests it leaves for these nodes are deleted."""
    if not running:
        yield None
        return
    with start_blocking_portal() as portal:
        kube = portal.call(Kube.connect, str(healthd.kubeconfig))
        operator = FakeRebootOperator(kube, by_control_file(
            {name: m.control for name, m in machines.items()}), namespace=MEDIK8S)
        task = portal.start_task_soon(operator.run)
        try:
            yield operator
        finally:
            task.cancel()
            portal.call(kube.close)
            for node in machines:
                with contextlib.suppress(k8s.ApiException):
                    healthd.custom.delete_namespaced_custom_object(
                        REQUESTS.group, REQUESTS.version, MEDIK8S, REQUESTS.plural, node)


def run_appwrapper(fleet: RepairFleet, gpus: int = 8) -> tuple[str, str]:
    """An AppWrapper of one pod with `gpus` GPUs in team blue, Running; its name and
    its node."""
    workloads = Workloads(fleet.healthd.client)
    name = f"job-{uuid.uuid4().hex[:5]}"
    fleet.healthd.applier.apply([appwrapper(name, "blue", pods=1, gpus_per_pod=gpus)])
    eventually(lambda: len(workloads.running_nodes("blue", name)) == 1
               and workloads.phase("blue", name) == "Running", 120, "the job Running")
    return name, workloads.running_nodes("blue", name)[0]


# -- recording ---------------------------------------------------------------------------


def _repair_state(node: Obj) -> str | None:
    doc = repair_of(node)
    return None if doc is None else str(doc["state"])


def _verdict(node: Obj) -> str | None:
    return (node["metadata"].get("labels") or {}).get(GPUHEALTH)


def _request(request: Obj) -> Obj:
    """A reboot request as `Watching.requests` keeps it: which object, and what it asks."""
    return {"uid": request["metadata"]["uid"], "spec": request.get("spec"),
            "labels": request["metadata"].get("labels") or {}}


def _event(event: Obj) -> tuple[str, str, int]:
    return (event["involvedObject"].get("name", ""), event.get("reason", ""),
            int(event.get("count") or 1))


class Watching:
    """What the cluster showed about `nodes` from its start (see the module docstring)."""

    def __init__(self, fleet: RepairFleet, nodes: Sequence[str]) -> None:
        healthd, self.nodes = fleet.healthd, list(nodes)
        core, group, version = healthd.core, *KUEUE
        self._verdicts = Recorder(healthd.client, core.list_node, _verdict, names=nodes)
        self._states = Recorder(healthd.client, core.list_node, _repair_state, names=nodes)
        self._queue = Recorder(healthd.client, partial(
            healthd.custom.list_cluster_custom_object, group, version, "clusterqueues"),
            lending_limit, names=[SLACK], field_selector=f"metadata.name={SLACK}")
        self._events = Recorder(healthd.client, core.list_event_for_all_namespaces, _event,
                                field_selector="involvedObject.kind=Node")
        self._before = set(self._events.order)
        self._recorders = [self._verdicts, self._states, self._queue, self._events]
        self._requests: Recorder | None = None
        if fleet.operator is not None:  # the reboot requests, named after their nodes
            self._requests = Recorder(healthd.client, partial(
                healthd.custom.list_namespaced_custom_object, REQUESTS.group,
                REQUESTS.version, MEDIK8S, REQUESTS.plural), _request, names=nodes)
            self._recorders.append(self._requests)

    def stop(self) -> None:
        for recorder in self._recorders:
            recorder.stop()

    def verdicts(self, node: str) -> list[str | None]:
        return list(self._verdicts.values(node))

    def states(self, node: str) -> list[str | None]:
        return list(self._states.values(node))

    def requests(self, node: str) -> list[Obj]:
        """Every reboot request for `node` that ever existed, in order, each as
        `_request` shows it, again when it changed (with `reboots`)."""
        assert self._requests is not None, "the fleet has no reboot hand-off"
        return list(self._requests.values(node))

    def lending(self) -> list[str | None]:
        return list(self._queue.values(SLACK))

    def when(self, node: str, *, verdict: str | None = None,
             state: str | None = None) -> float:
        """When (time.time()) `node` last turned to `verdict`, or its repair to `state`."""
        recorder, wanted = (self._verdicts, verdict) if state is None else (self._states, state)
        return max(at for value, at in recorder.timed(node) if value == wanted)

    def events(self, node: str, reasons: Sequence[str] = REPAIR_EVENTS) -> list[tuple[str, int]]:
        """The Events among `reasons` sent about `node` since the start, in the order
        they were sent, each with how many times it was counted."""
        out = []
        for name in self._events.order:
            values = self._events.values(name)
            about, reason, _ = values[0]
            if name not in self._before and about == node and reason in reasons:
                out.append((reason, values[-1][2]))
        return out


@contextlib.contextmanager
def watching(fleet: RepairFleet, nodes: Sequence[str]) -> Iterator[Watching]:
    seen = Watching(fleet, nodes)
    try:
        yield seen
    finally:
        seen.stop()
