"""The `ping` check: can this node reach its peer nodes over ICMP echo, on every
network they share?

Each peer is probed on every address it has (IPv4 and IPv6) at once, per network:
the pod network (`status.podIPs`) and every secondary network it is attached to
(Multus `network-status`, handed over in `Peer.networks`). A peer that answers on
any address of a network is reachable on that network. The check judges each
network on its own, from THIS node's view only: an unreachable peer is a
`PEER_UNREACHABLE` finding about that peer on that network, and a node that cannot
reach most of its peers on a network is `NETWORK_ISOLATED` there (about the node
for the pod network, about `network/<name>` for a secondary one). Who is really at
fault when several nodes disagree is a cluster-wide question answered by
`healthd.blame.judge` over every node's results, network by network.

That answer comes back: a peer the fleet blames on a network (`Peer.blamed`, handed
on by the controller with the peer set) is left out of this node's isolation count
there. Most of its own peers cannot reach it, so missing it says nothing about this
node: a node that reaches every peer the fleet does not blame is not isolated, however
many blamed peers it misses (each is still its `PEER_UNREACHABLE`). The floor holds
for what is left: the share is taken over at least two judged peers the fleet does not
blame; with fewer, only a node that reaches none of its peers is isolated. Blame never
clears that one: a node that reached nobody measured nothing in its own favour.

Which networks are probed, and with how many echoes and what deadline each, is
configuration (`networks`, `per_network`).

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
from typing import Any, ClassVar, Literal

import anyio
import icmplib
from pydantic import BaseModel, ConfigDict, Field

from checks.base import (
    POD_NETWORK,
    AutopilotGauge,
    BaseCheck,
    CheckContext,
    CheckResult,
    Entity,
    Measure,
    Peer,
    ResultBuilder,
    measures,
)
from checks.probes import Echo, Prober, Probes


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


class NetworkProbe(BaseModel):
    """How one network is probed; unset fields take the check's own values."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    count: int | None = Field(None, ge=1, le=100, description="echo requests per address")
    timeout_s: float | None = Field(None, gt=0, le=30, description="wait for each reply")
    deadline_s: float | None = Field(
        None, gt=0, le=600, description="the whole network's probing ends by then"
    )


class PingParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    networks: Literal["all"] | tuple[str, ...] = Field(
        "all", description=f"networks to probe: all, or names ({POD_NETWORK!r} = pod network)"
    )
    per_network: dict[str, NetworkProbe] = Field(
        default_factory=dict, description="count / timeout_s / deadline_s per network name"
    )

    count: int = Field(3, ge=1, le=100, description="echo requests per address")
    timeout_s: float = Field(1.0, gt=0, le=30, description="wait for each reply")
    interval_s: float = Field(0.2, ge=0, le=10, description="pause between requests")
    concurrency: int = Field(64, ge=1, le=4096, description="addresses probed at once")
    privileged: bool = Field(
        True, description="raw sockets (CAP_NET_RAW); false: ICMP datagram sockets"
    )
    isolated_fraction: float = Field(
        0.5, ge=0, lt=1, description="isolated when MORE than this fraction of the peers the fleet "
        "does not blame is unreachable"
    )


@dataclass(frozen=True)
class PeerOutcome:
    """Everything probed for one peer: echoes per valid address, addresses that are
    not IP addresses, and addresses whose probe failed (with why)."""

    peer: Peer
    echoes: tuple[Echo, ...] = ()
    invalid: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    network: str = POD_NETWORK

    @property
    def entity(self) -> Entity:
        return Entity.peer(self.peer.name, self.network)

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
    """One entry per peer name (addresses merged per network, order kept), without
    this node."""
    merged: dict[str, dict[str, list[str]]] = {}
    blamed: dict[str, frozenset[str]] = {}
    for peer in peers:
        if peer.name == self_name and self_name:
            continue
        networks = merged.setdefault(str(peer.name), {POD_NETWORK: []})
        blamed[str(peer.name)] = blamed.get(str(peer.name), frozenset()) | peer.blamed
        for network, given in [(POD_NETWORK, peer.addresses), *peer.networks.items()]:
            addresses = networks.setdefault(str(network), [])
            listed = [given] if isinstance(given, str) else given
            addresses.extend(str(a) for a in listed if str(a) not in addresses)
    return [
        Peer(name, tuple(nets.pop(POD_NETWORK)), {n: tuple(a) for n, a in nets.items() if a},
             blamed[name])
        for name, nets in sorted(merged.items())
    ]


