"""Objects nested deeper than Python's decoder goes (the API server stores up to
10,000 levels): each costs itself only. A List keeps its other items, a watch skips
the object (or forgets it, when it turns too deep) and still delivers its deletion,
a GET of it is `Undecodable`; each is named once in a warning and counted by kind."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing

import anyio
import pytest

from healthd.kube.backoff import Backoff
from healthd.kube.client import Kube
from healthd.kube.decoding import TOO_DEEP, UndecodableObjects, carries_marker, loads, prune
from healthd.kube.errors import Undecodable
from healthd.kube.objects import PODS
from healthd.kube.watching import watch_forever
from healthd.sim.apiserver import ApiEmulator
from tests.deep_json import deep_pod, nested, post
from tests.kube.conftest import pod

pytestmark = pytest.mark.anyio

PODS_PATH = "/api/v1/namespaces/default/pods"


def test_prune_cuts_what_opens_past_the_depth_and_ignores_brackets_in_strings() -> None:
    text = '[1, "[[{", [[[2]]], {"x": [3]}, {"y": 4}]'
    pruned, cut = prune(text, depth=2)
    assert cut == 2
    assert json.loads(pruned) == [1, "[[{", [TOO_DEEP], {"x": TOO_DEEP}, {"y": 4}]


def test_loads_decodes_as_before_and_prunes_only_after_running_out_of_recursion() -> None:
    assert loads(b'{"a": [1, {"b": 2}]}') == ({"a": [1, {"b": 2}]}, False)
    value, pruned = loads('{"ok": {"x": 1}, "deep": ' + nested(3000) + "}")
    assert pruned and value["ok"] == {"x": 1}
    assert carries_marker(value["deep"]) and not carries_marker(value["ok"])


@pytest.fixture
def tally() -> UndecodableObjects:
    return UndecodableObjects()


@pytest.fixture
async def kube(api: ApiEmulator, tally: UndecodableObjects) -> AsyncIterator[Kube]:
    async with Kube(api.async_client(), timeout_s=5, undecodable=tally) as client:
        yield client


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "cannot decode" in r.getMessage()]


async def test_a_list_keeps_its_other_items_and_names_the_deep_one_once(
        api: ApiEmulator, kube: Kube, tally: UndecodableObjects,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    api.seed(pod("a"), pod("c"))
    assert await post(api.url, PODS_PATH, deep_pod("b")) == 201
    for _ in range(3):  # a relist brings it back: said and counted once
        listing = await kube.list(PODS)
        assert sorted(p["metadata"]["name"] for p in listing["items"]) == ["a", "c"]
    [told] = warnings(caplog)
    assert "default/b" in told and "pods" in told
    assert tally.counts() == {"pods": 1}


async def test_a_get_of_the_deep_object_is_undecodable_and_the_others_read(
        api: ApiEmulator, kube: Kube, tally: UndecodableObjects) -> None:
    api.seed(pod("a"))
    assert await post(api.url, PODS_PATH, deep_pod("b")) == 201
    with pytest.raises(Undecodable):
        await kube.get(PODS, "b", "default")
    assert (await kube.get(PODS, "a", "default"))["metadata"]["name"] == "a"
    assert tally.counts() == {"pods": 1}


async def test_a_watch_skips_a_deep_object_forgets_one_turned_deep_and_sees_deletions(
        api: ApiEmulator, kube: Kube, tally: UndecodableObjects) -> None:
    api.seed(pod("a"))
    seen: list[tuple[str, str]] = []
    events = watch_forever(kube, PODS, backoff=Backoff(initial=0.02, maximum=0.1))
    with anyio.fail_after(10):
        async with aclosing(events):
            async for event in events:
                seen.append((event.type, event.object["metadata"]["name"]))
                if seen == [("ADDED", "a")]:
                    assert await post(api.url, PODS_PATH, deep_pod("b")) == 201  # skipped
                    api.seed(pod("c"))
                elif len(seen) == 2:  # a turns too deep: forgotten, as a relist would
                    assert await post(api.url, f"{PODS_PATH}/a", deep_pod("a"),
                                      method="PUT") == 200
                elif len(seen) == 3:  # the deep one's deletion still comes through
                    api.remove("Pod", "b", "default")
                elif len(seen) == 4:
                    break
    assert seen == [("ADDED", "a"), ("ADDED", "c"), ("DELETED", "a"), ("DELETED", "b")]
    assert tally.counts() == {"pods": 2}  # b and a, each once
