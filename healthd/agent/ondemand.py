"""Serving on-demand requests: `healthd.io/run` and `healthd.io/clear` on the agent's
own Node, taken once, run through the same runner as everything else, answered.

One request at a time, in the order the node watch shows them. For each request on
the node (healthd.requests parses them):

1. take it (JSON-patch `test` + `remove`): if the value changed meanwhile, a newer
   request is there and the next node event brings it; nothing is lost or run twice.
   A clear's take also writes `healthd.io/clearing` (the clear in flight: id, text,
   when taken);
2. refuse it when it cannot run: a malformed value, an unknown check, an argument
   out of range, an exclusive check while pods hold the GPUs (the answer names
   them), an API that cannot say whether they do, a clear while the controller's
   repair holds the node (`repair_holding`). A refusal changes nothing but
   `last-run` and posts a Warning Event;
3. run it: `run` runs the selected checks (trigger `on-demand`); `clear` marks what
   holds the node for release and re-runs those checks (trigger `clear`);
4. answer it in `healthd.io/last-run` (id, request, accepted, times, verdict,
   per-check status), written together with the state it produced (and, for a
   clear, the removal of `clearing`), and a Normal Event.

A clear the Node shows in flight that this agent did not take (its predecessor
stopped before the answer) is carried out from step 2 on, under its id and start,
before any new request: a clear is answered exactly once, whenever the agent stops.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import checks
from checks.base import CheckResult, Severity
from healthd.agent.deeprecord import Asked
from healthd.agent.deepruns import DeepRuns
from healthd.agent.health import NodeHealth
from healthd.agent.node_events import NodeEvents
from healthd.agent.node_watch import NodeWatch
from healthd.agent.verdict import Trigger
from healthd.check.plans import Planned
from healthd.kube.conventions import Keys, Reason
from healthd.kube.errors import KubeError
from healthd.kube.events import NORMAL, WARNING
from healthd.kube.objects import annotations_of, resource_version_of
from healthd.published import Clearing, Repair, read_clearing, read_repair
from healthd.requests import NodePatcher, Request, answer, read_requests, take
from healthd.util.logs import log_context
from healthd.util.times import parse_time, rfc3339

log = logging.getLogger(__name__)

ANSWER_FLUSH_S = 5.0  # let the verdict reach the node before the answer says it is done
_SEEN = 64  # requests remembered as taken (a stale node copy must not retry them)

Results = Mapping[str, CheckResult | str]  # per check key: its result, or why it did not run


class Refused(Exception):
    """The request cannot run; the message says why (it goes in last-run)."""


class RequestHandler:
    """Serves the agent's on-demand requests (see the module docstring)."""

    def __init__(self, health: NodeHealth, runs: DeepRuns, *, watch: NodeWatch,
                 publisher: NodePatcher, events: NodeEvents, plan: Callable[[str], Planned],
                 keys: Keys) -> None:
        """`publisher` takes requests off the node; `plan` gives a check key as
        configured (ValueError for a bad argument)."""
        self.health, self.runs, self.watch = health, runs, watch
        self.publisher, self.events, self.plan = publisher, events, plan
        self.keys = keys
        self._taken: deque[tuple[str, str, str, str]] = deque(maxlen=_SEEN)
        self._clears: deque[Clearing] = deque(maxlen=_SEEN)  # in flight, carried out

    async def serve(self) -> None:
        """Handle requests as node events show them; runs until cancelled."""
        while True:
            node = await self.watch.next()
            if node is None:
                continue
            await self._carry_on(node)
            for request in read_requests(node, self.keys, checks.REGISTRY):
                seen = (request.kind, request.id, request.text, resource_version_of(node) or "")
                if seen in self._taken:
                    continue  # our copy of the node predates our own take
                if request.kind == "clear" and (held := repair_holding(node, self.keys)):
                    request = replace(request, error=held)
                start = self.health.clock()
                if not await self._take(request, start):
                    continue
                self._taken.append(seen)
                with log_context(request_id=request.id):
                    await self.handle(request, start)

    async def _take(self, request: Request, start: float) -> bool:
        """Take `request` off the node; a clear that will run is kept in flight
        (`clearing`) until its answer."""
        if request.kind != "clear" or not request.ok:
            return await take(self.publisher, request, self.keys)
        clearing = Clearing(request.id, request.text, rfc3339(start))
        self._clears.append(clearing)  # a later copy of the node shows our own
        self.health.keep_clearing(True)
        if await take(self.publisher, request, self.keys,
                      also={self.keys.clearing: clearing.encode()}):
            return True
        self.health.keep_clearing(False)
        return False

    async def _carry_on(self, node: dict[str, Any]) -> None:
        """A clear the node shows in flight that this agent did not take: its
        predecessor stopped before answering it. Carry it out and answer it, once."""
        clearing = read_clearing(node, self.keys)
        if not isinstance(clearing, Clearing) or not clearing.id or clearing in self._clears:
            return
        self._clears.append(clearing)
        self.health.keep_clearing(True)
        request = Request(clearing.id, clearing.request, "clear", annotation=self.keys.clear,
                          error=repair_holding(node, self.keys))
        with log_context(request_id=request.id):
            log.info("carrying out the clear taken at %s, not answered before the agent "
                     "restarted", clearing.start)
            await self.handle(request, parse_time(clearing.start) or self.health.clock())

    async def handle(self, request: Request, start: float | None = None) -> None:
        """Run or refuse one taken request, then answer it. `start`: when it was taken
        (None: now)."""
        start = self.health.clock() if start is None else start
        log.info("on-demand request %s: %s", request.kind, request.shown)
        try:
            if request.error:
                raise Refused(request.error)
            if request.kind == "clear":
                results = await self._clear(Asked(request, start))
            else:
                results = await self._run(Asked(request, start))
        except Refused as exc:
            await self._answer(request, start, error=str(exc), results={})
            return
        await self._answer(request, start, error="", results=results)

    async def answer_resumed(self, request: Request, start: float, results: Results) -> None:
        """Answer a request whose diagnostic an earlier agent started and this one
        finished (healthd.agent.deepresume)."""
        with log_context(request_id=request.id):
            await self._answer(request, start, error="", results=results)

    async def _run(self, asked: Asked) -> Results:
        planned = self._plan([str(s) for s in asked.request.selected])
        await self._refuse_if_busy(planned)
        return await self.runs.run_planned(planned, Trigger.ON_DEMAND, asked)

    async def _clear(self, asked: Asked) -> Results:
        planned = self._plan(self.health.start_clear())
        await self._refuse_if_busy(planned)
        return await self.runs.run_planned(planned, Trigger.CLEAR, asked)

    def _plan(self, keys: list[str]) -> list[Planned]:
        try:
            return [self.plan(key) for key in keys]
        except ValueError as exc:
            raise Refused(str(exc)) from None

    async def _refuse_if_busy(self, planned: list[Planned]) -> None:
        """Exclusive checks need every GPU: refuse the whole request while pods hold
        them, before anything runs."""
        exclusive = [p.key for p in planned if p.exclusive]
        if not exclusive:
            return
        try:
            busy = await self.runs.busy_pods()
        except KubeError as exc:
            raise Refused(f"cannot tell whether the GPUs are free for {', '.join(exclusive)}: "
                          f"{exc}") from None
        if busy:
            raise Refused(f"{', '.join(exclusive)} needs every GPU of the node, but pods hold "
                          f"GPUs: {', '.join(busy)}")

    async def _answer(self, request: Request, start: float, *, error: str,
                      results: Results) -> None:
        health = self.health
        statuses = _statuses(results)
        last_run = answer(request, accepted=not error, error=error, start=start,
                          end=health.clock(), verdict=health.verdict, checks=statuses,
                          reasons=_unknown_reasons(results))
        await health.answer(last_run, ANSWER_FLUSH_S)
        if error:
            log.warning("request %s refused: %s", request.shown, error)
            await self.events.post(WARNING, Reason.BAD_REQUEST,
                                   f"request {request.shown!r} ({request.id}) refused: {error}")
        else:
            reasons = _unknown_reasons(results)
            summary = ", ".join(f"{k} {v}" + (f" ({reasons[k]})" if k in reasons else "")
                                for k, v in statuses.items()) or "nothing to re-run"
            done = Reason.CLEARED if request.kind == "clear" else Reason.REQUEST_DONE
            await self.events.post(NORMAL, done,
                                   f"request {request.shown!r} ({request.id}) done: {summary}; "
                                   f"verdict {health.verdict.value}")


