"""The ping check's judging, with a fake Prober in place of ICMP.

Tests: reachable peers pass with RTT and loss values; one silent peer is
PEER_UNREACHABLE on that peer only; any answering address makes a peer reachable;
more than `isolated_fraction` silent peers is NETWORK_ISOLATED on the node (and the
per-peer findings are dropped); no peers is SKIPPED; missing ICMP permission is
UNKNOWN with a one-line reason; garbage addresses are UNKNOWN for that peer and
never probed; probe errors; the concurrency limit; the real prober's translation
of icmplib's permission error.
"""

from __future__ import annotations

from collections.abc import Mapping

import anyio
import icmplib
import pytest

from checks.base import (
    CheckContext,
    CheckResult,
    Entity,
    EntityStatus,
    Peer,
    Severity,
    run_check,
)
from checks.catalog import Catalog
from checks.ping import IcmpProber, PingCheck, ProbeError, ProbePermissionError
from checks.probes import Echo, Probes

pytestmark = pytest.mark.anyio

UP = (0.4, 0.6, 0.5)


class FakeProber:
    """Answers from a table: RTTs for a live address, an exception to raise, and
    silence (every request lost) for any address not in the table."""

    def __init__(self, table: Mapping[str, tuple[float, ...] | Exception] | None = None) -> None:
        self.table = dict(table or {})
        self.calls: list[tuple[str, int, float, float]] = []
        self.in_flight = self.max_in_flight = 0

    async def probe(self, address: str, *, count: int, interval_s: float, timeout_s: float) -> Echo:
        self.calls.append((address, count, interval_s, timeout_s))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await anyio.sleep(0.01)  # let the other probes start
        finally:
            self.in_flight -= 1
        got = self.table.get(address, ())
        if isinstance(got, Exception):
            raise got
        return Echo(address, count, got[:count])


def _peers(**addresses: str) -> list[Peer]:
    return [Peer(name, tuple(a.split())) for name, a in addresses.items()]


async def _run(
    peers: list[Peer], prober: FakeProber, node: str = "n0", **params: object
) -> CheckResult:
    ctx = CheckContext(catalog=Catalog(), node_name=node, peers=peers)
    return await run_check(PingCheck(params, probes=Probes(ping=prober)), ctx)


def _codes(result: CheckResult) -> list[tuple[str, str]]:
    return [(f.code, f.entity.label) for f in result.findings]


def _entity(result: CheckResult, label: str) -> EntityStatus:
    return next(e for e in result.entities if e.entity.label == label)


THREE = _peers(a="10.0.0.1 fd00:1::1", b="10.0.0.2 fd00:1::2", c="10.0.0.3")


async def test_reachable_peers_pass_with_rtt_and_loss() -> None:
    prober = FakeProber({"10.0.0.1": UP, "10.0.0.2": UP, "10.0.0.3": UP})
    result = await _run(THREE, prober)
    assert result.status is Severity.PASS
    a = _entity(result, "peer/a")
    assert a.values["rtt_avg_ms"] == 0.5 and a.values["rtt_max_ms"] == 0.6
    assert a.values["loss"] == 0.0
    assert a.values["addresses"] == "10.0.0.1,fd00:1::1"


async def test_one_silent_peer_is_unreachable_on_that_peer_only() -> None:
    prober = FakeProber({"10.0.0.1": UP, "10.0.0.3": UP})
    result = await _run(THREE, prober)
    assert _codes(result) == [("PEER_UNREACHABLE", "peer/b")]
    assert result.status is Severity.WARN
    finding = result.findings[0]
    assert finding.severity is Severity.WARN
    assert finding.values["loss"] == 1.0
    assert "10.0.0.2" in finding.message and "fd00:1::2" in finding.message
    assert _entity(result, "peer/a").status is Severity.PASS


async def test_peer_answering_on_ipv6_only_is_reachable() -> None:
    prober = FakeProber({"10.0.0.1": UP, "fd00:1::2": UP, "10.0.0.3": UP})
    result = await _run(THREE, prober)
    assert result.status is Severity.PASS
    assert _entity(result, "peer/b").values["loss"] == 0.0


async def test_partial_loss_is_reachable_with_loss_value() -> None:
    prober = FakeProber({"10.0.0.1": (0.5,), "10.0.0.2": UP, "10.0.0.3": UP})
    result = await _run(THREE, prober)
    assert result.status is Severity.PASS
    assert _entity(result, "peer/a").values["loss"] == pytest.approx(0.6667)


async def test_most_peers_silent_is_network_isolated_without_per_peer_noise() -> None:
    result = await _run(THREE, FakeProber({"10.0.0.3": UP}))
    assert _codes(result) == [("NETWORK_ISOLATED", "node")]
    assert result.findings[0].entity == Entity.node("n0")
    assert result.findings[0].severity is Severity.ERR
    assert result.status is Severity.ERR
    assert _entity(result, "peer/a").status is Severity.UNKNOWN
    assert _entity(result, "peer/a").values["loss"] == 1.0
    assert _entity(result, "peer/c").status is Severity.PASS


async def test_exactly_half_silent_is_not_isolated() -> None:
    peers = _peers(a="10.0.0.1", b="10.0.0.2", c="10.0.0.3", d="10.0.0.4")
    result = await _run(peers, FakeProber({"10.0.0.1": UP, "10.0.0.2": UP}))
    assert _codes(result) == [("PEER_UNREACHABLE", "peer/c"), ("PEER_UNREACHABLE", "peer/d")]


