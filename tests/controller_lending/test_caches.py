"""The caches: synced only once the first full list is in, pods indexed by node and
by AppWrapper, only the slack queues kept, deleted objects dropped (also when the
watch had to relist after 410), Kueue version discovery, and no wait on Kueue for
the kinds resets decide from."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from healthd.controller.caches import RESET_KINDS, Caches
from healthd.kube.backoff import Backoff
from healthd.kube.client import Kube
from healthd.kube.conventions import APPWRAPPER_LABEL
from healthd.kube.kueue import KUEUE_V1BETA1, KUEUE_V1BETA2, choose_kueue
from healthd.sim.apiserver import ApiEmulator
from tests.controller_lending.helpers import (
    flavor,
    node,
    set_verdict,
    simple_queue,
    until,
)

pytestmark = pytest.mark.anyio

Change = tuple[str, str | None, str | None]


def pod(name: str, node_name: str = "", appwrapper: str | None = "aw-1",
        namespace: str = "team-a") -> dict[str, Any]:
    labels = {APPWRAPPER_LABEL: appwrapper} if appwrapper else {}
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "pause"}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels}, "spec": spec}


def names(objs: list[dict[str, Any]]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)


@asynccontextmanager
async def running(kube: Kube, wait: tuple[str, ...] | None = None,
                  slack: tuple[str, ...] = ("slack-cluster-queue",)
                  ) -> AsyncIterator[tuple[Caches, list[Change]]]:
    changes: list[Change] = []

    def record(kind: str, old: dict | None, new: dict | None) -> None:
        changes.append((kind, old and old["metadata"]["name"], new and new["metadata"]["name"]))

    caches = Caches(kube, slack_queues=slack, on_change=record,
                    backoff=Backoff(initial=0.05, maximum=0.2))
    async with anyio.create_task_group() as tg:
        tg.start_soon(caches.run)
        with anyio.fail_after(5):
            await caches.wait_synced(wait)
        yield caches, changes
        tg.cancel_scope.cancel()


async def test_synced_means_the_whole_first_list(api: ApiEmulator, kube: Kube) -> None:
    api.seed(*(node(f"n{i}") for i in range(50)), flavor("default-flavor"))
    async with running(kube) as (caches, changes):
        assert len(caches.nodes) == 50 and caches.synced
        assert len(caches.appwrappers) == 0 and caches.appwrappers.synced.is_set()
        assert sum(1 for kind, _, _ in changes if kind == "nodes") == 50


async def test_pods_indexed_by_node_and_appwrapper(api: ApiEmulator, kube: Kube) -> None:
    api.seed(pod("p1", "n1"), pod("p2", "n1", appwrapper="aw-2"), pod("p3", "n2"),
             pod("plain", "n1", appwrapper=None), pod("pending"))
    async with running(kube) as (caches, _):
        assert names(caches.pods_on_node("n1")) == ["p1", "p2"]  # the unlabelled pod is not kept
        assert names(caches.pods_of_appwrapper("team-a/aw-1")) == ["p1", "p3", "pending"]
        bound = pod("pending", "n2")  # the scheduler binds it
        api.put(bound)
        await until(lambda: names(caches.pods_on_node("n2")) == ["p3", "pending"])
        api.remove("Pod", "p1", "team-a")
        await until(lambda: names(caches.pods_on_node("n1")) == ["p2"])
        assert names(caches.pods_of_appwrapper("team-a/aw-1")) == ["p3", "pending"]


async def test_only_slack_queues_are_kept(api: ApiEmulator, kube: Kube) -> None:
    api.seed(simple_queue(name="team-a"), simple_queue(name="slack-cluster-queue"))
    async with running(kube) as (caches, _):
        assert list(caches.clusterqueues.keys()) == ["slack-cluster-queue"]


async def test_changes_reach_the_callback(api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("n1"))
    async with running(kube) as (caches, changes):
        changes.clear()
        set_verdict(api, "n1", "EVICT")
        await until(lambda: ("nodes", "n1", "n1") in changes)
        assert caches.nodes.get("n1")["metadata"]["labels"]["autopilot.ibm.com/gpuhealth"] \
            == "EVICT"
        api.remove("Node", "n1")
        await until(lambda: ("nodes", "n1", None) in changes)
        assert "n1" not in caches.nodes


async def test_relist_after_expiry_drops_what_vanished(api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("n1"), node("n2"))
    async with running(kube) as (caches, changes):
        await api.go_away()
        api.remove("Node", "n1")
        api.seed(node("n3"))
        api.compact()  # the watch's resourceVersion is gone: 410, relist
        await api.come_back()
        await until(lambda: sorted(caches.nodes.keys()) == ["n2", "n3"], timeout=10)
        assert ("nodes", "n1", None) in changes


def beating(name: str, at: str, **labels: str) -> dict[str, Any]:
    obj = node(name, labels=labels)
    obj["status"]["conditions"] = [{"type": "Ready", "status": "True",
                                    "lastHeartbeatTime": at}]
    return obj


async def test_a_relist_keeps_what_it_holds_of_what_did_not_change(
        api: ApiEmulator, kube: Kube) -> None:
    api.seed(*(beating(n, "00:00") for n in ("n1", "n2", "n3")))
    async with running(kube) as (caches, changes):
        held = {key: caches.nodes.get(key) for key in ("n1", "n2", "n3")}
        before = len(changes)
        await api.go_away()
        api.put(beating("n2", "00:00", moved="yes"))
        api.put(beating("n3", "00:30"))  # a heartbeat only
        version = api.resource_version
        api.compact()  # the watch's resourceVersion is gone: 410, relist
        await api.come_back()
        await until(lambda: len(changes) > before, timeout=10)
        await anyio.sleep(0.2)
        # Only the change the caches read reached a handler; the relist built no
        # second copy of the nodes it already held (n3 only took its new version).
        assert changes[before:] == [("nodes", "n2", "n2")]
        assert caches.nodes.get("n1") is held["n1"] and caches.nodes.get("n3") is held["n3"]
        assert caches.nodes.get("n3")["metadata"]["resourceVersion"] == str(version)


async def test_kueue_absent_does_not_block_reset_kinds(api: ApiEmulator, kube: Kube) -> None:
    api.serve("kueue.x-k8s.io/v1beta2", False)
    api.serve("kueue.x-k8s.io/v1beta1", False)
    api.seed(node("n1"))
    async with running(kube, wait=RESET_KINDS) as (caches, _):
        assert "n1" in caches.nodes
        await anyio.sleep(0.1)
        assert caches.kueue is None and not caches.clusterqueues.synced.is_set()
        api.serve("kueue.x-k8s.io/v1beta1", True)  # Kueue installed later
        await until(lambda: caches.clusterqueues.synced.is_set(), timeout=10)
        assert caches.kueue == KUEUE_V1BETA1


def test_choose_kueue() -> None:
    def group(*versions: str) -> dict[str, Any]:
        return {"versions": [{"groupVersion": f"kueue.x-k8s.io/{v}", "version": v}
                             for v in versions]}

    assert choose_kueue(group("v1beta1", "v1beta2")) == KUEUE_V1BETA2
    assert choose_kueue(group("v1beta1")) == KUEUE_V1BETA1
    assert choose_kueue(group("v1alpha1")) is None
    assert choose_kueue({"versions": "garbage"}) is None
    assert KUEUE_V1BETA1.cohort_field == "cohort" and KUEUE_V1BETA2.cohort_field == "cohortName"


async def test_the_caches_keep_no_managed_fields(api: ApiEmulator, kube: Kube) -> None:
    managed = [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {}}}}]
    seeded = node("n1", verdict="PASS")
    seeded["metadata"]["managedFields"] = managed
    bound = pod("p1", "n1")
    bound["metadata"]["managedFields"] = managed
    api.seed(seeded, bound)
    async with running(kube) as (caches, _):
        cached = caches.nodes.get("n1")
        assert cached is not None and "managedFields" not in cached["metadata"]
        assert cached["metadata"]["labels"]["autopilot.ibm.com/gpuhealth"] == "PASS"
        assert all("managedFields" not in p["metadata"] for p in caches.pods_on_node("n1"))
    server_copy = api.get("Node", "n1")
    assert server_copy is not None and server_copy["metadata"]["managedFields"] == managed
