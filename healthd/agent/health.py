"""The node's health, owned in one place: its verdict state, the policy that moves it,
and what the Node shows of it.

Every change goes through `NodeHealth`: a check's result, a deep run starting or
ending (TESTING), a clear. The pure verdict machine (healthd.agent.verdict) folds it
into the state, the metrics see the new state, and the publisher
(healthd.agent.node_status) gets the desired Node. Besides the state it keeps what
else the Node shows: the DCGM level labels deep runs leave, the answer to the
latest on-demand request (`last-run`), whether the clear in flight (`clearing`,
written with its take) stays, and the GPU-reset Job the agent let go of NVML for
(`nvml-released`, healthd.agent.nvml_release).

The parts that change the node's health (the runner's results, healthd.agent.deepruns,
healthd.agent.ondemand, the event runs) are handed this object directly.

A restart changes nothing on the Node. The verdict is shown only once the node is
judged: the agent has resumed what its Node showed (`resume`, at the first copy of the
Node) and every check due at start has ended its first turn (`first_round_done`), or
a holding that only a clear ends is held (no later result of the round can lower
it). Until then only the answer to an on-demand request (with the removal of the
clear it answers) and `nvml-released` are written (a GPU reset waits for the latter,
not for a judgement).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import anyio

from checks.base import CheckResult, Severity
from healthd.agent.metrics import AgentMetrics
from healthd.agent.node_status import DesiredNode, NodePublisher, desired_from
from healthd.agent.resume import resumed_from
from healthd.agent.verdict import (
    CheckState,
    HealthState,
    Policy,
    Trigger,
    apply,
    end_testing,
    initial,
    request_clear,
    resume,
    start_testing,
)
from healthd.config import Config
from healthd.kube.conventions import Keys, Verdict, dcgm_label_value
from healthd.published import REPAIR_TESTING, Repair

log = logging.getLogger(__name__)

LABEL_WAIT_S = 60.0  # fault-to-label: give up measuring after this long


AWAITING_VALIDATION = "awaiting the validation of a new node"


def validates_new_nodes(config: Config) -> bool:
    """Whether the controller validates a node it sees first before it may be PASS."""
    repair = config.controller.repair
    return repair.enabled and repair.validate_new_nodes and not config.controller.dry_run


def policy_of(config: Config) -> Policy:
    """The verdict policy the agent's settings and the finding catalog make."""
    settings = config.agent
    return Policy(recover_after=settings.recover_after, catalog=config.catalog(),
                  max_doublings=settings.flap_max_doublings,
                  flap_window=settings.flap_window, min_hold=settings.min_hold)


