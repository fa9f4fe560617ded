"""etcd restored from a backup, as the emulator plays it (`snapshot()`, `restore()`):
objects and versions go back to the backup's, the versions clients saw come round
again with other content, older watches get 410 and open ones are cut off; and how
the API server answers a list from a version it has not reached: it waits for it
(3 s on a real one), then refuses with 504 ResourceVersionTooLarge."""

from __future__ import annotations

import json

import aiohttp
import anyio
import pytest

from healthd.sim.apiserver import ApiEmulator
from tests.emulator.kube import Kube

pytestmark = pytest.mark.anyio

CM = {"apiVersion": "v1", "kind": "ConfigMap"}


def _cm(api: ApiEmulator, name: str, **data: str) -> dict[str, object]:
    return api.put({**CM, "metadata": {"name": name, "namespace": "default"}, "data": data})


def _rv(obj: dict[str, object] | None) -> str:
    assert obj is not None
    return str(obj["metadata"]["resourceVersion"])  # type: ignore[index]


async def test_a_restore_brings_back_the_backup_and_its_versions(emulator: ApiEmulator,
                                                                 ekube: Kube) -> None:
    kept = _cm(emulator, "kept", step="backup")
    backup = emulator.snapshot()
    _cm(emulator, "kept", step="after")
    _cm(emulator, "later")
    seen = emulator.resource_version

    emulator.restore(backup)

    restored = emulator.get("ConfigMap", "kept", "default")
    assert restored is not None and restored["data"] == {"step": "backup"}
    assert _rv(restored) == _rv(kept)
    assert emulator.get("ConfigMap", "later", "default") is None
    listing = await ekube.call("CoreV1Api", "list_namespaced_config_map", "default")
    assert listing.metadata.resource_version == str(backup.rv)
    # Writes continue from the backup's revision: a version a client saw before the
    # restore now names other content.
    again = _cm(emulator, "other")
    assert int(_rv(again)) == backup.rv + 1 <= seen


async def test_a_watch_from_before_the_backup_is_410(emulator: ApiEmulator, ekube: Kube) -> None:
    before = str(emulator.resource_version)
    _cm(emulator, "a")
    emulator.restore(emulator.snapshot())
    with pytest.raises(Exception) as info:
        await ekube.watch("CoreV1Api", "list_namespaced_config_map", "default",
                          resource_version=before, timeout_seconds=2)
    assert getattr(info.value, "status", None) == 410


async def test_a_restore_cuts_open_watches_off(emulator: ApiEmulator) -> None:
    _cm(emulator, "a")
    backup = emulator.snapshot()
    url = f"{emulator.url}/api/v1/configmaps?watch=true&timeoutSeconds=30"
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        assert b'"ADDED"' in await resp.content.readline()
        emulator.restore(backup)
        with anyio.fail_after(5), pytest.raises(aiohttp.ClientPayloadError):
            await resp.content.read()


async def test_a_one_item_list_tells_the_current_version(kube: Kube) -> None:
    # What a watch asks after a broken stream: the collection's version now, not
    # that of the item it returns (any selection, even an empty one, will do).
    await kube.call("CoreV1Api", "create_namespaced_config_map", kube.namespace,
                    {"metadata": {"name": kube.name("first")}})
    made = await kube.call("CoreV1Api", "create_namespaced_config_map", kube.namespace,
                           {"metadata": {"name": kube.name("second")}})
    listing = await kube.call("CoreV1Api", "list_namespaced_config_map", kube.namespace,
                              limit=1, label_selector="test.healthd.io/none=x")
    assert listing.items == []
    assert int(listing.metadata.resource_version) >= int(made.metadata.resource_version)


async def test_a_list_from_a_version_reached_while_it_waits_is_answered(kube: Kube) -> None:
    listing = await kube.call("CoreV1Api", "list_namespaced_config_map", kube.namespace)
    ahead = str(int(listing.metadata.resource_version) + 1)
    answers: list[object] = []

    async def list_ahead() -> None:
        answers.append(await kube.error_or_none(
            "CoreV1Api", "list_namespaced_config_map", kube.namespace,
            resource_version=ahead, resource_version_match="NotOlderThan"))

    async with anyio.create_task_group() as group:
        group.start_soon(list_ahead)
        await anyio.sleep(0.3)  # the list is waiting for the version by now
        await kube.call("CoreV1Api", "create_namespaced_config_map", kube.namespace,
                        {"metadata": {"name": kube.name("reaches")}})
    assert answers == [None]


async def test_a_list_from_a_version_never_reached_waits_then_is_504() -> None:
    async with ApiEmulator(too_large_wait_s=0.5) as api:
        ahead = api.resource_version + 5
        url = f"{api.url}/api/v1/configmaps?resourceVersion={ahead}" \
              "&resourceVersionMatch=NotOlderThan"
        async with aiohttp.ClientSession() as session:
            started = anyio.current_time()
            async with session.get(url) as resp:
                body = json.loads(await resp.text())
            waited = anyio.current_time() - started
    assert resp.status == 504 and body["reason"] == "Timeout"
    assert [c["reason"] for c in body["details"]["causes"]] == ["ResourceVersionTooLarge"]
    assert waited >= 0.5  # it waited for the version before refusing
