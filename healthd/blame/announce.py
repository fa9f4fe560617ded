"""Fleet-level network blame, the controller's activity: which node do its peers
fail to reach, on which network, said once per episode.

The judgement itself is healthd.blame.networks' (pure, shared with `healthd
status`); this module follows the controller's node cache, re-judges when a ping
report moves (coalesced after a short settle, longer when judging is slow: never
polled), and says what changed:

- a node most of its peers cannot reach on a network (verdict BLAMED): one Warning
  Event `PeerUnreachable` on that Node naming the network and the reporters, once
  per blame episode, and `healthd_network_blamed{node,network}` 1 while it lasts
  (the series goes when it ends);
- a partition of a network: nobody is blamed on it, one Warning Event on the
  controller's Lease per episode, a log line, and `healthd_network_partitioned{network}` 1.

It never writes a label or an annotation: the node's verdict belongs to its own
agent. What it blames, after every judgement, goes to `on_blame`: the controller's
peer publisher (healthd.controller.peering) marks each blamed node in the peer sets
of the nodes that probe it, so that missing it does not make them isolated
(checks.ping). Episodes outlive a leadership term of this process, so a restarted
term does not announce them again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from checks.base import POD_NETWORK
from healthd.blame.judge import Row
from healthd.blame.networks import (
    Assessment,
    assess_networks,
    blame_message,
    network_name,
    ping_rows,
)
from healthd.blame.peersets import Blame
from healthd.kube.conventions import Keys, Reason
from healthd.kube.events import WARNING, EventRecorder
from healthd.kube.objects import NODES, name_of
from healthd.kube.shapes import KubeObject, Node

log = logging.getLogger(__name__)

SETTLE_S = 0.1  # lets one ping round's annotations from many agents land together
PACE = 4  # wait at least this many times the last judgement's duration before the next
Obj = dict[str, Any]
NODES_KIND = NODES.plural  # the kind the controller's caches name nodes by


class NodeStore(Protocol):
    def get(self, key: str) -> Node | None: ...


class NodeCache(Protocol):
    """What blame reads of the controller's caches: the nodes, once synced."""

    @property
    def nodes(self) -> NodeStore: ...

    async def wait_synced(self, kinds: Iterable[str] | None = None) -> None: ...


class BlameGauges(Protocol):
    """Where blame shows in the controller's metrics."""

    def set_blamed(self, blamed: Iterable[tuple[str, str]]) -> None: ...

    def set_partitioned(self, networks: Mapping[str, bool]) -> None: ...


# -- the activity ----------------------------------------------------------------------


@dataclass
class Episodes:
    """What has been announced (Events posted): the blamed (node, network) pairs and
    the partitioned networks. Owned by the controller, so it outlives one term."""

    blamed: set[Blame] = field(default_factory=set)
    partitioned: set[str] = field(default_factory=set)


