"""Create, get, list and delete through the typed and custom-object APIs: metadata the
server fills in, generateName, 201 on create (the client drops a CR body otherwise),
409 AlreadyExists, 404, list kind/resourceVersion, Status vs object on delete,
finalizers, Events through both APIs sharing one storage, and the real server's
namespace rules for Events.

Against a real server, controllers write too (the node TTL controller annotates a new
Node, the PVC protection controller holds a PVC's deletion a moment): a round trip
compares identity, not byte equality, and waits for a deletion to finish."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import anyio
import pytest

from tests.emulator.kube import Kube

pytestmark = pytest.mark.anyio

CONTAINERS = {"containers": [{"name": "c", "image": "busybox"}]}
# A MicroTime with non-zero microseconds: client 37 turns the string into a datetime
# and sends `isoformat()`, which drops a zero fraction (the real server then answers 400).
EVENT_TIME = "2026-01-01T00:00:00.123456Z"
DELETED_WITHIN_S = 10.0


@dataclass(frozen=True)
class Case:
    api: str
    suffix: str  # e.g. "namespaced_pod" -> create_namespaced_pod, read_..., list_...
    namespaced: bool
    body: dict[str, Any]

    def __str__(self) -> str:
        return f"{self.api}.{self.suffix}"


CASES = [
    Case("CoreV1Api", "namespaced_pod", True, {"spec": CONTAINERS}),
    Case("CoreV1Api", "namespaced_event", True,
         {"involvedObject": {"kind": "Pod", "name": "p1"}, "reason": "Test", "message": "m"}),
    Case("CoreV1Api", "namespaced_persistent_volume_claim", True,
         {"spec": {"accessModes": ["ReadWriteOnce"],
                   "resources": {"requests": {"storage": "1Gi"}}}}),
    Case("CoreV1Api", "namespaced_service", True, {"spec": {"ports": [{"port": 80}]}}),
    Case("CoreV1Api", "namespaced_endpoints", True, {"subsets": []}),
    Case("CoreV1Api", "namespaced_config_map", True, {"data": {"k": "v"}}),
    Case("CoreV1Api", "node", False, {"spec": {}}),
    Case("EventsV1Api", "namespaced_event", True,
         {"eventTime": EVENT_TIME, "reportingController": "healthd.io/agent",
          "reportingInstance": "a", "action": "Check", "reason": "Test", "type": "Normal",
          "note": "n", "regarding": {"kind": "Pod", "name": "p1"}}),
    Case("BatchV1Api", "namespaced_job", True,
         {"spec": {"template": {"spec": {**CONTAINERS, "restartPolicy": "Never"}}}}),
    Case("CoordinationV1Api", "namespaced_lease", True, {"spec": {"holderIdentity": "a"}}),
    Case("StorageV1Api", "storage_class", False, {"provisioner": "example.com/none"}),
    Case("DiscoveryV1Api", "namespaced_endpoint_slice", True,
         {"addressType": "IPv4", "endpoints": []}),
]


def _body(kube: Kube, case: Case, name: str) -> dict[str, Any]:
    """The case's object named `name`; an Event's object lives in the test's namespace."""
    body: dict[str, Any] = {"metadata": {"name": name}, **case.body}
    for ref in ("involvedObject", "regarding"):
        if ref in body:
            body[ref] = {**body[ref], "namespace": kube.namespace}
    return body


async def _gone(kube: Kube, api: str, method: str, *args: Any) -> int:
    """The status of reading a deleted object once it is gone (a finalizer the
    server's own controllers remove may hold it a moment)."""
    with anyio.fail_after(DELETED_WITHIN_S):
        while True:
            err = await kube.error_or_none(api, method, *args)
            if err is not None:
                return int(err.status)
            await anyio.sleep(0.1)


def _in_ns(kube: Kube, case: Case, *rest: Any) -> tuple[Any, ...]:
    """create/list arguments: the namespace comes first."""
    return (kube.namespace, *rest) if case.namespaced else rest


def _named(kube: Kube, case: Case, name: str) -> tuple[Any, ...]:
    """read/delete arguments: the name, then the namespace."""
    return (name, kube.namespace) if case.namespaced else (name,)


