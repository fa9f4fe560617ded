"""Fleet network blame in the real controller, in process, against the API emulator
over HTTP, with nodes annotated as real agents annotate them after a ping round:

- everything fine: no Event, no blamed series, no partition;
- one node down (everyone misses it, it reports nothing): one Warning Event
  `PeerUnreachable` on it naming the reporters, `healthd_network_blamed{node}` 1,
  exactly once per episode however often the reports are republished; recovery
  removes the series, a new fault is a new episode;
- one node isolated (it says so, everyone misses it): judge() calls it ISOLATED,
  its agent already says NETWORK_ISOLATED, so no PeerUnreachable and no series;
- a split in halves, reported either as explicit misses or (as agents do with the
  default isolation threshold) as "isolated" on every node: nobody blamed, one
  Event on the controller's Lease, `healthd_network_partitioned` 1 until it heals;
- a dry run announces nothing and still counts;

and in every case the controller writes no Node at all (the request log)."""

from __future__ import annotations

import anyio
import pytest

from healthd.blame.announce import NetworkBlame
from healthd.blame.networks import Assessment
from healthd.sim.apiserver import ApiEmulator
from tests.blame.conftest import (
    BLAMED,
    PARTITIONED,
    agent_node,
    blame_events,
    node_writes,
    product_writes,
    publish,
    silent_node,
)
from tests.controller.conftest import (
    KubeFactory,
    Replica,
    controllers,
    eventually,
    settings,
    settled,
)

pytestmark = pytest.mark.anyio

NODES = [f"n{i}" for i in range(1, 7)]
POD = {"network": "pod"}  # the blame series name the network; these tests are the pod's


def on_pod(node: str) -> dict[str, str]:
    return {"node": node, **POD}
LEASE = "healthd-controller"


def blame(ctl: Replica) -> NetworkBlame:
    term = ctl.controller.term
    assert term is not None
    return term.blame


async def judged(ctl: Replica) -> Assessment:
    """Until the controller has judged what the API holds now (every published
    report in its rows, a settle period and a round of Events later)."""
    await settled(ctl)
    found = blame(ctl).assessment
    assert found is not None
    return found


def assert_no_node_writes(api: ApiEmulator) -> None:
    assert node_writes(api) == []
    assert product_writes(api) == []


async def test_everything_fine_says_nothing(api: ApiEmulator, kube_for: KubeFactory) -> None:
    api.seed(*(agent_node(n, NODES) for n in NODES))
    async with controllers(kube_for, settings(), "ctl") as (ctl,):
        found = await judged(ctl)
        assert found.reporters == 6 and not found.blamed and not found.partitioned
        assert blame_events(api) == []
        assert ctl.sample(PARTITIONED, POD) == 0
        assert ctl.registry.get_sample_value(BLAMED, on_pod("n1")) is None
    assert_no_node_writes(api)


async def test_a_node_down_is_blamed_once_per_episode(api: ApiEmulator,
                                                      kube_for: KubeFactory) -> None:
    api.seed(*(agent_node(n, NODES) for n in NODES))
    async with controllers(kube_for, settings(), "ctl") as (ctl,):
        await judged(ctl)
        # n3 goes down: its last report stays, every other agent now misses it.
        for reporter in NODES:
            if reporter != "n3":
                publish(api, reporter, NODES, unreached=["n3"])
        await eventually(lambda: blame_events(api, "Node", "n3"))
        [event] = blame_events(api)
        assert event["type"] == "Warning"
        assert event["message"].startswith("5 of 5 peers cannot reach n3 by ping: "
                                           "n1, n2, n4, n5, n6")
        assert ctl.sample(BLAMED, on_pod("n3")) == 1
        assert ctl.sample(PARTITIONED, POD) == 0

        # The next ping rounds move the matrix (n1 also misses n5 once) and n3 stays
        # blamed: the same episode, no second Event.
        publish(api, "n1", NODES, unreached=["n3", "n5"])
        await eventually(lambda: blame(ctl).rows["n1"].unreached == {"n3", "n5"})
        assert set((await judged(ctl)).blamed) == {"n3"}
        publish(api, "n1", NODES, unreached=["n3"])
        await eventually(lambda: blame(ctl).rows["n1"].unreached == {"n3"})
        await judged(ctl)
        assert len(blame_events(api)) == 1

        # Repaired: the series goes; failing again is a new episode.
        for reporter in NODES:
            publish(api, reporter, NODES)
        await eventually(lambda: ctl.registry.get_sample_value(BLAMED, on_pod("n3"))
                         is None)
        assert len(blame_events(api)) == 1
        for reporter in NODES:
            if reporter != "n3":
                publish(api, reporter, NODES, unreached=["n3"])
        await eventually(lambda: len(blame_events(api, "Node", "n3")) == 2)
    assert_no_node_writes(api)


