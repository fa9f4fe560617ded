"""Helpers for the lending tests: object builders (nodes, flavors, slack queues),
emulator edits made the way another client would make them, and a running lending
stack (caches + `QueueWriter`) on a real `Kube` client."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio

from healthd.config.controller import ControllerSettings
from healthd.controller.caches import Caches
from healthd.controller.clusterqueues import QueueWriter
from healthd.kube.client import Kube
from healthd.kube.conventions import CONTROLLER_COMPONENT, Keys
from healthd.kube.events import EventRecorder
from healthd.sim.apiserver import ApiEmulator

KEYS = Keys()
GPU = "nvidia.com/gpu"
QUEUE = "slack-cluster-queue"
QUEUE_PATH = r"/apis/kueue\.x-k8s\.io/v1beta[12]/clusterqueues/.*"
Obj = dict[str, Any]


def node(name: str, *, gpus: int = 4, verdict: str | None = None,
         labels: dict[str, str] | None = None, unschedulable: bool = False,
         taints: tuple[str, ...] = (), capacity: dict[str, str] | None = None,
         allocatable: dict[str, str] | None = None) -> Obj:
    """A GPU node; `verdict` sets the health label, `taints` are keys (NoSchedule)."""
    all_labels = dict(labels or {})
    if verdict is not None:
        all_labels[KEYS.gpuhealth] = verdict
    cap = capacity if capacity is not None else {GPU: str(gpus), "cpu": "64",
                                                 "memory": "512Gi", "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": all_labels},
            "spec": {"unschedulable": unschedulable,
                     "taints": [{"key": k, "effect": "NoSchedule"} for k in taints]},
            "status": {"capacity": cap, "allocatable": allocatable or cap}}


def flavor(name: str, node_labels: dict[str, str] | None = None,
           version: str = "v1beta2") -> Obj:
    spec = {"nodeLabels": node_labels} if node_labels else {}
    return {"apiVersion": f"kueue.x-k8s.io/{version}", "kind": "ResourceFlavor",
            "metadata": {"name": name}, "spec": spec}


def resources(**quotas: str | tuple[str, str]) -> list[Obj]:
    """`resources(gpu="6", cpu=("32", "8"))`: name -> nominal or (nominal, lendingLimit).
    `gpu` stands for nvidia.com/gpu."""
    out = []
    for name, value in quotas.items():
        nominal, limit = value if isinstance(value, tuple) else (value, None)
        entry = {"name": GPU if name == "gpu" else name, "nominalQuota": nominal}
        if limit is not None:
            entry["lendingLimit"] = limit
        out.append(entry)
    return out


def group(*flavors: tuple[str, list[Obj]]) -> Obj:
    """A resource group: (flavor name, resources) pairs; coveredResources derived."""
    covered = list(dict.fromkeys(r["name"] for _, rs in flavors for r in rs
                                 if isinstance(r, dict) and "name" in r))
    return {"coveredResources": covered,
            "flavors": [{"name": f, "resources": rs} for f, rs in flavors]}


def queue(*groups: Obj, name: str = QUEUE, cohort: str | None = "default-cohort",
          version: str = "v1beta2") -> Obj:
    spec: Obj = {"namespaceSelector": {}, "resourceGroups": list(groups)}
    if cohort:
        spec["cohortName" if version == "v1beta2" else "cohort"] = cohort
    return {"apiVersion": f"kueue.x-k8s.io/{version}", "kind": "ClusterQueue",
            "metadata": {"name": name}, "spec": spec}


def simple_queue(nominal: str = "6", **kwargs: Any) -> Obj:
    """The upstream fixture: one flavor, one GPU resource."""
    return queue(group(("default-flavor", resources(gpu=nominal))), **kwargs)


def stored_queue(api: ApiEmulator, name: str = QUEUE) -> Obj:
    obj = api.get("ClusterQueue", name)
    assert obj is not None, f"queue {name} is gone"
    return obj


def limit_of(api: ApiEmulator, g: int = 0, f: int = 0, r: int = 0, name: str = QUEUE
             ) -> str | None:
    """The stored lendingLimit of one resource (None: no field)."""
    entry = stored_queue(api, name)["spec"]["resourceGroups"][g]["flavors"][f]["resources"][r]
    return entry.get("lendingLimit")


def edit(api: ApiEmulator, kind: str, name: str, change: Callable[[Obj], None]) -> Obj:
    """Change a stored object in place (as another client would) and store it back."""
    obj = copy.deepcopy(api.get(kind, name))
    assert obj is not None, f"{kind} {name} not found"
    change(obj)
    return api.put(obj)


def set_verdict(api: ApiEmulator, name: str, verdict: str | None) -> None:
    def change(obj: Obj) -> None:
        labels = obj["metadata"].setdefault("labels", {})
        if verdict is None:
            labels.pop(KEYS.gpuhealth, None)
        else:
            labels[KEYS.gpuhealth] = verdict
    edit(api, "Node", name, change)


def queue_writes(api: ApiEmulator) -> list[Any]:
    return api.writes("PATCH", QUEUE_PATH) + api.writes("PUT", QUEUE_PATH)


def events(api: ApiEmulator, reason: str) -> list[Obj]:
    return [e for e in api.list("Event") if e.get("reason") == reason]


async def until(condition: Callable[[], Any], timeout: float = 5.0) -> None:
    """Wait until `condition()` is true (a loose upper bound, never a timing claim)."""
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.01)


async def settle(api: ApiEmulator, quiet: float = 0.3) -> None:
    """Wait until no request has reached the server for `quiet` seconds."""
    with anyio.fail_after(10):
        seen = -1
        while len(api.requests) != seen:
            seen = len(api.requests)
            await anyio.sleep(quiet)


class RecordingMetrics:
    """Records what the writer reports, as the controller's metrics would."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str]] = []
        self.lending: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.forgotten: list[str] = []

    def count_lending_write(self, queue: str, result: str) -> None:
        self.writes.append((queue, result))

    def set_lending(self, queue: str, flavor: str, resource: str, **values: Any) -> None:
        self.lending[(queue, flavor, resource)] = values

    def forget_queue(self, queue: str) -> None:
        self.forgotten.append(queue)
        self.lending = {k: v for k, v in self.lending.items() if k[0] != queue}


class Lending:
    """A running lending stack: its caches and writer, for assertions."""

    def __init__(self, caches: Caches, writer: QueueWriter) -> None:
        self.caches = caches
        self.writer = writer


@asynccontextmanager
async def lending(kube: Kube, *, metrics: Any = None, **settings: Any
                  ) -> AsyncIterator[Lending]:
    """Caches feeding a `QueueWriter`, both running until the block ends."""
    config = ControllerSettings.model_validate(settings)
    holder: list[QueueWriter] = []
    caches = Caches(kube, slack_queues=config.slack_queues,
                    on_change=lambda kind, old, new: holder[0].handle(kind, old, new))
    writer = QueueWriter(kube, caches, EventRecorder(kube, component=CONTROLLER_COMPONENT),
                         settings=config, keys=KEYS, metrics=metrics)
    holder.append(writer)
    async with anyio.create_task_group() as tg:
        tg.start_soon(caches.run)
        tg.start_soon(writer.run)
        with anyio.fail_after(5):
            await caches.wait_synced()
        try:
            yield Lending(caches, writer)
        finally:
            tg.cancel_scope.cancel()
