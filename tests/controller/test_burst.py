"""Many AppWrappers due at once, end to end: a node carrying the GPU pods of 40
AppWrappers turns EVICT; every one is reset exactly once (one status write, one
Warning Event on it), however they are interleaved, and the node gets one Normal
Event for the whole burst, naming how many were reset."""

from __future__ import annotations

import anyio
import pytest

from healthd.sim.apiserver import ApiEmulator
from tests.controller.conftest import (
    NS,
    KubeFactory,
    appwrapper,
    controllers,
    default_flavor,
    events,
    eventually,
    gpu_limit,
    gpu_pod,
    node,
    phase,
    product_writes,
    set_verdict,
    settings,
    settled,
    slack_queue,
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


NODES = 100
PER_NODE = 4  # AppWrappers with a pod on each node, as label_to_reset's cluster has


async def test_100_nodes_evict_at_once_cost_one_event_per_node_and_a_true_limit(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    # AppWrapper j has one GPU pod on each of nodes j .. j+3 (mod NODES), as in the
    # benchmark's cluster; every node turns EVICT in one go (a rack losing power).
    nodes = [f"n{i:03d}" for i in range(NODES)]
    names = [f"aw-{j:03d}" for j in range(NODES)]
    api.seed(*(node(n) for n in nodes), default_flavor(), slack_queue(str(8 * NODES)),
             *(appwrapper(n) for n in names),
             *(gpu_pod(names[j], nodes[(j + k) % NODES], index=k)
               for j in range(NODES) for k in range(PER_NODE)))
    config = settings(resets={"rate_per_minute": 100_000, "burst": 1_000},
                      breaker={"max_unhealthy": "100%"})
    async with controllers(kube_for, config, "ctl") as (ctl,):
        await settled(ctl)
        before = len(api.requests)
        for n in nodes:
            set_verdict(api, n, "EVICT", "XID_79")
        await eventually(lambda: all(phase(api, n) == "Resetting" for n in names), within=30)
        await eventually(lambda: gpu_limit(api) == "0", within=30)
        await eventually(lambda: events(api, "LendingLimitUpdated"), within=30)
        await eventually(lambda: len(events(api, "NodeEvicted")) >= NODES, within=30)
        await quiet(api)
    burst = api.requests[before:]
    # Each AppWrapper: one status write and one Warning Event naming its nodes.
    assert [len(status_writes(api, n)) for n in names] == [1] * NODES
    assert sorted(e["involvedObject"]["name"] for e in events(api, "NodeEvicted")) == names
    # Each node: at most one Event, naming the AppWrappers reset because of it; together
    # they name every AppWrapper reset.
    on_nodes = events(api, "AppWrapperReset")
    subjects = [e["involvedObject"]["name"] for e in on_nodes]
    assert len(subjects) == len(set(subjects)) and set(subjects) <= set(nodes)
    assert {aw for e in on_nodes for aw in names if f"{NS}/{aw}" in e["message"]} == set(names)
    # The slack queue: written as the nodes change (coalesced, never one write per
    # node), each write with its Event; the limit is the truth (every GPU is gone).
    patches = [r for r in burst if r.method == "PATCH" and "/clusterqueues/" in r.path]
    assert 1 <= len(patches) < NODES
    assert len(events(api, "LendingLimitUpdated")) == len(patches)
    # Nothing was read back: the caches and the tested patches were enough.
    assert [r.path for r in burst if r.method == "GET" and r.query.get("watch") != "true"
            and "/leases/" not in r.path] == []


async def quiet(server: ApiEmulator, quiet_s: float = 1.0) -> None:
    """Until no write but the Lease's reached the server for `quiet_s` (whatever was
    due is sent)."""
    seen = -1
    with anyio.fail_after(30):
        while len(product_writes(server)) != seen:
            seen = len(product_writes(server))
            await anyio.sleep(quiet_s)
