"""The ping check against real peers: network namespaces joined by veth pairs.

Tests: all peers up -> PASS with RTTs; each fault (peer link down, blackhole route,
nftables drop of echo requests) -> PEER_UNREACHABLE on exactly that peer; a peer
that loses only IPv4 is still reachable over IPv6; every peer down ->
NETWORK_ISOLATED; unprivileged sockets follow net.ipv4.ping_group_range.
Traffic goes only to the namespaces the lab creates.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import replace

import pytest

from checks.base import CheckContext, CheckResult, Entity, Peer, Severity, run_check
from checks.catalog import Catalog
from checks.ping import PingCheck
from tests.conftest import require_binary
from tests.network.netlab import NetLab

pytestmark = [pytest.mark.root, pytest.mark.anyio]

# The check's own reply timeout (1 s): the replies are read by the event loop, and a
# shorter one lost every echo of an up peer on a loaded 2-core machine.
FAST = {"count": 2, "timeout_s": 1.0, "interval_s": 0.05}
PEERS = ("p0", "p1", "p2")


async def _lab(netlab: NetLab, names: tuple[str, ...] = PEERS) -> CheckContext:
    peers = [await netlab.add_peer(name) for name in names]
    return CheckContext(catalog=Catalog(), node_name="self", peers=peers)


async def _ping(ctx: CheckContext, **params: object) -> CheckResult:
    return await run_check(PingCheck({**FAST, **params}), ctx, timeout_s=15)


def _codes(result: CheckResult) -> list[tuple[str, str]]:
    return [(f.code, f.entity.label) for f in result.findings]


def _status(result: CheckResult, label: str) -> Severity:
    return next(e.status for e in result.entities if e.entity.label == label)


async def test_all_peers_up_pass_with_rtt(netlab: NetLab) -> None:
    result = await _ping(await _lab(netlab))
    assert result.status is Severity.PASS, result.reason
    assert result.findings == ()
    for entity in result.entities:
        assert entity.values["loss"] == 0.0
        assert entity.values["rtt_max_ms"] >= entity.values["rtt_avg_ms"] > 0


async def _nft_drop(netlab: NetLab, name: str) -> None:
    await netlab.drop_echo(name, require_binary("nft"))


async def _blackhole(netlab: NetLab, name: str) -> None:
    await netlab.blackhole(name)


FAULTS: dict[str, Callable[[NetLab, str], Awaitable[None]]] = {
    "link down": NetLab.link_down,
    "blackhole route": _blackhole,
    "nftables drop": _nft_drop,
}


@pytest.mark.parametrize("fault", FAULTS)
async def test_fault_flags_exactly_that_peer(netlab: NetLab, fault: str) -> None:
    ctx = await _lab(netlab)
    await FAULTS[fault](netlab, "p1")
    result = await _ping(ctx)
    assert _codes(result) == [("PEER_UNREACHABLE", "peer/p1")]
    assert result.status is Severity.WARN
    assert result.findings[0].values["loss"] == 1.0
    assert _status(result, "peer/p0") is _status(result, "peer/p2") is Severity.PASS


async def test_peer_reachable_over_ipv6_only_is_reachable(netlab: NetLab) -> None:
    ctx = await _lab(netlab)
    await netlab.blackhole("p1", families=(4,))
    result = await _ping(ctx)
    assert result.status is Severity.PASS
    assert result.findings == ()


async def test_every_peer_down_is_network_isolated(netlab: NetLab) -> None:
    ctx = await _lab(netlab)
    for name in PEERS:
        await netlab.link_down(name)
    result = await _ping(ctx)
    assert _codes(result) == [("NETWORK_ISOLATED", "node")]
    assert result.status is Severity.ERR
    assert result.findings[0].entity == Entity.node("self")


async def test_garbage_address_is_unknown_for_that_peer_only(netlab: NetLab) -> None:
    ctx = await _lab(netlab, ("p0", "p1"))
    ctx = replace(ctx, peers=[*ctx.peers, Peer("junk", ["10.0.0.300", "eth0"])])
    result = await _ping(ctx)
    assert _status(result, "peer/junk") is Severity.UNKNOWN
    assert _status(result, "peer/p0") is _status(result, "peer/p1") is Severity.PASS
    assert result.findings == ()


def _ping_group_allows_us() -> bool:
    with open("/proc/sys/net/ipv4/ping_group_range") as f:
        low, high = (int(x) for x in f.read().split())
    return low <= os.getgid() <= high


@pytest.mark.skipif(_ping_group_allows_us(), reason="net.ipv4.ping_group_range admits us")
async def test_unprivileged_without_ping_group_is_unknown_with_reason(netlab: NetLab) -> None:
    result = await _ping(await _lab(netlab, ("p0",)), privileged=False)
    assert result.status is Severity.UNKNOWN
    assert "net.ipv4.ping_group_range" in result.reason
    assert "\n" not in result.reason


@pytest.mark.skipif(not _ping_group_allows_us(), reason="net.ipv4.ping_group_range excludes us")
async def test_unprivileged_with_ping_group_pings(netlab: NetLab) -> None:
    result = await _ping(await _lab(netlab, ("p0",)), privileged=False)
    assert result.status is Severity.PASS
