"""`watch_forever` on a server whose history moved back (etcd restored from a backup):
versions go back below the ones the watch saw, and what the restored server holds
must still reach the consumer, compared by content, not by version.

- a watch that comes back to the restored server first (the usual case: the restore
  restarted the API server) notices at once, without waiting for its period;
- with `reread`, a watch relists at the end of every stream, so it sees the restored
  copy even when the server passed its version before it came back, and even when
  that copy has the very version of the one it saw;
- `Rewinds` shared by several watches: a notice from anyone makes every one relist.

The watch periods here are long (600 s) unless the test needs them short, so nothing
passes by waiting for a period to end."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from healthd.kube.backoff import Backoff
from healthd.kube.client import Kube
from healthd.kube.objects import NODES, PODS, Resource
from healthd.kube.watching import Rewinds, WatchEvent, watch_forever
from healthd.sim.apiserver import ApiEmulator
from tests.kube.conftest import churn, node, pod
from tests.kube.test_watching import until

pytestmark = pytest.mark.anyio

LONG_S = 600
Seen = list[WatchEvent]


@asynccontextmanager
async def following(kube: Kube, res: Resource = PODS, **kwargs: Any) -> AsyncIterator[Seen]:
    """`watch_forever` in the background; yields the growing list of events."""
    seen: Seen = []

    async def consume() -> None:
        async for event in watch_forever(kube, res, backoff=Backoff(initial=0.02, maximum=0.1),
                                         **{"timeout_s": LONG_S, **kwargs}):
            seen.append(event)

    async with anyio.create_task_group() as group:
        group.start_soon(consume)
        yield seen
        group.cancel_scope.cancel()


def named(events: Seen) -> list[tuple[str, str]]:
    return [(e.type, e.object["metadata"]["name"]) for e in events]


def labels(event: WatchEvent) -> dict[str, str]:
    return dict(event.object["metadata"].get("labels") or {})


async def test_a_watch_coming_back_to_a_restored_server_relists_at_once(
        api: ApiEmulator, kube: Kube, caplog: pytest.LogCaptureFixture) -> None:
    api.seed(pod("a", labels={"app": "x", "step": "backup"}))
    backup = api.snapshot()
    async with following(kube, label_selector="app=x") as seen:
        await until(lambda: len(seen) == 1)
        api.put(pod("a", labels={"app": "x", "step": "after"}))
        api.seed(pod("b", labels={"app": "x"}))
        await until(lambda: len(seen) == 3)
        with caplog.at_level(logging.WARNING, "healthd.kube.watching"):
            api.restore(backup)
            await until(lambda: len(seen) == 5)
    assert sorted(named(seen[3:])) == [("DELETED", "b"), ("MODIFIED", "a")]
    restored = next(e for e in seen[3:] if e.type == "MODIFIED")
    assert labels(restored) == {"app": "x", "step": "backup"}
    assert "history moved back" in caplog.text
    # The question was one item of the watch's own selection (what it may read).
    probes = [r for r in api.requests_to("GET", "/api/v1/pods") if r.query.get("limit") == "1"]
    assert [(p.query["limit"], p.query.get("labelSelector")) for p in probes] == [("1", "app=x")]


async def test_reread_sees_a_restored_copy_the_server_passed_by(
        api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("mine", {"health": "PASS"}), node("other"))
    backup = api.snapshot()
    async with following(kube, NODES, field_selector="metadata.name=mine", timeout_s=1,
                         reread=True) as seen:
        await until(lambda: len(seen) == 1)
        api.put(node("mine", {"health": "EVICT"}))
        await until(lambda: len(seen) == 2)
        await api.go_away()
        api.restore(backup)
        churn(api, past=api.resource_version + 10**3)  # far past what the watch saw
        await api.come_back()
        await until(lambda: len(seen) == 3)
        restored = seen[2]
        await anyio.sleep(2.5)  # more periods end: each rereads, none finds a change
    assert restored.type == "MODIFIED" and labels(restored) == {"health": "PASS"}
    assert len(seen) == 3


async def test_reread_compares_content_when_versions_collide(
        api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("mine", {"health": "PASS"}))
    backup = api.snapshot()
    async with following(kube, NODES, timeout_s=1, reread=True) as seen:
        await until(lambda: len(seen) == 1)
        before = api.put(node("mine", {"health": "EVICT"}))
        await until(lambda: len(seen) == 2)
        api.restore(backup)
        # The restored server's next write lands on the very version the watch saw.
        collided = api.put(node("mine", {"health": "WARN"}))
        assert collided["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        await until(lambda: len(seen) == 3)
    assert seen[2].type == "MODIFIED" and labels(seen[2]) == {"health": "WARN"}


async def test_a_notice_makes_every_sharing_watch_relist_at_once(
        api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("n1", {"health": "PASS"}), pod("a", labels={"step": "backup"}))
    backup = api.snapshot()
    rewinds = Rewinds()
    async with following(kube, NODES, rewinds=rewinds) as nodes, \
            following(kube, PODS, rewinds=rewinds) as pods:
        await until(lambda: len(nodes) == 1 and len(pods) == 1)
        api.put(node("n1", {"health": "EVICT"}))
        api.put(pod("a", labels={"step": "after"}))
        await until(lambda: len(nodes) == 2 and len(pods) == 2)
        await api.go_away()
        api.restore(backup)
        churn(api, past=api.resource_version + 10**3)  # the watches come back unaware
        await api.come_back()
        await anyio.sleep(0.5)  # both resumed by now, silently
        assert (len(nodes), len(pods)) == (2, 2)
        rewinds.notice("a witness saw it")  # e.g. the controller's Lease
        await until(lambda: len(nodes) == 3 and len(pods) == 3)
    assert labels(nodes[2]) == {"health": "PASS"} and labels(pods[2]) == {"step": "backup"}
