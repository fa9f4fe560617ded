"""PATCH in the three flavours the client sends: merge (null deletes), JSON patch with
`test` (422 on failure, nothing written; `null` tests that a member is absent),
strategic merge (conditions by type, containers by name, taints replaced whole; 415 on
custom resources), and 409 on a
stale resourceVersion in the patch; 422 FieldValueTooLong when the annotations together
pass 256 KiB."""

from __future__ import annotations

import json

import pytest

from tests.emulator.kube import Kube

pytestmark = pytest.mark.anyio

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
SMP = "application/strategic-merge-patch+json"
AW = ("workload.codeflare.dev", "v1beta2")


async def _node(kube: Kube, **metadata: object) -> str:
    name = kube.name("node")
    kube.later("CoreV1Api", "delete_node", name)
    await kube.call("CoreV1Api", "create_node", {"metadata": {"name": name, **metadata}})
    return name


async def test_merge_patch_null_deletes(kube: Kube) -> None:
    name = await _node(kube, labels={"a": "1", "b": "2"})
    out = await kube.call("CoreV1Api", "patch_node", name,
                          {"metadata": {"labels": {"a": None, "c": "3"}}}, _content_type=MERGE)
    assert out.metadata.labels == {"b": "2", "c": "3"}


async def test_json_patch_with_passing_test_applies(kube: Kube) -> None:
    name = await _node(kube, annotations={"healthd.io/run": "all"})
    out = await kube.call("CoreV1Api", "patch_node", name, [
        {"op": "test", "path": "/metadata/annotations/healthd.io~1run", "value": "all"},
        {"op": "remove", "path": "/metadata/annotations/healthd.io~1run"}])
    assert "healthd.io/run" not in (out.metadata.annotations or {})


async def test_json_patch_failing_test_is_422_and_writes_nothing(kube: Kube) -> None:
    name = await _node(kube, annotations={"healthd.io/run": "newer"})
    err = await kube.error("CoreV1Api", "patch_node", name, [
        {"op": "test", "path": "/metadata/annotations/healthd.io~1run", "value": "all"},
        {"op": "remove", "path": "/metadata/annotations/healthd.io~1run"}])
    assert err.status == 422 and json.loads(err.body)["kind"] == "Status"
    node = await kube.call("CoreV1Api", "read_node", name)
    # Only our key: a real cluster's node TTL controller adds its own annotation.
    assert node.metadata.annotations["healthd.io/run"] == "newer"


async def test_json_patch_test_of_null_passes_on_an_absent_member_only(kube: Kube) -> None:
    """What guards a first write of an annotation (healthd.controller.repairs): a
    `test` of `null` passes where the member is absent and fails where it is set."""
    name = await _node(kube, annotations={"healthd.io/run": "all"})
    pointer = "/metadata/annotations/healthd.io~1repair"
    out = await kube.call("CoreV1Api", "patch_node", name, [
        {"op": "test", "path": pointer, "value": None},
        {"op": "add", "path": pointer, "value": "first"}])
    assert out.metadata.annotations["healthd.io/repair"] == "first"
    err = await kube.error("CoreV1Api", "patch_node", name, [
        {"op": "test", "path": pointer, "value": None},
        {"op": "add", "path": pointer, "value": "second"}])
    assert err.status == 422
    node = await kube.call("CoreV1Api", "read_node", name)
    assert node.metadata.annotations["healthd.io/repair"] == "first"


async def test_json_patch_on_custom_resource_status(ekube: Kube) -> None:
    ns = ekube.namespace
    await ekube.call("CustomObjectsApi", "create_namespaced_custom_object", *AW, ns,
                     "appwrappers", {"apiVersion": "workload.codeflare.dev/v1beta2",
                                     "kind": "AppWrapper", "metadata": {"name": "aw"}})
    await ekube.call("CustomObjectsApi", "patch_namespaced_custom_object_status", *AW, ns,
                     "appwrappers", "aw", {"status": {"phase": "Running"}})
    reset = [{"op": "test", "path": "/status/phase", "value": "Running"},
             {"op": "replace", "path": "/status/phase", "value": "Resetting"}]
    out = await ekube.call("CustomObjectsApi", "patch_namespaced_custom_object_status", *AW, ns,
                           "appwrappers", "aw", reset, _content_type=JSON_PATCH)
    assert out["status"]["phase"] == "Resetting"
    err = await ekube.error("CustomObjectsApi", "patch_namespaced_custom_object_status", *AW,
                            ns, "appwrappers", "aw", reset, _content_type=JSON_PATCH)
    assert err.status == 422


