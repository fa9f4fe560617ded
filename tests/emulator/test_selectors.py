"""Label selectors (every operator) and field selectors (supported labels, and the 400
a real server answers for any other) on list."""

from __future__ import annotations

import pytest

from tests.emulator.kube import Kube

pytestmark = pytest.mark.anyio

PODS = {
    "p1": ({"tier": "gpu", "zone": "a"}, "node-1"),
    "p2": ({"tier": "gpu", "zone": "b"}, "node-2"),
    "p3": ({"tier": "cpu"}, "node-2"),
}


async def _pods(kube: Kube) -> None:
    for name, (labels, node) in PODS.items():
        await kube.call("CoreV1Api", "create_namespaced_pod", kube.namespace, {
            "metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}})


async def _names(kube: Kube, **selectors: str) -> list[str]:
    listing = await kube.call("CoreV1Api", "list_namespaced_pod", kube.namespace, **selectors)
    return sorted(p.metadata.name for p in listing.items)


@pytest.mark.parametrize(("selector", "expected"), [
    ("tier=gpu", ["p1", "p2"]),
    ("tier==gpu", ["p1", "p2"]),
    ("tier!=gpu", ["p3"]),
    ("zone in (a,c)", ["p1"]),
    ("zone notin (a)", ["p2", "p3"]),
    ("zone", ["p1", "p2"]),
    ("!zone", ["p3"]),
    ("tier=gpu,zone!=a", ["p2"]),
])
async def test_label_selector_operators(kube: Kube, selector: str, expected: list[str]) -> None:
    await _pods(kube)
    assert await _names(kube, label_selector=selector) == expected


@pytest.mark.parametrize(("selector", "expected"), [
    ("spec.nodeName=node-2", ["p2", "p3"]),
    ("spec.nodeName!=node-2", ["p1"]),
    ("metadata.name==p1", ["p1"]),
    ("status.phase=Pending,spec.nodeName=node-1", ["p1"]),
])
async def test_field_selectors(kube: Kube, selector: str, expected: list[str]) -> None:
    await _pods(kube)
    assert await _names(kube, field_selector=selector) == expected


async def test_unsupported_field_label_is_400(kube: Kube) -> None:
    err = await kube.error("CoreV1Api", "list_namespaced_pod", kube.namespace,
                           field_selector="spec.priority=1")
    assert err.status == 400


async def test_malformed_label_selector_is_400(kube: Kube) -> None:
    err = await kube.error("CoreV1Api", "list_namespaced_pod", kube.namespace,
                           label_selector="tier in (gpu")
    assert err.status == 400
