"""Who pings whom: a bounded, rotating peer set per node and network, and the
`healthd.io/peers` annotation that carries it to each agent.

Pinging every other node is O(N) per agent and O(N^2) per fleet (DESIGN.md, Scale).
Instead each node probes `k` peers per network (16 by default), and the sets are a
pure function of the node names, the network and the epoch (the interval number,
`floor(unix time / epoch length)`), so the controller that publishes them, a test and
a person with the names can all recompute them:

1. the network's members (nodes with an address there) are put on a ring, ordered by
   `sha256("<epoch>/<network>/<node>")`: a fresh pseudo-random order every epoch
   and every network, so no two nodes stay neighbours for long and the ring has
   nothing to do with racks or switches;
2. the node at ring position i probes the nodes at positions i+1 .. i+k (mod N).

Every node is then probed by exactly k others and probes exactly k (each offset is a
permutation of the ring), whatever N is, as long as N > k; with N <= k every node
probes every other one. The sets rotate: a new epoch is a new ring. A node that joins
or leaves moves only the k nodes before it on the ring, so churn costs k + 1 new sets,
not N; a rotation costs one new set per node per epoch (N annotation writes per epoch
length, 1 h by default).

Blame reads the same annotation: whom a reporter probed is the peer set on its own
Node (healthd.blame.networks). And the annotation carries blame back: a peer the
fleet blames on a network is marked so (`"blamed": ["net1"]`) in the sets of the
nodes that probe it there, so that their own `ping` check does not count it against
them (checks.ping). A blame that starts or ends rewrites those `k` sets, no others.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from checks.base import POD_NETWORK, Peer

DEFAULT_PEERS = 16
DEFAULT_EPOCH_S = 3600.0
MAX_ANNOTATION_BYTES = 256 * 1024  # the agent refuses anything larger


def epoch_of(now: float, epoch_s: float) -> int:
    """The interval number `now` falls in."""
    return int(now // epoch_s)


def ring(members: Iterable[str], epoch: int, network: str = POD_NETWORK) -> list[str]:
    """The members in this epoch's ring order for `network` (step 1 above)."""
    def place(node: str) -> tuple[str, str]:
        digest = hashlib.sha256(f"{epoch}/{network}/{node}".encode()).hexdigest()
        return digest, node
    return sorted(set(members), key=place)


def assign(members: Iterable[str], k: int, epoch: int,
           network: str = POD_NETWORK) -> dict[str, tuple[str, ...]]:
    """node -> the peers it probes on `network` in `epoch` (step 2 above)."""
    order = ring(members, epoch, network)
    n = len(order)
    reach = min(k, n - 1)
    return {node: tuple(order[(i + step) % n] for step in range(1, reach + 1))
            for i, node in enumerate(order)}


# -- the annotation ---------------------------------------------------------------------


@dataclass(frozen=True)
class PeerSet:
    """What one node's agent probes: `peers` (a ping `Peer` each: its pod-network
    addresses when it is a peer on the pod network, its addresses on each secondary
    network where it is a peer there, and the networks of those on which the fleet
    blames it), for `epoch`."""

    epoch: int
    peers: tuple[Peer, ...] = ()

    def probed(self, network: str = POD_NETWORK) -> frozenset[str]:
        """The names this node probes on `network`."""
        if network == POD_NETWORK:
            return frozenset(p.name for p in self.peers if p.addresses)
        return frozenset(p.name for p in self.peers if p.networks.get(network))

    def encode(self) -> str:
        return json.dumps({"epoch": self.epoch, "peers": [_peer_json(p) for p in self.peers]},
                          sort_keys=True, separators=(",", ":"))


def _peer_json(peer: Peer) -> dict[str, Any]:
    out: dict[str, Any] = {"node": peer.name}
    if peer.addresses:
        out["addresses"] = list(peer.addresses)
    if peer.networks:
        out["networks"] = {n: list(a) for n, a in sorted(peer.networks.items())}
    if peer.blamed:
        out["blamed"] = sorted(peer.blamed)
    return out


class BadPeerSet(ValueError):
    """The annotation is there but is not a peer set; the message says why."""


def decode(raw: object) -> PeerSet:
    """The peer set in an annotation value; BadPeerSet when it is not one."""
    if not isinstance(raw, str) or len(raw) > MAX_ANNOTATION_BYTES:
        raise BadPeerSet("not a string of at most 256 KiB")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise BadPeerSet(f"not JSON ({exc})") from None
    if not isinstance(body, dict) or not isinstance(body.get("epoch"), int) \
            or not isinstance(body.get("peers"), list):
        raise BadPeerSet("not an object with an integer epoch and a list of peers")
    return PeerSet(body["epoch"], tuple(_peer_from(p) for p in body["peers"]))


def _peer_from(item: object) -> Peer:
    if not isinstance(item, dict) or not isinstance(item.get("node"), str):
        raise BadPeerSet("a peer without a node name")
    networks = item.get("networks", {})
    if not isinstance(networks, dict):
        raise BadPeerSet(f"peer {item['node']}: networks is not an object")
    return Peer(item["node"], _strings(item.get("addresses"), "addresses"),
                {str(n): _strings(a, "addresses") for n, a in networks.items()},
                frozenset(_strings(item.get("blamed"), "blamed networks")))


def _strings(value: object, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise BadPeerSet(f"{what} are not a list of strings")
    return tuple(value)


# -- from the agents' addresses to every node's peer set ------------------------------


@dataclass(frozen=True)
class Member:
    """One node's agent as peers see it: pod-network addresses, and per secondary
    network its addresses there."""

    node: str
    addresses: tuple[str, ...]
    networks: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


Blame = tuple[str, str]  # (node, network): the fleet blames the node on that network


def peer_sets(members: Sequence[Member], k: int, epoch: int,
              blamed: Collection[Blame] = ()) -> dict[str, PeerSet]:
    """Every member's peer set: `assign` on the pod network over the members with a
    pod address, and on each secondary network over the members attached there; a
    peer in `blamed` on a network it is probed on is marked blamed there."""
    by_name = {m.node: m for m in members}
    on: dict[str, list[str]] = {POD_NETWORK: [m.node for m in members if m.addresses]}
    for m in members:
        for network, addresses in m.networks.items():
            if addresses:
                on.setdefault(network, []).append(m.node)
    chosen: dict[str, dict[str, list[str]]] = {m.node: {} for m in members}
    for network, names in on.items():
        for node, peers in assign(names, k, epoch, network).items():
            for peer in peers:
                chosen[node].setdefault(peer, []).append(network)
    blame = frozenset(blamed)
    return {node: PeerSet(epoch, tuple(_peer(by_name[p], nets, blame)
                                       for p, nets in sorted(peers.items())))
            for node, peers in chosen.items()}


def _peer(member: Member, networks: list[str], blamed: frozenset[Blame]) -> Peer:
    return Peer(member.node,
                member.addresses if POD_NETWORK in networks else (),
                {n: member.networks[n] for n in sorted(networks) if n != POD_NETWORK},
                frozenset(n for n in networks if (member.node, n) in blamed))
