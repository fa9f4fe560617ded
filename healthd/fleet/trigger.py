"""`healthd trigger`: ask many nodes' agents for on-demand checks and collect the answers.

The protocol is the agent's (healthd.requests): write `healthd.io/run` with a
`healthd.io/run-id` in ONE merge patch per node; the agent takes the request and
answers in `healthd.io/last-run` carrying that id. This module drives it for a fleet:

1. validate the request text exactly as the agent will (its own parser), before
   anything is written: a bad check list costs zero writes;
2. refuse exclusive checks (`dcgm:3`) on nodes whose GPUs are busy, naming the
   pods, unless the admin forces them (the agent still has the last word);
3. write requests with at most `batch` outstanding: the next node is asked when an
   outstanding one answers or times out. A node where another request still waits
   (someone else's, not yet taken: its agent may be busy with an earlier one) is
   not asked: the write is guarded by the node's resourceVersion, so a request
   written meanwhile is never overwritten;
4. follow the answers with ONE watch over the target nodes (never polling); a node
   is done when its last-run carries our id, or when `timeout_s` passes: then a
   request the agent never took is withdrawn (JSON-patch `test` on our text and
   id: only ours), so a node whose agent comes back later does not run a stale
   request;
5. `interrupt()` (Ctrl-C) stops issuing and waiting at once: the report says what
   came back, and which nodes were asked but had not answered.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

import anyio

import checks
from checks.base import Severity, worst
from healthd.check.plans import planned_check
from healthd.config import Config
from healthd.fleet.targets import Resolved
from healthd.kube.client import Kube
from healthd.kube.conventions import Keys, Verdict
from healthd.kube.errors import Conflict, Invalid, KubeError, NotFound
from healthd.kube.objects import (
    NODES,
    annotations_of,
    labels_of,
    name_of,
    resource_version_of,
)
from healthd.kube.shapes import Node, view
from healthd.kube.watching import DELETED, watch_forever
from healthd.published import LastRun, read_last_run
from healthd.requests import Request, read_requests, take_ops

log = logging.getLogger(__name__)


# A node's state in a trigger run.
PENDING = "pending"  # not asked yet
REQUESTED = "requested"  # asked, no answer yet
ANSWERED = "answered"
REFUSED = "refused"  # not asked: busy GPUs (or the agent refused it: see `accepted`)
OCCUPIED = "occupied"  # not asked: another request waits on the node, not yet taken
NO_ANSWER = "no-answer"  # timed out
FAILED = "failed"  # the request could not be written, or the node went away
MISSING = "missing"  # no such node
INTERRUPTED = "interrupted"  # asked, then the admin stopped waiting
NOT_ASKED = "not-asked"  # the admin stopped before this node was asked
OPEN_STATES = frozenset({PENDING, REQUESTED})
WRITE_ATTEMPTS = 5  # a node that changes under the request write is re-read this often


class RequestError(ValueError):
    """The check list is not a request the agent would accept (nothing was written)."""


@dataclass(frozen=True)
class Plan:
    """What to ask for, validated: the request text, its id, which checks are exclusive."""

    text: str
    request_id: str
    exclusive: tuple[str, ...] = ()


def new_request_id(clock: Callable[[], float] = time.time) -> str:
    """`trigger-20250513T195455-3fa9c1`: readable, and unique across admins."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(clock()))
    return f"trigger-{stamp}-{secrets.token_hex(3)}"


def plan_request(text: str, keys: Keys, config: Config, request_id: str | None = None) -> Plan:
    """Validate `text` with the agent's own request parser; RequestError when the agent
    would refuse it. Exclusive checks are found from the configured check instances."""
    probe = {"metadata": {"annotations": {keys.run: text}}}
    (request,) = read_requests(probe, keys, checks.REGISTRY)
    if request.error:
        raise RequestError(request.error)
    exclusive = []
    for selected in request.selected:
        try:
            if planned_check(config, str(selected)).exclusive:
                exclusive.append(str(selected))
        except ValueError as exc:
            raise RequestError(str(exc)) from None
    return Plan(text.strip(), request_id or new_request_id(), tuple(exclusive))


@dataclass
class NodeOutcome:
    """One node's part in a trigger run, as shown in the final table."""

    node: str
    before: str | None = None  # the verdict label before the request
    state: str = PENDING
    after: str | None = None  # the verdict the answer reports
    checks: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)  # why a check is UNKNOWN
    error: str = ""
    accepted: bool | None = None
    asked_at: float | None = None  # monotonic, when the request was written
    waited_s: float | None = None  # from the write to the answer, as seen here
    duration_s: float | None = None  # the agent's own start-to-end

    @property
    def problem(self) -> str:
        """What went wrong, in words: the error, else why checks were UNKNOWN."""
        return self.error or "; ".join(f"{k}: {v}" for k, v in self.reasons.items())

    @property
    def status(self) -> Severity:
        """The node's result for the exit code: the worst check status; UNKNOWN for
        anything that did not run (refused, no answer, a check NOT RUN)."""
        if self.state != ANSWERED or not self.accepted:
            return Severity.UNKNOWN
        return worst(_severity(s) for s in self.checks.values())