async def test_isolated_fraction_is_a_parameter() -> None:
    peers = _peers(a="10.0.0.1", b="10.0.0.2", c="10.0.0.3", d="10.0.0.4")
    prober = FakeProber({"10.0.0.1": UP, "10.0.0.2": UP, "10.0.0.3": UP})
    result = await _run(peers, prober, isolated_fraction=0.2)
    assert _codes(result) == [("NETWORK_ISOLATED", "node")]


async def test_a_single_silent_peer_is_not_isolation() -> None:
    result = await _run(_peers(a="10.0.0.1"), FakeProber())
    assert _codes(result) == [("PEER_UNREACHABLE", "peer/a")]


@pytest.mark.parametrize("peers", [[], _peers(n0="10.0.0.9")], ids=["none", "only-self"])
async def test_no_peers_is_skipped(peers: list[Peer]) -> None:
    prober = FakeProber()
    result = await _run(peers, prober)
    assert result.status is Severity.SKIPPED
    assert result.reason == "no peers to ping"
    assert prober.calls == []


async def test_missing_permission_is_unknown_with_one_line_reason() -> None:
    denied = ProbePermissionError("cannot open raw ICMP sockets: needs CAP_NET_RAW")
    result = await _run(THREE, FakeProber({"10.0.0.1": denied, "10.0.0.2": UP}))
    assert result.status is Severity.UNKNOWN
    assert result.reason == str(denied)
    assert result.findings == ()


async def test_garbage_address_is_unknown_for_that_peer_and_never_probed() -> None:
    peers = [*THREE, Peer("junk", ("10.0.0.300", "node-7.example"))]
    prober = FakeProber({"10.0.0.1": UP, "10.0.0.2": UP, "10.0.0.3": UP})
    result = await _run(peers, prober)
    junk = _entity(result, "peer/junk")
    assert junk.status is Severity.UNKNOWN
    assert "'10.0.0.300'" in junk.reason and "'node-7.example'" in junk.reason
    assert not {"10.0.0.300", "node-7.example"} & {call[0] for call in prober.calls}
    assert result.findings == ()
    assert result.status is Severity.UNKNOWN


async def test_probe_error_makes_that_peer_unknown_with_reason() -> None:
    broken = ProbeError("SocketAddressError: cannot assign source")
    result = await _run(THREE, FakeProber({"10.0.0.1": UP, "10.0.0.2": UP, "10.0.0.3": broken}))
    c = _entity(result, "peer/c")
    assert c.status is Severity.UNKNOWN
    assert "10.0.0.3" in c.reason and "cannot assign source" in c.reason
    assert result.findings == ()


async def test_non_string_addresses_are_garbage_not_crashes() -> None:
    peers = [*THREE, Peer("odd", [5, None]), Peer("flat", "10.0.0.4")]  # type: ignore[list-item]
    prober = FakeProber({"10.0.0.1": UP, "10.0.0.2": UP, "10.0.0.3": UP, "10.0.0.4": UP})
    result = await _run(peers, prober)
    assert _entity(result, "peer/odd").status is Severity.UNKNOWN
    assert "'5'" in _entity(result, "peer/odd").reason
    assert _entity(result, "peer/flat").status is Severity.PASS


async def test_isolation_message_stays_short_on_a_big_fleet() -> None:
    peers = [Peer(f"p{i:03d}", (f"10.0.{i // 250}.{i % 250 + 1}",)) for i in range(300)]
    result = await _run(peers, FakeProber(), concurrency=300)
    message = result.findings[0].message
    assert message.startswith("cannot reach 300 of 300 peers: p000, p001")
    assert message.endswith("and 290 more")


async def test_peer_with_no_addresses_is_unknown() -> None:
    result = await _run([*THREE, Peer("bare", ())], FakeProber({"10.0.0.1": UP}))
    assert _entity(result, "peer/bare").reason == "no addresses to probe"


async def test_duplicate_peer_entries_are_merged() -> None:
    peers = _peers(a="10.0.0.1") + _peers(a="fd00:1::1 10.0.0.1")
    prober = FakeProber({"fd00:1::1": UP})
    result = await _run(peers, prober)
    assert result.status is Severity.PASS
    assert sorted(call[0] for call in prober.calls) == ["10.0.0.1", "fd00:1::1"]


async def test_params_reach_the_prober_and_concurrency_is_bounded() -> None:
    peers = [Peer(f"p{i}", (f"10.0.1.{i}",)) for i in range(10)]
    prober = FakeProber({f"10.0.1.{i}": UP for i in range(10)})
    result = await _run(peers, prober, count=2, timeout_s=0.5, interval_s=0.1, concurrency=3)
    assert result.status is Severity.PASS
    assert prober.max_in_flight == 3
    assert set(call[1:] for call in prober.calls) == {(2, 0.1, 0.5)}


async def test_real_prober_translates_permission_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    async def refuse(*args: object, **kwargs: object) -> None:
        raise icmplib.SocketPermissionError(False)

    monkeypatch.setattr(icmplib, "async_ping", refuse)
    with pytest.raises(ProbePermissionError, match=r"net\.ipv4\.ping_group_range"):
        await IcmpProber(privileged=False).probe("127.0.0.1", count=1, interval_s=0, timeout_s=1)
    with pytest.raises(ProbePermissionError, match="CAP_NET_RAW"):
        await IcmpProber(privileged=True).probe("127.0.0.1", count=1, interval_s=0, timeout_s=1)


async def test_real_prober_pings_loopback() -> None:
    # Loopback only: raw sockets need CAP_NET_RAW, datagram ones the sysctl.
    try:
        echo = await IcmpProber().probe("127.0.0.1", count=1, interval_s=0, timeout_s=1)
    except ProbePermissionError as exc:
        pytest.skip(f"no ICMP socket here: {exc}")
    assert echo.reachable and echo.loss == 0.0
