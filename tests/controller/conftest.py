"""Fixtures for the controller: an emulator per test, `Kube` clients talking to it
over real HTTP (one per simulated replica), and builders for the objects the
controller reads (Nodes, AppWrappers and their Pods, Kueue queues and flavors)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry

from healthd.config import Config
from healthd.controller.controller import Controller
from healthd.controller.metrics import ControllerMetrics
from healthd.kube.client import Kube
from healthd.kube.conventions import Keys
from healthd.sim.apiserver import ApiEmulator, RecordedRequest
from healthd.sim.apiserver.testing import api  # noqa: F401

KubeFactory = Callable[..., Kube]


@pytest.fixture
async def kube_for(api: ApiEmulator) -> AsyncIterator[KubeFactory]:  # noqa: F811
    """`kube_for("replica-a")`: a client authenticated as that user (its own
    connection pool, so one replica's requests can be refused alone)."""
    async with AsyncExitStack() as stack:

        def make(user: str = "admin") -> Kube:
            client = Kube(api.async_client(user=user), timeout_s=2)
            stack.push_async_callback(client.close)
            return client

        yield make


# -- objects --------------------------------------------------------------------------

KEYS = Keys()
GPU = "nvidia.com/gpu"
NS = "team-a"
QUEUE = "slack-cluster-queue"
Obj = dict[str, Any]


def node(name: str, verdict: str = "PASS", *, gpus: int = 8, codes: tuple[str, ...] = (),
         labels: dict[str, str] | None = None) -> Obj:
    """A GPU node with the health label (and, with `codes`, the agent's annotation
    holding them at that verdict)."""
    annotations = {}
    if codes:
        annotations[KEYS.health] = json.dumps({
            "verdict": verdict, "top": codes[0],
            "held": [{"code": c, "severity": verdict} for c in codes]})
    capacity = {GPU: str(gpus), "cpu": "64", "memory": "512Gi", "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {KEYS.gpuhealth: verdict, **(labels or {})},
                         "annotations": annotations},
            "spec": {}, "status": {"capacity": capacity, "allocatable": capacity}}


def appwrapper(name: str, phase: str = "Running") -> Obj:
    return {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"suspend": False, "components": []},
            "status": {"phase": phase, "conditions": [
                {"type": "QuotaReserved", "status": "True", "reason": "Resuming",
                 "message": "Suspend is false", "lastTransitionTime": "2025-01-01T00:00:00Z"},
                {"type": "Unhealthy", "status": "False", "reason": "FoundNoFailedPods",
                 "message": "", "lastTransitionTime": "2025-01-01T00:01:00Z"}]}}