class NetworkBlame:
    """Follows the node cache (`handle`), recomputes the blame when a ping report
    moves (`run`), and announces what changed; see the module docstring."""

    def __init__(self, caches: NodeCache, events: EventRecorder, *, keys: Keys,
                 metrics: BlameGauges, dry_run: bool, lease: Obj,
                 episodes: Episodes | None = None, settle_s: float = SETTLE_S,
                 on_blame: Callable[[frozenset[Blame]], None] | None = None) -> None:
        self._caches = caches
        self._events = events
        self._keys = keys
        self._metrics = metrics
        self._dry_run = dry_run
        self._lease = lease
        self.episodes = episodes if episodes is not None else Episodes()
        self.settle_s = settle_s
        self._on_blame = on_blame
        self.by_network: dict[str, dict[str, Row]] = {POD_NETWORK: {}}
        self.assessments: dict[str, Assessment] = {}
        self._changed = anyio.Event()

    @property
    def rows(self) -> dict[str, Row]:
        """The pod network's rows, node -> row."""
        return self.by_network.get(POD_NETWORK, {})

    @property
    def assessment(self) -> Assessment | None:
        """The pod network's latest assessment (None before the first)."""
        return self.assessments.get(POD_NETWORK)

    def handle(self, kind: str, old: KubeObject | None, new: KubeObject | None) -> None:
        """The caches' change callback: quick; wakes `run` only when a ping report
        appears, moves or goes, or a node comes or goes."""
        if kind != NODES_KIND:
            return
        name = name_of(new or old or {})
        rows = ping_rows(new, self._keys) if new is not None else {}
        held = {n: by_node[name] for n, by_node in self.by_network.items() if name in by_node}
        if rows == held and old is not None and new is not None:
            return
        for by_node in self.by_network.values():
            by_node.pop(name, None)
        for network, row in rows.items():
            self.by_network.setdefault(network, {})[name] = row
        self._changed.set()

    async def run(self) -> None:
        """Judge once the node cache is synced, then on every change, until cancelled.
        The gauges are cleared when the term ends (a standby exports no blame)."""
        try:
            await self._caches.wait_synced([NODES_KIND])
            while True:
                self._changed = anyio.Event()
                started = anyio.current_time()
                await self.evaluate()
                spent = anyio.current_time() - started
                await self._changed.wait()
                # Judging bounded peer sets costs about a second per network at 10,000
                # nodes, and a rotation moves every view within one ping interval:
                # pace the judgement so it takes at most 1/(PACE + 1) of a core.
                await anyio.sleep(max(self.settle_s, PACE * spent))
        finally:
            self._metrics.set_blamed(())
            self._metrics.set_partitioned({})

    async def evaluate(self) -> dict[str, Assessment]:
        """Judge every network's current rows and announce what changed."""
        found = assess_networks({n: rows for n, rows in self.by_network.items()
                                 if rows or n == POD_NETWORK})
        self.assessments = found
        blamed = {(node, network): (reporters, a.peers[node])
                  for network, a in found.items() for node, reporters in a.blamed.items()
                  if self._caches.nodes.get(node)}
        self._metrics.set_blamed(blamed)
        self._metrics.set_partitioned(
            {network: a.partitioned for network, a in found.items()})
        for node, network in sorted(self.episodes.blamed - blamed.keys()):
            log.info("%s: its peers reach it again on %s (or it is gone)", node,
                     network_name(network))
        for key in sorted(blamed.keys() - self.episodes.blamed):
            await self._announce_blame(*key, *blamed[key])
        self.episodes.blamed = set(blamed)
        if self._on_blame is not None:
            self._on_blame(frozenset(blamed))
        for assessment in found.values():
            await self._announce_partition(assessment)
        return found

    async def _announce_blame(self, node: str, network: str, reporters: tuple[str, ...],
                              peers: int) -> None:
        message = blame_message(node, reporters, peers, network)
        log.warning("%s%s", "dry run: " if self._dry_run else "", message)
        subject = self._caches.nodes.get(node)
        if not self._dry_run and subject is not None:
            await self._events.record(subject, type=WARNING,
                                      reason=Reason.PEER_UNREACHABLE.value,
                                      message=message, res=NODES)

    async def _announce_partition(self, found: Assessment) -> None:
        network = found.network
        was = network in self.episodes.partitioned
        if found.partitioned:
            self.episodes.partitioned.add(network)
        else:
            self.episodes.partitioned.discard(network)
        if was and not found.partitioned:
            log.info("the partition of %s is over", network_name(network))
        if was or not found.partitioned:
            return
        what = "network partition" if network == POD_NETWORK else f"{network} partition"
        message = f"{what}: {found.why}; no node is blamed for pings across it"
        log.warning("%s%s", "dry run: " if self._dry_run else "", message)
        if not self._dry_run:
            await self._events.record(self._lease, type=WARNING,
                                      reason=Reason.PEER_UNREACHABLE.value, message=message)
