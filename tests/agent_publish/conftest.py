"""Fixtures for the node publisher and request tests: an emulator with one Node that
other owners have already written to, a real `Kube` client on it, and states built
by the real verdict machine from check results."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio

from checks.base import CheckResult, Entity, Finding, Severity, worst
from checks.catalog import Catalog
from healthd.agent import verdict
from healthd.agent.node_status import NodePublisher, desired_from
from healthd.agent.verdict import HealthState, Policy, Trigger
from healthd.kube.backoff import Backoff
from healthd.kube.client import Kube
from healthd.kube.conventions import COMPONENT, Keys
from healthd.kube.events import EventRecorder
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.apiserver.testing import api  # noqa: F401

NODE = "gpu-node-1"
KEYS = Keys()
CATALOG = Catalog()

# What other owners put on the node: none of it may ever change.
FOREIGN_LABELS = {"kubernetes.io/hostname": NODE, "autopilot.ibm.com/other": "keep",
                  "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
FOREIGN_ANNOTATIONS = {"node.alpha.kubernetes.io/ttl": "0", "team.example/owner": "infra"}
TAINTS = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
READY = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet ready",
         "lastTransitionTime": "2025-01-01T00:00:00Z", "lastHeartbeatTime": "2025-01-01T00:00:00Z"}


def node_object() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE, "labels": dict(FOREIGN_LABELS),
                     "annotations": dict(FOREIGN_ANNOTATIONS)},
        "spec": {"unschedulable": True, "taints": [dict(t) for t in TAINTS]},
        "status": {"conditions": [dict(READY)]},
    }


def gpu(index: int) -> Entity:
    return Entity.gpu(index, uuid=f"GPU-{index:08d}-aaaa-bbbb-cccc-dddddddddddd",
                      pci_bus_id=f"00000000:{index + 0x10:02X}:00.0", model="NVIDIA H100")


def finding(code: str, index: int, message: str) -> Finding:
    spec = CATALOG.lookup(code)
    return Finding(code, spec.severity, gpu(index), message, spec.sticky)


def result(check: str, *findings: Finding) -> CheckResult:
    status = worst(f.severity for f in findings) if findings else Severity.PASS
    return CheckResult(check=check, status=status, findings=findings)


def judged(*runs: tuple[str, CheckResult], at: float = 1000.0) -> HealthState:
    """The state after each of `runs` (key, result) was reported by two consecutive
    runs (enough to hold any finding), all at time `at`."""
    state = verdict.initial(at)
    for key, res in runs:
        for _ in range(2):
            state = verdict.apply(state, key, res, trigger=Trigger.PERIODIC, at=at,
                                  policy=Policy())
    return state


class Clock:
    """A settable wall clock for condition times."""

    def __init__(self, now: float = 1_750_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Harness:
    """A running publisher and what tests need around it."""

    def __init__(self, emulator: ApiEmulator, kube: Kube, publisher: NodePublisher,
                 clock: Clock) -> None:
        self.api = emulator
        self.kube = kube
        self.publisher = publisher
        self.clock = clock

    def publish(self, state: HealthState, **kwargs: Any) -> None:
        kwargs.setdefault("dcgm_levels", {})
        self.publisher.want(desired_from(state, KEYS, node=NODE, **kwargs), state)

    async def published(self, state: HealthState, **kwargs: Any) -> None:
        self.publish(state, **kwargs)
        assert await self.publisher.flush(5), self.publisher.last_error

    def node(self) -> dict[str, Any]:
        obj = self.api.get("Node", NODE)
        assert obj is not None
        return obj

    def node_writes(self) -> list[Any]:
        return self.api.writes(None, f"/api/v1/nodes/{NODE}(/status)?")

    def events(self) -> list[dict[str, Any]]:
        """Stored Events, oldest first."""
        return sorted(self.api.list("Event"),
                      key=lambda e: int(e["metadata"]["resourceVersion"]))

    def assert_foreign_untouched(self) -> None:
        node = self.node()
        labels = node["metadata"].get("labels", {})
        annotations = node["metadata"].get("annotations", {})
        assert {k: labels.get(k) for k in FOREIGN_LABELS} == FOREIGN_LABELS
        assert {k: annotations.get(k) for k in FOREIGN_ANNOTATIONS} == FOREIGN_ANNOTATIONS
        assert node["spec"] == {"unschedulable": True, "taints": TAINTS}
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready == [READY]


@asynccontextmanager
async def running(emulator: ApiEmulator, *, seed: bool = True,
                  backoff: Backoff | None = None) -> AsyncIterator[Harness]:
    """A publisher for the node, its loop running; the node seeded unless `seed` is False;
    short backoff delays unless `backoff` says otherwise."""
    if seed:
        emulator.seed(node_object())
    kube = Kube(emulator.async_client(), timeout_s=2)
    clock = Clock()
    events = EventRecorder(kube, component=COMPONENT, host=NODE)
    publisher = NodePublisher(kube, NODE, KEYS, events,
                              backoff=backoff or Backoff(initial=0.05, maximum=0.2),
                              clock=clock)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher.run)
            yield Harness(emulator, kube, publisher, clock)
            tg.cancel_scope.cancel()
    finally:
        await kube.close()

