"""The NVIDIA GPU Operator's operands on the real control plane, as the operator runs
them on its GPU nodes: one DaemonSet per operand that holds the GPUs (the device
plugin, DCGM, dcgm-exporter, GPU Feature Discovery: healthd.sim.operands.OPERANDS) in
the namespace `gpu-operator`, each selecting the nodes whose operand label says "true"
(`nvidia.com/gpu.deploy.dcgm: "true"`, ...) and tolerating every taint, as the
operator's do. The real DaemonSet controller and scheduler place their pods; kwok marks
them Running and removes them once deleted (it runs no container).

`OperandPods` plays their containers on the simulated machines, as the e2e Kubelet
plays healthd's: an operand pod Running on a machine's node holds every GPU of that
machine (a named holder, "gpu-operator/<pod>": healthd.sim.holders, so a GPU reset there
is refused while it runs) until it is deleted. It also records, per node, which
operands have a pod there (not marked for deletion) after each change, with the node's
repair state read right then.

`gpu_operator` installs the DaemonSets, labels the fleet's nodes as the operator does,
and returns once every node runs one pod of each operand, holding its GPUs.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from kubernetes import client as k8s

from healthd.sim.holders import hold, release
from healthd.sim.operands import NAMESPACE, OPERANDS, operand_labels
from tests.e2e.healthd import HEALTHD, Healthd, eventually
from tests.e2e.kubelet import Machine
from tests.e2e.recorders import Recorder
from tests.e2e.repairs import RepairFleet, repair_of

Obj = dict[str, Any]
EVERY_OPERAND = frozenset(OPERANDS)
UNREAD = "<unread>"  # the node's repair state could not be read


def operand_daemonsets() -> list[Obj]:
    """One DaemonSet per operand, as the GPU Operator makes them (the module docstring)."""
    return [_daemonset(name, label) for name, label in OPERANDS.items()]


def _daemonset(name: str, label: str) -> Obj:
    selector = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"selector": {"matchLabels": selector},
                     "template": {"metadata": {"labels": selector}, "spec": {
                         "nodeSelector": {label: "true"},
                         "tolerations": [{"operator": "Exists"}],
                         "containers": [{"name": name, "image": f"nvcr.io/nvidia/{name}"}]}}}}


@dataclass(frozen=True)
class Change:
    """The operands with a pod on a node after a change, and the node's repair state
    then (None: never repaired)."""

    operands: frozenset[str]
    state: str | None


class OperandPods:
    """See the module docstring: the operand pods on `machines`' nodes."""

    def __init__(self, healthd: Healthd, machines: Mapping[str, Machine]) -> None:
        self.healthd, self.machines = healthd, machines
        self._alive: dict[str, tuple[str, str]] = {}  # pod -> (node, operand)
        self._held: dict[str, str] = {}  # "namespace/pod" holding its machine's GPUs -> node
        self._changes: dict[str, list[Change]] = {}
        self._lock = threading.Lock()  # the recorder's thread writes, the test reads
        self._recorder = Recorder(healthd.client, partial(
            healthd.core.list_namespaced_pod, NAMESPACE), _phase, on_event=self._saw)

    def stop(self) -> None:
        self._recorder.stop()

    def changes(self, node: str) -> list[Change]:
        """Each change of the node's operands so far, in order."""
        with self._lock:
            return list(self._changes.get(node, []))

    def running(self, node: str) -> list[str]:
        """The operand of each pod Running on `node` now (a fresh read, not the watch)."""
        pods = self.healthd.core.list_namespaced_pod(
            NAMESPACE, field_selector=f"spec.nodeName={node}").items
        return sorted(p.metadata.labels["app"] for p in pods if p.status.phase == "Running"
                      and p.metadata.deletion_timestamp is None)

    def holding(self, node: str) -> int:
        """How many operand pods hold the node's GPUs now."""
        with self._lock:
            return sum(1 for held in self._held.values() if held == node)

    def _saw(self, kind: str, pod: Obj) -> None:
        meta = pod["metadata"]
        node = pod["spec"].get("nodeName") or ""
        machine = self.machines.get(node)
        if machine is None:
            return
        name, key = meta["name"], f"{meta['namespace']}/{meta['name']}"
        alive = kind != "DELETED" and meta.get("deletionTimestamp") is None
        # Its container holds the GPUs while it runs; a deleted pod's has ended.
        if alive and pod["status"].get("phase") == "Running" and key not in self._held:
            hold(machine.control, key)
            with self._lock:
                self._held[key] = node
        elif not alive and key in self._held:
            release(machine.control, key)
            with self._lock:
                del self._held[key]
        if alive:
            self._alive[name] = (node, str((meta.get("labels") or {}).get("app")))
        else:
            self._alive.pop(name, None)
        self._note(node)

    def _note(self, node: str) -> None:
        operands = frozenset(op for n, op in self._alive.values() if n == node)
        last = self.changes(node)[-1:]
        if not last or last[0].operands != operands:
            change = Change(operands, self._state(node))
            with self._lock:
                self._changes.setdefault(node, []).append(change)

    def _state(self, node: str) -> str | None:
        try:
            doc = repair_of(self.healthd.node(node))
        except k8s.ApiException:
            return UNREAD
        return None if doc is None else str(doc["state"])


def _phase(pod: Obj) -> str | None:
    return (pod.get("status") or {}).get("phase")


def operand_labels_of(healthd: Healthd, node: str) -> dict[str, str | None]:
    """The node's operand labels now (None: it lacks one)."""
    labels = healthd.node(node)["metadata"].get("labels") or {}
    return {label: labels.get(label) for label in OPERANDS.values()}


def gpu_holders(machine: Machine, uuid: str) -> list[str]:
    """What holds GPU `uuid` of `machine` now, as `healthd gpu-reset --holders-only`
    (the reset's own first look) names it on the machine: what makes a reset refuse."""
    done = subprocess.run(
        [*HEALTHD, "gpu-reset", "--holders-only", "--sim", str(machine.spec_file),
         "--sim-control", str(machine.control), "--", uuid],
        capture_output=True, text=True, timeout=60, check=False)
    (gpu,) = json.loads(done.stdout.strip().splitlines()[-1])["gpus"]
    return [str(h) for h in gpu["holders"]]


@contextlib.contextmanager
def gpu_operator(fleet: RepairFleet) -> Iterator[OperandPods]:
    """The operands on every node of `fleet` (see the module docstring); at the end,
    their DaemonSets are deleted (their pods with them)."""
    healthd = fleet.healthd
    healthd.applier.apply([{"apiVersion": "v1", "kind": "Namespace",
                            "metadata": {"name": NAMESPACE}}])
    healthd.applier.apply(operand_daemonsets())
    pods = OperandPods(healthd, fleet.machines)
    try:
        for node in fleet.nodes:  # what the operator does on a GPU node it manages
            healthd.core.patch_node(node, {"metadata": {"labels": operand_labels()}})
        for node in fleet.nodes:
            eventually(lambda n=node: pods.running(n) == sorted(OPERANDS)  # type: ignore[misc]
                       and pods.holding(n) == len(OPERANDS), 90,
                       f"one pod of each operand running on {node}, holding its GPUs")
        yield pods
    finally:
        pods.stop()
        healthd.applier.delete(operand_daemonsets())
