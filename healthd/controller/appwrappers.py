"""`Resetter`: the one module that writes AppWrappers.

A reset is the transition the AppWrapper operator makes itself when its pods sit
on a NoExecute node: through the status subresource, phase `Running` ->
`Resetting` and condition `Unhealthy=True` (reason NodeEvicted). The operator
then deletes the components, waits its retry pause and resumes them on healthy
nodes (its injected node affinity keeps them off EVICT ones). The status counter
`resettingCount` is left alone, as the operator does for node-health resets.

Events do not hold up the next reset: inside `sending_events()` (the reset loop
runs in it) they are posted by background tasks, at most `EVENT_BACKLOG` at a time
(a full backlog makes the next reset wait for room), and leaving the block sends
what is pending, for at most `DRAIN_S`, even when it is cancelled. Outside it (a
one-off reset) they are posted before `reset` returns. Each reset gets its Warning
Event on the AppWrapper; the Normal Event on an EVICT node is one per node per
burst (`one_burst()`, which the reset loop holds over batches that follow each
other closely): a node carrying the pods of 40 AppWrappers gets one Event naming
them, not 40, and a rack whose node events were split into several batches still
gets one Event per node.

The write is one JSON patch guarded by `test` ops on the phase and on the
conditions list as read, so a stale cache or a concurrent writer can never be
overwritten: a failed test re-reads the AppWrapper and decides again. Before any
write the safety rails (`safety.py`) have their say, in this order: the circuit
breaker, the per-AppWrapper spacing, the global rate limit; `dry_run` stops just
before the write. Every call ends in one result, counted and logged:

| result | meaning |
| --- | --- |
| `reset` | the status was written; Events on the AppWrapper and each node |
| `dry-run` | it would have been written (dry run) |
| `breaker-open` | too many GPU nodes are bad: resets are held back |
| `spacing` | this AppWrapper was reset too recently |
| `rate-limited` | the global token bucket is empty |
| `conflict-retry` | the AppWrapper changed under the write; after re-reading it, it is not due any more (or kept changing): nothing stale was written |
| `gone` | the AppWrapper is deleted, or no longer Running / ours |
| `error` | the API server refused or was unreachable |
"""  # noqa: E501 (the table is meant to be read as it is)

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

import anyio
import anyio.abc

from healthd.config.controller import ControllerSettings
from healthd.controller.resets import (
    APPWRAPPER_RESET,
    BREAKER_CLOSED,
    BREAKER_OPEN,
    MESSAGE_NODES,
    NODE_EVICTED,
    RESETTING,
    RUNNING,
    UNHEALTHY,
    ResetDecision,
    eligible,
    last_reset_at,
)
from healthd.controller.safety import Breaker, BreakerState, Clock, Spacing, TokenBucket
from healthd.kube.client import Kube
from healthd.kube.errors import Conflict, Invalid, KubeError, NotFound
from healthd.kube.events import NORMAL, WARNING, EventRecorder
from healthd.kube.objects import APPWRAPPERS, NODES, meta
from healthd.kube.shapes import AppWrapper, Condition, Node, part, view
from healthd.util.times import rfc3339

log = logging.getLogger(__name__)

RESET = "reset"
DRY_RUN = "dry-run"
BREAKER = "breaker-open"
SPACING = "spacing"
RATE_LIMITED = "rate-limited"
CONFLICT_RETRY = "conflict-retry"
GONE = "gone"
ERROR = "error"
RESULTS = (RESET, DRY_RUN, BREAKER, SPACING, RATE_LIMITED, CONFLICT_RETRY, GONE, ERROR)
WRITE_ATTEMPTS = 3  # a status that keeps changing under us: let the next event retry
EVENT_BACKLOG = 64  # resets whose Events may be in flight at once
DRAIN_S = 5.0  # on the way out, how long pending Events may still take

NodeLookup = Callable[[str], Node | None]


class ResetMetrics(Protocol):
    """What the Resetter records (`healthd.controller.metrics.ControllerMetrics`)."""

    def count_reset(self, result: str) -> None: ...
    def observe_latency(self, seconds: float) -> None: ...
    def set_breaker(self, is_open: bool, bad_nodes: int | None = None) -> None: ...


