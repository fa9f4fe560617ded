"""Watches against the emulator: one `watch` request (events, selectors, resume from a
version, 410 as `Gone`, bookmarks kept out of sight) and `watch_forever` (list then
watch, resume across a server that goes away and returns, relist on 410 with DELETED
for what vanished meanwhile, bookmarks moving the resume point, retries after errors)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from itertools import pairwise

import anyio
import pytest

from healthd.kube import errors
from healthd.kube.backoff import Backoff
from healthd.kube.client import Kube
from healthd.kube.objects import NODES, PODS
from healthd.kube.watching import WatchEvent, watch, watch_forever
from healthd.sim.apiserver import ApiEmulator
from tests.kube.conftest import node, pod

pytestmark = pytest.mark.anyio

PODS_PATH = "/api/v1/pods"
Seen = list[tuple[str, str]]


def fast_backoff() -> Backoff:
    return Backoff(initial=0.02, maximum=0.1)


async def collect(events: AsyncIterator[WatchEvent], count: int) -> Seen:
    """The first `count` events as (type, name); a loose bound on the wait."""
    seen: Seen = []
    with anyio.fail_after(5):
        async with aclosing(events):
            async for event in events:
                seen.append((event.type, event.object["metadata"]["name"]))
                if len(seen) == count:
                    break
    return seen


@asynccontextmanager
async def forever(kube: Kube, **kwargs: object) -> AsyncIterator[Seen]:
    """Run `watch_forever` on pods in the background; yield the growing event list."""
    seen: Seen = []

    async def consume() -> None:
        async for event in watch_forever(kube, PODS, backoff=fast_backoff(), **kwargs):
            seen.append((event.type, event.object["metadata"]["name"]))

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        yield seen
        tg.cancel_scope.cancel()


async def until(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(5):
        while not condition():
            await anyio.sleep(0.02)


def list_calls(api: ApiEmulator) -> list[object]:
    """Lists (their first pages; not the one-item probes that ask for the server's
    version)."""
    return [r for r in api.requests_to("GET", PODS_PATH)
            if r.query.get("watch") != "true" and r.query.get("limit") != "1"
            and "continue" not in r.query]


def watch_calls(api: ApiEmulator) -> list[object]:
    return [r for r in api.requests_to("GET", PODS_PATH) if r.query.get("watch") == "true"]


async def test_watch_sees_changes_after_the_listed_version(api: ApiEmulator, kube: Kube) -> None:
    api.seed(pod("old"))
    version = (await kube.list(PODS))["metadata"]["resourceVersion"]
    events = watch(kube, PODS, resource_version=version, timeout_s=5)
    api.seed(pod("new"))
    await kube.merge_patch(PODS, "new", {"metadata": {"labels": {"a": "b"}}}, "default")
    await kube.delete(PODS, "new", "default")
    assert await collect(events, 3) == [("ADDED", "new"), ("MODIFIED", "new"),
                                        ("DELETED", "new")]


async def test_watch_without_a_version_starts_with_what_exists(
        api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("n1"), node("n2"))
    assert sorted(await collect(watch(kube, NODES, timeout_s=5), 2)) == [
        ("ADDED", "n1"), ("ADDED", "n2")]


async def test_watch_honours_selectors(api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("mine"), node("other"))
    version = (await kube.list(NODES))["metadata"]["resourceVersion"]
    events = watch(kube, NODES, field_selector="metadata.name=mine", resource_version=version,
                   timeout_s=5)
    api.put(node("other", {"x": "1"}))
    api.put(node("mine", {"x": "1"}))
    assert await collect(events, 1) == [("MODIFIED", "mine")]


async def test_watch_from_an_expired_version_raises_gone(api: ApiEmulator, kube: Kube) -> None:
    api.seed(pod("a"))
    version = (await kube.list(PODS))["metadata"]["resourceVersion"]
    api.seed(pod("b"))
    api.compact()
    with pytest.raises(errors.Gone):
        await collect(watch(kube, PODS, resource_version=version, timeout_s=5), 1)


async def test_watch_ends_at_its_timeout_without_showing_bookmarks() -> None:
    async with ApiEmulator(bookmark_interval=0.1) as api, Kube(api.async_client()) as k:
        api.seed(pod("a"))
        version = (await k.list(PODS))["metadata"]["resourceVersion"]
        assert await collect(watch(k, PODS, resource_version=version, timeout_s=1), 1) == []


async def test_watch_on_a_server_that_is_down_is_unavailable(api: ApiEmulator,
                                                            kube: Kube) -> None:
    await api.go_away()
    with pytest.raises(errors.Unavailable):
        await collect(watch(kube, PODS, timeout_s=5), 1)


async def test_forever_lists_then_follows(api: ApiEmulator, kube: Kube) -> None:
    api.seed(pod("a", labels={"app": "agent"}), pod("z", labels={"app": "other"}))
    async with forever(kube, label_selector="app=agent") as seen:
        await until(lambda: seen == [("ADDED", "a")])
        api.seed(pod("b", labels={"app": "agent"}), pod("y", labels={"app": "other"}))
        api.remove("Pod", "a", "default")
        await until(lambda: len(seen) == 3)
    assert seen[1:] == [("ADDED", "b"), ("DELETED", "a")]


async def test_forever_resumes_across_an_outage_without_relisting(
        api: ApiEmulator, kube: Kube) -> None:
    api.seed(pod("a"))
    async with forever(kube) as seen:
        await until(lambda: seen == [("ADDED", "a")])
        await api.go_away()
        api.seed(pod("b"))  # changed while the agent cannot see the server
        await anyio.sleep(0.2)
        await api.come_back()
        await until(lambda: len(seen) == 2)
        api.seed(pod("c"))
        await until(lambda: len(seen) == 3)
    assert seen == [("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c")]
    assert len(list_calls(api)) == 1


async def test_forever_relists_on_gone_and_reports_what_vanished(
        api: ApiEmulator, kube: Kube) -> None:
    api.seed(pod("stays"), pod("changes"), pod("vanishes"))
    async with forever(kube) as seen:
        await until(lambda: len(seen) == 3)
        await api.go_away()
        api.remove("Pod", "vanishes", "default")
        api.put(pod("changes", labels={"new": "yes"}))
        api.seed(pod("arrives"))
        api.compact()  # the history the watch would resume from is gone: 410
        await api.come_back()
        await until(lambda: len(seen) == 6)
    assert sorted(seen[3:]) == [("ADDED", "arrives"), ("DELETED", "vanishes"),
                                ("MODIFIED", "changes")]
    assert len(list_calls(api)) == 2


async def test_forever_relists_on_a_fresh_server_that_never_had_its_version() -> None:
    async with ApiEmulator() as old, Kube(old.async_client(), watch_timeout_s=1) as k:
        old.seed(*(pod(f"old-{i}") for i in range(5)))
        async with forever(k) as seen:
            await until(lambda: len(seen) == 5)
            await old.go_away()
            # A restored etcd, a new control plane: versions start again, lower.
            async with ApiEmulator(port=old.port) as fresh:
                fresh.seed(pod("new"))
                # Its watch from the old version is silent; the one-item list from that
                # version is refused (504 TooLarge), so it relists and sees the truth.
                await until(lambda: ("ADDED", "new") in seen)
                assert sorted(seen[5:]) == [("ADDED", "new"), *(("DELETED", f"old-{i}")
                                                                 for i in range(5))]


async def test_forever_resumes_from_bookmarks() -> None:
    async with ApiEmulator(bookmark_interval=0.1) as api, Kube(api.async_client()) as k:
        async with forever(k, label_selector="app=agent", timeout_s=1) as seen:
            await until(lambda: len(watch_calls(api)) == 1)
            api.seed(*(pod(f"other-{i}") for i in range(3)))  # unseen, but move the version
            api.compact()
            await until(lambda: len(watch_calls(api)) == 2)
            api.seed(pod("a", labels={"app": "agent"}))
            await until(lambda: seen == [("ADDED", "a")])
        # The bookmark carried the version past the compaction: resumed, never relisted.
        assert len(list_calls(api)) == 1
        assert watch_calls(api)[1].query["resourceVersion"] == str(api.resource_version - 1)


async def test_forever_retries_failed_lists_and_watches(api: ApiEmulator, kube: Kube) -> None:
    api.seed(pod("a"))
    api.fail("GET", PODS_PATH, 503, times=2, query={"watch": "^$"})
    api.fail("GET", PODS_PATH, 500, times=2, query={"watch": "true"})
    async with forever(kube) as seen:
        await until(lambda: seen == [("ADDED", "a")])
        api.seed(pod("b"))
        await until(lambda: len(seen) == 2)
    assert len(list_calls(api)) == 3


WRITES = 20
WRITE_EVERY_S = 0.05
BATCH_S = 0.5


async def arrivals(api: ApiEmulator, kube: Kube,
                   batch_s: float) -> tuple[list[tuple[str, float]], float]:
    """A node's label written `WRITES` times, `WRITE_EVERY_S` apart, as a watch with
    `batch_s` hands the changes over: (label value, when it was handed over); and
    how long the writes took."""
    api.put(node("hb", {"beat": "0"}))
    seen: list[tuple[str, float]] = []

    async def consume() -> None:
        async for event in watch_forever(kube, NODES, batch_s=batch_s):
            seen.append((event.object["metadata"]["labels"]["beat"], anyio.current_time()))

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await until(lambda: len(seen) == 1)
        started = anyio.current_time()
        for beat in range(1, WRITES + 1):
            await anyio.sleep(WRITE_EVERY_S)
            api.put(node("hb", {"beat": str(beat)}))
        writes_s = anyio.current_time() - started
        await until(lambda: seen[-1][0] == str(WRITES))
        tg.cancel_scope.cancel()
    return seen[1:], writes_s


def handovers(seen: list[tuple[str, float]]) -> int:
    """How many times the watch handed changes over: changes handed over together
    follow each other within a few milliseconds."""
    return 1 + sum(1 for (_, a), (_, b) in pairwise(seen) if b - a > 0.02)


async def test_a_batched_watch_reads_many_changes_at_a_time_and_loses_none(
        api: ApiEmulator, kube: Kube) -> None:
    one_by_one, _ = await arrivals(api, kube, batch_s=0)
    batched, writes_s = await arrivals(api, kube, batch_s=BATCH_S)
    expected = [str(b) for b in range(1, WRITES + 1)]
    assert [v for v, _ in one_by_one] == expected
    assert [v for v, _ in batched] == expected  # every change, in order
    # Read once per batch_s while the writes went on, not once per write.
    times = str([round(t - batched[0][1], 3) for _, t in batched])
    assert handovers(batched) <= writes_s / BATCH_S + 2, times
    assert handovers(batched) < handovers(one_by_one) / 2, times


async def test_a_batched_watch_hands_a_burst_over_at_once(api: ApiEmulator, kube: Kube) -> None:
    """What the server sends together after a quiet spell (nodes that failed together)
    is handed over together, first change included: the circuit breaker judges the
    fleet on the whole burst, not on its first node."""
    api.put(node("rack", {"beat": "0"}))
    seen: list[tuple[str, float]] = []

    async def consume() -> None:
        async for event in watch_forever(kube, NODES, batch_s=BATCH_S):
            seen.append((event.object["metadata"]["name"], anyio.current_time()))

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await until(lambda: len(seen) == 1)
        await anyio.sleep(2 * BATCH_S)  # quiet
        for name in ("r1", "r2", "r3", "r4"):
            api.put(node(name))
        await until(lambda: len(seen) == 5)
        tg.cancel_scope.cancel()
    assert [n for n, _ in seen[1:]] == ["r1", "r2", "r3", "r4"]
    assert handovers(seen[1:]) == 1