async def test_a_node_without_a_report_is_blamed_from_the_start(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    """A dead node whose agent never reported: blamed by the others' rows alone."""
    api.seed(silent_node("n3"), *(agent_node(n, NODES, unreached=["n3"])
                                  for n in NODES if n != "n3"))
    async with controllers(kube_for, settings(), "ctl") as (ctl,):
        await eventually(lambda: blame_events(api, "Node", "n3"))
        found = await judged(ctl)
        assert dict(found.blamed) == {"n3": ("n1", "n2", "n4", "n5", "n6")}
        assert ctl.sample(BLAMED, on_pod("n3")) == 1
        assert len(blame_events(api)) == 1
    assert_no_node_writes(api)


async def test_an_isolated_node_is_not_blamed_as_a_peer_problem(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    api.seed(agent_node("n3", NODES, isolated=True),
             *(agent_node(n, NODES, unreached=["n3"]) for n in NODES if n != "n3"))
    async with controllers(kube_for, settings(), "ctl") as (ctl,):
        found = await judged(ctl)
        assert found.isolated == ("n3",)  # what judge() says: its own view, confirmed
        assert not found.blamed and not found.partitioned
        assert blame_events(api) == []
        assert ctl.registry.get_sample_value(BLAMED, on_pod("n3")) is None
        assert ctl.sample(PARTITIONED, POD) == 0
    assert_no_node_writes(api)


def split(left: list[str], right: list[str], *, as_isolated: bool) -> list[dict]:
    everyone = left + right
    return [agent_node(n, everyone, isolated=as_isolated,
                       unreached=right if n in left else left) for n in everyone]


@pytest.mark.parametrize("as_isolated", [False, True], ids=["misses", "isolated"])
async def test_a_split_in_halves_blames_nobody_and_flags_a_partition(
        api: ApiEmulator, kube_for: KubeFactory, as_isolated: bool) -> None:
    left, right = NODES[:3], NODES[3:]
    api.seed(*(agent_node(n, NODES) for n in NODES))
    async with controllers(kube_for, settings(), "ctl") as (ctl,):
        await judged(ctl)
        for obj in split(left, right, as_isolated=as_isolated):
            api.put(obj)
        await eventually(lambda: blame_events(api, "Lease", LEASE))
        found = await judged(ctl)
        assert found.partitioned and not found.blamed
        if not as_isolated:
            assert found.groups == (tuple(left), tuple(right))
        [event] = blame_events(api)
        assert event["involvedObject"]["namespace"] == "healthd-system"
        assert event["message"].startswith("network partition: ")
        assert ctl.sample(PARTITIONED, POD) == 1
        assert all(ctl.registry.get_sample_value(BLAMED, on_pod(n)) is None for n in NODES)

        for n in NODES:  # healed
            publish(api, n, NODES)
        await eventually(lambda: ctl.sample(PARTITIONED, POD) == 0)
        assert len(blame_events(api)) == 1
    assert_no_node_writes(api)


async def test_a_dry_run_announces_nothing_but_counts(api: ApiEmulator,
                                                      kube_for: KubeFactory) -> None:
    api.seed(silent_node("n3"), *(agent_node(n, NODES, unreached=["n3"])
                                  for n in NODES if n != "n3"))
    async with controllers(kube_for, settings(dry_run=True), "ctl") as (ctl,):
        await eventually(lambda: ctl.sample(BLAMED, on_pod("n3")) == 1)
        await anyio.sleep(0.2)
        assert blame_events(api) == []
    assert api.writes() == []


async def test_a_standby_exports_no_blame(api: ApiEmulator, kube_for: KubeFactory) -> None:
    api.seed(silent_node("n3"), *(agent_node(n, NODES, unreached=["n3"])
                                  for n in NODES if n != "n3"))
    async with controllers(kube_for, settings(), "a", "b") as replicas:
        await eventually(lambda: any(r.controller.leading for r in replicas))
        leader = next(r for r in replicas if r.controller.leading)
        standby = next(r for r in replicas if r is not leader)
        await eventually(lambda: leader.sample(BLAMED, on_pod("n3")) == 1)
        assert standby.registry.get_sample_value(BLAMED, on_pod("n3")) is None
        await anyio.sleep(0.3)
        assert len(blame_events(api)) == 1