def _severity(text: str) -> Severity:
    try:
        return Severity(text)
    except ValueError:  # "NOT RUN: GPUs are busy ..."
        return Severity.UNKNOWN


@dataclass
class Report:
    """Every target node's outcome, in target order."""

    plan: Plan
    outcomes: dict[str, NodeOutcome]
    interrupted: bool = False
    waited: bool = True  # False: requests were placed, answers not awaited

    @property
    def status(self) -> Severity:
        if not self.outcomes:
            return Severity.UNKNOWN
        return worst(self._status(o) for o in self.outcomes.values())

    def _status(self, outcome: NodeOutcome) -> Severity:
        if outcome.state == REQUESTED and not self.waited:
            return Severity.PASS  # placed as asked; its result is not this run's to judge
        return outcome.status

    @property
    def exit_code(self) -> int:
        """Nagios convention over all nodes; no node at all is UNKNOWN."""
        return self.status.exit_code

    def count(self, *states: str) -> int:
        return sum(1 for o in self.outcomes.values() if o.state in states)


class FleetTrigger:
    """One trigger run over resolved targets; see the module docstring."""

    def __init__(self, kube: Kube, plan: Plan, targets: Resolved, *, keys: Keys,
                 batch: int | None = None, timeout_s: float = 300.0, wait: bool = True,
                 refused: Mapping[str, str] | None = None,
                 agentless: frozenset[str] = frozenset(),
                 on_progress: Callable[[Report], None] | None = None,
                 on_answer: Callable[[NodeOutcome], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._kube, self._keys, self._targets, self._clock = kube, keys, targets, clock
        self._batch = max(1, batch) if batch else max(1, len(targets.nodes))
        self._timeout_s, self._wait = timeout_s, wait
        self._agentless = agentless  # nodes seen without a running agent pod (a hint)
        self._on_progress = on_progress or (lambda report: None)
        self._on_answer = on_answer or (lambda outcome: None)  # a node's request is over
        self._wake = anyio.Event()
        self._interrupted = False
        self._latest = dict(targets.nodes)  # each node as last read or watched
        outcomes = {name: NodeOutcome(name, before=_verdict(obj, keys))
                    for name, obj in targets.nodes.items()}
        for name, why in (refused or {}).items():
            if name in outcomes:
                outcomes[name].state, outcomes[name].error = REFUSED, why
        for name in targets.missing:
            outcomes[name] = NodeOutcome(name, state=MISSING, error="no such node")
        self.report = Report(plan, outcomes, waited=wait)

    def interrupt(self) -> None:
        """Stop issuing and waiting now (Ctrl-C); `run` returns what came back."""
        self._interrupted = True
        self.report.interrupted = True
        self._wake.set()

    async def run(self) -> Report:
        """Issue every request (paced by `batch`), wait for the answers, return."""
        queue = deque(n for n, o in self.report.outcomes.items() if o.state == PENDING)
        async with anyio.create_task_group() as group:
            if self._wait or self._batch < len(queue):
                group.start_soon(self._follow)
            await self._drive(queue)
            group.cancel_scope.cancel()
        self._finish(queue)
        return self.report

    async def _drive(self, queue: deque[str]) -> None:
        while not self._interrupted:
            while queue and len(self._outstanding()) < self._batch and not self._interrupted:
                await self._ask(queue.popleft())
            self._on_progress(self.report)
            if not queue and (not self._wait or not self._outstanding()):
                return
            self._wake = anyio.Event()
            await self._expire()
            with anyio.move_on_after(self._next_deadline()):
                await self._wake.wait()
            await self._expire()

    def _outstanding(self) -> list[NodeOutcome]:
        return [o for o in self.report.outcomes.values() if o.state == REQUESTED]

    # -- asking ------------------------------------------------------------------------

    async def _ask(self, node: str) -> None:
        outcome = self.report.outcomes[node]
        outcome.state, outcome.asked_at = REQUESTED, self._clock()
        try:
            pending = await self._place(node)
        except NotFound:
            outcome.state, outcome.error = MISSING, "no such node"
        except KubeError as exc:
            outcome.state, outcome.error = FAILED, f"cannot write the request: {exc}"
        else:
            if pending:
                outcome.state, outcome.error = OCCUPIED, pending
        if outcome.state != REQUESTED:
            self._on_answer(outcome)

    async def _place(self, node: str) -> str:
        """Write our request on `node` unless another one waits there: "" when
        written, else that request in words. The merge patch carries the
        resourceVersion read, so a request written since is never overwritten: a
        conflict re-reads the node and looks again."""
        plan = self.report.plan
        for _ in range(WRITE_ATTEMPTS):
            current = self._latest[node]
            pending = _pending_request(current, self._keys)
            if pending:
                return pending
            patch = {"metadata": {"resourceVersion": resource_version_of(current),
                                  "annotations": {self._keys.run: plan.text,
                                                  self._keys.run_id: plan.request_id}}}
            try:
                await self._kube.merge_patch(NODES, node, patch)
                return ""
            except Conflict:
                self._latest[node] = view(Node, await self._kube.get(NODES, node))
        raise KubeError(f"the node changed under each of {WRITE_ATTEMPTS} attempts")

    # -- following the answers ---------------------------------------------------------

    async def _follow(self) -> None:
        """One watch over the target nodes: each event may carry an answer."""
        events = watch_forever(self._kube, NODES, label_selector=self._targets.label_selector,
                               field_selector=self._targets.field_selector)
        async for event in events:
            node = view(Node, event.object)
            outcome = self.report.outcomes.get(name_of(node))
            if outcome is not None and event.type != DELETED:
                self._latest[outcome.node] = node  # a fresh resourceVersion to ask on
            if outcome is None or outcome.state != REQUESTED:
                continue
            if event.type == DELETED:
                outcome.state, outcome.error = FAILED, "the node was deleted"
            else:
                self._observe(outcome, node)
            if outcome.state != REQUESTED:
                self._on_answer(outcome)
                self._wake.set()

    def _observe(self, outcome: NodeOutcome, node: Node) -> None:
        answer = read_last_run(node, self._keys)
        if not isinstance(answer, LastRun) or answer.id != self.report.plan.request_id:
            return
        outcome.state = ANSWERED
        outcome.accepted = answer.accepted
        outcome.error = answer.error
        outcome.after = answer.verdict or None
        outcome.checks = dict(answer.checks)
        outcome.reasons = dict(answer.reasons)
        outcome.duration_s = (answer.duration_s if answer.duration_s is not None
                              else _span_s(answer.start, answer.end))
        if outcome.asked_at is not None:
            outcome.waited_s = self._clock() - outcome.asked_at

    # -- timeouts and the end ----------------------------------------------------------

    def _next_deadline(self) -> float:
        asked = [o.asked_at for o in self._outstanding() if o.asked_at is not None]
        if not asked:
            return self._timeout_s
        return max(0.0, min(asked) + self._timeout_s - self._clock())

    async def _expire(self) -> None:
        now = self._clock()
        for outcome in self._outstanding():
            if outcome.asked_at is not None and now - outcome.asked_at >= self._timeout_s:
                outcome.state = NO_ANSWER
                withdrawn = await self._withdraw(outcome.node)
                outcome.error = (f"no agent answered within {_human(self._timeout_s)}"
                                 f"{self._why_silent(outcome.node)} ({withdrawn})")
                self._on_answer(outcome)

    def _why_silent(self, node: str) -> str:
        """What the node shows about why its agent did not answer, if anything."""
        if node in self._agentless:
            return "; no agent pod runs there"
        if _verdict(self._latest[node], self._keys) == Verdict.TESTING.value:
            return ("; the node is TESTING: its agent is busy with a deep diagnostic and "
                    "takes one request at a time")
        return ""

    async def _withdraw(self, node: str) -> str:
        """Remove our request if it is still there untaken (a `test` on our text and
        id: a request someone wrote since is left alone); what happened, in words."""
        plan = self.report.plan
        request = Request(plan.request_id, plan.text, "run", annotation=self._keys.run,
                          explicit_id=True)
        try:
            await self._kube.json_patch(NODES, node, take_ops(request, self._keys))
        except NotFound:
            return "the node is gone"
        except Invalid:  # not ours any more: taken, or replaced by someone else's
            return await self._not_withdrawn(node)
        except KubeError as exc:
            log.warning("could not withdraw the request on %s: %s", node, exc)
            return f"could not withdraw the request, it may still run: {exc}"
        return "request withdrawn"

    async def _not_withdrawn(self, node: str) -> str:
        try:
            current = view(Node, await self._kube.get(NODES, node))
        except KubeError:
            current = self._latest[node]
        now = annotations_of(current)
        ours = (self.report.plan.text, self.report.plan.request_id)
        if self._keys.run in now and (now[self._keys.run], now.get(self._keys.run_id)) != ours:
            return "another request replaced it before the agent took it: left in place"
        return "the request was taken: its answer may still come"

    def _finish(self, queue: deque[str]) -> None:
        for outcome in self._outstanding():
            outcome.state = INTERRUPTED if self._interrupted else outcome.state
            if self._interrupted:
                outcome.error = "asked; stopped before its answer came"
        for node in queue:
            outcome = self.report.outcomes[node]
            outcome.state, outcome.error = NOT_ASKED, "not asked: stopped before its turn"
        self._on_progress(self.report)


def _verdict(node: Node, keys: Keys) -> str | None:
    return labels_of(node).get(keys.gpuhealth) or None


def _pending_request(node: Node, keys: Keys) -> str:
    """The request waiting on `node` for its agent, in words ("" when none)."""
    annotations = annotations_of(node)
    if keys.run not in annotations:
        return ""
    given = annotations.get(keys.run_id)
    return (f"another request is pending: {keys.run}={annotations[keys.run]!r}"
            + (f" ({given})" if given else "")
            + ", not yet taken by the node's agent (busy with an earlier one?); not "
            f"overwritten: wait for its answer in {keys.last_run}, then ask again")


def _span_s(start: str, end: str) -> float | None:
    try:
        return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    except ValueError:
        return None


def _human(seconds: float) -> str:
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"
