"""`watch_forever` lists in pages (`limit`/`continue`) and lists again from the start
when the continue token expires between pages; with a projection it yields only
what the projection shows changed, in a relist as in the watch."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from healthd.kube.client import Kube
from healthd.kube.objects import PODS
from healthd.kube.projections import POD_FIELDS, projection
from healthd.kube.watching import watch_forever
from healthd.sim.apiserver import ApiEmulator
from tests.kube.conftest import pod
from tests.kube.test_watching import PODS_PATH, Seen, fast_backoff, until

pytestmark = pytest.mark.anyio

LISTED = ("LISTED", "")  # where `listed` was called among the events


@asynccontextmanager
async def paged(kube: Kube, **kwargs: Any) -> AsyncIterator[Seen]:
    seen: Seen = []

    async def consume() -> None:
        async for event in watch_forever(kube, PODS, backoff=fast_backoff(), page_size=2,
                                         listed=lambda: seen.append(LISTED), **kwargs):
            seen.append((event.type, event.object["metadata"]["name"]))

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        yield seen
        tg.cancel_scope.cancel()


def pages(api: ApiEmulator) -> list[dict[str, str]]:
    return [r.query for r in api.requests_to("GET", PODS_PATH)
            if r.query.get("watch") != "true" and r.query.get("limit") != "1"]


async def test_a_list_comes_in_pages_and_is_whole_before_it_is_called_listed(
        api: ApiEmulator, kube: Kube) -> None:
    api.seed(*(pod(f"p{i}") for i in range(5)))
    async with paged(kube) as seen:
        await until(lambda: LISTED in seen)
    assert seen == [*(("ADDED", f"p{i}") for i in range(5)), LISTED]
    queries = pages(api)
    assert [q["limit"] for q in queries] == ["2", "2", "2"]
    assert ["continue" in q for q in queries] == [False, True, True]


async def test_a_token_expired_between_pages_lists_again_from_the_start(
        api: ApiEmulator, kube: Kube) -> None:
    api.seed(*(pod(f"p{i}") for i in range(5)))
    api.fail("GET", PODS_PATH, None, delay=0.3, query={"continue": ".+"})
    async with paged(kube) as seen:
        await until(lambda: len(seen) == 2)  # the first page is in
        api.put(pod("p0", labels={"moved": "yes"}))
        api.compact()  # the list's version is gone: the next page is 410 Expired
        await until(lambda: LISTED in seen)
    assert seen == [("ADDED", "p0"), ("ADDED", "p1"), ("MODIFIED", "p0"),
                    *(("ADDED", f"p{i}") for i in range(2, 5)), LISTED]
    assert ["continue" in q for q in pages(api)] == [False, True, False, True, True]


def with_ip(name: str, ip: str, **labels: str) -> dict[str, Any]:
    obj = pod(name, labels=labels)
    obj["status"] = {"phase": "Running", "podIP": ip}
    return obj


async def test_with_a_projection_only_changes_it_keeps_are_yielded(
        api: ApiEmulator, kube: Kube) -> None:
    api.seed(with_ip("a", "10.0.0.1"), with_ip("b", "10.0.0.2"))
    async with paged(kube, project=projection(POD_FIELDS)) as seen:
        await until(lambda: LISTED in seen)
        api.put(with_ip("a", "10.0.0.9"))  # a field the projection drops: nothing
        api.put(with_ip("b", "10.0.0.2", app="x"))
        await until(lambda: len(seen) == 4)
        await api.go_away()
        api.put(with_ip("a", "10.0.0.8"))
        api.put(with_ip("b", "10.0.0.7", app="y"))
        api.compact()  # a relist, which compares projections too
        await api.come_back()
        await until(lambda: seen.count(LISTED) == 2)
        await anyio.sleep(0.2)
    assert seen == [("ADDED", "a"), ("ADDED", "b"), LISTED, ("MODIFIED", "b"),
                    ("MODIFIED", "b"), LISTED]