def gpu_pod(owner: str, node_name: str, *, gpus: int = 1, index: int = 0) -> Obj:
    """A running pod of AppWrapper `owner` using `gpus` GPUs on `node_name`."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{owner}-{index}", "namespace": NS,
                         "labels": {"workload.codeflare.dev/appwrapper": owner}},
            "spec": {"nodeName": node_name, "containers": [
                {"name": "main", "image": "trainer",
                 "resources": {"requests": {GPU: str(gpus)}, "limits": {GPU: str(gpus)}}}]},
            "status": {"phase": "Running"}}


def slack_queue(gpu_nominal: str = "12", *, version: str = "v1beta2",
                lending_limit: str | None = None) -> Obj:
    """The slack queue lending GPUs only (as the upstream fixture does)."""
    gpu: Obj = {"name": GPU, "nominalQuota": gpu_nominal}
    if lending_limit is not None:
        gpu["lendingLimit"] = lending_limit
    cohort = "cohortName" if version == "v1beta2" else "cohort"
    return {"apiVersion": f"kueue.x-k8s.io/{version}", "kind": "ClusterQueue",
            "metadata": {"name": QUEUE},
            "spec": {cohort: "default-cohort", "namespaceSelector": {}, "resourceGroups": [
                {"coveredResources": [GPU],
                 "flavors": [{"name": "default-flavor", "resources": [gpu]}]}]}}


def default_flavor(version: str = "v1beta2") -> Obj:
    return {"apiVersion": f"kueue.x-k8s.io/{version}", "kind": "ResourceFlavor",
            "metadata": {"name": "default-flavor"}, "spec": {}}


def gpu_limit(server: ApiEmulator) -> str | None:
    """The slack queue's stored GPU lendingLimit (None: the field is absent)."""
    stored = server.get("ClusterQueue", QUEUE) or {}
    resources = stored["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    return next(r for r in resources if r["name"] == GPU).get("lendingLimit")


def phase(server: ApiEmulator, name: str) -> str:
    return str(((server.get("AppWrapper", name, NS) or {}).get("status") or {}).get("phase"))


def status_writes(server: ApiEmulator, name: str | None = None) -> list[RecordedRequest]:
    """Accepted writes to AppWrapper status (resets)."""
    path = rf"/apis/workload\.codeflare\.dev/v1beta2/namespaces/{NS}/appwrappers/" \
           rf"{name or '[^/]+'}/status"
    return [r for r in server.writes("PATCH", path) if r.status == 200]


def product_writes(server: ApiEmulator) -> list[RecordedRequest]:
    """Every write but the Lease's (leader election writes by design)."""
    return [r for r in server.writes() if "/leases" not in r.path]


def events(server: ApiEmulator, reason: str) -> list[Obj]:
    return [e for e in server.list("Event") if e.get("reason") == reason]


def set_verdict(server: ApiEmulator, name: str, verdict: str, *codes: str) -> None:
    """What the node agent does: relabel the node (a watch event for the controller)."""
    stored = server.get("Node", name)
    assert stored is not None
    fresh = node(name, verdict, codes=codes,
                 gpus=int(stored["status"]["capacity"][GPU]))
    stored["metadata"]["labels"] = fresh["metadata"]["labels"]
    stored["metadata"]["annotations"] = fresh["metadata"]["annotations"]
    server.put(stored)


# -- running the controller -----------------------------------------------------------


def settings(**overrides: Any) -> Config:
    """A config whose timings suit tests (a 1 s lease, a 1 s breaker hold) and whose
    breaker lets one of two nodes fail (the default 30% would not)."""
    controller = {"election": {"lease_duration": "1s", "renew_deadline": "500ms",
                               "retry_period": "100ms"},
                  "breaker": {"hold": "1s", "max_unhealthy": "50%"}} | overrides
    return Config.model_validate({"controller": controller})


@dataclass
class Replica:
    """One in-process controller with its own metrics and API identity."""

    controller: Controller
    scope: anyio.CancelScope

    @property
    def registry(self) -> CollectorRegistry:
        return self.controller.metrics.registry

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float:
        return self.registry.get_sample_value(name, labels or {}) or 0.0

    def stop(self) -> None:
        self.scope.cancel()


@asynccontextmanager
async def controllers(kube_for: KubeFactory, config: Config,
                      *names: str) -> AsyncIterator[list[Replica]]:
    """Run one controller per name (the API user and Lease identity); stop them all
    on exit."""
    async with anyio.create_task_group() as group:
        replicas = []
        for name in names:
            controller = Controller(config, kube=kube_for(name),
                                    metrics=ControllerMetrics(CollectorRegistry()),
                                    identity=name)
            replica = Replica(controller, anyio.CancelScope())
            replicas.append(replica)

            async def run(replica: Replica = replica) -> None:
                with replica.scope:
                    await replica.controller.run()

            group.start_soon(run)
        yield replicas
        group.cancel_scope.cancel()


async def eventually(condition: Callable[[], object], within: float = 3.0) -> float:
    """Seconds until `condition()` is true; fails the test after `within`."""
    start = anyio.current_time()
    try:
        with anyio.fail_after(within):
            while not condition():
                await anyio.sleep(0.02)
    except TimeoutError:
        pytest.fail(f"not true within {within} s: {condition.__doc__ or condition}")
    return anyio.current_time() - start


async def settled(replica: Replica) -> None:
    """Until the replica leads with synced caches and has acted on what it saw."""
    await eventually(lambda: replica.controller.term is not None
                     and replica.controller.term.caches.synced)
    await anyio.sleep(0.4)  # a settle period and a round of writes, had any been due
