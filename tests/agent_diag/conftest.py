"""Fixtures for deep diagnostics, the busy gate and peers: an emulator per test, a
`Kube` speaking to it over real HTTP, and builders for the Nodes and Pods the tests
seed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from healthd.kube.client import Kube
from healthd.kube.conventions import GPU_RESOURCE
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.apiserver.testing import api, sync_api  # noqa: F401

NODE = "gpu-node-1"
DIAG_NS = "healthd-system"


@pytest.fixture
async def kube(api: ApiEmulator) -> AsyncIterator[Kube]:  # noqa: F811
    async with Kube(api.async_client(), timeout_s=2) as client:
        yield client


def node(name: str = NODE, gpus: int = 8) -> dict[str, Any]:
    """A GPU Node with `gpus` allocatable GPUs."""
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"allocatable": {GPU_RESOURCE: str(gpus)},
                       "capacity": {GPU_RESOURCE: str(gpus)}}}


def container(name: str = "c", requests: int | None = None,
              limits: int | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = {GPU_RESOURCE: str(requests), "cpu": "1"}
    if limits is not None:
        resources["limits"] = {GPU_RESOURCE: str(limits)}
    return {"name": name, "image": "busybox", "resources": resources}


def pod(name: str, *, node_name: str = NODE, namespace: str = "work", phase: str = "Running",
        containers: list[dict[str, Any]] | None = None,
        init: list[dict[str, Any]] | None = None, labels: dict[str, str] | None = None,
        deleting: bool = False, ip: str = "", created: str = "") -> dict[str, Any]:
    """A Pod as the kubelet would have left it (status included)."""
    spec: dict[str, Any] = {"containers": containers or [container()]}
    if node_name:
        spec["nodeName"] = node_name
    if init:
        spec["initContainers"] = init
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {}}
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
        meta["finalizers"] = ["example.com/hold"]
    if created:
        meta["creationTimestamp"] = created
    status: dict[str, Any] = {"phase": phase}
    if ip:
        status["podIP"] = ip
        status["podIPs"] = [{"ip": ip}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
            "status": status}