@pytest.mark.parametrize("case", CASES, ids=str)
async def test_every_kind_round_trips(kube: Kube, case: Case) -> None:
    name = kube.name("obj")
    if not case.namespaced:
        kube.later(case.api, f"delete_{case.suffix}", name)
    created = await kube.call(case.api, f"create_{case.suffix}",
                              *_in_ns(kube, case, _body(kube, case, name)))
    assert created.metadata.name == name and created.metadata.uid
    if case.namespaced:
        assert created.metadata.namespace == kube.namespace
    read = await kube.call(case.api, f"read_{case.suffix}", *_named(kube, case, name))
    assert read.metadata.uid == created.metadata.uid
    assert int(read.metadata.resource_version) >= int(created.metadata.resource_version)
    listing = await kube.call(case.api, f"list_{case.suffix}", *_in_ns(kube, case))
    assert name in [item.metadata.name for item in listing.items]
    assert int(listing.metadata.resource_version) >= int(created.metadata.resource_version)
    # Background, as healthd deletes: batch/v1 Jobs otherwise default to orphaning.
    await kube.call(case.api, f"delete_{case.suffix}", *_named(kube, case, name),
                    propagation_policy="Background")
    assert await _gone(kube, case.api, f"read_{case.suffix}", *_named(kube, case, name)) == 404


async def test_create_fills_in_metadata_from_the_server(kube: Kube) -> None:
    pod = await kube.call("CoreV1Api", "create_namespaced_pod", kube.namespace,
                          {"metadata": {"generateName": "worker-"}, "spec": CONTAINERS})
    meta = pod.metadata
    assert meta.name.startswith("worker-") and len(meta.name) == len("worker-") + 5
    assert meta.namespace == kube.namespace  # from the URL, not the body
    assert meta.uid and meta.creation_timestamp is not None
    assert meta.resource_version.isdigit()


async def test_resource_version_is_one_counter_across_kinds(kube: Kube) -> None:
    first = await kube.call("CoreV1Api", "create_namespaced_config_map", kube.namespace,
                            {"metadata": {"name": "a"}})
    second = await kube.call("CoordinationV1Api", "create_namespaced_lease", kube.namespace,
                             {"metadata": {"name": "b"}})
    assert int(second.metadata.resource_version) > int(first.metadata.resource_version)


async def test_duplicate_create_is_409_already_exists(kube: Kube) -> None:
    body = {"metadata": {"name": "dup"}}
    await kube.call("CoreV1Api", "create_namespaced_config_map", kube.namespace, body)
    err = await kube.error("CoreV1Api", "create_namespaced_config_map", kube.namespace, body)
    assert err.status == 409 and "AlreadyExists" in err.body


async def test_create_without_a_name_is_422(kube: Kube) -> None:
    err = await kube.error("CoreV1Api", "create_namespaced_config_map", kube.namespace,
                           {"metadata": {}})
    assert err.status == 422


async def test_namespace_in_body_must_match_the_url(kube: Kube) -> None:
    err = await kube.error("CoreV1Api", "create_namespaced_config_map", kube.namespace,
                           {"metadata": {"name": "x", "namespace": "elsewhere"}})
    assert err.status == 400


async def test_custom_resource_create_returns_the_body(ekube: Kube) -> None:
    aw = await ekube.call(
        "CustomObjectsApi", "create_namespaced_custom_object", "workload.codeflare.dev",
        "v1beta2", ekube.namespace, "appwrappers",
        {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
         "metadata": {"generateName": "job-"}, "spec": {"components": []}})
    assert aw["metadata"]["name"].startswith("job-") and aw["metadata"]["uid"]
    cq = await ekube.call(
        "CustomObjectsApi", "create_cluster_custom_object", "kueue.x-k8s.io", "v1beta2",
        "clusterqueues", {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                          "metadata": {"name": "slack"}, "spec": {"cohortName": "all"}})
    assert cq["kind"] == "ClusterQueue" and "namespace" not in cq["metadata"]
    listing = await ekube.call("CustomObjectsApi", "list_namespaced_custom_object",
                               "workload.codeflare.dev", "v1beta2", ekube.namespace,
                               "appwrappers")
    assert listing["kind"] == "AppWrapperList"
    assert listing["apiVersion"] == "workload.codeflare.dev/v1beta2"
    assert int(listing["metadata"]["resourceVersion"]) >= int(aw["metadata"]["resourceVersion"])


async def test_kueue_versions_share_one_object(ekube: Kube) -> None:
    await ekube.call("CustomObjectsApi", "create_cluster_custom_object", "kueue.x-k8s.io",
                     "v1beta2", "clusterqueues",
                     {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                      "metadata": {"name": "q"}, "spec": {"cohortName": "all"}})
    old = await ekube.call("CustomObjectsApi", "get_cluster_custom_object", "kueue.x-k8s.io",
                           "v1beta1", "clusterqueues", "q")
    assert old["apiVersion"] == "kueue.x-k8s.io/v1beta1"
    assert old["spec"] == {"cohort": "all"}


