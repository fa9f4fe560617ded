"""Fixtures for AppWrapper resets: an emulator per test, a `Kube` over real HTTP, a
hand-driven clock, fresh metrics, and builders for nodes, AppWrappers and pods.

`reconcile` plays the controller's part in one pass: read nodes, pods and
AppWrappers from the server, decide, reset. The tests then assert what reached the
server (writes, stored status, Events) and what was counted.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from healthd.capacity.health import evict_codes
from healthd.config.controller import ControllerSettings
from healthd.controller.appwrappers import Resetter
from healthd.controller.metrics import ControllerMetrics
from healthd.controller.resets import decide
from healthd.kube.client import Kube
from healthd.kube.conventions import APPWRAPPER_LABEL, CONTROLLER_COMPONENT, Keys, Verdict
from healthd.kube.events import EventRecorder
from healthd.kube.objects import APPWRAPPERS, NODES, PODS, key_of, name_of
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.apiserver.testing import api  # noqa: F401

Obj = dict[str, Any]
KEYS = Keys()
NS = "team-a"
T0 = 1_750_000_000.0  # the fake clock's start (epoch seconds)
AW_STATUS_PATH = rf"/apis/workload\.codeflare\.dev/v1beta2/namespaces/{NS}/appwrappers/[^/]+/status"


class FakeClock:
    """Epoch seconds that move only when a test says so."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
async def kube(api: ApiEmulator) -> AsyncIterator[Kube]:  # noqa: F811
    async with Kube(api.async_client(), timeout_s=2) as client:
        yield client


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def metrics() -> ControllerMetrics:
    return ControllerMetrics(CollectorRegistry())


MakeResetter = Callable[..., Resetter]


@pytest.fixture
def make_resetter(kube: Kube, clock: FakeClock, metrics: ControllerMetrics) -> MakeResetter:
    """`make_resetter(dry_run=True, resets={...}, breaker={...})`: a Resetter with
    settings built from those overrides."""

    def make(*, subject: Obj | None = None, **overrides: Any) -> Resetter:
        settings = ControllerSettings.model_validate(overrides)
        events = EventRecorder(kube, component=CONTROLLER_COMPONENT)
        return Resetter(kube, events, settings=settings, metrics=metrics, clock=clock,
                        breaker_subject=subject)

    return make


def count(metrics: ControllerMetrics, result: str) -> float:
    value = metrics.registry.get_sample_value("healthd_controller_resets_total",
                                              {"result": result})
    return value or 0.0


# -- objects --------------------------------------------------------------------------


def node(name: str, verdict: Verdict = Verdict.PASS, *codes: str) -> Obj:
    """A GPU node with the verdict label and, when `codes` are given, a health
    annotation holding them at that verdict."""
    annotations = {}
    if codes:
        held = [{"code": c, "severity": verdict.value} for c in codes]
        annotations[KEYS.health] = json.dumps({"verdict": verdict.value, "top": codes[0],
                                               "held": held})
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {KEYS.gpuhealth: verdict.value},
                         "annotations": annotations},
            "status": {"capacity": {"nvidia.com/gpu": "8", "cpu": "64", "pods": "110"}}}


def appwrapper(name: str, phase: str = "Running", *, managed_by: str | None = None,
               conditions: list[Obj] | None = None) -> Obj:
    spec: Obj = {"suspend": False, "components": []}
    if managed_by is not None:
        spec["managedBy"] = managed_by
    default = [
        {"type": "QuotaReserved", "status": "True", "reason": "Resuming",
         "message": "Suspend is false", "lastTransitionTime": "2025-01-01T00:00:00Z"},
        {"type": "PodsReady", "status": "True", "reason": "SufficientPodsReady",
         "message": "1 pods running", "lastTransitionTime": "2025-01-01T00:01:00Z"},
        {"type": "Unhealthy", "status": "False", "reason": "FoundNoFailedPods",
         "message": "", "lastTransitionTime": "2025-01-01T00:01:00Z"},
    ]
    return {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
            "metadata": {"name": name, "namespace": NS, "generation": 3},
            "spec": spec,
            "status": {"phase": phase, "resettingCount": 1,
                       "conditions": default if conditions is None else conditions}}


def pod(name: str, aw: str, node_name: str, *, phase: str = "Running",
        requests: Obj | None = None, limits: Obj | None = None,
        init_requests: Obj | None = None, terminating: bool = False) -> Obj:
    """A pod of AppWrapper `aw`; by default one container requesting one GPU."""
    if requests is None and limits is None:
        requests = {"nvidia.com/gpu": "1"}
    resources = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    spec: Obj = {"nodeName": node_name,
                 "containers": [{"name": "main", "image": "trainer", "resources": resources}]}
    if init_requests:
        spec["initContainers"] = [{"name": "setup", "image": "setup",
                                   "resources": {"requests": init_requests}}]
    metadata: Obj = {"name": name, "namespace": NS, "labels": {APPWRAPPER_LABEL: aw}}
    if terminating:
        metadata["deletionTimestamp"] = "2025-01-01T00:00:00Z"
        metadata["finalizers"] = ["example.com/keep"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec,
            "status": {"phase": phase}}


def stored_aw(api: ApiEmulator, name: str) -> Obj:  # noqa: F811
    obj = api.get("AppWrapper", name, NS)
    assert obj is not None
    return obj


def reset_writes(api: ApiEmulator, name: str = "[^/]+") -> list[Any]:  # noqa: F811
    """Every status PATCH to AppWrapper `name` (a regex)."""
    path = AW_STATUS_PATH.replace("[^/]+", name)
    return api.writes("PATCH", path)


def events(api: ApiEmulator, reason: str) -> list[Obj]:  # noqa: F811
    return [e for e in api.list("Event") if e.get("reason") == reason]


# -- one controller pass --------------------------------------------------------------


async def evict_map(kube: Kube) -> dict[str, tuple[str, ...]]:
    nodes = (await kube.list(NODES))["items"]
    return {name_of(n): evict_codes(n, KEYS) for n in nodes
            if n["metadata"].get("labels", {}).get(KEYS.gpuhealth) == Verdict.EVICT.value}


async def reconcile(kube: Kube, resetter: Resetter) -> dict[str, str]:
    """Decide about every AppWrapper from what the server holds now and reset what is
    due: {ns/name: result} for the ones with a decision."""
    evict = await evict_map(kube)
    pods = (await kube.list(PODS, label_selector=APPWRAPPER_LABEL))["items"]
    results = {}
    for aw in (await kube.list(APPWRAPPERS))["items"]:
        decision = decide(aw, pods, evict)
        if decision is not None:
            results[key_of(aw)] = await resetter.reset(decision, appwrapper=aw)
    return results
