"""The one writer of slack ClusterQueues: keeps each `lendingLimit` equal to the truth.

`QueueWriter` follows the caches (`handle` is the caches' change callback: node and
flavor changes move the `LendingModel`, any change marks the slack queues dirty) and
its `run` loop reconciles dirty queues as soon as they are marked, coalescing bursts.
Nothing is written before the node, queue and flavor caches have synced, and nothing
is written when the queue already holds the right values (a restart costs no write).

A write is one RFC 6902 JSON patch that `test`s what it was computed from: the
flavor and resource names at the indexes used, the nominalQuota, and the old
lendingLimit (or, when there was none, the object's resourceVersion, since a patch
cannot test for absence). A concurrent writer therefore makes it fail (422) instead
of being overwritten; the writer re-reads from the server (not the cache) and
recomputes. A 409 is a transient conflict, never a rejection: the writer re-reads
and retries the same way, and only when every one of `MAX_ATTEMPTS` attempts met a
conflict does it post a Warning Event (`LendingLimitConflict`) and back off. A 422 on
an object that did not change is the server (Kueue's webhook) rejecting the value: a
Warning Event (`LendingLimitRejected`), then backoff. A queue without a cohort cannot
carry a lendingLimit at all, so none is sent: a Warning Event, and the queue waits
for its next change. A missing queue is waited for quietly. `dry_run` logs and counts
each decision once and writes nothing, Events included.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from typing import Any, Protocol

import anyio

from healthd.capacity.health import unavailability
from healthd.capacity.lending import (
    LendingModel,
    LimitChange,
    flavor_path,
    lending_path,
    parse_quantity,
)
from healthd.config.controller import ControllerSettings
from healthd.controller.caches import (
    FLAVORS_KIND,
    LENDING_KINDS,
    NODES_KIND,
    QUEUES_KIND,
    Caches,
)
from healthd.kube import Backoff, Conflict, EventRecorder, Invalid, Kube, KubeError, NotFound
from healthd.kube.conventions import Keys, Reason
from healthd.kube.events import NORMAL, WARNING
from healthd.kube.kueue import KueueResources, cohort_of
from healthd.kube.objects import name_of, node_labels_of, resource_version_of
from healthd.kube.shapes import ClusterQueue, KubeObject, Node, view
from healthd.kube.watching import older_version

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 4  # re-reads after a failed test before backing off
Obj = dict[str, Any]  # a JSON patch operation


class LendingMetrics(Protocol):
    """What the writer reports (the controller's metrics module implements it)."""

    def count_lending_write(self, queue: str, result: str) -> None:
        """One write decision: written, dry-run, conflict, rejected, error."""

    def set_lending(self, queue: str, flavor: str, resource: str, *,
                    limit: Decimal | None, nominal: Decimal, shortfall: Decimal,
                    unavailable: Mapping[str, Decimal] | None = None) -> None:
        """One (queue, flavor, resource): the limit due (None: no field), the nominal
        quota, the shortfall, and unavailable capacity by reason."""

    def forget_queue(self, queue: str) -> None:
        """Drop every series of a queue that is gone."""


class _NoMetrics:
    def count_lending_write(self, queue: str, result: str) -> None:
        pass

    def set_lending(self, queue: str, flavor: str, resource: str, *,
                    limit: Decimal | None, nominal: Decimal, shortfall: Decimal,
                    unavailable: Mapping[str, Decimal] | None = None) -> None:
        pass

    def forget_queue(self, queue: str) -> None:
        pass


class _Rejected(Exception):
    """The server refused a value that was computed from its current object."""


def patch_ops(queue: ClusterQueue, changes: Iterable[LimitChange]) -> list[Obj]:
    """The JSON patch for `changes`, guarded by `test`s of everything they rest on."""
    ops: list[Obj] = []
    for c in changes:
        at = (c.group, c.flavor_index, c.resource_index)
        guards: list[Obj] = [
            {"op": "test", "path": f"{flavor_path(c.group, c.flavor_index)}/name",
             "value": c.flavor},
            {"op": "test", "path": lending_path(*at, "name"), "value": c.resource},
            {"op": "test", "path": lending_path(*at, "nominalQuota"), "value": c.nominal},
        ]
        if c.old is not None:
            guards.append({"op": "test", "path": c.path, "value": c.old})
        else:
            guards.append({"op": "test", "path": "/metadata/resourceVersion",
                           "value": resource_version_of(queue)})
        ops.extend(op for op in guards if op not in ops)
        if c.new is None:
            ops.append({"op": "remove", "path": c.path})
        else:
            ops.append({"op": "replace" if c.old is not None else "add", "path": c.path,
                        "value": c.new})
    return ops


def _describe(c: LimitChange) -> str:
    old = c.old if c.old is not None else "unset"
    new = c.new if c.new is not None else "unset"
    return (f"{c.resource} in {c.flavor}: lendingLimit {old} -> {new} "
            f"(nominalQuota {c.nominal}, unavailable {c.unavailable.normalize():f})")


def _newer(a: ClusterQueue | None, b: ClusterQueue | None) -> ClusterQueue | None:
    """The later of two reads of one object (resourceVersions compare as integers
    where they are, as every real server's do; else the first wins)."""
    if a is None or b is None:
        return a or b
    return b if older_version(resource_version_of(a), resource_version_of(b)) else a


class QueueWriter:
    """Reconciles the slack ClusterQueues' lendingLimits from the caches."""

    def __init__(self, kube: Kube, caches: Caches, events: EventRecorder, *,
                 settings: ControllerSettings, keys: Keys,
                 metrics: LendingMetrics | None = None, model: LendingModel | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._kube = kube
        self._caches = caches
        self._events = events
        self._settings = settings
        self._keys = keys
        self._metrics = metrics or _NoMetrics()
        self._clock = clock
        self.model = model or LendingModel()
        self._dirty: set[str] = set()
        self._wake = anyio.Event()
        self._retry_at: dict[str, float] = {}
        self._backoff: dict[str, Backoff] = {}
        self._latest: dict[str, ClusterQueue] = {}  # our last read or write, until cached
        self._said: dict[tuple[str, str], str] = {}  # (queue, topic) -> last message given
        self._observed: dict[str, frozenset[tuple[str, str]]] = {}  # series shown per queue

    # -- following the caches ------------------------------------------------------

    def handle(self, kind: str, old: KubeObject | None, new: KubeObject | None) -> None:
        """The caches' change callback (quick, never raises)."""
        if kind == NODES_KIND:
            if self._set_node(name_of(new or old or {}),
                              None if new is None else view(Node, new)):
                self.mark_dirty()
        elif kind == FLAVORS_KIND:
            self.model.set_flavors(self._flavor_labels())
            self.mark_dirty()
        elif kind == QUEUES_KIND:
            name = name_of(new or old or {})
            self._retry_at.pop(name, None)  # the queue itself changed: try again at once
            self.mark_dirty(name)

    def _set_node(self, name: str, new: Node | None) -> bool:
        """Move the model to node `name`'s new state (None: gone); False when its
        contribution is unchanged (most node updates: heartbeats, other owners' labels)."""
        after = None if new is None else unavailability(
            new, keys=self._keys, bad_verdicts=self._settings.bad_verdicts,
            source=self._settings.capacity_source,
            health_resources=frozenset(self._settings.health_resources))
        if self.model.bad_nodes.get(name) == after:
            return False
        self.model.set_node(name, after)
        return True

    def _flavor_labels(self) -> dict[str, dict[str, str]]:
        return {name_of(f): node_labels_of(f) for f in self._caches.flavors.values()}

    def resync(self) -> None:
        """Rebuild the model from the caches (after they synced)."""
        self.model.set_flavors(self._flavor_labels())
        for node in list(self._caches.nodes.values()):
            self._set_node(name_of(node), node)

    def forget_own_writes(self) -> None:
        """The server's history moved back: our last writes may be lost with it, and a
        restored queue (an older resourceVersion) must not look older than them."""
        self._latest.clear()

    def mark_dirty(self, queue: str | None = None) -> None:
        """Reconcile `queue` (None: every slack queue) as soon as the loop can."""
        if queue is None:
            self._dirty.update(self._settings.slack_queues)
        elif queue in self._settings.slack_queues:
            self._dirty.add(queue)
        self._wake.set()

    # -- the loop ------------------------------------------------------------------

    async def run(self) -> None:
        """Wait for the caches, then reconcile dirty queues until cancelled."""
        await self._caches.wait_synced(LENDING_KINDS)
        self.resync()
        self.mark_dirty()
        while True:
            await self._wait_for_work()
            for name in self._due():
                self._dirty.discard(name)
                await self.reconcile(name)

    def _due(self) -> list[str]:
        now = self._clock()
        return sorted(q for q in self._dirty if self._retry_at.get(q, 0) <= now)

    async def _wait_for_work(self) -> None:
        if self._due():
            return
        waits = [self._retry_at[q] - self._clock() for q in self._dirty if q in self._retry_at]
        with anyio.move_on_after(min(waits) if waits else None):
            await self._wake.wait()
        self._wake = anyio.Event()

    # -- one queue -----------------------------------------------------------------

    @property
    def _kueue(self) -> KueueResources | None:
        return self._caches.kueue

    async def reconcile(self, name: str) -> None:
        """Bring queue `name` to the values due; re-read and retry when a concurrent
        writer got there first; back off when the server refuses the values."""
        queue = self._read(name)
        if queue is None or self._kueue is None:
            self._missing(name)
            return
        self._said.pop((name, "missing"), None)
        try:
            for _ in range(MAX_ATTEMPTS):
                fresh = await self._attempt(name, queue)
                if fresh is None:
                    self._backoff.pop(name, None)
                    self._said.pop((name, "conflict"), None)
                    return
                queue = fresh
            await self._conflicts_exhausted(queue)
        except _Rejected:
            pass
        except KubeError as exc:
            self._metrics.count_lending_write(name, "error")
            log.warning("cannot update the lendingLimit of queue %s: %s", name, exc)
        self._schedule_retry(name)

    def _read(self, name: str) -> ClusterQueue | None:
        cached = self._caches.clusterqueues.get(name)
        if cached is None:
            self._latest.pop(name, None)
            return None
        return _newer(cached, self._latest.get(name))

    def _missing(self, name: str) -> None:
        self._metrics.forget_queue(name)
        self._observed.pop(name, None)
        if self._said.get((name, "missing")) is None:
            self._said[(name, "missing")] = "absent"
            log.info("slack ClusterQueue %s does not exist (yet); lending waits for it", name)

    def _schedule_retry(self, name: str) -> None:
        delay = self._backoff.setdefault(name, Backoff(initial=1, maximum=60)).next()
        self._retry_at[name] = self._clock() + delay
        self._dirty.add(name)

    async def _attempt(self, name: str, queue: ClusterQueue) -> ClusterQueue | None:
        """One evaluate-and-write; returns a fresh read to retry with, else None."""
        limits = self.model.evaluate(queue)
        self._observe(name, limits)
        await self._report_shortfall(queue, limits)
        changes = await self._writable(queue, [c for c in limits if c.changed])
        if not changes:
            return None
        if self._settings.dry_run:
            self._dry_run(name, changes)
            return None
        return await self._write(name, queue, changes)

    async def _write(self, name: str, queue: ClusterQueue,
                     changes: list[LimitChange]) -> ClusterQueue | None:
        assert self._kueue is not None
        try:
            result = await self._kube.json_patch(self._kueue.queues, name,
                                                 patch_ops(queue, changes))
        except NotFound:
            return None  # deleted meanwhile: the watch tells us
        except (Invalid, Conflict) as exc:
            return await self._after_refusal(name, queue, changes, exc)
        self._latest[name] = view(ClusterQueue, result)
        self._metrics.count_lending_write(name, "written")
        message = "; ".join(_describe(c) + self._culprits(c) for c in changes)
        log.info("queue %s: %s", name, message)
        await self._event(queue, NORMAL, Reason.LENDING_LIMIT_UPDATED, message)
        return None

    async def _after_refusal(self, name: str, queue: ClusterQueue, changes: list[LimitChange],
                             exc: KubeError) -> ClusterQueue | None:
        assert self._kueue is not None
        try:
            fresh = view(ClusterQueue, await self._kube.get(self._kueue.queues, name))
        except NotFound:
            return None
        if isinstance(exc, Conflict) or resource_version_of(fresh) != resource_version_of(queue):
            self._metrics.count_lending_write(name, "conflict")
            log.info("queue %s changed before our write landed; recomputing", name)
            self._latest[name] = fresh
            return fresh
        self._metrics.count_lending_write(name, "rejected")
        message = f"the server refused {'; '.join(map(_describe, changes))}: {exc.message}"
        log.warning("queue %s: %s", name, message)
        await self._event(queue, WARNING, Reason.LENDING_LIMIT_REJECTED, message,
                          topic="rejected")
        raise _Rejected(message)

    async def _conflicts_exhausted(self, queue: ClusterQueue) -> None:
        message = (f"every one of {MAX_ATTEMPTS} attempts to update the lendingLimit met a "
                   "conflict (409, or the queue changed before the write landed); backing off")
        log.warning("queue %s: %s", name_of(queue), message)
        await self._event(queue, WARNING, Reason.LENDING_LIMIT_CONFLICT, message,
                          topic="conflict")

    async def _writable(self, queue: ClusterQueue, changes: list[LimitChange]) -> list[LimitChange]:
        """`changes` less what the queue cannot hold: without a cohort Kueue accepts
        no lendingLimit (removing one is always fine)."""
        if cohort_of(queue):
            self._said.pop((name_of(queue), "cohort"), None)
            return changes
        if all(c.new is None for c in changes):
            return changes
        blocked = [c for c in changes if c.new is not None]
        assert self._kueue is not None
        message = (f"no lendingLimit can be set without spec.{self._kueue.cohort_field}: "
                   f"not writing {'; '.join(map(_describe, blocked))}")
        if (name_of(queue), "cohort") not in self._said:  # once until the queue gets one
            self._metrics.count_lending_write(name_of(queue), "rejected")
            log.warning("queue %s: %s", name_of(queue), message)
            await self._event(queue, WARNING, Reason.LENDING_LIMIT_REJECTED, message,
                              topic="cohort")
        return [c for c in changes if c.new is None]

    def _dry_run(self, name: str, changes: list[LimitChange]) -> None:
        message = "; ".join(map(_describe, changes))
        if self._said.get((name, "dry-run")) == message:
            return  # the same decision again: logged and counted already
        self._said[(name, "dry-run")] = message
        self._metrics.count_lending_write(name, "dry-run")
        log.info("dry run: would patch queue %s: %s", name, message)

    async def _report_shortfall(self, queue: ClusterQueue, limits: list[LimitChange]) -> None:
        short = [c for c in limits if c.shortfall > 0]
        if not short:
            self._said.pop((name_of(queue), "shortfall"), None)
            return
        message = "; ".join(
            f"{c.resource} in {c.flavor}: {c.unavailable.normalize():f} unavailable but "
            f"nominalQuota is {c.nominal}, {c.shortfall.normalize():f} short" for c in short)
        await self._event(queue, WARNING, Reason.LENDING_SHORTFALL,
                          f"lending cannot cover lost capacity: {message}", topic="shortfall")

    async def _event(self, queue: ClusterQueue, type: str, reason: str, message: str, *,
                     topic: str | None = None) -> None:
        """An Event on the queue; with `topic`, only when its message changed."""
        if topic is not None:
            if self._said.get((name_of(queue), topic)) == message:
                return
            self._said[(name_of(queue), topic)] = message
        if self._settings.dry_run:
            log.info("dry run: would record %s on queue %s: %s", reason, name_of(queue), message)
            return
        assert self._kueue is not None
        await self._events.record(queue, type=type, reason=reason, message=message,
                                  res=self._kueue.queues)

    def _observe(self, name: str, limits: list[LimitChange]) -> None:
        """Metrics for every entry of the queue (a changed layout drops old series)."""
        layout = frozenset((c.flavor, c.resource) for c in limits)
        if self._observed.get(name) != layout:
            self._metrics.forget_queue(name)
            self._observed[name] = layout
        for c in limits:
            by_reason = self.model.unavailable_by_reason(c.flavor)
            self._metrics.set_lending(
                name, c.flavor, c.resource, limit=None if c.new is None else parse_quantity(c.new),
                nominal=parse_quantity(c.nominal), shortfall=c.shortfall,
                unavailable={reason: v for (res, reason), v in by_reason.items()
                             if res == c.resource})

    def _culprits(self, c: LimitChange, shown: int = 5) -> str:
        """` on n1, n2 (+3 more)`: the bad nodes behind a change, for humans."""
        nodes = self.model.nodes_behind(c.flavor, c.resource)
        if not nodes:
            return ""
        more = f" (+{len(nodes) - shown} more)" if len(nodes) > shown else ""
        return f" on {', '.join(nodes[:shown])}{more}"