def repair_holding(node: Mapping[str, Any], keys: Keys) -> str:
    """Why a clear on `node` may release nothing now ("" when it may): the controller's
    repair holds the node (it resets or validates the GPUs, or waits for the reboot it
    requested) until the controller closes it. The repair's own validation writes its
    clear with the validation run under the record's run id: that clear goes through."""
    repair = read_repair(node, keys)
    if not isinstance(repair, Repair) or not repair.holds_node:
        return ""
    annotations = annotations_of(node)
    if (repair.state == "validating" and keys.run in annotations
            and annotations.get(keys.run_id) == repair.run_id):
        return ""
    return (f"the repair holds the node ({repair.doing}): a clear releases nothing until "
            "the controller ends the repair, whose validation clears what it is for")


def _statuses(results: Results) -> dict[str, str]:
    """Per-check status for the answer: the result's status, or why it did not run."""
    return {key: r.status.value if isinstance(r, CheckResult) else f"NOT RUN: {r}"
            for key, r in results.items()}


def _unknown_reasons(results: Results) -> dict[str, str]:
    """Why each check that could not tell could not (a diagnostic Job never scheduled,
    a timeout, no driver): an UNKNOWN is never shown without its reason."""
    return {key: r.reason or "no reason given" for key, r in results.items()
            if isinstance(r, CheckResult) and r.status is Severity.UNKNOWN}
