"""Fixtures for fleet network blame: the emulator and real clients of the controller
tests, and GPU nodes whose `healthd.io/health` annotation is what a real agent
publishes after a ping round (built by the agent's own verdict and rendering code,
so the controller reads exactly the agent's format)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from checks.base import Entity, ResultBuilder
from checks.catalog import Catalog
from healthd.agent import verdict as v
from healthd.agent.node_view import health_json
from healthd.sim.apiserver import ApiEmulator, RecordedRequest
from healthd.sim.apiserver.testing import api  # noqa: F401
from tests.controller.conftest import KEYS, Obj, kube_for, node  # noqa: F401

BLAMED = "healthd_network_blamed"
PARTITIONED = "healthd_network_partitioned"


# A secondary network's view in a ping round: (peers missed there, isolated there).
NetView = tuple[Iterable[str], bool]


def ping_health(name: str, peers: Iterable[str], *, unreached: Iterable[str] = (),
                isolated: bool = False,
                networks: Mapping[str, NetView] | None = None) -> tuple[str, str]:
    """(verdict label, health annotation) of an agent whose ping rounds on `name`
    missed `unreached` among `peers` on the pod network, or found itself isolated,
    and (`networks`) did the same on each secondary network the peers share: two
    such rounds, so that what they found is held and therefore published."""
    peers = list(peers)
    builder = ResultBuilder("ping", Catalog())
    views: dict[str, NetView] = {"": (unreached, isolated), **(networks or {})}
    for network, (missed, alone) in views.items():
        missed = set(missed)
        for peer in peers:
            if peer == name:
                continue
            entity = Entity.peer(peer, network)
            if peer in missed and not alone:
                builder.finding("PEER_UNREACHABLE", entity, f"{peer} does not answer")
            elif alone:  # as checks.ping says it: from a cut-off node, not judged
                builder.seen(entity)
                builder.unknown(entity, "not judged: this node cannot reach most of its peers")
            else:
                builder.seen(entity)
        if alone:
            where = Entity("network", network) if network else Entity.node(name)
            builder.finding("NETWORK_ISOLATED", where, "cannot reach its peers")
    state = v.initial()
    for at in (10.0, 20.0):
        state = v.apply(state, "ping", builder.build(), trigger=v.Trigger.PERIODIC, at=at,
                        policy=v.Policy())
    return state.verdict.value, health_json(state)


def agent_node(name: str, peers: Iterable[str], *, unreached: Iterable[str] = (),
               isolated: bool = False, labels: dict[str, str] | None = None,
               networks: Mapping[str, NetView] | None = None) -> Obj:
    """A GPU node as its agent leaves it after its ping rounds (`ping_health`)."""
    verdict, health = ping_health(name, peers, unreached=unreached, isolated=isolated,
                                  networks=networks)
    obj = node(name, verdict, labels=labels)
    obj["metadata"]["annotations"][KEYS.health] = health
    return obj


def silent_node(name: str) -> Obj:
    """A node whose agent never published a ping round (down, or not there)."""
    return node(name, "PASS")


def publish(server: ApiEmulator, name: str, peers: Iterable[str], *,
            unreached: Iterable[str] = (), isolated: bool = False,
            networks: Mapping[str, NetView] | None = None) -> None:
    """What the agent on `name` does after a ping round: relabel and re-annotate."""
    fresh = agent_node(name, peers, unreached=unreached, isolated=isolated,
                       networks=networks)
    stored = server.get("Node", name)
    assert stored is not None
    stored["metadata"]["labels"] = fresh["metadata"]["labels"]
    stored["metadata"]["annotations"] = fresh["metadata"]["annotations"]
    server.put(stored)


def node_writes(server: ApiEmulator) -> list[RecordedRequest]:
    """Every write to a Node (labels, annotations, status): the controller makes none."""
    return server.writes(path=r"/api/v1/nodes.*")


def product_writes(server: ApiEmulator) -> list[RecordedRequest]:
    """Every write but Events and the Lease (election writes it by design)."""
    return [r for r in server.writes() if "/leases" not in r.path and "/events" not in r.path]


def blame_events(server: ApiEmulator, kind: str | None = None,
                 name: str | None = None) -> list[Obj]:
    """PeerUnreachable Events, about objects of `kind` (and `name`) when given."""
    return [e for e in server.list("Event") if e.get("reason") == "PeerUnreachable"
            and (kind is None or e["involvedObject"].get("kind") == kind)
            and (name is None or e["involvedObject"].get("name") == name)]