def unhealthy(decision: ResetDecision, aw: AppWrapper, at: float) -> Condition:
    """The `Unhealthy=True` condition a reset writes."""
    cond: Condition = {"type": UNHEALTHY, "status": "True", "reason": NODE_EVICTED,
                            "message": decision.message, "lastTransitionTime": rfc3339(at)}
    generation = meta(aw).get("generation")
    if isinstance(generation, int):
        cond["observedGeneration"] = generation
    return cond


def reset_ops(decision: ResetDecision, aw: AppWrapper, at: float) -> list[dict[str, Any]]:
    """The JSON patch (on the status subresource) that resets `aw` as read: the phase
    and the conditions list are tested, so only that exact state is changed, and
    every other condition is carried over."""
    conditions = part(aw.get("status")).get("conditions")  # as read: the test compares it
    cond = unhealthy(decision, aw, at)
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/status/phase", "value": RUNNING},
        {"op": "replace", "path": "/status/phase", "value": RESETTING},
    ]
    if not isinstance(conditions, list):
        return [*ops, {"op": "add", "path": "/status/conditions", "value": [cond]}]
    kept = [c for c in conditions if not (isinstance(c, dict) and c.get("type") == UNHEALTHY)]
    at_index = next((i for i, c in enumerate(conditions)
                     if isinstance(c, dict) and c.get("type") == UNHEALTHY), len(kept))
    kept.insert(at_index, cond)  # where it was, so a diff shows one changed entry
    return [*ops, {"op": "test", "path": "/status/conditions", "value": conditions},
            {"op": "replace", "path": "/status/conditions", "value": kept}]


def node_event_message(resets: list[tuple[str, str]]) -> str:
    """What a node's Event says about the AppWrappers (`ns/name`, codes) reset on it."""
    names = [name for name, _ in resets]
    codes = ", ".join(dict.fromkeys(c for _, c in resets))  # each code once, in order
    if len(names) == 1:
        return f"Reset AppWrapper {names[0]}: its pods use GPUs on this EVICT node ({codes})"
    listed = ", ".join(names[:MESSAGE_NODES])
    more = f" and {len(names) - MESSAGE_NODES} more" if len(names) > MESSAGE_NODES else ""
    return (f"Reset {len(names)} AppWrappers ({listed}{more}): their pods use GPUs on this "
            f"EVICT node ({codes})")


