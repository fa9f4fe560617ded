"""Fleet network blame per network, from node objects annotated by the agent's own
rendering code (pod network plus a secondary network `net1`):

- 100 nodes, one node's `net1` dead (its pod network fine; it reports itself
  isolated on net1, everyone else misses it there): exactly that node is blamed,
  on `net1` only; nobody is blamed on the pod network and nothing is partitioned;
- 100 nodes, the whole `net1` fabric down (every node isolated on net1): a
  partition of net1, nobody blamed individually, the pod network unaffected;
- a node with a malformed net1 view keeps its pod-network row;
- in the real controller over the emulator: one `PeerUnreachable` Event on the node
  naming net1, `healthd_network_blamed{node,network="net1"}` 1 and no pod-network
  series; a whole-net1 outage gives one partition Event on the Lease and
  `healthd_network_partitioned{network="net1"}` 1; no Node write in any case.
"""

from __future__ import annotations

import json

import pytest

from healthd.blame.networks import assess_networks, ping_rows, rows_by_network
from healthd.sim.apiserver import ApiEmulator
from tests.blame.conftest import (
    BLAMED,
    PARTITIONED,
    agent_node,
    blame_events,
    node_writes,
)
from tests.controller.conftest import KEYS, KubeFactory, controllers, eventually, settings

pytestmark = pytest.mark.anyio

FLEET = [f"gpu-{i:03d}" for i in range(100)]
DEAD = "gpu-042"


def net1_dead_on(dead: str, nodes: list[str]) -> list[dict[str, object]]:
    """Every node after a ping round in which `dead`'s net1 NIC is gone."""
    return [agent_node(n, nodes, networks={"net1": ((), True)}) if n == dead
            else agent_node(n, nodes, networks={"net1": ([dead], False)}) for n in nodes]


def test_one_dead_net1_nic_blames_exactly_that_node_on_net1() -> None:
    found = assess_networks(rows_by_network(net1_dead_on(DEAD, FLEET), KEYS))
    assert set(found) == {"pod", "net1"}
    assert dict(found["pod"].blamed) == {}
    assert not found["pod"].partitioned
    assert list(found["net1"].blamed) == [DEAD]
    assert len(found["net1"].blamed[DEAD]) == 99 and found["net1"].peers[DEAD] == 99
    assert not found["net1"].partitioned


def test_whole_net1_fabric_down_is_a_partition_not_individual_blame() -> None:
    nodes = [agent_node(n, FLEET, networks={"net1": ((), True)}) for n in FLEET]
    found = assess_networks(rows_by_network(nodes, KEYS))
    assert found["net1"].partitioned
    assert dict(found["net1"].blamed) == {}
    assert "network net1" in found["net1"].why
    assert dict(found["pod"].blamed) == {} and not found["pod"].partitioned


def test_pod_network_only_fleet_has_no_secondary_rows() -> None:
    nodes = [agent_node(n, FLEET[:5]) for n in FLEET[:5]]
    assert set(rows_by_network(nodes, KEYS)) == {"pod"}
    assert "networks" not in json.loads(nodes[0]["metadata"]["annotations"][KEYS.health])["ping"]


def test_a_malformed_secondary_view_keeps_the_pod_network_row() -> None:
    node = agent_node("n1", ["n1", "n2"], networks={"net1": ((), False)})
    health = json.loads(node["metadata"]["annotations"][KEYS.health])
    health["ping"]["networks"] = {"net1": "garbage", "": {}, "net2": {"isolated": "yes"}}
    node["metadata"]["annotations"][KEYS.health] = json.dumps(health)
    assert set(ping_rows(node, KEYS)) == {"pod"}


NODES = [f"n{i}" for i in range(1, 7)]


async def test_controller_blames_the_node_on_net1_with_one_event(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    api.seed(*net1_dead_on("n3", NODES))
    async with controllers(kube_for, settings(), "ctl") as (ctl,):
        await eventually(lambda: blame_events(api, "Node", "n3"))
        [event] = blame_events(api)
        assert event["message"].startswith(
            "5 of 5 peers cannot reach n3 by ping on network net1: n1, n2, n4, n5, n6")
        await eventually(lambda: ctl.sample(BLAMED, {"node": "n3", "network": "net1"}) == 1)
        assert ctl.registry.get_sample_value(BLAMED, {"node": "n3", "network": "pod"}) is None
        assert ctl.sample(PARTITIONED, {"network": "net1"}) == 0
    assert node_writes(api) == []


async def test_controller_calls_a_whole_net1_outage_a_partition(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    api.seed(*(agent_node(n, NODES, networks={"net1": ((), True)}) for n in NODES))
    async with controllers(kube_for, settings(), "ctl") as (ctl,):
        await eventually(lambda: ctl.sample(PARTITIONED, {"network": "net1"}) == 1)
        await eventually(lambda: blame_events(api, "Lease"))
        assert blame_events(api, "Node") == []
        [event] = blame_events(api, "Lease")
        assert event["message"].startswith("net1 partition: ")
        assert ctl.sample(PARTITIONED, {"network": "pod"}) == 0
        assert all(ctl.registry.get_sample_value(BLAMED, {"node": n, "network": "net1"})
                   is None for n in NODES)
    assert node_writes(api) == []
