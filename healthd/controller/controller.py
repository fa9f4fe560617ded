"""The controller's orchestrator: one replica leads, and while it leads it watches
the cluster, keeps the slack queues' lendingLimits true and resets AppWrappers
whose GPU pods sit on EVICT nodes.

Activities of one leadership term (tasks of one task group, cancelled together the
moment the Lease is lost):

- the caches (healthd.controller.caches): list+watch of Nodes, AppWrapper pods,
  AppWrappers, the slack ClusterQueues and ResourceFlavors; every change goes to
  both activities below as it is applied;
- lending (healthd.controller.clusterqueues.QueueWriter): node and flavor changes
  move the lending model, dirty queues are reconciled in coalesced bursts;
- resets (healthd.controller.evictions.EvictionReactor): a node turning EVICT marks
  the AppWrappers with GPU pods on it, decided and reset at once under the rails;
- repairs (healthd.controller.repairs.RepairReactor, with `controller.repair.enabled`):
  a bad node's GPUs reset in place by a Job, then validated, or the node held or
  handed to humans, its state in its `repair` annotation;
- network blame (healthd.blame.announce.NetworkBlame): the agents' ping reports
  judged fleet-wide; Events and gauges only, never a node label;
- ping's peers (healthd.controller.peering.PeerPublisher): the agent pods watched
  once, each node's bounded peer set written on its Node (`healthd.io/peers`), the
  peers the blame names marked there;
- the cache-sync gauges;
- a log line, once per node and streak, when a node's health annotation cannot be
  read (someone else wrote it): the controller decides from the verdict label, and
  such a node merely has no finding codes and no ping view until its agent rewrites it.

A term starts from nothing: new caches, a first full list, then a full
evaluation, so a new leader (or a restarted one) neither repeats a reset that was
done (the AppWrapper left `Running`; the spacing reads its `Unhealthy` condition)
nor loses one that was due. In dry run no Lease is taken (that would be a write):
the replica acts alone, deciding, logging and counting, writing nothing.

The server's history can move back under a term: etcd restored from a backup
brings back the backup's objects with their older resourceVersions (a reset
AppWrapper `Running` again on its EVICT node, the slack queue's old lendingLimit),
and new writes reuse versions the caches saw, so resumed watches skip them for
good. Relisting every cache each watch period would find them, at the cost of the
whole fleet every minute. Instead two witnesses notice, and every cache relists
once (`healthd.kube.watching.Rewinds`): each watch, when it reconnects after a
broken stream, asks for the server's current version (one small read) and finds it
below the one it saw; and the leader's Lease, renewed every `retry_period`, comes
back with a version below the one the leader last wrote (a conflict on renewal
shows it; healthd.controller.election). The Lease holds when the restored server
passed the watches' versions before they came back, and a leader whose renewals
fail past `renew_deadline` ends its term and starts afresh anyway. The relists
turn the differences into events (the restored AppWrapper `Running` again, the
restored queue), and what this process remembers of its own writes (the spacing
of its resets, its last queue writes) is forgotten: that history is gone, and only
what the objects now show counts. Within one history nothing changes: a reset
shows on its AppWrapper, which is never reset twice.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import anyio

from healthd.blame.announce import Episodes, NetworkBlame
from healthd.config import Config
from healthd.controller.appwrappers import Resetter
from healthd.controller.caches import KINDS, NODES_KIND, Caches
from healthd.controller.clusterqueues import QueueWriter
from healthd.controller.election import LeaseElector
from healthd.controller.evictions import SETTLE_S, EvictionReactor
from healthd.controller.metrics import ControllerMetrics
from healthd.controller.peering import PeerPublisher
from healthd.controller.repairs import RepairReactor
from healthd.controller.safety import BreakerState
from healthd.kube.backoff import Backoff
from healthd.kube.client import Kube
from healthd.kube.conventions import CONTROLLER_COMPONENT, Keys
from healthd.kube.events import EventRecorder
from healthd.kube.objects import LEASES, name_of
from healthd.kube.shapes import KubeObject
from healthd.kube.watching import Rewinds
from healthd.published import Undecodable, read_health

log = logging.getLogger(__name__)


def default_identity(config: Config) -> str:
    """The Lease holder identity: the pod's name, else hostname and process id."""
    return config.pod_name or f"{socket.gethostname()}_{os.getpid()}"


