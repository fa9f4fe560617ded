"""The ping check on several networks, with the fake Prober of the judging tests.

Tests: each network judged on its own (a peer silent on net1 only is
PEER_UNREACHABLE on peer/n2@net1, its pod-network entity PASS); isolation on one
network is NETWORK_ISOLATED about network/net1, not the node; `networks` limits what
is probed (a named list, the pod network as `pod`); `per_network` count and
timeout reach the prober; an address still in flight at a network's deadline is
UNKNOWN for that peer, not unreachable; a peer attached to net1 only for some peers
is probed there only; a peer's duplicate entries are merged per network; peers the
fleet blames on net1 (and only there) are left out of this node's isolation count on
net1, over at least two peers it does not blame, and a node that reaches none of its
peers is isolated whatever the blame.
"""

from __future__ import annotations

import anyio
import pytest

from checks.base import CheckContext, CheckResult, Peer, Severity, run_check
from checks.catalog import Catalog
from checks.ping import PingCheck
from checks.probes import Echo, Probes
from tests.network.test_ping_judging import UP, FakeProber

pytestmark = pytest.mark.anyio

PEERS = [Peer(f"n{i}", (f"10.0.0.{i}",), {"net1": (f"192.168.1.{i}",)}) for i in (1, 2, 3)]
ALL_UP = {a: UP for p in PEERS for a in (*p.addresses, *p.networks["net1"])}


async def run(prober: FakeProber, peers: list[Peer] = PEERS, **params: object) -> CheckResult:
    ctx = CheckContext(catalog=Catalog(), node_name="n0", peers=peers)
    return await run_check(PingCheck(params, probes=Probes(ping=prober)), ctx)


def codes(result: CheckResult) -> list[tuple[str, str]]:
    return [(f.code, f.entity.label) for f in result.findings]


def status(result: CheckResult, label: str) -> Severity:
    return next(e.status for e in result.entities if e.entity.label == label)


async def test_each_network_is_judged_on_its_own() -> None:
    table = {**ALL_UP}
    del table["192.168.1.2"]
    result = await run(FakeProber(table))
    assert codes(result) == [("PEER_UNREACHABLE", "peer/n2@net1")]
    assert "network net1 (192.168.1.2)" in result.findings[0].message
    assert status(result, "peer/n2") is Severity.PASS
    assert len(result.entities) == 6


async def test_isolated_on_net1_is_about_the_network_not_the_node() -> None:
    table = {a: UP for p in PEERS for a in p.addresses}
    result = await run(FakeProber(table))
    assert codes(result) == [("NETWORK_ISOLATED", "network/net1")]
    assert "on net1" in result.findings[0].message
    assert result.status is Severity.ERR
    assert status(result, "peer/n1") is Severity.PASS


@pytest.mark.parametrize(("networks", "probed"), [
    (["net1"], {"192.168.1.1", "192.168.1.2", "192.168.1.3"}),
    (["pod"], {"10.0.0.1", "10.0.0.2", "10.0.0.3"}),
    (["net7"], set()),
])
async def test_networks_names_what_is_probed(networks: list[str], probed: set[str]) -> None:
    prober = FakeProber(ALL_UP)
    result = await run(prober, networks=networks)
    assert {c[0] for c in prober.calls} == probed
    assert result.status is (Severity.PASS if probed else Severity.SKIPPED)


async def test_per_network_count_and_timeout_reach_the_prober() -> None:
    prober = FakeProber(ALL_UP)
    await run(prober, count=3, timeout_s=1.0,
              per_network={"net1": {"count": 5, "timeout_s": 0.25}})
    sent = {address: (count, timeout) for address, count, _, timeout in prober.calls}
    assert sent["192.168.1.1"] == (5, 0.25)
    assert sent["10.0.0.1"] == (3, 1.0)


class SlowOn(FakeProber):
    """Answers net1 only after a long wait."""

    async def probe(self, address: str, *, count: int, interval_s: float,
                    timeout_s: float) -> Echo:
        if address.startswith("192.168."):
            await anyio.sleep(5)
        return await super().probe(address, count=count, interval_s=interval_s,
                                   timeout_s=timeout_s)


