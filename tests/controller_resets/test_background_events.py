"""Reset Events posted in the background (`Resetter.sending_events`): every reset
written inside the block gets its Warning Event on the AppWrapper and its Normal
Event on the node, also when the block is cancelled right after the write (the
pending Events are drained), and a reset outside the block posts them itself."""

from __future__ import annotations

import anyio
import pytest

from healthd.controller.appwrappers import Resetter
from healthd.controller.resets import decide
from healthd.kube.client import Kube
from healthd.kube.conventions import Verdict
from healthd.kube.objects import APPWRAPPERS
from healthd.sim.apiserver import ApiEmulator
from tests.controller_resets.conftest import (
    NS,
    MakeResetter,
    appwrapper,
    events,
    evict_map,
    node,
    pod,
    reset_writes,
)

pytestmark = pytest.mark.anyio

NAMES = ("a", "b", "c")


async def reset_all(kube: Kube, resetter: Resetter) -> list[str]:
    evict = await evict_map(kube)
    results = []
    for name in NAMES:
        aw = await kube.get(APPWRAPPERS, name, NS)
        decision = decide(aw, [pod(f"{name}-0", name, "n1")], evict)
        assert decision is not None
        results.append(await resetter.reset(decision, appwrapper=aw))
    return results


def seed(api: ApiEmulator) -> None:
    api.seed(node("n1", Verdict.EVICT, "XID_79"), *(appwrapper(n) for n in NAMES),
             *(pod(f"{n}-0", n, "n1") for n in NAMES))


def assert_every_event_posted(api: ApiEmulator) -> None:
    assert sorted(e["involvedObject"]["name"] for e in events(api, "NodeEvicted")) == list(NAMES)
    assert [e["involvedObject"]["name"] for e in events(api, "AppWrapperReset")] == ["n1"] * 3


async def test_events_of_resets_in_the_block_are_all_posted(
        api: ApiEmulator, kube: Kube, make_resetter: MakeResetter) -> None:
    resetter = make_resetter()
    seed(api)
    async with resetter.sending_events():
        assert await reset_all(kube, resetter) == ["reset"] * 3
    assert_every_event_posted(api)
    assert len(reset_writes(api)) == 3


async def test_in_one_burst_a_node_gets_one_event_naming_every_appwrapper(
        api: ApiEmulator, kube: Kube, make_resetter: MakeResetter) -> None:
    resetter = make_resetter()
    seed(api)
    async with resetter.sending_events(), resetter.one_burst():
        assert await reset_all(kube, resetter) == ["reset"] * 3
    assert sorted(e["involvedObject"]["name"] for e in events(api, "NodeEvicted")) == list(NAMES)
    (on_node,) = events(api, "AppWrapperReset")
    assert on_node["involvedObject"]["name"] == "n1"
    assert on_node["message"] == (f"Reset 3 AppWrappers ({NS}/a, {NS}/b, {NS}/c): their pods "
                                  "use GPUs on this EVICT node (XID_79)")


async def test_a_cancelled_block_still_drains_the_pending_events(
        api: ApiEmulator, kube: Kube, make_resetter: MakeResetter) -> None:
    resetter = make_resetter()
    seed(api)
    with anyio.CancelScope() as scope:
        async with resetter.sending_events():
            assert await reset_all(kube, resetter) == ["reset"] * 3
            scope.cancel()  # a lost Lease, a shutdown: right after the writes
            await anyio.sleep(10)
    assert scope.cancelled_caught
    assert_every_event_posted(api)


async def test_outside_the_block_a_reset_posts_its_events_itself(
        api: ApiEmulator, kube: Kube, make_resetter: MakeResetter) -> None:
    resetter = make_resetter()
    seed(api)
    assert await reset_all(kube, resetter) == ["reset"] * 3
    assert_every_event_posted(api)