class Term:
    """One leadership term: the caches and the activities that act on them."""

    def __init__(self, kube: Kube, config: Config, *, metrics: ControllerMetrics,
                 events: EventRecorder, clock: Callable[[], float],
                 settle_s: float, episodes: Episodes | None = None,
                 rewinds: Rewinds | None = None) -> None:
        settings = config.controller
        keys = Keys(config.label_prefix, config.own_prefix)
        self.metrics = metrics
        self.caches = Caches(kube, slack_queues=settings.slack_queues, on_change=self._changed,
                             rewinds=rewinds, keys=keys)
        self.lending = QueueWriter(kube, self.caches, events, settings=settings, keys=keys,
                                   metrics=metrics)
        lease = _lease_ref(settings.election.lease_name, settings.election.namespace)
        self.resetter = Resetter(kube, events, settings=settings, metrics=metrics, clock=clock,
                                 node_lookup=self.caches.nodes.get, breaker_subject=lease)
        self.resets = EvictionReactor(self.caches, self.resetter, keys=keys, settings=settings,
                                      clock=clock, settle_s=settle_s)
        self.repairs = RepairReactor(kube, self.caches, events, config=config, metrics=metrics,
                                     breaker_open=self._breaker_open, clock=clock) \
            if settings.repair.enabled else None
        self.peering = PeerPublisher(kube, self.caches, settings=settings.peers,
                                     namespace=config.agent.peers.namespace,
                                     label_selector=config.agent.peers.label_selector,
                                     keys=keys, dry_run=settings.dry_run, clock=clock,
                                     rewinds=self.caches.rewinds)
        self.blame = NetworkBlame(self.caches, events, keys=keys, metrics=metrics,
                                  dry_run=settings.dry_run, lease=lease, episodes=episodes,
                                  on_blame=self.peering.set_blame)
        self.unreadable = UnreadableHealth(keys)

    def _breaker_open(self) -> bool:
        """The reset breaker on the fleet as the caches show it now (the eviction
        loop, which announces its changes, may not have judged the latest event)."""
        fleet = self.resets.fleet
        return self.resetter.breaker.update(fleet.bad_nodes, fleet.gpu_nodes) \
            is BreakerState.OPEN

    def _changed(self, kind: str, old: KubeObject | None, new: KubeObject | None) -> None:
        # Each handler is quick and guards itself; one failing must not starve the others.
        handlers = [self.unreadable.handle, self.lending.handle, self.resets.handle,
                    self.blame.handle, self.peering.handle]
        if self.repairs is not None:
            handlers.append(self.repairs.handle)
        for handle in handlers:
            try:
                handle(kind, old, new)
            except Exception:
                log.exception("handling a change of %s failed", kind)

    def _forget_own_writes(self) -> None:
        """The server's history moved back: see the module docstring."""
        self.lending.forget_own_writes()
        self.resetter.forget_own_writes()

    async def run(self) -> None:
        for kind in KINDS:
            self.metrics.set_synced(kind, False)
        try:
            with self.caches.rewinds.listening(self._forget_own_writes):
                await self._run_activities()
        finally:
            gc.unfreeze()  # this term's objects may be collected again (see below)
            for kind in KINDS:
                self.metrics.set_synced(kind, False)

    async def _run_activities(self) -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(self.caches.run)
            group.start_soon(self.lending.run)
            group.start_soon(self.resets.run)
            group.start_soon(self.blame.run)
            group.start_soon(self.peering.run)
            if self.repairs is not None:
                group.start_soon(self.repairs.run)
            for kind in KINDS:
                group.start_soon(self._report_synced, kind)
            group.start_soon(self._freeze_when_synced)

    async def _freeze_when_synced(self) -> None:
        """Once the caches hold the fleet, hide what is in memory from the cyclic
        garbage collector: millions of small dicts that never form cycles, which each
        full collection walked again (a third of the CPU of a 100-node burst at 5,000
        nodes). Reference counting still frees them; the term unfreezes on its way
        out, so the cycles it leaves (its handlers and caches) are collected."""
        await self.caches.wait_synced()
        gc.freeze()

    async def _report_synced(self, kind: str) -> None:
        await self.caches.store(kind).synced.wait()
        self.metrics.set_synced(kind)


