"""The controller publishes ping's peers on each Node (healthd.controller.peering),
through the real client over HTTP against the API emulator:

- 50 nodes with agent pods (half of them on net1 too): every Node gets
  `healthd.io/peers` with 16 peers per network, every node is probed by exactly 16
  others, with the addresses of the peers' agent pods; one write per node;
- steady state: no write at all (heartbeats, a new term of a restarted leader);
- an agent pod that goes: its Node loses the annotation, the 16 nodes that probed it
  get new sets, nobody else is written;
- the epoch turns: every node's set changes, once;
- a node the fleet blames on net1 is marked blamed there in the sets of the nodes
  that probe it, in their first write already; the marks go when the blame ends,
  and only those sets are rewritten;
- dry run: nothing written;
- the controller writes only that one annotation of a Node.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable

import anyio
import pytest
from prometheus_client import CollectorRegistry

from healthd.blame.peersets import PeerSet, decode
from healthd.config import Config
from healthd.controller.controller import Controller
from healthd.controller.metrics import ControllerMetrics
from healthd.kube.objects import PODS
from healthd.sim.apiserver import ApiEmulator, RecordedRequest
from tests.blame.conftest import agent_node
from tests.controller.conftest import KEYS, KubeFactory, Obj, eventually, node, settings

pytestmark = pytest.mark.anyio

AGENTS = "healthd-system"
LABEL = {"app.kubernetes.io/name": "healthd-agent"}
FLEET = [f"gpu-{i:03d}" for i in range(50)]
HOUR = 3600.0


def agent_pod(i: int, node_name: str, *, net1: bool | None = None) -> Obj:
    """The agent pod on `node_name`; on net1 too when `net1` says so (by default, for
    every other node)."""
    annotations = {}
    if net1 if net1 is not None else i % 2 == 0:  # on net1 too, as Multus says
        annotations["k8s.v1.cni.cncf.io/network-status"] = json.dumps([
            {"name": "pod", "interface": "eth0", "ips": [f"10.0.0.{i + 1}"], "default": True},
            {"name": "healthd-system/net1", "interface": "net1", "ips": [f"192.168.1.{i + 1}"]}])
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"healthd-agent-{i}", "namespace": AGENTS, "labels": LABEL,
                         "annotations": annotations,
                         "creationTimestamp": "2026-11-26T00:00:00Z"},
            "spec": {"nodeName": node_name, "containers": [{"name": "agent", "image": "i"}]},
            "status": {"phase": "Running", "podIP": f"10.0.0.{i + 1}",
                       "podIPs": [{"ip": f"10.0.0.{i + 1}"}]}}


def seed_fleet(api: ApiEmulator) -> None:
    api.seed(*[node(n) for n in FLEET], *[agent_pod(i, n) for i, n in enumerate(FLEET)])


def published(api: ApiEmulator) -> dict[str, PeerSet]:
    out = {}
    for name in FLEET:
        raw = (api.get("Node", name) or {})["metadata"].get("annotations", {}).get(KEYS.peers)
        if raw is not None:
            out[name] = decode(raw)
    return out


def peer_writes(api: ApiEmulator) -> list[RecordedRequest]:
    return [r for r in api.writes(path=r"/api/v1/nodes/.*")]


def fake_clock(at: float) -> Callable[[], float]:
    """Wall time that starts at `at` and runs with the real one."""
    start = time.monotonic()
    return lambda: at + time.monotonic() - start


@contextlib.asynccontextmanager
async def running(kube_for: KubeFactory, config: Config, clock: Callable[[], float],
                  name: str = "ctl") -> AsyncIterator[Controller]:
    """A controller running (leading, alone) until the block ends."""
    controller = Controller(config, kube=kube_for(name), identity=name, clock=clock,
                            metrics=ControllerMetrics(CollectorRegistry()))
    async with anyio.create_task_group() as group:
        group.start_soon(controller.run)
        try:
            yield controller
        finally:
            group.cancel_scope.cancel()


async def test_every_node_gets_16_peers_per_network_and_steady_state_writes_nothing(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    seed_fleet(api)
    async with running(kube_for, settings(), fake_clock(10 * HOUR)) as controller:
        await eventually(lambda: len(published(api)) == 50, within=10)
        sets = published(api)
        net1 = {n for i, n in enumerate(FLEET) if i % 2 == 0}
        for name, peer_set in sets.items():
            assert peer_set.epoch == 10
            assert len(peer_set.probed()) == 16
            assert len(peer_set.probed("net1")) == (16 if name in net1 else 0)
        probed_by = Counter(p for s in sets.values() for p in s.probed())
        assert set(probed_by.values()) == {16}
        one = sets["gpu-000"].peers[0]
        index = FLEET.index(one.name)
        if one.addresses:
            assert list(one.addresses) == [f"10.0.0.{index + 1}"]
        assert len(peer_writes(api)) == 50
        body = peer_writes(api)[0].body
        assert list(body["metadata"]) == ["annotations"]
        assert list(body["metadata"]["annotations"]) == [KEYS.peers]

        # Heartbeats (a status change) and time within the epoch: nothing to write.
        for name in FLEET[:10]:
            stored = api.get("Node", name)
            assert stored is not None
            stored["status"]["conditions"] = [{"type": "Ready", "status": "True",
                                               "lastHeartbeatTime": "2026-11-26T10:00:00Z"}]
            api.put(stored)
        await anyio.sleep(1.5)
        assert len(peer_writes(api)) == 50

        # An agent pod goes: its Node loses the annotation; its 16 probers are rewritten.
        gone = "gpu-007"
        probers = [n for n, s in sets.items() if gone in s.probed()]
        kube = kube_for("admin")
        await kube.delete(PODS, "healthd-agent-7", AGENTS)
        await eventually(lambda: gone not in published(api), within=10)
        await anyio.sleep(1.5)
        rewritten = {r.path.rsplit("/", 1)[-1] for r in peer_writes(api)[50:]}
        assert set(probers) <= rewritten | {gone}
        assert len(peer_writes(api)) - 50 <= len(probers) + 1
        assert all(gone not in s.probed() for s in published(api).values())

    # A new leader (or a restarted one) finds everything as it should be.
    before = len(peer_writes(api))
    async with running(kube_for, settings(), fake_clock(10 * HOUR), name="ctl-2") as controller:
        await eventually(lambda: controller.term is not None
                         and controller.term.peering.pods.synced.is_set(), within=10)
        await anyio.sleep(1.5)
    assert len(peer_writes(api)) == before


async def test_each_rotation_rewrites_every_node_once(api: ApiEmulator,
                                                      kube_for: KubeFactory) -> None:
    seed_fleet(api)
    async with running(kube_for, settings(), fake_clock(11 * HOUR - 2.0)):
        await eventually(lambda: len(published(api)) == 50, within=10)
        first = published(api)
        assert {s.epoch for s in first.values()} == {10}
        await eventually(lambda: {s.epoch for s in published(api).values()} == {11},
                         within=10)
        await anyio.sleep(1.0)
    turned = published(api)
    assert len(peer_writes(api)) == 100
    changed = sum(first[n].probed() != turned[n].probed() for n in FLEET)
    assert changed == 50


async def test_dry_run_writes_no_peers(api: ApiEmulator, kube_for: KubeFactory) -> None:
    seed_fleet(api)
    async with running(kube_for, settings(dry_run=True), fake_clock(10 * HOUR)) as controller:
        await eventually(lambda: controller.term is not None
                         and controller.term.peering.writes == 50, within=10)
    assert peer_writes(api) == []


async def test_a_node_blamed_on_net1_is_marked_in_the_sets_of_its_probers(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    nodes, dead = [f"n{i}" for i in range(6)], "n5"
    api.seed(*[agent_node(n, nodes, networks={"net1": ((), True) if n == dead
                                               else ([dead], False)}) for n in nodes],
             *[agent_pod(i, n, net1=True) for i, n in enumerate(nodes)])

    def marks() -> dict[str, dict[str, list[str]]]:
        sets = {n: decode(raw) for n in nodes
                if (raw := (api.get("Node", n) or {})["metadata"]["annotations"].get(
                    KEYS.peers)) is not None}
        return {n: {p.name: sorted(p.blamed) for p in s.peers if p.blamed}
                for n, s in sets.items()}

    async with running(kube_for, settings(), fake_clock(10 * HOUR)):
        blamed = {n: {dead: ["net1"]} for n in nodes if n != dead} | {dead: {}}
        await eventually(lambda: marks() == blamed, within=10)
        assert len(peer_writes(api)) == 6  # the first write carried the blame already
        for n in nodes:  # the NIC is back: every agent reaches everyone on net1
            stored = api.get("Node", n)
            assert stored is not None
            stored["metadata"]["annotations"][KEYS.health] = agent_node(
                n, nodes, networks={"net1": ((), False)})["metadata"]["annotations"][KEYS.health]
            api.put(stored)
        await eventually(lambda: marks() == {n: {} for n in nodes}, within=10)
        await anyio.sleep(1.5)
        rewritten = [r.path.rsplit("/", 1)[-1] for r in peer_writes(api)[6:]]
        assert sorted(rewritten) == [n for n in nodes if n != dead]
