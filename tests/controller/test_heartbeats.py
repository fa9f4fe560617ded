"""A Node heartbeat is not work: kwok and kubelets rewrite every Node's conditions
every few seconds (`lastHeartbeatTime`), each one a watch event. The controller's
Node cache keeps a projection without heartbeats, so such an event changes nothing
it holds: no handler runs, the eviction reactor is not woken; the stored copy only
takes the new resourceVersion. A change it does read still reaches every handler."""

from __future__ import annotations

from typing import Any

import pytest

from healthd.controller.caches import NODES_KIND
from healthd.kube.objects import resource_version_of
from healthd.sim.apiserver import ApiEmulator
from tests.controller.conftest import (
    KubeFactory,
    controllers,
    eventually,
    node,
    set_verdict,
    settings,
    settled,
)

pytestmark = pytest.mark.anyio

NODE_COUNT = 20
HEARTBEATS = 5  # rounds, each over every node


def heartbeating(name: str, beat: int) -> dict[str, Any]:
    obj = node(name)
    obj["status"]["conditions"] = [
        {"type": kind, "status": status, "reason": "KubeletReady",
         "lastHeartbeatTime": f"2026-11-26T00:00:{beat:02d}Z",
         "lastTransitionTime": "2026-11-26T00:00:00Z"}
        for kind, status in (("Ready", "True"), ("MemoryPressure", "False"))]
    return obj


async def test_heartbeats_wake_no_handler_and_a_label_change_still_does(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    names = [f"n{i}" for i in range(NODE_COUNT)]
    api.seed(*(heartbeating(n, 0) for n in names))
    async with controllers(kube_for, settings(), "ctl") as (ctl,):
        await settled(ctl)
        term = ctl.controller.term
        assert term is not None
        handled: list[str] = []
        react = term.resets.handle

        def counting(kind: str, old: Any, new: Any) -> None:
            if kind == NODES_KIND:
                handled.append(kind)
            react(kind, old, new)

        term.resets.handle = counting  # type: ignore[method-assign]
        wakes = term.resets._work.poke
        pokes: list[None] = []
        term.resets._work.poke = lambda: (pokes.append(None), wakes())[1]  # type: ignore[method-assign]
        for beat in range(1, HEARTBEATS + 1):
            for name in names:
                api.put(heartbeating(name, beat))
        latest = resource_version_of(api.get("Node", names[-1]) or {})
        # Every heartbeat reached the cache (its copy carries the last version) ...
        await eventually(lambda: resource_version_of(
            term.caches.nodes.get(names[-1]) or {}) == latest)
        # ... and none of the NODE_COUNT * HEARTBEATS events woke anything.
        assert handled == [] and pokes == []

        set_verdict(api, "n0", "WARN")
        await eventually(lambda: handled == [NODES_KIND])
        assert len(pokes) == 1