async def test_strategic_merge_merges_conditions_by_type(kube: Kube) -> None:
    name = await _node(kube)
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"}
    await kube.call("CoreV1Api", "patch_node_status", name, {"status": {"conditions": [ready]}})
    gpu = {"type": "GPUUnhealthy", "status": "False", "reason": "AllChecksPassed", "message": ""}
    out = await kube.call("CoreV1Api", "patch_node_status", name,
                          {"status": {"conditions": [gpu]}})
    # The real server's order: the patch's new item first (what `describe node` lists).
    assert [c.type for c in out.status.conditions] == ["GPUUnhealthy", "Ready"]
    out = await kube.call("CoreV1Api", "patch_node_status", name,
                          {"status": {"conditions": [{**gpu, "status": "True"}]}})
    assert {c.type: c.status for c in out.status.conditions} == {
        "Ready": "True", "GPUUnhealthy": "True"}


async def test_strategic_merge_replaces_taints_whole(kube: Kube) -> None:
    name = await _node(kube)
    other = {"key": "other.io/maintenance", "effect": "NoSchedule"}
    ours = {"key": "healthd.io/unhealthy", "effect": "NoExecute"}
    await kube.call("CoreV1Api", "patch_node", name, {"spec": {"taints": [other]}})
    out = await kube.call("CoreV1Api", "patch_node", name, {"spec": {"taints": [ours]}})
    assert [t.key for t in out.spec.taints] == ["healthd.io/unhealthy"]


async def test_strategic_merge_merges_containers_by_name(kube: Kube) -> None:
    containers = [{"name": "a", "image": "busybox:1"}, {"name": "b", "image": "busybox:1"}]
    await kube.call("CoreV1Api", "create_namespaced_pod", kube.namespace,
                    {"metadata": {"name": "p"}, "spec": {"containers": containers}})
    out = await kube.call("CoreV1Api", "patch_namespaced_pod", "p", kube.namespace,
                          {"spec": {"containers": [{"name": "b", "image": "busybox:2"}]}})
    assert [(c.name, c.image) for c in out.spec.containers] == [
        ("a", "busybox:1"), ("b", "busybox:2")]


async def test_strategic_merge_on_custom_resource_is_415(ekube: Kube) -> None:
    await ekube.call("CustomObjectsApi", "create_cluster_custom_object", "kueue.x-k8s.io",
                     "v1beta2", "resourceflavors",
                     {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                      "metadata": {"name": "gpu"}})
    err = await ekube.error("CustomObjectsApi", "patch_cluster_custom_object", "kueue.x-k8s.io",
                            "v1beta2", "resourceflavors", "gpu", {"spec": {}},
                            _content_type=SMP)
    assert err.status == 415


async def test_patch_with_stale_resource_version_is_409(kube: Kube) -> None:
    name = await _node(kube)
    node = await kube.call("CoreV1Api", "read_node", name)
    stale = node.metadata.resource_version
    await kube.call("CoreV1Api", "patch_node", name, {"metadata": {"labels": {"x": "1"}}})
    err = await kube.error("CoreV1Api", "patch_node", name,
                           {"metadata": {"resourceVersion": stale, "labels": {"x": "2"}}},
                           _content_type=MERGE)
    assert err.status == 409


async def test_annotations_past_256_kib_together_are_refused_as_the_real_server_does(
        kube: Kube) -> None:
    name = await _node(kube, annotations={"a.example/big": "x" * 200_000})
    err = await kube.error("CoreV1Api", "patch_node", name,
                           {"metadata": {"annotations": {"b.example/big": "y" * 70_000}}},
                           _content_type=MERGE)
    assert err.status == 422
    body = json.loads(err.body)
    assert "metadata.annotations: Too long: may not be more than 262144 bytes" in body["message"]
    # The real server lists the same cause once per validation pass that sees it.
    assert {(c["reason"], c["field"]) for c in body["details"]["causes"]} == {
        ("FieldValueTooLong", "metadata.annotations")}
    out = await kube.call("CoreV1Api", "read_node", name)
    assert "b.example/big" not in out.metadata.annotations  # nothing written
