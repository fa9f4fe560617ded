"""Discovery: /version (with and without the slash), /api, /apis and resource lists,
a group/version switched off, and the dynamic client finding kinds through it."""

from __future__ import annotations

import anyio
import kubernetes.dynamic as dynamic
import pytest

from healthd.sim.apiserver import ApiEmulator
from tests.emulator.kube import Kube

pytestmark = pytest.mark.anyio


async def test_version_answers_both_clients(kube: Kube) -> None:
    # The sync client asks /version/ and the async one /version: both must answer.
    info = await kube.call("VersionApi", "get_code")
    assert info.major and info.git_version.startswith("v1.")


async def test_core_and_group_discovery(kube: Kube) -> None:
    versions = await kube.call("CoreApi", "get_api_versions")
    assert "v1" in versions.versions
    groups = {g.name: g for g in (await kube.call("ApisApi", "get_api_versions")).groups}
    assert {"batch", "coordination.k8s.io", "events.k8s.io"} <= set(groups)
    core = await kube.call("CoreV1Api", "get_api_resources")
    names = {r.name: r for r in core.resources}
    assert names["nodes"].namespaced is False and names["pods"].namespaced is True
    assert "nodes/status" in names and "configmaps/status" not in names


async def test_custom_groups_are_discoverable(emulator: ApiEmulator, ekube: Kube) -> None:
    groups = {g.name: g for g in (await ekube.call("ApisApi", "get_api_versions")).groups}
    kueue = groups["kueue.x-k8s.io"]
    assert kueue.preferred_version.version == "v1beta2"
    assert {v.version for v in kueue.versions} == {"v1beta1", "v1beta2"}
    listing = await ekube.call("CustomObjectsApi", "get_api_resources",
                               "workload.codeflare.dev", "v1beta2")
    assert {r.name for r in listing.resources} == {"appwrappers", "appwrappers/status"}


async def test_unserved_version_leaves_discovery_and_404s(emulator: ApiEmulator,
                                                          ekube: Kube) -> None:
    emulator.serve("kueue.x-k8s.io/v1beta2", False)
    groups = {g.name: g for g in (await ekube.call("ApisApi", "get_api_versions")).groups}
    assert [v.version for v in groups["kueue.x-k8s.io"].versions] == ["v1beta1"]
    err = await ekube.error("CustomObjectsApi", "list_cluster_custom_object",
                            "kueue.x-k8s.io", "v1beta2", "clusterqueues")
    assert err.status == 404
    listing = await ekube.call("CustomObjectsApi", "list_cluster_custom_object",
                               "kueue.x-k8s.io", "v1beta1", "clusterqueues")
    assert listing["items"] == []


async def test_dynamic_client_finds_kinds(emulator: ApiEmulator) -> None:
    def run() -> list[str]:
        with emulator.sync_client() as client:
            dyn = dynamic.DynamicClient(client)
            queues = dyn.resources.get(api_version="kueue.x-k8s.io/v1beta2", kind="ClusterQueue")
            queues.create(body={"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                                "metadata": {"name": "slack"}, "spec": {}})
            nodes = dyn.resources.get(api_version="v1", kind="Node")
            assert nodes.get().items == []
            return [q.metadata.name for q in queues.get().items]

    assert await anyio.to_thread.run_sync(run) == ["slack"]
