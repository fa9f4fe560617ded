"""Watch through `kubernetes.watch` and `kubernetes.aio.watch`: initial ADDED, resume
from a resourceVersion, 410 Expired after compaction, timeoutSeconds, bookmarks,
selector enter/leave as ADDED/DELETED, namespace scope, and the spellings of
`watch=` other clients send."""

from __future__ import annotations

import json
from collections.abc import Callable

import aiohttp
import pytest

from healthd.sim.apiserver import ApiEmulator
from tests.emulator.kube import Event, Kube, types_of

pytestmark = pytest.mark.anyio


# Every ConfigMap a test makes carries this label and the watches select it: a real
# cluster's root-CA publisher puts `kube-root-ca.crt` into each new namespace meanwhile.
OURS = "test.healthd.io/made"


def _count(n: int) -> Callable[[list[Event]], bool]:
    return lambda events: len(events) >= n


async def _cm(kube: Kube, name: str, namespace: str | None = None, **labels: str) -> None:
    await kube.call("CoreV1Api", "create_namespaced_config_map", namespace or kube.namespace,
                    {"metadata": {"name": name, "labels": {OURS: "yes", **labels}}})


async def _rv(kube: Kube) -> str:
    listing = await kube.call("CoreV1Api", "list_namespaced_config_map", kube.namespace)
    return listing.metadata.resource_version


async def test_watch_without_version_starts_with_added(kube: Kube) -> None:
    await _cm(kube, "a")
    await _cm(kube, "b")
    events = await kube.watch("CoreV1Api", "list_namespaced_config_map", kube.namespace,
                              label_selector=OURS, timeout_seconds=5, until=_count(2))
    assert sorted(types_of(events)) == [("ADDED", "a"), ("ADDED", "b")]
    assert events[0]["object"].metadata.name in ("a", "b")  # typed objects for both clients


async def test_resume_replays_only_later_events(kube: Kube) -> None:
    await _cm(kube, "old")
    rv = await _rv(kube)
    await _cm(kube, "new")
    await kube.call("CoreV1Api", "patch_namespaced_config_map", "new", kube.namespace,
                    {"data": {"k": "v"}})
    await kube.call("CoreV1Api", "delete_namespaced_config_map", "new", kube.namespace)
    events = await kube.watch("CoreV1Api", "list_namespaced_config_map", kube.namespace,
                              label_selector=OURS, resource_version=rv, timeout_seconds=5,
                              until=_count(3))
    assert types_of(events) == [("ADDED", "new"), ("MODIFIED", "new"), ("DELETED", "new")]


async def test_timeout_seconds_ends_the_stream(kube: Kube) -> None:
    await _cm(kube, "a")
    events = await kube.watch("CoreV1Api", "list_namespaced_config_map", kube.namespace,
                              timeout_seconds=1)
    assert ("ADDED", "a") in types_of(events)


async def test_selector_leave_is_deleted_and_enter_is_added(kube: Kube) -> None:
    await _cm(kube, "x", tier="gpu")
    rv = await _rv(kube)
    for tier in ("cpu", "gpu"):
        await kube.call("CoreV1Api", "patch_namespaced_config_map", "x", kube.namespace,
                        {"metadata": {"labels": {"tier": tier}}})
    events = await kube.watch("CoreV1Api", "list_namespaced_config_map", kube.namespace,
                              label_selector="tier=gpu", resource_version=rv,
                              timeout_seconds=5, until=_count(2))
    assert types_of(events) == [("DELETED", "x"), ("ADDED", "x")]


async def test_namespaced_watch_sees_only_its_namespace(kube: Kube) -> None:
    other = kube.name("other")
    await kube.call("CoreV1Api", "create_namespace", {"metadata": {"name": other}})
    kube.later("CoreV1Api", "delete_namespace", other)
    rv = await _rv(kube)
    await _cm(kube, "elsewhere", namespace=other)
    await _cm(kube, "here")
    events = await kube.watch("CoreV1Api", "list_namespaced_config_map", kube.namespace,
                              label_selector=OURS, resource_version=rv, timeout_seconds=5,
                              until=_count(1))
    assert types_of(events) == [("ADDED", "here")]


async def test_expired_version_is_410(emulator: ApiEmulator, ekube: Kube) -> None:
    await _cm(ekube, "a")
    rv = await _rv(ekube)
    await _cm(ekube, "b")
    emulator.compact()
    with pytest.raises(Exception) as info:
        await ekube.watch("CoreV1Api", "list_namespaced_config_map", ekube.namespace,
                          resource_version=rv, timeout_seconds=5)
    assert getattr(info.value, "status", None) == 410


async def test_a_watch_from_a_version_the_server_never_had_stays_silent(kube: Kube) -> None:
    # A restored or replaced server (versions started again) accepts the watch and
    # sends nothing, not even a bookmark, until its timeout ends it.
    await _cm(kube, "a")
    future = str(int(await _rv(kube)) + 10**7)
    await _cm(kube, "b")
    events = await kube.watch("CoreV1Api", "list_namespaced_config_map", kube.namespace,
                              resource_version=future, timeout_seconds=2,
                              allow_watch_bookmarks=True)
    assert events == []


async def test_a_list_from_a_version_the_server_never_had_is_504_too_large(
        kube: Kube) -> None:
    future = str(int(await _rv(kube)) + 10**7)
    error = await kube.error("CoreV1Api", "list_namespaced_config_map", kube.namespace,
                             resource_version=future, resource_version_match="NotOlderThan")
    assert error.status == 504
    causes = json.loads(error.body)["details"]["causes"]
    assert [c["reason"] for c in causes] == ["ResourceVersionTooLarge"]


async def test_bookmarks_carry_the_resource_version(ekube: Kube) -> None:
    await _cm(ekube, "a")
    events = await ekube.watch("CoreV1Api", "list_namespaced_config_map", ekube.namespace,
                               timeout_seconds=1, allow_watch_bookmarks=True)
    bookmarks = [e for e in events if e["type"] == "BOOKMARK"]
    assert bookmarks and bookmarks[-1]["raw_object"]["metadata"]["resourceVersion"].isdigit()


async def test_store_writes_reach_watchers(emulator: ApiEmulator, ekube: Kube) -> None:
    rv = str(emulator.resource_version)
    emulator.put({"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": "seeded", "namespace": ekube.namespace}})
    events = await ekube.watch("CoreV1Api", "list_namespaced_config_map", ekube.namespace,
                               resource_version=rv, timeout_seconds=5, until=_count(1))
    assert types_of(events) == [("ADDED", "seeded")]


@pytest.mark.parametrize("spelling", ["true", "True", "1"])
async def test_watch_query_spellings(emulator: ApiEmulator, spelling: str) -> None:
    emulator.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    url = f"{emulator.url}/api/v1/nodes?watch={spelling}&timeoutSeconds=1"
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        first = await resp.content.readline()
    assert b'"ADDED"' in first and b'"n1"' in first