async def test_delete_answers_status_or_object_by_kind(kube: Kube) -> None:
    await kube.call("CoreV1Api", "create_namespaced_config_map", kube.namespace,
                    {"metadata": {"name": "cm"}})
    status = await kube.call("CoreV1Api", "delete_namespaced_config_map", "cm", kube.namespace)
    assert status["kind"] == "Status" and status["status"] == "Success"
    await kube.call("CoreV1Api", "create_namespaced_pod", kube.namespace,
                    {"metadata": {"name": "p"}, "spec": CONTAINERS})
    pod = await kube.call("CoreV1Api", "delete_namespaced_pod", "p", kube.namespace,
                          grace_period_seconds=0)
    assert pod.metadata.name == "p"


async def test_finalizers_hold_deletion_until_removed(kube: Kube) -> None:
    await kube.call("CoreV1Api", "create_namespaced_config_map", kube.namespace,
                    {"metadata": {"name": "held", "finalizers": ["healthd.io/test"]}})
    await kube.call("CoreV1Api", "delete_namespaced_config_map", "held", kube.namespace)
    held = await kube.call("CoreV1Api", "read_namespaced_config_map", "held", kube.namespace)
    assert held.metadata.deletion_timestamp is not None
    await kube.call("CoreV1Api", "patch_namespaced_config_map", "held", kube.namespace,
                    {"metadata": {"finalizers": None}},
                    _content_type="application/merge-patch+json")
    err = await kube.error("CoreV1Api", "read_namespaced_config_map", "held", kube.namespace)
    assert err.status == 404


async def test_events_of_both_apis_share_storage(kube: Kube) -> None:
    await kube.call("EventsV1Api", "create_namespaced_event", kube.namespace, {
        "metadata": {"name": "ev1"}, "eventTime": EVENT_TIME,
        "reportingController": "healthd.io/agent", "reportingInstance": "node-1",
        "action": "Check", "reason": "GPUUnhealthy", "type": "Warning", "note": "XID 79",
        "regarding": {"kind": "Pod", "name": "job-0", "namespace": kube.namespace}})
    core = await kube.call("CoreV1Api", "read_namespaced_event", "ev1", kube.namespace)
    assert core.message == "XID 79" and core.involved_object.name == "job-0"
    assert core.reason == "GPUUnhealthy"


NODE_EVENT = {"involvedObject": {"kind": "Node", "name": "gpu-node-1"},
              "reason": "GPUUnhealthy", "message": "XID 79", "type": "Warning"}


async def test_an_event_about_a_node_lives_in_default(kube: Kube) -> None:
    """healthd posts a Node's Events in `default`; anywhere else the server refuses."""
    name = kube.name("ev")
    kube.later("CoreV1Api", "delete_namespaced_event", name, "default")
    made = await kube.call("CoreV1Api", "create_namespaced_event", "default",
                           {"metadata": {"name": name}, **NODE_EVENT})
    assert made.involved_object.name == "gpu-node-1"
    err = await kube.error("CoreV1Api", "create_namespaced_event", kube.namespace,
                           {"metadata": {"name": name}, **NODE_EVENT})
    assert err.status == 422
    body = json.loads(err.body)
    assert body["message"] == (f'Event "{name}" is invalid: involvedObject.namespace: '
                               'Invalid value: "": does not match event.namespace')
    assert [c["field"] for c in body["details"]["causes"]] == ["involvedObject.namespace"]


async def test_an_event_lives_in_its_objects_namespace(kube: Kube) -> None:
    err = await kube.error("CoreV1Api", "create_namespaced_event", kube.namespace, {
        "metadata": {"name": "ev"}, "reason": "Reset", "message": "m",
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": "elsewhere"}})
    assert err.status == 422 and "does not match event.namespace" in err.body


async def test_a_new_style_event_needs_who_reported_what(kube: Kube) -> None:
    err = await kube.error("EventsV1Api", "create_namespaced_event", kube.namespace, {
        "metadata": {"name": "ev"}, "eventTime": EVENT_TIME, "type": "Normal",
        "regarding": {"kind": "Pod", "name": "p", "namespace": kube.namespace}})
    assert err.status == 422
    causes = [(c["field"], c["message"]) for c in json.loads(err.body)["details"]["causes"]]
    assert causes == [
        ("reportingController", "Required value"),
        ("reportingController", 'Invalid value: "": name part must be non-empty'),
        ("reportingController", 'Invalid value: "": name part must consist of alphanumeric '
         "characters, '-', '_' or '.', and must start and end with an alphanumeric character"
         " (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
         "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"),
        ("reportingInstance", "Required value"), ("action", "Required value"),
        ("reason", "Required value")]
