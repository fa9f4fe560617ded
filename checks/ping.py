"""The `ping` check: can this node reach its peer nodes over ICMP echo?

Each peer is probed on every address it has (IPv4 and IPv6) at once; a peer that
answers on any address is reachable. The check judges from THIS node's view only:
an unreachable peer is a `PEER_UNREACHABLE` finding about that peer, and a node
that cannot reach most of its peers is `NETWORK_ISOLATED`. Who is really at fault
when several nodes disagree is a cluster-wide question answered by `checks.blame`
over every node's results.

The ICMP traffic goes through a `Prober`. `IcmpProber` is the real one (icmplib,
raw sockets with CAP_NET_RAW, or unprivileged ICMP datagram sockets); tests swap in
a fake to exercise the judging. Probe errors form a small tree:

    ProbeError              the address could not be probed at all
    └── ProbePermissionError  no right to open ICMP sockets (affects every address)
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import anyio
import icmplib
from pydantic import BaseModel, ConfigDict, Field

from checks.base import BaseCheck, CheckContext, CheckResult, Entity, Peer, ResultBuilder


class ProbeError(Exception):
    """An address could not be probed (the probe itself failed, not the peer)."""


class ProbePermissionError(ProbeError):
    """This process may not open the ICMP sockets it needs."""


def permission_reason(privileged: bool) -> str:
    """One line that says which right is missing and how to grant it."""
    if privileged:
        return (
            "cannot open raw ICMP sockets: the agent needs CAP_NET_RAW "
            "(or set privileged: false and allow its group in net.ipv4.ping_group_range)"
        )
    return (
        f"cannot open ICMP datagram sockets: group {os.getgid()} is outside "
        "net.ipv4.ping_group_range (widen the sysctl, or grant CAP_NET_RAW and set "
        "privileged: true)"
    )


@dataclass(frozen=True)
class Echo:
    """What probing one address gave: requests sent and round-trip times received."""

    address: str
    sent: int
    rtts_ms: tuple[float, ...] = ()

    @property
    def reachable(self) -> bool:
        return bool(self.rtts_ms)

    @property
    def loss(self) -> float:
        """Fraction of requests unanswered; 1.0 when none could even be sent."""
        if self.sent <= 0:
            return 1.0
        return max(0.0, 1.0 - len(self.rtts_ms) / self.sent)


class Prober(Protocol):
    """Sends ICMP echo requests to one address. Raises ProbeError (or its
    ProbePermissionError) when it cannot probe; never for a silent peer."""

    async def probe(
        self, address: str, *, count: int, interval_s: float, timeout_s: float
    ) -> Echo: ...


@dataclass(frozen=True)
class IcmpProber:
    """The real prober: icmplib's asyncio ping, one socket per address."""

    privileged: bool = True

    async def probe(self, address: str, *, count: int, interval_s: float, timeout_s: float) -> Echo:
        try:
            host = await icmplib.async_ping(
                address,
                count=count,
                interval=interval_s,
                timeout=timeout_s,
                privileged=self.privileged,
            )
        except icmplib.SocketPermissionError as exc:
            raise ProbePermissionError(permission_reason(self.privileged)) from exc
        except PermissionError as exc:  # a seccomp or LSM refusal surfaces as EPERM/EACCES
            raise ProbePermissionError(permission_reason(self.privileged)) from exc
        except (icmplib.ICMPLibError, OSError) as exc:
            raise ProbeError(f"{type(exc).__name__}: {exc}") from exc
        return Echo(address, host.packets_sent, tuple(host.rtts))


class PingParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    count: int = Field(3, ge=1, le=100, description="echo requests per address")
    timeout_s: float = Field(1.0, gt=0, le=30, description="wait for each reply")
    interval_s: float = Field(0.2, ge=0, le=10, description="pause between requests")
    concurrency: int = Field(64, ge=1, le=4096, description="addresses probed at once")
    privileged: bool = Field(
        True, description="raw sockets (CAP_NET_RAW); false: ICMP datagram sockets"
    )
    isolated_fraction: float = Field(
        0.5, ge=0, lt=1, description="isolated when MORE than this fraction is unreachable"
    )


@dataclass(frozen=True)
class PeerOutcome:
    """Everything probed for one peer: echoes per valid address, addresses that are
    not IP addresses, and addresses whose probe failed (with why)."""

    peer: Peer
    echoes: tuple[Echo, ...] = ()
    invalid: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()

    @property
    def entity(self) -> Entity:
        return Entity("peer", self.peer.name)

    @property
    def judged(self) -> bool:
        """True when at least one address gave an answer or a real silence."""
        return bool(self.echoes)

    @property
    def reachable(self) -> bool:
        return any(e.reachable for e in self.echoes)

    @property
    def best(self) -> Echo | None:
        """The echo that speaks for the peer: lowest loss, then lowest average RTT."""
        if not self.echoes:
            return None
        return min(self.echoes, key=lambda e: (e.loss, _avg(e.rtts_ms)))

    def values(self) -> dict[str, float | str]:
        """RTT and loss as measured on the best address, plus what was tried."""
        out: dict[str, float | str] = {"addresses": ",".join(self.peer.addresses)}
        best = self.best
        if best is None:
            return out
        out["loss"] = round(best.loss, 4)
        if best.rtts_ms:
            out["rtt_avg_ms"] = round(_avg(best.rtts_ms), 3)
            out["rtt_max_ms"] = round(max(best.rtts_ms), 3)
        return out

    def unknown_reason(self) -> str:
        """Why the peer could not be judged (meaningful when not `judged`)."""
        parts = [f"not an IP address: {a!r}" for a in self.invalid] + list(self.errors)
        return "; ".join(parts) or "no addresses to probe"


