"""Fleet-level network blame: which node do its peers fail to reach.

One agent's `ping` check cannot tell "that peer is down" from "my own link is
down"; the fleet can. Every agent publishes what its latest ping round saw in its
`healthd.io/health` annotation (`"ping": {"isolated": bool, "unreached": [peers]}`,
healthd.agent.node_view): it probed every other agent node and reached all but
`unreached`, or, when `isolated`, almost none. This module reads those objects from
the controller's node cache, judges them with `checks.blame.judge_rows` (the
sparse form of `judge`: linear in nodes plus unreached entries, no n x n matrix),
and says what it found:

- a node most of its peers cannot reach (verdict BLAMED): one Warning Event
  `PeerUnreachable` on that Node naming the reporters, once per blame episode, and
  `healthd_network_blamed{node}` 1 while it lasts (the series goes when it ends);
- a node that cannot reach most peers (ISOLATED) already carries
  `NETWORK_ISOLATED` from its own agent: nothing more is said about it here;
- a partition (pings fail between groups of nodes, or most nodes reached almost
  nobody, which is how agents on either side of an even split report it): nobody
  is blamed, one Warning Event on the controller's Lease per episode, a log line,
  and `healthd_network_partitioned` 1.

It never writes a label or an annotation: the node's verdict belongs to its own
agent. `assess` is pure, so `healthd status` shows the same blame from the same
objects. The activity recomputes on node changes that move a ping report
(coalesced after a short settle, never polled); episodes outlive a leadership term
of this process, so a restarted term does not announce them again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

from checks.blame import Row, SparseReport, Verdict, judge_rows
from healthd.controller.caches import NODES_KIND, Caches
from healthd.controller.metrics import ControllerMetrics
from healthd.kube.conventions import Keys, Reason
from healthd.kube.events import WARNING, EventRecorder
from healthd.kube.objects import NODES, annotation_json, name_of

log = logging.getLogger(__name__)

SETTLE_S = 0.1  # lets one ping round's annotations from many agents land together
SHARE = 0.5  # "most" means more than this share (checks.blame)
NAMES_SHOWN = 10  # reporters named in an Event; the rest are counted
Obj = dict[str, Any]


# -- reading the reports ---------------------------------------------------------------


def ping_row(node: Obj, keys: Keys) -> Row | None:
    """The node's published ping view as a sparse row; None when it has none (no
    agent, ping not judged yet, or an annotation that is not what agents write)."""
    ping = annotation_json(node, keys.health).get("ping")
    if not isinstance(ping, dict) or not isinstance(ping.get("isolated", False), bool):
        return None
    if ping.get("isolated"):
        return Row(reached_none=True)
    unreached = ping.get("unreached", [])
    if not isinstance(unreached, list):
        return None
    return Row(frozenset(str(n) for n in unreached if isinstance(n, str) and n))


def rows_of(nodes: Iterable[Obj], keys: Keys) -> dict[str, Row]:
    """Every node's ping row, nodes without one left out."""
    return {name_of(n): row for n in nodes if (row := ping_row(n, keys)) is not None}


# -- judging ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Assessment:
    """What the fleet's ping reports say. `blamed`: node -> the credible reporters
    that cannot reach it (out of `peers[node]` that probed it)."""

    reporters: int
    blamed: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    peers: Mapping[str, int] = field(default_factory=dict)
    isolated: tuple[str, ...] = ()
    partitioned: bool = False
    groups: tuple[tuple[str, ...], ...] = ()
    why: str = ""  # what the partition looks like, for a person


def assess(rows: Mapping[str, Row], *, share: float = SHARE) -> Assessment:
    """Judge the rows (checks.blame's rules), with one guard: when most reporters
    reached almost nobody, each of them missed every peer and none says which, so
    the reports cannot single a node out; that is a partition (an even split reads
    exactly so), and nobody is blamed."""
    silent = sum(1 for row in rows.values() if row.reached_none)
    if len(rows) >= 2 and silent > share * len(rows):
        why = (f"{silent} of {len(rows)} nodes reached almost none of their peers: the "
               "network is split or down between many nodes")
        return Assessment(len(rows), partitioned=True, why=why)
    report = judge_rows(rows, share=share)
    blamed = [n for n in report.blamed if report.verdict_of(n) is Verdict.BLAMED]
    details = {n: report[n] for n in blamed}
    return Assessment(
        reporters=len(rows),
        blamed={n: d.unreachable_from for n, d in details.items()},
        peers={n: d.reporters for n, d in details.items()},
        isolated=report.isolated,
        partitioned=report.partitioned,
        groups=report.groups,
        why=_partition_text(report) if report.partitioned else "")