async def test_a_network_past_its_deadline_is_unknown_not_unreachable() -> None:
    with anyio.fail_after(3):
        result = await run(SlowOn(ALL_UP), per_network={"net1": {"deadline_s": 0.2}})
    assert result.findings == ()
    assert status(result, "peer/n1@net1") is Severity.UNKNOWN
    assert "deadline" in next(e.reason for e in result.entities
                              if e.entity.label == "peer/n1@net1")
    assert status(result, "peer/n1") is Severity.PASS


async def test_peers_not_on_net1_are_probed_on_the_pod_network_only() -> None:
    peers = [*PEERS[:2], Peer("n3", ("10.0.0.3",)), Peer("n1", (), {"net1": ("192.168.9.1",)})]
    prober = FakeProber(ALL_UP)
    result = await run(prober, peers)
    net1 = sorted(e.entity.name for e in result.entities if e.entity.network == "net1")
    assert net1 == ["n1", "n2"]
    assert {"192.168.1.1", "192.168.9.1"} <= {c[0] for c in prober.calls}
    assert result.findings == ()  # n1 answers on one of its net1 addresses


def silent_on_net1(*names: str) -> dict[str, tuple[float, ...]]:
    """Every address answers but the net1 addresses of `names`."""
    silent = {a for p in PEERS if p.name in names for a in p.networks["net1"]}
    return {a: UP for a in ALL_UP if a not in silent}


def blamed(peers: list[Peer], on: dict[str, str]) -> list[Peer]:
    """`peers`, those named in `on` blamed on the network given there."""
    return [Peer(p.name, p.addresses, p.networks, frozenset({on[p.name]}) if p.name in on
                 else frozenset()) for p in peers]


async def test_peers_the_fleet_blames_on_net1_do_not_isolate_this_node_there() -> None:
    """Two of three net1 peers lost their NIC and the fleet blames them: this node
    reaches the one it does not blame, so it is not isolated; it still says whom it
    misses."""
    peers = blamed(PEERS, {"n2": "net1", "n3": "net1"})
    result = await run(FakeProber(silent_on_net1("n2", "n3")), peers)
    assert codes(result) == [("PEER_UNREACHABLE", "peer/n2@net1"),
                             ("PEER_UNREACHABLE", "peer/n3@net1")]
    assert result.status is Severity.WARN


async def test_blame_on_another_network_does_not_count_on_net1() -> None:
    peers = blamed(PEERS, {"n2": "pod", "n3": "pod"})
    result = await run(FakeProber(silent_on_net1("n2", "n3")), peers)
    assert codes(result) == [("NETWORK_ISOLATED", "network/net1")]


async def test_a_node_that_reaches_no_peer_is_isolated_whatever_the_blame() -> None:
    peers = blamed(PEERS, {"n1": "net1", "n2": "net1", "n3": "net1"})
    result = await run(FakeProber(silent_on_net1("n1", "n2", "n3")), peers)
    assert codes(result) == [("NETWORK_ISOLATED", "network/net1")]
    assert result.findings[0].message.startswith("cannot reach 3 of 3 peers on net1: ")


async def test_the_share_is_taken_over_the_peers_the_fleet_does_not_blame() -> None:
    six = [Peer(f"n{i}", (f"10.0.0.{i}",), {"net1": (f"192.168.1.{i}",)}) for i in range(1, 7)]
    up = {a: UP for p in six for a in p.addresses} | {"192.168.1.6": UP}
    peers = blamed(six, {"n1": "net1", "n2": "net1"})
    result = await run(FakeProber(up), peers)  # misses 3 of the 4 it does not blame
    assert codes(result) == [("NETWORK_ISOLATED", "network/net1")]
    assert result.findings[0].message.startswith(
        "cannot reach 3 of 4 peers on net1 (not counting 2 the fleet blames): n3, n4, n5")
    one_left = blamed(six, {f"n{i}": "net1" for i in range(1, 6)})
    result = await run(FakeProber(up), one_left)  # reaches the only one it does not blame
    assert [c for c, _ in codes(result)] == ["PEER_UNREACHABLE"] * 5
