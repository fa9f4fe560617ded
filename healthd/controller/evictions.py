"""Reacting to EVICT nodes: which AppWrappers to look at, and when.

`EvictionReactor` follows the caches (`handle` is a change callback) and marks the
AppWrappers that may be due for a reset: the owners of the GPU pods on a node the
moment it turns EVICT (found through the pods-by-node index, so a label change
costs a few dictionary lookups, not a scan), and any AppWrapper whose pods or own
status change while one of its pods sits on an EVICT node. Its `run` loop decides
each marked AppWrapper with the pure `resets.decide` and hands due resets to the
`Resetter`, which applies the safety rails and writes.

Marks coalesce: a burst of node events wakes the loop once, after a short settle
time, so the circuit breaker sees a mass failure as one before any reset is tried.
The batches that follow each other closely (none `BURST_QUIET_S` apart, for at most
`BURST_MAX_S`) are one burst for the Resetter: each EVICT node gets one Event for it,
however the node events of a rack that failed together were split into batches.
The AppWrappers of one batch are decided concurrently (at most `CONCURRENCY` at a
time; a batch holds each key once, and the next batch waits for this one, so no
AppWrapper is ever decided twice at once), and the Resetter posts Events in the
background, so the API round trips of a burst overlap instead of adding up.
Results that only time can change (spacing, rate limit, an open breaker waiting for
its hold time) are retried by a timer, not by polling. Everything is level-
triggered from the caches: when the loop starts (a new leader, a restart) and when
the breaker closes, every AppWrapper with a pod on an EVICT node is decided afresh.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import anyio
import anyio.abc

from healthd.capacity.health import CORDONED, evict_codes, gpu_count, is_evict, reasons_of
from healthd.config.controller import ControllerSettings
from healthd.controller.appwrappers import Resetter
from healthd.controller.caches import APPWRAPPERS_KIND, NODES_KIND, PODS_KIND, RESET_KINDS, Caches
from healthd.controller.resets import affected, decide, eligible, owner_of
from healthd.controller.safety import BreakerState
from healthd.kube.conventions import Keys
from healthd.kube.objects import key_of, name_of, node_name_of
from healthd.kube.shapes import AppWrapper, KubeObject, Node, Pod, view

log = logging.getLogger(__name__)

SETTLE_S = 0.1  # lets a burst of node events land before the breaker judges the fleet
BURST_QUIET_S = 0.5  # no new work for this long: the burst is over, its node Events go out
BURST_MAX_S = 5.0  # a burst that never stops still reports this often
CONCURRENCY = 32  # AppWrappers decided (and written) at once
Obj = KubeObject  # any kind's object, as the caches' change callback gets it


class Worklist:
    """Keys to look at, each with the earliest time a change made it due (None: not
    caused by a label change). Marking wakes the consumer; bursts coalesce."""

    def __init__(self) -> None:
        self._items: dict[str, float | None] = {}
        self._wake = anyio.Event()

    def mark(self, key: str, since: float | None = None) -> None:
        if key in self._items:
            before = self._items[key]
            since = since if before is None else before if since is None else min(before, since)
        self._items[key] = since
        self._wake.set()

    def poke(self) -> None:
        """Wake the consumer with nothing new to look at (the fleet changed)."""
        self._wake.set()

    def drain(self) -> dict[str, float | None]:
        items, self._items = self._items, {}
        self._wake = anyio.Event()
        return items

    async def take(self, settle_s: float = 0) -> dict[str, float | None]:
        """Wait for a mark or poke, let `settle_s` more arrive, take everything."""
        await self._wake.wait()
        if settle_s > 0:
            await anyio.sleep(settle_s)
        return self.drain()

    async def take_within(self, wait_s: float,
                          settle_s: float = 0) -> dict[str, float | None] | None:
        """`take`, if a mark or poke comes within `wait_s`; else None."""
        with anyio.move_on_after(max(0.0, wait_s)):
            await self._wake.wait()
        if not self._wake.is_set():
            return None
        return await self.take(settle_s)


class Fleet:
    """GPU nodes and how many of them are bad, kept per node event (O(1)): what the
    circuit breaker judges. A cordon alone is an administrator's choice, not a
    health signal, so it does not make a node bad here."""

    def __init__(self, *, keys: Keys, settings: ControllerSettings) -> None:
        self._keys = keys
        self._settings = settings
        self._nodes: dict[str, bool] = {}  # GPU node -> bad

    def update(self, name: str, node: Node | None) -> None:
        self._nodes.pop(name, None)
        if node is None or gpu_count(node, self._settings.gpu_resource,
                                     self._settings.capacity_source) <= 0:
            return
        reasons = reasons_of(node, keys=self._keys, bad_verdicts=self._settings.bad_verdicts)
        self._nodes[name] = bool(reasons - {CORDONED})

    @property
    def gpu_nodes(self) -> int:
        return len(self._nodes)

    @property
    def bad_nodes(self) -> int:
        return sum(self._nodes.values())


class EvictionReactor:
    """Turns cache changes into reset decisions; see the module docstring."""

    def __init__(self, caches: Caches, resetter: Resetter, *, keys: Keys,
                 settings: ControllerSettings, clock: Callable[[], float] = time.time,
                 settle_s: float = SETTLE_S, burst_quiet_s: float = BURST_QUIET_S,
                 burst_max_s: float = BURST_MAX_S) -> None:
        self._caches = caches
        self._resetter = resetter
        self._keys = keys
        self._settings = settings
        self._clock = clock
        self.settle_s = settle_s
        self.burst_quiet_s, self.burst_max_s = burst_quiet_s, burst_max_s
        self._state = BreakerState.CLOSED  # as last judged
        self.fleet = Fleet(keys=keys, settings=settings)
        self.evict: dict[str, tuple[str, ...]] = {}  # EVICT node -> its finding codes
        self._work = Worklist()
        self._timers: dict[str, float] = {}  # key ("" = the fleet) -> when its timer fires
        self._group: anyio.abc.TaskGroup | None = None
        self._limiter = anyio.CapacityLimiter(CONCURRENCY)

    # -- following the caches ------------------------------------------------------

    def handle(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        """The caches' change callback (quick, never blocks)."""
        if kind == NODES_KIND:
            self._node_changed(name_of(new or old or {}),
                               None if new is None else view(Node, new))
        elif kind == PODS_KIND:
            pod = view(Pod, new or old)
            owner = owner_of(pod)
            if owner and node_name_of(pod) in self.evict:
                self._work.mark(owner)
        elif kind == APPWRAPPERS_KIND and new is not None and eligible(view(AppWrapper, new)):
            # Only a Running AppWrapper can be due: our own reset (now Resetting) and
            # the operator's later steps are not looked at again until it runs again.
            key = key_of(new)
            if any(node_name_of(p) in self.evict for p in self._caches.pods_of_appwrapper(key)):
                self._work.mark(key)

    def _node_changed(self, name: str, node: Node | None) -> None:
        self.fleet.update(name, node)
        self._work.poke()
        was_evict = name in self.evict
        if node is None or not is_evict(node, self._keys):
            self.evict.pop(name, None)
            return
        self.evict[name] = evict_codes(node, self._keys)
        if not was_evict:
            now = self._clock()
            for key in affected(self._caches.pods_on_node(name), self._settings.gpu_resource):
                self._work.mark(key, since=now)

    def mark_all(self) -> None:
        """Decide afresh every AppWrapper with a GPU pod on an EVICT node."""
        for node in list(self.evict):
            for key in affected(self._caches.pods_on_node(node), self._settings.gpu_resource):
                self._work.mark(key)

    # -- the loop ------------------------------------------------------------------

    async def run(self) -> None:
        """Wait for the caches resets decide from, then decide marked AppWrappers
        until cancelled."""
        await self._caches.wait_synced(RESET_KINDS)
        self.mark_all()  # `handle` saw the first lists; decide all of it once
        async with self._resetter.sending_events(), anyio.create_task_group() as group:
            self._group = group
            self._state = self._resetter.breaker.state
            while True:
                await self._burst(await self._work.take(self.settle_s))

    async def _burst(self, batch: dict[str, float | None]) -> None:
        """Decide `batch` and the batches that follow it closely, as one burst."""
        ends = anyio.current_time() + self.burst_max_s
        async with self._resetter.one_burst():
            next_batch: dict[str, float | None] | None = batch
            while next_batch is not None:
                self._state = await self._judge_fleet(self._state)
                await self._evaluate_all(next_batch)
                left = ends - anyio.current_time()
                next_batch = None if left <= 0 else \
                    await self._work.take_within(min(self.burst_quiet_s, left), self.settle_s)

    async def _evaluate_all(self, batch: dict[str, float | None]) -> None:
        async def one(key: str, since: float | None) -> None:
            async with self._limiter:
                await self._evaluate(key, since)

        async with anyio.create_task_group() as group:
            for key, since in batch.items():
                group.start_soon(one, key, since)

    async def _judge_fleet(self, before: BreakerState) -> BreakerState:
        state = await self._resetter.observe_fleet(self.fleet.bad_nodes, self.fleet.gpu_nodes)
        if before is BreakerState.OPEN and state is BreakerState.CLOSED:
            self.mark_all()  # what the breaker held back is due now, if still true
        closes_in = self._resetter.breaker.next_change_s()
        if closes_in is not None:
            self._later("", closes_in)
        return state

    async def _evaluate(self, key: str, since: float | None) -> None:
        aw = self._caches.appwrappers.get(key)
        if aw is None:
            return
        decision = decide(aw, self._caches.pods_of_appwrapper(key), self.evict,
                          resource=self._settings.gpu_resource)
        if decision is None:
            return
        result = await self._resetter.reset(decision, appwrapper=aw, since=since)
        again = self._resetter.retry_in_s(result, decision, aw)
        if again is not None:
            self._later(key, again, since)

    def _later(self, key: str, delay_s: float, since: float | None = None) -> None:
        """Look at `key` again in `delay_s` ("" pokes the fleet); one timer per key."""
        due = anyio.current_time() + max(0.0, delay_s)
        if self._group is None or self._timers.get(key, float("inf")) <= due:
            return
        self._timers[key] = due

        async def fire() -> None:
            await anyio.sleep_until(due)
            if self._timers.get(key) == due:
                del self._timers[key]
                if key:
                    self._work.mark(key, since)
                else:
                    self._work.poke()

        self._group.start_soon(fire)

