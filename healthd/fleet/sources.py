"""What `healthd status` reads from the API: one `Snapshot` of the objects it shows.

Two ways to fill it, same shape: `read_snapshot` lists everything once; `follow`
keeps it current with one `watch_forever` per source (list, then watch; never
polling) and calls back on every change, which is what `--watch` redraws on.

Sources: all Nodes (lending needs every node even when a selector narrows the
rows; a second node watch with the selector says which rows to show), the agent
pods (`agent.peers` in the config), the slack ClusterQueues and ResourceFlavors
of the Kueue version the server serves, the controller's Lease, and the
controller's Events by reason (resets and the breaker). Only the nodes are
required: any other source that cannot be read is named in `problems` and the
rest of the view still shows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio

from healthd.config import Config
from healthd.kube.client import Kube
from healthd.kube.conventions import Reason
from healthd.kube.errors import KubeError, NotFound
from healthd.kube.kueue import KueueResources, discover_kueue
from healthd.kube.objects import (
    EVENTS,
    LEASES,
    NODES,
    PODS,
    Resource,
    items_of,
    key_of,
    name_of,
)
from healthd.kube.shapes import (
    ClusterQueue,
    Event,
    KubeObject,
    Lease,
    Node,
    Pod,
    ResourceFlavor,
    view,
)
from healthd.kube.watching import DELETED, watch_forever

log = logging.getLogger(__name__)

S = TypeVar("S", bound=KubeObject)
EVENT_REASONS = (Reason.NODE_EVICTED, Reason.RESET_BREAKER_OPEN, Reason.RESET_BREAKER_CLOSED)


@dataclass
class Snapshot:
    """The objects one status view is computed from (dicts keyed by `key_of`)."""

    nodes: dict[str, Node] = field(default_factory=dict)
    shown: set[str] | None = None  # node names the selector matches; None: all
    agent_pods: dict[str, Pod] = field(default_factory=dict)
    kueue: KueueResources | None = None
    queues: dict[str, ClusterQueue] = field(default_factory=dict)
    flavors: dict[str, ResourceFlavor] = field(default_factory=dict)
    lease: Lease | None = None
    events: dict[str, Event] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)  # source -> what went wrong


def _items(listing: object, shape: type[S]) -> dict[str, S]:
    return {key_of(i): i for i in items_of(listing, shape)}


async def read_snapshot(kube: Kube, config: Config, selector: str | None) -> Snapshot:
    """List every source once. KubeError only when the nodes cannot be listed."""
    snap = Snapshot(nodes=_items(await kube.list(NODES), Node))
    if selector:
        snap.shown = set(_items(await kube.list(NODES, label_selector=selector), Node))
    peers = config.agent.peers
    await _optional(snap, "agent pods", _set_pods(kube, snap, peers.namespace,
                                                  peers.label_selector))
    await _optional(snap, "kueue", _read_kueue(kube, snap, config))
    await _optional(snap, "lease", _read_lease(kube, snap, config))
    for reason in EVENT_REASONS:
        listing = kube.list(EVENTS, field_selector=f"reason={reason.value}")
        await _optional(snap, f"events {reason.value}", _merge_events(snap, listing))
    return snap


async def _optional(snap: Snapshot, source: str, work: Any) -> None:
    try:
        await work
    except KubeError as exc:
        snap.problems[source] = str(exc)


async def _set_pods(kube: Kube, snap: Snapshot, namespace: str, selector: str) -> None:
    snap.agent_pods = _items(await kube.list(PODS, namespace, label_selector=selector), Pod)


async def _merge_events(snap: Snapshot, listing: Any) -> None:
    snap.events.update(_items(await listing, Event))


async def _read_kueue(kube: Kube, snap: Snapshot, config: Config) -> None:
    snap.kueue = await discover_kueue(kube)
    if snap.kueue is None:
        return
    snap.flavors = _items(await kube.list(snap.kueue.flavors), ResourceFlavor)
    for name in config.controller.slack_queues:
        try:
            snap.queues[name] = view(ClusterQueue, await kube.get(snap.kueue.queues, name))
        except NotFound:
            snap.problems[f"queue {name}"] = f"slack ClusterQueue {name} does not exist"


async def _read_lease(kube: Kube, snap: Snapshot, config: Config) -> None:
    election = config.controller.election
    try:
        snap.lease = view(Lease, await kube.get(LEASES, election.lease_name,
                                                election.namespace))
    except NotFound:
        snap.lease = None


# -- following -------------------------------------------------------------------------


@dataclass(frozen=True)
class Feed:
    """One watched collection and where its events go."""

    res: Resource
    apply: Callable[[str, dict[str, Any]], None]  # a watch event's type and object
    namespace: str | None = None
    labels: str | None = None
    fields: str | None = None


Changed = Callable[[Snapshot], None]


async def follow(kube: Kube, config: Config, selector: str | None, on_change: Changed) -> None:
    """Keep a Snapshot current from watches; `on_change` after every change. Runs
    until cancelled; outages are waited out by `watch_forever`."""
    snap = Snapshot(shown=set() if selector else None)
    try:
        snap.kueue = await discover_kueue(kube)
    except KubeError as exc:
        snap.problems["kueue"] = str(exc)
    peers, election = config.agent.peers, config.controller.election
    feeds: list[Feed] = [
        Feed(NODES, _into(snap.nodes, Node)),
        Feed(PODS, _into(snap.agent_pods, Pod), peers.namespace, labels=peers.label_selector),
        Feed(LEASES, lambda kind, obj: setattr(snap, "lease",
                                               None if kind == DELETED else view(Lease, obj)),
             election.namespace, fields=f"metadata.name={election.lease_name}"),
    ]
    feeds += [Feed(EVENTS, _into(snap.events, Event), fields=f"reason={r.value}")
              for r in EVENT_REASONS]
    if selector and snap.shown is not None:
        feeds.append(Feed(NODES, _names_into(snap.shown), labels=selector))
    if snap.kueue is not None:
        feeds.append(Feed(snap.kueue.flavors, _into(snap.flavors, ResourceFlavor)))
        feeds += [Feed(snap.kueue.queues, _into(snap.queues, ClusterQueue),
                       fields=f"metadata.name={name}")
                  for name in config.controller.slack_queues]
    async with anyio.create_task_group() as group:
        for feed in feeds:
            group.start_soon(_run_feed, kube, feed, lambda: on_change(snap))


async def _run_feed(kube: Kube, feed: Feed, changed: Callable[[], None]) -> None:
    async for event in watch_forever(kube, feed.res, feed.namespace,
                                     label_selector=feed.labels, field_selector=feed.fields):
        feed.apply(event.type, event.object)
        changed()


def _into(store: dict[str, S], shape: type[S]) -> Callable[[str, dict[str, Any]], None]:
    def apply(kind: str, obj: dict[str, Any]) -> None:
        if kind == DELETED:
            store.pop(key_of(obj), None)
        else:
            store[key_of(obj)] = view(shape, obj)
    return apply


def _names_into(names: set[str]) -> Callable[[str, dict[str, Any]], None]:
    def apply(kind: str, obj: dict[str, Any]) -> None:
        (names.discard if kind == DELETED else names.add)(name_of(obj))
    return apply
