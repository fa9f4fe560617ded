"""Events about the agent's own Node: what on-demand requests answer with, and the one
Warning that says a check cannot run on this node.

Recording is best effort (healthd.kube.events): posting never raises."""

from __future__ import annotations

import math
from typing import Any

import anyio

from checks.base import CheckResult, Severity
from healthd.agent.node_watch import NodeWatch
from healthd.kube.conventions import Reason
from healthd.kube.events import WARNING, EventRecorder


class NodeEvents:
    """Posts Events about the Node as its watch last showed it (its uid, so that
    `kubectl describe node` lists them)."""

    def __init__(self, recorder: EventRecorder, watch: NodeWatch) -> None:
        self._recorder, self._watch = recorder, watch

    async def post(self, type_: str, reason: str, message: str) -> None:
        """Post an Event about this agent's Node (never raises)."""
        node: dict[str, Any] = self._watch.obj or {
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": self._watch.node}}
        involved = {"apiVersion": "v1", "kind": "Node", "metadata": node.get("metadata", {})}
        await self._recorder.record(involved, type=type_, reason=reason, message=message)


class UnavailableChecks:
    """One Warning Event when a check cannot be used on this node (its tool or
    service is missing), not one per run; told again only after it worked. `observe`
    never waits for the API: `run` posts what it queued."""

    def __init__(self, events: NodeEvents) -> None:
        self._events = events
        self._told: set[str] = set()
        self._send, self._queue = anyio.create_memory_object_stream[str](math.inf)

    def observe(self, key: str, result: CheckResult) -> None:
        """Note the result of check `key`: queue its Warning if it is news."""
        if result.status.ordered:  # it worked: a later relapse is news again
            self._told.discard(key)
        if not (result.status is Severity.SKIPPED and result.actionable):
            return
        if key in self._told:
            return
        self._told.add(key)
        self._send.send_nowait(f"check {key} cannot run on this node: {result.reason}")

    async def run(self) -> None:
        """Post the queued Warnings; runs until cancelled."""
        async for message in self._queue:
            await self._events.post(WARNING, Reason.CHECK_UNAVAILABLE, message)