class Resetter:
    """Resets AppWrappers under the safety rails; see the module docstring.

    `node_lookup` (e.g. the node cache's `get`) gives the Node objects that Events
    are about (their uid makes `kubectl describe node` show them); `breaker_subject`
    is the object the breaker's Events are about (the controller's Lease or Pod);
    without it the breaker only logs and sets its metric.
    """

    def __init__(self, kube: Kube, events: EventRecorder, *, settings: ControllerSettings,
                 metrics: ResetMetrics | None = None, clock: Clock = time.time,
                 node_lookup: NodeLookup | None = None,
                 breaker_subject: dict[str, Any] | None = None) -> None:
        self._kube = kube
        self._events = events
        self._metrics = metrics
        self._clock = clock
        self._node_lookup = node_lookup
        self._breaker_subject = breaker_subject
        self.dry_run = settings.dry_run
        pace, trip = settings.resets, settings.breaker
        self.bucket = TokenBucket(pace.rate_per_minute / 60, pace.burst, clock)
        self.spacing = Spacing(pace.min_spacing, clock)
        self.breaker = Breaker(trip.max_unhealthy, trip.window, trip.hold, clock,
                               min_allowed=trip.min_allowed)
        self._announced = BreakerState.CLOSED
        self._event_tasks: anyio.abc.TaskGroup | None = None
        self._event_slots = anyio.Semaphore(EVENT_BACKLOG)
        self._event_scopes: set[anyio.CancelScope] = set()
        self._node_resets: dict[str, list[tuple[str, str]]] | None = None  # in one_burst

    # -- the fleet -------------------------------------------------------------------

    async def observe_fleet(self, bad_nodes: int, gpu_nodes: int) -> BreakerState:
        """Feed the breaker with the fleet as it is now (call on every node change)."""
        self.breaker.update(bad_nodes, gpu_nodes)
        return await self._announce()

    async def _announce(self) -> BreakerState:
        """Metric always; log line and Event when the state changed since last said."""
        state = self.breaker.state
        if self._metrics is not None:
            self._metrics.set_breaker(state is BreakerState.OPEN, self.breaker.bad_nodes)
        if state is self._announced:
            return state
        self._announced = state
        if state is BreakerState.OPEN:
            text = f"circuit breaker open, AppWrapper resets stopped: {self.breaker.describe()}"
            log.error(text)
            await self._breaker_event(WARNING, BREAKER_OPEN, text)
        else:
            text = f"circuit breaker closed, AppWrapper resets resume: {self.breaker.describe()}"
            log.warning(text)
            await self._breaker_event(NORMAL, BREAKER_CLOSED, text)
        return state

    async def _breaker_event(self, type: str, reason: str, message: str) -> None:
        if self._breaker_subject is not None and not self.dry_run:
            await self._events.record(self._breaker_subject, type=type, reason=reason,
                                      message=message)

    # -- resets ----------------------------------------------------------------------

    async def reset(self, decision: ResetDecision, *, appwrapper: AppWrapper | None = None,
                    since: float | None = None) -> str:
        """Reset the AppWrapper `decision` names; returns the result (module docstring).

        `appwrapper` is the object the decision was made from (e.g. the cache's); when
        absent it is read. `since` is when the node's label change was seen (epoch
        seconds), for the label-to-reset latency.
        """
        try:
            result = await self._reset(decision, appwrapper, since)
        except KubeError as exc:
            log.warning("reset of AppWrapper %s failed: %s", decision.appwrapper, exc)
            result = ERROR
        if self._metrics is not None:
            self._metrics.count_reset(result)
        level = logging.DEBUG if result in (SPACING, GONE) else logging.INFO
        log.log(level, "AppWrapper %s on %s: %s", decision.appwrapper,
                ", ".join(decision.nodes), result)
        return result

    async def _reset(self, decision: ResetDecision, aw: AppWrapper | None,
                     since: float | None) -> str:
        if await self._announce() is BreakerState.OPEN:
            return BREAKER
        aw = aw if aw is not None else await self._read(decision)
        if aw is None or not eligible(aw):
            return GONE
        if not self.spacing.allowed(decision.appwrapper, last_reset_at(aw)):
            return SPACING
        if not self.bucket.take():
            return RATE_LIMITED
        if self.dry_run:
            self.spacing.record(decision.appwrapper)
            log.info("dry run: would reset AppWrapper %s: %s", decision.appwrapper,
                     decision.message)
            return DRY_RUN
        try:
            result, written = await self._write(decision, aw)
        except KubeError as exc:
            log.warning("reset of AppWrapper %s failed: %s", decision.appwrapper, exc)
            result, written = ERROR, None
        if result != RESET or written is None:
            self.bucket.give_back()
            return result
        self.spacing.record(decision.appwrapper)
        if since is not None and self._metrics is not None:
            self._metrics.observe_latency(self._clock() - since)
        await self._send_events(decision, written)
        return RESET

    async def _read(self, decision: ResetDecision) -> AppWrapper | None:
        try:
            return view(AppWrapper, await self._kube.get(APPWRAPPERS, decision.name,
                                                         decision.namespace))
        except NotFound:
            return None

    async def _write(self, decision: ResetDecision,
                     aw: AppWrapper) -> tuple[str, AppWrapper | None]:
        """Patch until written; re-read after each failed test. (result, written object)."""
        for _ in range(WRITE_ATTEMPTS):
            ops = reset_ops(decision, aw, self._clock())
            try:
                written = await self._kube.json_patch(APPWRAPPERS, decision.name, ops,
                                                      decision.namespace, subresource="status")
                return RESET, view(AppWrapper, written)
            except NotFound:
                return GONE, None
            except (Invalid, Conflict) as exc:
                log.info("AppWrapper %s changed before the reset was written (%s); re-reading",
                         decision.appwrapper, exc)
            fresh = await self._read(decision)
            if fresh is None:
                return GONE, None
            if not eligible(fresh) or not self.spacing.allowed(decision.appwrapper,
                                                               last_reset_at(fresh)):
                return CONFLICT_RETRY, None
            aw = fresh
        return CONFLICT_RETRY, None

    @asynccontextmanager
    async def sending_events(self) -> AsyncIterator[None]:
        """Post reset Events in the background while inside (see the module docstring)."""
        async with anyio.create_task_group() as group:
            self._event_tasks = group
            try:
                yield
            finally:
                self._event_tasks = None  # later resets post inline
                drain_by = anyio.current_time() + DRAIN_S
                for scope in self._event_scopes:
                    scope.deadline = min(scope.deadline, drain_by)

    @asynccontextmanager
    async def one_burst(self) -> AsyncIterator[None]:
        """Resets inside share their node Events: each EVICT node gets one, naming
        every AppWrapper reset because of it in the block, posted when it ends."""
        self._node_resets = {}
        try:
            yield
        finally:
            pending, self._node_resets = self._node_resets, None
            # Shielded like the Events themselves (a lost Lease right after the writes
            # still reports them), for at most DRAIN_S.
            with anyio.move_on_after(DRAIN_S, shield=True):
                for node, resets in pending.items():
                    await self._post(self._record_node_event, node, resets)

    async def _send_events(self, decision: ResetDecision, aw: AppWrapper) -> None:
        await self._post(self._record_appwrapper_event, decision, aw)
        for node, codes in zip(decision.nodes, decision.codes, strict=True):
            if self._node_resets is not None:
                self._node_resets.setdefault(node, []).append((decision.appwrapper, codes))
            else:
                await self._post(self._record_node_event, node, [(decision.appwrapper, codes)])

    async def _post(self, record: Callable[..., Awaitable[None]], *args: Any) -> None:
        """`record(*args)` in the background inside `sending_events`, else now."""
        if self._event_tasks is None:
            await record(*args)
            return
        await self._event_slots.acquire()
        self._event_tasks.start_soon(self._in_background, record, args)

    async def _in_background(self, record: Callable[..., Awaitable[None]],
                             args: tuple[Any, ...]) -> None:
        # Shielded: a shutdown lets the Events of resets already written go out, until
        # `sending_events` sets the drain deadline.
        with anyio.CancelScope(shield=True) as scope:
            self._event_scopes.add(scope)
            try:
                await record(*args)
            finally:
                self._event_scopes.discard(scope)
                self._event_slots.release()

    async def _record_appwrapper_event(self, decision: ResetDecision,
                                       aw: AppWrapper) -> None:
        await self._events.record(aw, type=WARNING, reason=NODE_EVICTED,
                                  message=f"Reset: {decision.message}", res=APPWRAPPERS)

    async def _record_node_event(self, node: str, resets: list[tuple[str, str]]) -> None:
        """The Event on `node` for the AppWrappers (`ns/name`, its codes) reset on it."""
        subject = (self._node_lookup(node) if self._node_lookup else None) \
            or {"metadata": {"name": node}}
        await self._events.record(subject, type=NORMAL, reason=APPWRAPPER_RESET, res=NODES,
                                  message=node_event_message(resets))

    def forget_own_writes(self) -> None:
        """The server's history moved back: the resets this process remembers may be
        lost with it, and an AppWrapper restored to `Running` on an EVICT node is due
        again (its own `Unhealthy` condition still spaces resets it does show)."""
        self.spacing.forget()

    # -- when to look again ----------------------------------------------------------

    def retry_in_s(self, result: str, decision: ResetDecision,
                   appwrapper: AppWrapper | None = None) -> float | None:
        """After `result`, seconds until trying `decision` again could succeed; None
        when only a change of the objects can make it due (or it is done)."""
        if result == BREAKER:
            return self.breaker.next_change_s()
        if result == RATE_LIMITED:
            return self.bucket.wait_s()
        if result == SPACING:
            last = last_reset_at(appwrapper) if appwrapper is not None else None
            return self.spacing.remaining_s(decision.appwrapper, last)
        if result == ERROR:
            return 1.0
        return None