def _avg(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("inf")


def _valid_address(address: object) -> bool:
    # Peers must be given as IP addresses: a name would need DNS, which a
    # network check must not depend on (and a typo must not become a lookup).
    if not isinstance(address, str):
        return False  # ipaddress would take an int as an address
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def _merge_peers(peers: Sequence[Peer], self_name: str) -> list[Peer]:
    """One entry per peer name (addresses merged, order kept), without this node."""
    merged: dict[str, list[str]] = {}
    for peer in peers:
        if peer.name == self_name and self_name:
            continue
        given = [peer.addresses] if isinstance(peer.addresses, str) else peer.addresses
        addresses = merged.setdefault(str(peer.name), [])
        addresses.extend(str(a) for a in given if str(a) not in addresses)
    return [Peer(name, tuple(addresses)) for name, addresses in sorted(merged.items())]


class PingCheck(BaseCheck):
    """Pings every peer on every address; reports unreachable peers and isolation."""

    NAME: ClassVar[str] = "ping"
    Params: ClassVar[type[BaseModel]] = PingParams
    DEFAULT_INTERVAL_S: ClassVar[float] = 300.0
    # Room for large fleets: 64 addresses at a time, ~3.4 s each with the defaults.
    DEFAULT_TIMEOUT_S: ClassVar[float] = 120.0
    DESCRIPTION: ClassVar[str] = "ICMP echo to every peer node (IPv4 and IPv6)"

    params: PingParams

    def __init__(
        self,
        params: BaseModel | Mapping[str, Any] | None = None,
        *,
        prober: Prober | None = None,
    ) -> None:
        super().__init__(params)
        self.prober: Prober = prober or IcmpProber(privileged=self.params.privileged)

    async def run(self, ctx: CheckContext) -> CheckResult:
        peers = _merge_peers(ctx.peers, ctx.node_name)
        if not peers:
            return CheckResult.skipped(self.NAME, "no peers to ping")
        try:
            outcomes = await self._probe_all(peers)
        except ProbePermissionError as exc:
            return CheckResult.unknown(self.NAME, str(exc))
        return self._judge(ctx, outcomes)

    async def _probe_all(self, peers: Sequence[Peer]) -> list[PeerOutcome]:
        """Probe every valid address of every peer, at most `concurrency` at once."""
        limiter = anyio.CapacityLimiter(self.params.concurrency)
        results: dict[tuple[str, str], Echo | ProbeError] = {}

        async def one(name: str, address: str) -> None:
            async with limiter:
                results[(name, address)] = await self._probe_one(address)

        async with anyio.create_task_group() as tg:
            for peer in peers:
                for address in peer.addresses:
                    if _valid_address(address):
                        tg.start_soon(one, peer.name, address)
        for outcome in results.values():
            if isinstance(outcome, ProbePermissionError):
                raise outcome  # no address can be probed: the whole check cannot tell
        return [_outcome(peer, results) for peer in peers]

    async def _probe_one(self, address: str) -> Echo | ProbeError:
        p = self.params
        try:
            return await self.prober.probe(
                address, count=p.count, interval_s=p.interval_s, timeout_s=p.timeout_s
            )
        except ProbeError as exc:
            return exc

    def _judge(self, ctx: CheckContext, outcomes: Sequence[PeerOutcome]) -> CheckResult:
        builder = ResultBuilder(self.NAME, ctx.catalog)
        judged = [o for o in outcomes if o.judged]
        down = [o for o in judged if not o.reachable]
        isolated = len(judged) >= 2 and len(down) > self.params.isolated_fraction * len(judged)
        for outcome in outcomes:
            self._record_peer(builder, outcome, isolated)
        if isolated:
            builder.finding(
                "NETWORK_ISOLATED",
                Entity.node(ctx.node_name or "node"),
                f"cannot reach {len(down)} of {len(judged)} peers: "
                + _some([o.peer.name for o in down]),
                unreachable=len(down),
                peers=len(judged),
            )
        return builder.build()

    def _record_peer(self, builder: ResultBuilder, outcome: PeerOutcome, isolated: bool) -> None:
        entity, values = outcome.entity, outcome.values()
        if not outcome.judged:
            builder.seen(entity, **values)
            builder.unknown(entity, outcome.unknown_reason())
        elif outcome.reachable:
            builder.seen(entity, **values)
        elif isolated:
            # From an isolated node, "peer unreachable" says nothing about the peer:
            # one NETWORK_ISOLATED finding replaces the per-peer noise, and the peer
            # keeps its measured values but is marked as not judged.
            builder.seen(entity, **values)
            builder.unknown(entity, "not judged: this node cannot reach most of its peers")
        else:
            tried = ", ".join(e.address for e in outcome.echoes)
            message = f"peer {outcome.peer.name} does not answer ping on {tried}"
            if outcome.invalid or outcome.errors:
                message += f" (also: {outcome.unknown_reason()})"
            builder.finding("PEER_UNREACHABLE", entity, message, **values)


def _some(names: Sequence[str], shown: int = 10) -> str:
    """A readable list that stays short on a thousand-node fleet."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def _outcome(peer: Peer, results: dict[tuple[str, str], Echo | ProbeError]) -> PeerOutcome:
    echoes: list[Echo] = []
    invalid: list[str] = []
    errors: list[str] = []
    for address in peer.addresses:
        got = results.get((peer.name, address))
        if got is None:
            invalid.append(address)
        elif isinstance(got, Echo):
            echoes.append(got)
        else:
            errors.append(f"{address}: {got}")
    return PeerOutcome(peer, tuple(echoes), tuple(invalid), tuple(errors))
