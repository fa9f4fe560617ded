"""A fleet of agents pinging bounded, rotating peer sets, round after round, made of
the real parts: the peer sets the controller publishes (healthd.blame.peersets), the
real `ping` check over a fake prober that answers as the fault says, each agent's
real verdict machine and the health annotation it renders, and the controller's
blame over those Nodes (healthd.blame.networks), handed back to the next round's peer
sets as the controller publishes it. Only ICMP is simulated."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from checks.base import CheckContext, CheckResult, run_check
from checks.catalog import Catalog
from checks.ping import PingCheck
from checks.probes import Echo, Probes
from healthd.agent import verdict as v
from healthd.agent.node_view import health_json
from healthd.blame.networks import Assessment, assess_networks, rows_by_network
from healthd.blame.peersets import Blame, Member, PeerSet, peer_sets
from tests.controller.conftest import KEYS, Obj, node

NET1 = "net1"
INTERVAL_S = 300.0  # ping's default interval: one round

# (reporter, target, network, round) -> whether the echo comes back
Reach = Callable[[str, str, str, int], bool]


def everything_reachable(reporter: str, target: str, network: str, turn: int) -> bool:
    return True


def members(count: int) -> list[Member]:
    """`count` GPU nodes with a pod address and a net1 address each."""
    return [Member(f"gpu-{i:03d}", (f"10.0.{i // 250}.{i % 250 + 1}",),
                   {NET1: (f"192.168.{i // 250}.{i % 250 + 1}",)}) for i in range(count)]


class _Prober:
    """Echoes as `reach` says, for one reporter in one round."""

    def __init__(self, reporter: str, owners: dict[str, tuple[str, str]], reach: Reach,
                 turn: int) -> None:
        self._reporter, self._owners, self._reach, self._turn = reporter, owners, reach, turn
        self.sent = 0

    async def probe(self, address: str, *, count: int, interval_s: float,
                    timeout_s: float) -> Echo:
        self.sent += count
        target, network = self._owners[address]
        up = self._reach(self._reporter, target, network, self._turn)
        return Echo(address, count, (0.3,) * count if up else ())


@dataclass
class Fleet:
    """Agents on `nodes`, each probing `k` peers per network; `silent` agents are down
    (they neither report nor answer). `blamed`: what the latest round's judgement
    blames, which the next round's peer sets carry."""

    nodes: list[Member]
    k: int = 16
    rounds_per_epoch: int = 12  # one hour of five-minute rounds
    silent: frozenset[str] = frozenset()
    states: dict[str, v.HealthState] = field(default_factory=dict)
    echoes: int = 0  # sent by all agents, over all rounds
    probed_most: int = 0  # the most peers one agent probed on one network in a round
    blamed: frozenset[Blame] = frozenset()

    def __post_init__(self) -> None:
        self.owners = {a: (m.node, "pod") for m in self.nodes for a in m.addresses}
        self.owners.update({a: (m.node, n) for m in self.nodes
                            for n, addresses in m.networks.items() for a in addresses})

    def sets(self, turn: int) -> dict[str, PeerSet]:
        return peer_sets(self.nodes, self.k, turn // self.rounds_per_epoch, self.blamed)

    def play(self, turn: int, reach: Reach) -> dict[str, Assessment]:
        """One round: every live agent pings its peers, then the controller judges."""
        sets = self.sets(turn)
        results = anyio.run(self._ping_all, sets, reach, turn)
        for m in self.nodes:
            if m.node in self.silent:
                continue
            result = results[m.node]
            state = self.states.get(m.node, v.initial())
            self.states[m.node] = v.apply(state, "ping", result, trigger=v.Trigger.PERIODIC,
                                          at=turn * INTERVAL_S, policy=v.Policy())
            for network in ("", NET1):
                self.probed_most = max(self.probed_most, len(sets[m.node].probed(
                    network or "pod")))
        found = assess_networks(rows_by_network(self.node_objects(), KEYS))
        self.blamed = frozenset((node, network) for network, a in found.items()
                                for node in a.blamed)
        return found

    def verdicts(self) -> dict[str, str]:
        """Every reporting node's verdict label as its agent publishes it."""
        return {name: state.verdict.value for name, state in self.states.items()}

    def holding(self, code: str) -> set[str]:
        """The nodes whose agent holds a finding `code` (on any entity)."""
        return {name for name, state in self.states.items()
                if any(h.code == code for h in state.held)}

    async def _ping_all(self, sets: dict[str, PeerSet], reach: Reach, turn: int
                        ) -> dict[str, CheckResult]:
        return {m.node: await self._ping(m.node, sets[m.node], reach, turn)
                for m in self.nodes if m.node not in self.silent}

    async def _ping(self, name: str, peers: PeerSet, reach: Reach, turn: int) -> CheckResult:
        def alive(reporter: str, target: str, network: str, at: int) -> bool:
            return target not in self.silent and reach(reporter, target, network, at)
        prober = _Prober(name, self.owners, alive, turn)
        ctx = CheckContext(catalog=Catalog(), node_name=name, peers=peers.peers)
        result = await run_check(PingCheck({}, probes=Probes(ping=prober)), ctx)
        self.echoes += prober.sent
        return result

    def node_objects(self) -> list[Obj]:
        """Every Node as its agent left it (a silent agent's shows no ping view)."""
        out = []
        for m in self.nodes:
            state = self.states.get(m.node)
            obj = node(m.node, state.verdict.value if state else "PASS")
            if state is not None:
                obj["metadata"]["annotations"][KEYS.health] = health_json(state)
            out.append(obj)
        return out
