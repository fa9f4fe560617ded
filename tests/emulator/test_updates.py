"""PUT replace and the status subresource: 409 on a stale resourceVersion, `.status`
untouched through the main resource, only `.status` through `/status`, and writes
that change nothing leaving the resourceVersion alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.emulator.kube import Kube

pytestmark = pytest.mark.anyio

AW = ("workload.codeflare.dev", "v1beta2")
READY = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"}


async def _node(kube: Kube) -> str:
    name = kube.name("node")
    kube.later("CoreV1Api", "delete_node", name)
    await kube.call("CoreV1Api", "create_node", {"metadata": {"name": name}})
    await kube.call("CoreV1Api", "patch_node_status", name, {"status": {"conditions": [READY]}})
    return name


async def test_replace_with_stale_resource_version_is_409(kube: Kube) -> None:
    await kube.call("CoreV1Api", "create_namespaced_config_map", kube.namespace,
                    {"metadata": {"name": "cm"}, "data": {"v": "1"}})
    stale = await kube.call("CoreV1Api", "read_namespaced_config_map", "cm", kube.namespace)
    fresh = await kube.call("CoreV1Api", "read_namespaced_config_map", "cm", kube.namespace)
    fresh.data = {"v": "2"}
    await kube.call("CoreV1Api", "replace_namespaced_config_map", "cm", kube.namespace, fresh)
    stale.data = {"v": "3"}
    err = await kube.error("CoreV1Api", "replace_namespaced_config_map", "cm", kube.namespace,
                           stale)
    assert err.status == 409 and "Conflict" in err.body
    now = await kube.call("CoreV1Api", "read_namespaced_config_map", "cm", kube.namespace)
    assert now.data == {"v": "2"}


async def _replace_node(kube: Kube, name: str, change: Callable[[Any], None]) -> Any:
    """Read, change, replace; again on 409 (a real cluster's node controllers write
    the Node too, as they would between any client's read and write)."""
    for _ in range(5):
        node = await kube.call("CoreV1Api", "read_node", name)
        change(node)
        err = await kube.error_or_none("CoreV1Api", "replace_node", name, node)
        if err is None:
            return await kube.call("CoreV1Api", "read_node", name)
        assert err.status == 409
    raise AssertionError("replace_node conflicted five times")


async def test_replace_never_changes_status(kube: Kube) -> None:
    name = await _node(kube)

    def change(node: Any) -> None:
        node.metadata.labels = {"healthd.io/x": "y"}
        node.status.conditions[0].status = "False"

    out = await _replace_node(kube, name, change)
    assert out.metadata.labels == {"healthd.io/x": "y"}
    assert out.status.conditions[0].status == "True"


async def test_status_subresource_changes_only_status(kube: Kube) -> None:
    name = await _node(kube)
    out = await kube.call("CoreV1Api", "patch_node_status", name, {
        "spec": {"unschedulable": True}, "status": {"conditions": [{**READY, "status": "False"}]}})
    assert out.status.conditions[0].status == "False"
    assert not (out.spec and out.spec.unschedulable)


async def test_emulator_status_writes_ignore_metadata(ekube: Kube) -> None:
    # Stricter than built-in kinds on a real server (which take label changes through
    # /status): product code must not rely on that, so the emulator refuses it.
    name = await _node(ekube)
    out = await ekube.call("CoreV1Api", "patch_node_status", name,
                           {"metadata": {"labels": {"sneaky": "yes"}}})
    assert not (out.metadata.labels or {}).get("sneaky")


async def test_custom_resource_status_isolation(ekube: Kube) -> None:
    ns = ekube.namespace
    await ekube.call("CustomObjectsApi", "create_namespaced_custom_object", *AW, ns,
                     "appwrappers", {"apiVersion": "workload.codeflare.dev/v1beta2",
                                     "kind": "AppWrapper", "metadata": {"name": "aw"},
                                     "spec": {"suspend": False}, "status": {"phase": "Bogus"}})
    aw = await ekube.call("CustomObjectsApi", "get_namespaced_custom_object", *AW, ns,
                          "appwrappers", "aw")
    assert "status" not in aw  # create ignores status when the kind has the subresource
    aw["status"] = {"phase": "Running"}
    aw["spec"]["suspend"] = True
    out = await ekube.call("CustomObjectsApi", "replace_namespaced_custom_object_status", *AW,
                           ns, "appwrappers", "aw", aw)
    assert out["status"] == {"phase": "Running"} and out["spec"]["suspend"] is False
    out = await ekube.call("CustomObjectsApi", "patch_namespaced_custom_object", *AW, ns,
                           "appwrappers", "aw", {"status": {"phase": "Failed"}})
    assert out["status"] == {"phase": "Running"}


async def test_write_that_changes_nothing_keeps_resource_version(kube: Kube) -> None:
    # A ConfigMap, not a Node: a real cluster's node controllers write Nodes meanwhile.
    await kube.call("CoreV1Api", "create_namespaced_config_map", kube.namespace,
                    {"metadata": {"name": "same", "labels": {"a": "1"}}})
    before = await kube.call("CoreV1Api", "read_namespaced_config_map", "same", kube.namespace)
    after = await kube.call("CoreV1Api", "patch_namespaced_config_map", "same", kube.namespace,
                            {"metadata": {"labels": {"a": "1"}}})
    assert after.metadata.resource_version == before.metadata.resource_version