class UnreadableHealth:
    """Says once per node, until it reads again, that its health annotation cannot be
    read (not on every event of that node)."""

    def __init__(self, keys: Keys) -> None:
        self._keys = keys
        self.nodes: set[str] = set()  # nodes told about, still unreadable

    def handle(self, kind: str, old: KubeObject | None, new: KubeObject | None) -> None:
        if kind != NODES_KIND:
            return
        name = name_of(new or old or {})
        doc = read_health(new, self._keys) if new is not None else None
        problem = doc.why if isinstance(doc, Undecodable) else ""
        if not problem:
            self.nodes.discard(name)
        elif name not in self.nodes:
            self.nodes.add(name)
            log.warning("node %s: its %s annotation cannot be read (%s); its verdict label "
                        "alone counts until its agent rewrites it", name, self._keys.health,
                        problem, extra={"node": name})


class Controller:
    """`healthd controller`: elect, then run terms while leading; see the module
    docstring. `run` returns only when cancelled (or when a term fails)."""

    def __init__(self, config: Config, *, kube: Kube, metrics: ControllerMetrics,
                 identity: str | None = None, clock: Callable[[], float] = time.time,
                 settle_s: float = SETTLE_S) -> None:
        self.config = config
        self.settings = config.controller
        self.kube = kube
        self.metrics = metrics
        self.identity = identity or default_identity(config)
        self._clock = clock
        self._settle_s = settle_s
        self._events = EventRecorder(kube, component=CONTROLLER_COMPONENT, host=self.identity)
        self.term: Term | None = None  # the current term while leading
        self._episodes = Episodes()  # blame already announced, across terms
        self.rewinds = Rewinds()  # the server's history moving back, across terms

    @property
    def leading(self) -> bool:
        return self.term is not None

    def ready(self) -> tuple[bool, str]:
        """Readiness: a standby is ready to take over; a leader once its caches synced."""
        if self.term is None:
            return True, ""
        waiting = [k for k in KINDS if not self.term.caches.store(k).synced.is_set()]
        if not waiting:
            return True, ""
        return False, f"leading; waiting for the first list of {', '.join(waiting)}"

    async def run(self) -> None:
        if self.settings.dry_run:
            log.info("dry run: acting without a Lease; nothing will be written")
            await self.lead()
            return
        election = self.settings.election
        elector = LeaseElector(self.kube, name=election.lease_name,
                               namespace=election.namespace, identity=self.identity,
                               lease_s=election.lease_duration,
                               renew_s=election.renew_deadline, retry_s=election.retry_period,
                               rewinds=self.rewinds)
        log.info("%s: campaigning for Lease %s/%s", self.identity, election.namespace,
                 election.lease_name)
        await elector.run(self.lead)

    async def lead(self) -> None:
        """Act while leading, until cancelled. A term that fails (a bug, an object no
        code foresaw) is logged and started afresh from new caches after a backoff:
        everything is level-triggered, so nothing is lost by starting over."""
        backoff = Backoff(initial=1, maximum=60)
        self.metrics.set_leader(True)
        try:
            while True:
                self.term = Term(self.kube, self.config, metrics=self.metrics,
                                 events=self._events, clock=self._clock,
                                 settle_s=self._settle_s, episodes=self._episodes,
                                 rewinds=self.rewinds)
                try:
                    await self.term.run()
                except Exception:
                    log.exception("the controller failed; starting over from fresh caches")
                self.term = None
                await anyio.sleep(backoff.next())
        finally:
            self.metrics.set_leader(False)
            self.term = None


def _lease_ref(name: str, namespace: str) -> dict[str, Any]:
    """The controller's Lease as an Event subject (for breaker Events)."""
    return {"apiVersion": LEASES.api_version, "kind": LEASES.kind,
            "metadata": {"name": name, "namespace": namespace}}