@dataclass(frozen=True)
class NetworkPlan:
    """One network to probe: the peers on it (with their addresses there) and how."""

    network: str
    peers: tuple[Peer, ...]
    count: int
    timeout_s: float
    deadline_s: float | None

    @property
    def secondary(self) -> bool:
        return self.network != POD_NETWORK


def plan_networks(peers: Sequence[Peer], params: PingParams) -> list[NetworkPlan]:
    """The networks to probe (pod network first, then by name), as configured. A
    network only some peers are attached to is probed on those peers only; a peer
    given with secondary addresses only is one to probe on those networks only (a
    bounded peer set names each peer where it was chosen); one with no address at all
    is still reported, as not probed."""
    on: dict[str, list[Peer]] = {POD_NETWORK: [p for p in peers
                                               if p.addresses or not p.networks]}
    for peer in peers:
        for network, addresses in sorted(peer.networks.items()):
            on.setdefault(network, []).append(Peer(peer.name, addresses,
                                                   blamed=peer.blamed))
    wanted = params.networks
    plans = []
    for network in sorted(on, key=lambda n: (n != POD_NETWORK, n)):
        if not on[network] or (wanted != "all" and network not in wanted):
            continue
        how = params.per_network.get(network, NetworkProbe())
        plans.append(NetworkPlan(
            network, tuple(on[network]),
            count=how.count or params.count,
            timeout_s=how.timeout_s or params.timeout_s,
            deadline_s=how.deadline_s))
    return plans


