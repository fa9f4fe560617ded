"""Many AppWrappers due at once, end to end: a node carrying the GPU pods of 40
AppWrappers turns EVICT; every one is reset exactly once (one status write, one
Warning Event on it), however they are interleaved, and the node gets one Normal
Event for the whole burst, naming how many were reset."""

from __future__ import annotations

import pytest

from healthd.sim.apiserver import ApiEmulator
from tests.controller.conftest import (
    KubeFactory,
    appwrapper,
    controllers,
    events,
    eventually,
    gpu_pod,
    node,
    phase,
    set_verdict,
    settings,
    settled,
    status_writes,
)

pytestmark = pytest.mark.anyio

COUNT = 40


async def test_a_burst_resets_every_appwrapper_once(api: ApiEmulator,
                                                    kube_for: KubeFactory) -> None:
    names = [f"aw-{i}" for i in range(COUNT)]
    api.seed(node("n1"), node("n2"), *(appwrapper(n) for n in names),
             *(gpu_pod(n, "n1") for n in names))
    config = settings(resets={"rate_per_minute": 100_000, "burst": 1_000})
    async with controllers(kube_for, config, "ctl") as (ctl,):
        await settled(ctl)
        set_verdict(api, "n1", "EVICT", "XID_79")
        await eventually(lambda: all(phase(api, n) == "Resetting" for n in names), within=10)
        await eventually(lambda: len(events(api, "NodeEvicted")) >= COUNT, within=10)
        await eventually(lambda: len(events(api, "AppWrapperReset")) >= 1, within=10)
        assert ctl.sample("healthd_controller_resets_total", {"result": "reset"}) == COUNT
    assert [len(status_writes(api, n)) for n in names] == [1] * COUNT
    warned = sorted(e["involvedObject"]["name"] for e in events(api, "NodeEvicted"))
    assert warned == sorted(names)
    (on_node,) = events(api, "AppWrapperReset")
    assert on_node["involvedObject"]["name"] == "n1"
    assert f"Reset {COUNT} AppWrappers (" in on_node["message"]
    assert f"and {COUNT - 10} more" in on_node["message"]