def _partition_text(report: SparseReport) -> str:
    sizes = " + ".join(str(len(g)) for g in report.groups)
    sides = "; ".join(_names(g, 3) for g in report.groups)
    return f"pings fail between {len(report.groups)} groups of nodes ({sizes}: {sides})"


def _names(names: tuple[str, ...] | list[str], shown: int = NAMES_SHOWN) -> str:
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def blame_message(node: str, reporters: tuple[str, ...], peers: int) -> str:
    """The PeerUnreachable Event's message on a blamed node."""
    return (f"{len(reporters)} of {peers} peers cannot reach {node} by ping: "
            f"{_names(reporters)}. The node, its network link or its switch port is "
            "likely at fault; its own agent may not see it")


# -- the activity ----------------------------------------------------------------------


@dataclass
class Episodes:
    """What has been announced (Events posted): the blamed nodes and whether a
    partition is on. Owned by the controller, so it outlives one term."""

    blamed: set[str] = field(default_factory=set)
    partitioned: bool = False


class NetworkBlame:
    """Follows the node cache (`handle`), recomputes the blame when a ping report
    moves (`run`), and announces what changed; see the module docstring."""

    def __init__(self, caches: Caches, events: EventRecorder, *, keys: Keys,
                 metrics: ControllerMetrics, dry_run: bool, lease: Obj,
                 episodes: Episodes | None = None, settle_s: float = SETTLE_S) -> None:
        self._caches = caches
        self._events = events
        self._keys = keys
        self._metrics = metrics
        self._dry_run = dry_run
        self._lease = lease
        self.episodes = episodes if episodes is not None else Episodes()
        self.settle_s = settle_s
        self.rows: dict[str, Row] = {}
        self.assessment: Assessment | None = None
        self._changed = anyio.Event()

    def handle(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        """The caches' change callback: quick; wakes `run` only when a ping report
        appears, moves or goes, or a node comes or goes."""
        if kind != NODES_KIND:
            return
        name = name_of(new or old or {})
        row = ping_row(new, self._keys) if new is not None else None
        if row == self.rows.get(name) and old is not None and new is not None:
            return
        if row is None:
            self.rows.pop(name, None)
        else:
            self.rows[name] = row
        self._changed.set()

    async def run(self) -> None:
        """Judge once the node cache is synced, then on every change, until cancelled.
        The gauges are cleared when the term ends (a standby exports no blame)."""
        try:
            await self._caches.wait_synced([NODES_KIND])
            while True:
                self._changed = anyio.Event()
                await self.evaluate()
                await self._changed.wait()
                await anyio.sleep(self.settle_s)
        finally:
            self._metrics.set_blamed(())
            self._metrics.set_partitioned(False)

    async def evaluate(self) -> Assessment:
        """Judge the current rows and announce what changed."""
        found = assess(self.rows)
        self.assessment = found
        blamed = {n: r for n, r in found.blamed.items() if self._caches.nodes.get(n)}
        self._metrics.set_blamed(blamed)
        self._metrics.set_partitioned(found.partitioned)
        for gone in sorted(self.episodes.blamed - blamed.keys()):
            log.info("%s: its peers reach it again (or it is gone)", gone)
        for node in sorted(blamed.keys() - self.episodes.blamed):
            await self._announce_blame(node, blamed[node], found.peers[node])
        self.episodes.blamed = set(blamed)
        await self._announce_partition(found)
        return found

    async def _announce_blame(self, node: str, reporters: tuple[str, ...], peers: int) -> None:
        message = blame_message(node, reporters, peers)
        log.warning("%s%s", "dry run: " if self._dry_run else "", message)
        subject = self._caches.nodes.get(node)
        if not self._dry_run and subject is not None:
            await self._events.record(subject, type=WARNING,
                                      reason=Reason.PEER_UNREACHABLE.value,
                                      message=message, res=NODES)

    async def _announce_partition(self, found: Assessment) -> None:
        was, self.episodes.partitioned = self.episodes.partitioned, found.partitioned
        if was and not found.partitioned:
            log.info("the network partition is over")
        if was or not found.partitioned:
            return
        message = f"network partition: {found.why}; no node is blamed for pings across it"
        log.warning("%s%s", "dry run: " if self._dry_run else "", message)
        if not self._dry_run:
            await self._events.record(self._lease, type=WARNING,
                                      reason=Reason.PEER_UNREACHABLE.value, message=message)