class NodeHealth:
    """The node's verdict state and policy, and its way to the Node (see the module
    docstring)."""

    def __init__(self, policy: Policy, publisher: NodePublisher, metrics: AgentMetrics, *,
                 keys: Keys, node: str, clock: Callable[[], float],
                 validates_new: bool = False) -> None:
        self.policy, self.publisher, self.metrics = policy, publisher, metrics
        self.keys, self.node, self.clock = keys, node, clock
        self.state: HealthState = initial(clock())
        self.last_run: str | None = None  # the answer to the latest on-demand request
        # The `clearing` annotation: None left as the Node shows it (nothing decided
        # yet), True kept (a clear in flight), False removed (answered).
        self.clearing: bool | None = None
        self.repair = ""  # what the controller's repair does now, while it holds TESTING
        self.repair_note = ""  # what the condition says of a repair that keeps the node out
        # The controller validates a node that has no repair record before it is PASS
        # (controller.repair.validate_new_nodes): TESTING until it has one.
        self.validates_new = validates_new
        self.dcgm_levels: dict[int, str | None] = {}  # level -> its label value
        self.nvml_released: str | None = None  # the reset Job NVML is let go for
        self._release_known = False  # decided since the start (until then: left alone)
        self._deep: dict[str, int | None] = {}  # deep runs in TESTING -> their DCGM level
        self.resumed = False  # what the Node showed has been taken back
        self._round_done = False  # every check due at start has ended its first turn
        self._shown: anyio.Event | None = None  # set once the verdict may be shown

    @property
    def verdict(self) -> Verdict:
        return self.state.verdict

    @property
    def showing(self) -> bool:
        """Whether the verdict may be shown: the node is judged (module docstring)."""
        return self.resumed and (self._round_done or any(h.needs_clear for h in self.state.held))

    def resume(self, node: Mapping[str, Any], known: Callable[[str], bool]) -> None:
        """Take back what `node` (the first copy of this agent's Node) shows; once.
        `known(key)`: whether this agent has check `key`."""
        if self.resumed:
            return
        taken = resumed_from(node, self.keys, known=known, at=self.clock())
        for note in taken.notes:
            log.warning("not resumed from the node: %s", note, extra={"node": self.node})
        self.resumed = True
        state = resume(self.state, taken.held, taken.checks, shown=taken.shown,
                       since=taken.since, at=self.clock(), testing=taken.testing)
        log.info("resumed from the node: label %s, %d holding(s)%s",
                 taken.shown.value if taken.shown else "none", len(taken.held),
                 "".join(f"; {h.code} on {h.entity} ({h.severity.value})" for h in taken.held),
                 extra={"node": self.node})
        self.set_state(state)

    def first_round_done(self) -> None:
        """Every check due at start has ended its first turn: the node is judged."""
        self._round_done = True
        self.publish()

    def record(self, key: str, result: CheckResult, trigger: Trigger) -> None:
        """Fold the result of check `key` into the state. The result of a deep run
        ends its TESTING in the same state (one write) and leaves its level's label."""
        at = self.clock()
        state = apply(self.state, key, result, trigger=trigger, at=at, policy=self.policy)
        if key in self._deep:
            self._label_level(self._deep[key], result, at)
            state = end_testing(state, key, at=at)
        self.metrics.observe_result(key, result)
        _log_result(key, result, trigger, self.state.checks.get(key))
        self.set_state(state)

    def start_testing(self, key: str, level: int | None) -> None:
        """A deep run of check `key` holds the GPUs: TESTING. `level`: the DCGM level
        whose label its result leaves, if any."""
        self._deep[key] = level
        self.set_state(start_testing(self.state, key, at=self.clock()))

    def end_testing(self, key: str) -> None:
        """The deep run of check `key` let the GPUs go, whatever happened to it."""
        self._deep.pop(key, None)
        self.set_state(end_testing(self.state, key, at=self.clock()))

    def observe_repair(self, repair: Repair | None, *, new: bool = False) -> None:
        """The controller's repair as the Node shows it: while it resets or validates
        the GPUs the node is TESTING (key REPAIR_TESTING), as during an exclusive
        diagnostic; held ERR and EVICT findings still win, as they do then. A `new`
        node (published.awaits_validation) awaits the validation of new nodes when
        the controller does one."""
        doing = repair.doing if repair is not None and repair.testing else ""
        if new and self.validates_new:
            doing = AWAITING_VALIDATION
        note = repair.note if repair is not None else ""
        if (doing, note) == (self.repair, self.repair_note):
            return
        if doing == self.repair:  # only what the condition says changed
            self.repair_note = note
            self.publish()
            return
        self.repair, self.repair_note = doing, note
        at = self.clock()
        self.set_state(start_testing(self.state, REPAIR_TESTING, at=at) if doing
                       else end_testing(self.state, REPAIR_TESTING, at=at))

    def observe_release(self, job: str | None) -> None:
        """The agent let go of NVML for GPU-reset Job `job` (None: it uses NVML
        again): written as `nvml-released`, judged or not."""
        self.nvml_released, self._release_known = job, True
        self.publish()

    def start_clear(self) -> list[str]:
        """Mark what holds the node for release; the check keys to re-run."""
        state, keys = request_clear(self.state, at=self.clock())
        self.set_state(state)
        return sorted(keys)

    def keep_clearing(self, keep: bool) -> None:
        """A clear is in flight (`keep`): the `clearing` annotation its take wrote stays
        until the answer; not: the next write removes it."""
        self.clearing = keep
        self.publish()

    async def answer(self, last_run: str, flush_s: float) -> None:
        """Publish `last-run` with the state, and the removal of the clear in flight in
        the same write; wait up to `flush_s` for it."""
        self.last_run = last_run
        if self.clearing:
            self.clearing = False
        self.publish()
        await self.publisher.flush(flush_s)

    async def label_shown(self, detected_at: float) -> None:
        """Measure the time from a fault detected at `detected_at` to the Node showing
        it: a fault found before the node is judged waits for its verdict to be shown
        (given up after LABEL_WAIT_S)."""
        with anyio.move_on_after(LABEL_WAIT_S):
            if not self.showing:
                self._shown = self._shown or anyio.Event()
                await self._shown.wait()
            if self.state.judged and await self.publisher.flush(LABEL_WAIT_S):
                self.metrics.observe_fault_to_label(self.clock() - detected_at)

    def set_state(self, state: HealthState) -> None:
        """Adopt a new state: metrics, and the desired Node to the publisher."""
        if state.verdict is not self.state.verdict:
            log.info("verdict %s -> %s", self.state.verdict.value, state.verdict.value,
                     extra={"verdict": state.verdict.value})
        self.state = state
        self.metrics.observe_state(state)
        self.publish()

    def publish(self) -> None:
        own = {**self._release_annotation(), **self._clearing_annotation()}
        if not self.showing:  # not judged yet: only an answer and the release may go out
            answer = {self.keys.last_run: self.last_run} if self.last_run is not None else {}
            if answer or own:
                self.publisher.want(DesiredNode(annotations={**answer, **own}), None)
            return
        if self._shown is not None:
            self._shown.set()
        desired = desired_from(self.state, self.keys, node=self.node,
                               dcgm_levels=self.dcgm_levels, last_run=self.last_run,
                               repair=self.repair, repair_note=self.repair_note)
        self.publisher.want(replace(desired, annotations={**desired.annotations, **own}),
                            self.state)

    def _release_annotation(self) -> dict[str, str | None]:
        """`nvml-released` (None removes it) once decided since the start; until then
        the Node keeps what it shows (a predecessor's release still holds)."""
        return {self.keys.nvml_released: self.nvml_released} if self._release_known else {}

    def _clearing_annotation(self) -> dict[str, str | None]:
        """`clearing` removed once the clear is answered; else left alone (the take
        writes it, and a predecessor's waits for this agent to carry it out)."""
        return {self.keys.clearing: None} if self.clearing is False else {}

    def _label_level(self, level: int | None, result: CheckResult, at: float) -> None:
        """A deep run of a labelled level that could tell leaves pass or fail, and when."""
        if level is not None and result.status.ordered:
            passed = result.status.rank < Severity.ERR.rank
            self.dcgm_levels[level] = dcgm_label_value(passed, at)


def _log_result(key: str, result: CheckResult, trigger: Trigger,
                before: CheckState | None) -> None:
    """A check's result in the log: at INFO when its status changed, else DEBUG."""
    changed = before is None or before.status is not result.status
    log.log(logging.INFO if changed else logging.DEBUG, "%s: %s%s", key,
            result.status.value, f" ({result.reason})" if result.reason else "",
            extra={"trigger": trigger.value, "duration_s": round(result.duration_s, 3)})
