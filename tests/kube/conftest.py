"""Fixtures for the Kubernetes layer: an emulator per test and a `Kube` talking to it
over real HTTP through the official client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from healthd.kube.client import Kube
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.apiserver.testing import api, sync_api  # noqa: F401


@pytest.fixture
async def kube(api: ApiEmulator) -> AsyncIterator[Kube]:  # noqa: F811
    async with Kube(api.async_client(), timeout_s=2) as client:
        yield client


def node(name: str, labels: dict[str, str] | None = None, **extra: object) -> dict[str, object]:
    """A minimal Node object."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": dict(labels or {}), **extra}}


def pod(name: str, namespace: str = "default", labels: dict[str, str] | None = None,
        node_name: str = "") -> dict[str, object]:
    """A minimal Pod object."""
    spec: dict[str, object] = {"containers": [{"name": "c", "image": "pause"}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
            "spec": spec}


def churn(server: ApiEmulator, past: int) -> None:
    """Writes elsewhere (Events, heartbeats: nothing the tests watch) until the
    server's version passes `past`."""
    while server.resource_version <= past:
        name = f"churn-{server.resource_version}"
        server.put({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": "other"}})