class PingCheck(BaseCheck):
    """Pings every peer on every address; reports unreachable peers and isolation."""

    NAME: ClassVar[str] = "ping"
    Params: ClassVar[type[BaseModel]] = PingParams
    DEFAULT_INTERVAL_S: ClassVar[float] = 300.0
    # Room for large fleets: 64 addresses at a time, ~3.4 s each with the defaults.
    DEFAULT_TIMEOUT_S: ClassVar[float] = 120.0
    DESCRIPTION: ClassVar[str] = "ICMP echo to every peer node on every network (IPv4, IPv6)"
    MEASURES: ClassVar[tuple[Measure, ...]] = (
        Measure("healthd_peer_ping_loss_ratio",
                "Share of echoes lost on the peer's best address.", "loss", "peer"),
        *measures("healthd_peer_ping_rtt_seconds", "Ping round-trip time in seconds.", "stat",
                  {"avg": "rtt_avg_ms", "max": "rtt_max_ms"}, kind="peer", scale=1e-3),
        Measure("healthd_network_peer_ping_loss_ratio", "Share of echoes lost on the peer's "
                "best address on a secondary network.", "loss", "peer", secondary=True),
        Measure("healthd_network_peer_ping_rtt_seconds", "Average ping round-trip time on a "
                "secondary network, in seconds.", "rtt_avg_ms", "peer", scale=1e-3,
                secondary=True),
    )
    AUTOPILOT: ClassVar[AutopilotGauge | None] = AutopilotGauge("ping", per="peer")
    REACHABILITY: ClassVar[bool] = True  # the node's view of its peers, per network
    CODES: ClassVar[tuple[str, ...]] = ("PEER_UNREACHABLE", "NETWORK_ISOLATED")

    params: PingParams

    def __init__(
        self,
        params: BaseModel | Mapping[str, Any] | None = None,
        *,
        probes: Probes | None = None,
    ) -> None:
        super().__init__(params, probes=probes)

    async def run(self, ctx: CheckContext) -> CheckResult:
        plans = plan_networks(_merge_peers(ctx.peers, ctx.node_name), self.params)
        if not plans:
            return CheckResult.skipped(self.NAME, "no peers to ping")
        prober: Prober = self.probes.ping or IcmpProber(privileged=self.params.privileged)
        limiter = anyio.CapacityLimiter(self.params.concurrency)
        outcomes: dict[str, list[PeerOutcome] | ProbePermissionError] = {}
        async with anyio.create_task_group() as tg:
            for plan in plans:
                tg.start_soon(self._probe_network, prober, plan, limiter, outcomes)
        for got in outcomes.values():
            if isinstance(got, ProbePermissionError):  # no address can be probed at all
                return CheckResult.unknown(self.NAME, str(got))
        builder = ResultBuilder(self.NAME, ctx.catalog)
        for plan in plans:
            judged = outcomes[plan.network]
            assert not isinstance(judged, ProbeError)
            self._judge(builder, ctx, plan, judged)
        return builder.build()

    async def _probe_network(
        self, prober: Prober, plan: NetworkPlan, limiter: anyio.CapacityLimiter,
        into: dict[str, list[PeerOutcome] | ProbePermissionError],
    ) -> None:
        """Probe every valid address of every peer on one network, within its
        deadline; an address still in flight at the deadline could not be judged."""
        results: dict[tuple[str, str], Echo | ProbeError] = {}

        async def one(name: str, address: str) -> None:
            async with limiter:
                results[(name, address)] = await self._probe_one(prober, plan, address)

        with anyio.move_on_after(plan.deadline_s):
            async with anyio.create_task_group() as tg:
                for peer in plan.peers:
                    for address in peer.addresses:
                        if _valid_address(address):
                            tg.start_soon(one, peer.name, address)
        late = ProbeError(f"no answer within the {plan.network} deadline of {plan.deadline_s} s")
        for peer in plan.peers:
            for address in filter(_valid_address, peer.addresses):
                results.setdefault((peer.name, address), late)
        denied = [o for o in results.values() if isinstance(o, ProbePermissionError)]
        if denied:  # no address can be probed: the whole check cannot tell
            into[plan.network] = denied[0]
            return
        into[plan.network] = [_outcome(peer, results, plan.network) for peer in plan.peers]

    async def _probe_one(self, prober: Prober, plan: NetworkPlan,
                         address: str) -> Echo | ProbeError:
        try:
            return await prober.probe(
                address, count=plan.count, interval_s=self.params.interval_s,
                timeout_s=plan.timeout_s,
            )
        except ProbeError as exc:
            return exc

    def _judge(self, builder: ResultBuilder, ctx: CheckContext, plan: NetworkPlan,
               outcomes: Sequence[PeerOutcome]) -> None:
        judged = [o for o in outcomes if o.judged]
        counted = _isolation_count(judged, plan.network, self.params.isolated_fraction)
        for outcome in outcomes:
            self._record_peer(builder, outcome, counted is not None)
        if counted is None:
            return
        down = [o for o in counted if not o.reachable]
        # On the pod network the node itself is cut off; on a secondary network
        # the node's attachment to that network is.
        entity = (Entity("network", plan.network) if plan.secondary
                  else Entity.node(ctx.node_name or "node"))
        where = f" on {plan.network}" if plan.secondary else ""
        builder.finding(
            "NETWORK_ISOLATED",
            entity,
            f"cannot reach {len(down)} of {len(counted)} peers{where}"
            + _not_counted(len(judged) - len(counted)) + ": " + _some([o.peer.name for o in down]),
            unreachable=len(down),
            peers=len(counted),
        )

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
            if outcome.network != POD_NETWORK:
                tried = f"network {outcome.network} ({tried})"
            message = f"peer {outcome.peer.name} does not answer ping on {tried}"
            if outcome.invalid or outcome.errors:
                message += f" (also: {outcome.unknown_reason()})"
            builder.finding("PEER_UNREACHABLE", entity, message, **values)


def _isolation_count(judged: Sequence[PeerOutcome], network: str,
                    fraction: float) -> list[PeerOutcome] | None:
    """The peers this node's isolation on `network` is judged over, when it is isolated
    (None when not): more than `fraction` of the judged peers the fleet does not blame
    there are unreachable, over at least two of them; or it reached none of its judged
    peers (two at least), blamed or not (see the module docstring)."""
    if len(judged) >= 2 and not any(o.reachable for o in judged):
        return list(judged)
    counted = [o for o in judged if network not in o.peer.blamed]
    down = sum(not o.reachable for o in counted)
    return counted if len(counted) >= 2 and down > fraction * len(counted) else None


def _not_counted(blamed: int) -> str:
    """What the isolation count leaves out: the peers the fleet blames."""
    if not blamed:
        return ""
    return f" (not counting {blamed} the fleet blames)"


def _some(names: Sequence[str], shown: int = 10) -> str:
    """A readable list that stays short on a thousand-node fleet."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def _outcome(
    peer: Peer, results: dict[tuple[str, str], Echo | ProbeError], network: str
) -> PeerOutcome:
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
    return PeerOutcome(peer, tuple(echoes), tuple(invalid), tuple(errors), network)
