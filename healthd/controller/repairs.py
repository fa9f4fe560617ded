"""Repairs, executed: the controller's part after the AppWrapper reset (only with
`controller.repair.enabled`).

`RepairReactor` follows the caches (`handle`: a node or one of its GPU pods changed)
and its own watch of the GPU-reset Jobs, and for each GPU node it looks at, does the
one step the node's `repair` annotation and the decision (healthd.repair.decision)
call for. The annotation is the state: the controller is its only writer, every
write is a JSON patch whose `test` guards the value read (a second leader or a stale
cache gets a refusal, never a double step), and a new leader carries on from it.

    idle/waiting/held  decide: reset GPUs, request a reboot, wait, hold, inspection
    resetting          the GPU-reset Job (healthd.controller.reset_job) is created,
                       again under the same name by a new leader; when it succeeds
                       -> validating; when it fails (or its deadline passes) the
                       attempt failed
    validating         `healthd.io/clear=true` and `healthd.io/run` (the validation
                       set, run id `repair-<attempt>`) were written with the state;
                       the agent's `last-run` answer under that id passes or fails
                       the attempt; no answer within `validation_timeout` fails it
    reboot-requested   the reboot request (healthd.controller.reboot_request, from
                       the configured template) is created, again by a new leader;
                       when the Node's `status.nodeInfo.bootID` differs from the
                       one recorded, the request is deleted -> validating; no new
                       boot id within `reboot_timeout`: the request is deleted, the
                       attempt timed out -> hardware-inspection
    hardware-inspection  sticky: nothing more until an admin's clear
                       (`healthd.io/clear=true`) is answered by the node's agent;
                       then idle, history kept

With `validate_new_nodes`, a new GPU node (no repair annotation, no verdict but one
that awaits this; healthd.published.awaits_validation) goes to validating (run id
`new-node`, no clear) before anything else.

The annotation is written first, the Job (or the reboot request) created second: a
leader killed in between leaves `resetting` with the Job's name (`reboot-requested`
with the request's), and the next one creates it (an AlreadyExists of our own is
fine; a request someone else created means someone else remediates the node). Every
state change posts one Event on the Node; a state that does not change is not written
(zero writes in steady state). A running GPU
pod is known from the AppWrapper pods cache; any other pod holding a GPU keeps the
Job unscheduled (it requests every GPU of the node) until its deadline fails it.

In dry run nothing is written: each decision is logged and counted once per change.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import anyio
import anyio.abc

from healthd.capacity.health import gpu_count
from healthd.config import Config
from healthd.config.controller import RemediationTemplate
from healthd.controller.caches import NODES_KIND, PODS_KIND, Caches
from healthd.controller.evictions import Worklist
from healthd.controller.metrics import ControllerMetrics
from healthd.controller.reboot_request import (
    ours,
    request_body,
    request_name,
    request_resource,
    someone_elses,
    template_resource,
    template_spec,
)
from healthd.controller.repair_state import (
    HELD,
    IDLE,
    INSPECTION,
    NEW_NODE_RUN_ID,
    REBOOT_REQUESTED,
    REFUSED_RECORD,
    RESETTING,
    VALIDATING,
    WAITING,
    NodeRepair,
    admin_cleared,
    finished,
    first_since,
    node_repair,
    operand_labels,
    operands_to_pause,
    rebooted,
    refused,
    refused_because,
    repair_ops,
    repaired,
    requested_reboot,
    situation,
    started_reset,
    timed_out,
    validating,
    validation_passed,
    validation_set,
    with_state,
)
from healthd.controller.reset_job import (
    SAID_CHARS,
    failure_of,
    job_name,
    job_outcome,
    reset_job,
)
from healthd.controller.resets import counts, owner_of
from healthd.kube.client import Kube
from healthd.kube.conventions import Keys
from healthd.kube.errors import Conflict, Invalid, KubeError, NotFound
from healthd.kube.events import EventRecorder
from healthd.kube.objects import (
    JOBS,
    NODES,
    PODS,
    annotations_of,
    container_statuses_of,
    items_of,
    name_of,
    namespace_of,
    node_name_of,
    phase_of,
)
from healthd.kube.shapes import KubeObject, Node, Pod, part, view
from healthd.kube.watching import DELETED, watch_forever
from healthd.published import REBOOT_NEEDED, Repair, read_repair
from healthd.repair.decision import Decision, Policy, Step, decide
from healthd.repair.report import ResetReport, reset_report
from healthd.util.times import parse_time, rfc3339

log = logging.getLogger(__name__)

SETTLE_S = 0.1  # a burst of node events is looked at once
RETRY_S = 5.0  # a step the API refused for a reason other than a conflict is retried
OTHER_PODS_S = 60.0  # a node whose GPUs pods we do not watch hold is looked at again
JOB_START_S = 5.0  # from the recorded attempt to its Job's creation (a margin)
HELD_RETRY_S = 30.0  # a reboot that cannot be requested (template, someone else's) is retried
RESET_MARGIN_S = 60.0  # beyond letting go and the Job's deadline, before `resetting` ends
ENDED_PHASES = frozenset({"Succeeded", "Failed"})  # a pod in them holds nothing
REBOOT_NOT_CONFIGURED = f"{REBOOT_NEEDED}: no reboot hand-off configured " \
    "(controller.repair.reboot)"
ACTIONS = {Step.RESET_GPUS: "reset", Step.REBOOT: "reboot", Step.WAIT: "wait",
           Step.HELD: "held", Step.HARDWARE_INSPECTION: "hardware-inspection",
           Step.NOTHING: "nothing"}


class RepairReactor:
    """Turns node changes into repair steps; see the module docstring."""

    def __init__(self, kube: Kube, caches: Caches, events: EventRecorder, *, config: Config,
                 metrics: ControllerMetrics, breaker_open: Callable[[], bool],
                 clock: Callable[[], float] = time.time) -> None:
        self._kube, self._caches, self._events = kube, caches, events
        self._config = config
        self._settings = config.controller
        self._repair = config.controller.repair
        self._policy = Policy.from_settings(self._repair)
        self._keys = Keys(config.label_prefix, config.own_prefix)
        self._metrics, self._breaker_open, self._clock = metrics, breaker_open, clock
        self._work = Worklist()
        self.jobs: dict[str, dict[str, Any]] = {}  # GPU-reset Job name -> as last seen
        self._ensured: set[str] = set()  # Jobs created (or found) this term
        self._jobs_listed = anyio.Event()  # `jobs` holds every GPU-reset Job there is
        self._requested: set[str] = set()  # nodes whose reboot request exists, this term
        self._refused: dict[str, str] = {}  # node -> why its request's create was refused
        self._fault_since: dict[str, float] = {}  # node -> its repaired findings' start
        self._told: dict[str, tuple[str, str]] = {}  # dry run: the decision last logged
        self._inspection: set[str] = set()  # nodes in hardware inspection
        self._timers: dict[str, float] = {}
        self._node_pods: dict[str, dict[str, Pod]] = {}  # node -> its pods, while released
        self._pod_watches: dict[str, anyio.CancelScope] = {}
        self._group: anyio.abc.TaskGroup | None = None

    # -- following the caches ------------------------------------------------------

    def handle(self, kind: str, old: KubeObject | None, new: KubeObject | None) -> None:
        """The caches' change callback (quick, never blocks)."""
        if kind == NODES_KIND:
            name = name_of(new or old or {})
            self._count_inspection(name, None if new is None else view(Node, new))
            self._work.mark(name)
        elif kind == PODS_KIND and (node := node_name_of(view(Pod, new or old))):
            self._work.mark(node)

    def _count_inspection(self, name: str, node: Node | None) -> None:
        """The repair-state gauges, from the node as it arrives."""
        repair = read_repair(node, self._keys) if node is not None else None
        state = repair.state if isinstance(repair, Repair) else ""
        (self._inspection.add if state == INSPECTION else self._inspection.discard)(name)
        self._metrics.set_in_inspection(len(self._inspection))
        since = parse_time(repair.since) if isinstance(repair, Repair) else None
        self._metrics.set_repair_state(name, state, since)

    # -- the loop ------------------------------------------------------------------

    async def run(self) -> None:
        """Wait for the nodes and pods, then repair until cancelled."""
        await self._caches.wait_synced((NODES_KIND, PODS_KIND))
        async with anyio.create_task_group() as group:
            self._group = group
            group.start_soon(self._watch_jobs)
            for name in list(self._caches.nodes.keys()):
                self._work.mark(name)
            while True:
                for name in await self._work.take(SETTLE_S):
                    try:
                        await self._evaluate(name)
                    except KubeError as exc:
                        log.warning("repair of node %s: %s; retrying in %g s", name, exc,
                                    RETRY_S, extra={"node": name})
                        self._later(name, RETRY_S)
                    except Exception:  # one node's odd object must not stop the others
                        log.exception("repair of node %s failed", name, extra={"node": name})

    async def _watch_jobs(self) -> None:
        async for event in watch_forever(self._kube, JOBS, self._repair.namespace,
                                         label_selector=f"{self._keys.gpu_reset}=true",
                                         listed=self._jobs_listed.set):
            job = event.object
            if event.type == DELETED:
                self.jobs.pop(name_of(job), None)
            else:
                self.jobs[name_of(job)] = job
            if node := annotations_of(job).get(self._keys.node_name):
                self._work.mark(node)

    def _later(self, name: str, delay_s: float) -> None:
        """Look at node `name` again in `delay_s`; one timer per node."""
        due = anyio.current_time() + max(0.0, delay_s)
        if self._group is None or self._timers.get(name, math.inf) <= due:
            return
        self._timers[name] = due

        async def fire() -> None:
            await anyio.sleep_until(due)
            if self._timers.get(name) == due:
                del self._timers[name]
                self._work.mark(name)

        self._group.start_soon(fire)

    # -- one node ------------------------------------------------------------------

    async def _evaluate(self, name: str) -> None:
        node = self._caches.nodes.get(name)
        if node is None or gpu_count(node, self._settings.gpu_resource,
                                     self._settings.capacity_source) <= 0:
            return
        current = node_repair(node, self._keys)
        now = self._clock()
        if current.state != RESETTING:
            self._stop_following_pods(name)
        problem = refused_because(current, namespace=self._repair.namespace, now=now)
        if problem:
            await self._refuse(current, problem, now)
        elif self._settings.dry_run:
            self._tell(name, self._decide(node, current, now))
        elif current.state == RESETTING:
            await self._follow_reset(node, current, now)
        elif current.state == VALIDATING:
            await self._follow_validation(current, now)
        elif current.state == REBOOT_REQUESTED:
            await self._follow_reboot(current, now)
        elif current.new and self._repair.validate_new_nodes and not current.held:
            await self._validate(current, validating(current.repair, now, NEW_NODE_RUN_ID),
                                 ("Normal", "NodeValidating", "a new node"))
        elif current.state == INSPECTION and admin_cleared(current):
            await self._write(current, with_state(current.repair, IDLE, "cleared by an admin",
                                                  now),
                              event=("Normal", "HardwareInspectionCleared",
                                     "an admin cleared the node: repairs may resume"))
        else:
            await self._step(node, current, self._decide(node, current, now), now)

    async def _refuse(self, current: NodeRepair, why: str, now: float) -> None:
        """A record the controller did not write is never acted on: said (log, Event,
        metric) and replaced by an idle one, its operands left as they are."""
        log.warning("node %s: %s: %s", current.name, REFUSED_RECORD, why,
                    extra={"node": current.name})
        if self._settings.dry_run:
            self._tell(current.name, Decision(Step.HELD, f"{REFUSED_RECORD}: {why}"))
            return
        if await self._write(current, refused(current.repair, why, now), restore=False,
                             event=("Warning", "RepairRecordRefused",
                                    f"{REFUSED_RECORD}: {why}")):
            self._metrics.count_refused_record()

    def _decide(self, node: Node, current: NodeRepair, now: float) -> Decision:
        pods = sum(counts(p, self._settings.gpu_resource)
                   for p in self._caches.pods_on_node(current.name))
        return decide(situation(current, now=now, pods_on_gpus=pods,
                                breaker_open=self._breaker_open()), self._policy)

    def _tell(self, name: str, decision: Decision) -> None:
        """Dry run: log and count a decision once per change."""
        said = (decision.step.value, decision.reason)
        if self._told.get(name) == said:
            return
        self._told[name] = said
        if decision.step is not Step.NOTHING:
            log.info("dry run: node %s: would %s: %s", name, decision.step.value,
                     decision.reason, extra={"node": name})
            self._metrics.count_repair(ACTIONS[decision.step], "dry-run")

    async def _step(self, node: Node, current: NodeRepair, decision: Decision,
                    now: float) -> None:
        step, why = decision.step, decision.reason
        if step in (Step.RESET_GPUS, Step.REBOOT) and (
                others := await self._other_gpu_pods(current.name)):
            # The caches hold AppWrapper pods only: any other pod on the GPUs is found
            # by one read before acting, and is waited for as an AppWrapper's would be.
            step, why = Step.WAIT, (f"{len(others)} running pod(s) not from an AppWrapper "
                                    f"hold the node's GPUs: {', '.join(others[:3])}")
            self._later(current.name, OTHER_PODS_S)
        if step is Step.RESET_GPUS:
            await self._start_reset(node, current, decision, now)
        elif step is Step.REBOOT:
            await self.request_reboot(current, decision, now)
        elif step is Step.WAIT:
            await self._settle(current, WAITING, why, now, ("Normal", "RepairWaiting"), step)
            if decision.retry_at is not None:  # a pause: decide again once it is over
                self._later(current.name, decision.retry_at - now)
        elif step is Step.HELD:
            await self._settle(current, HELD, why, now, ("Normal", "RepairHeld"), step)
        elif step is Step.HARDWARE_INSPECTION:
            await self._settle(current, INSPECTION, why, now,
                               ("Warning", "HardwareInspection"), step)
        elif current.state != IDLE:
            await self._write(current, with_state(current.repair, IDLE, why, now))

    async def _other_gpu_pods(self, node: str) -> list[str]:
        """`ns/name` of the running pods on `node` that hold a GPU and were not made by
        an AppWrapper (those the caches already count)."""
        listing = await self._kube.list(PODS, field_selector=f"spec.nodeName={node}")
        return sorted(f"{namespace_of(p)}/{name_of(p)}" for p in items_of(listing, Pod)
                      if counts(p, self._settings.gpu_resource) and owner_of(p) is None)

    async def request_reboot(self, current: NodeRepair, decision: Decision,
                             now: float) -> None:
        """Hand the reboot to the cluster's remediation: read the template, record the
        attempt (with the boot id to change from), then create the request. Without
        a template, or with one that cannot be used, the node is held, saying so."""
        ref = self._repair.reboot
        if ref is None:
            await self._settle(current, HELD, f"{REBOOT_NOT_CONFIGURED} ({decision.reason})",
                               now, ("Warning", "RebootNeeded"), Step.REBOOT)
            return
        problem = await self._reboot_problem(ref, current.name)
        if problem:
            await self._settle(current, HELD, f"{REBOOT_NEEDED}: {problem}", now,
                               ("Warning", "RebootRequestFailed"), Step.HELD)
            self._later(current.name, HELD_RETRY_S)
            return
        request = request_name(ref, current.name)
        new = requested_reboot(current.repair, request=request, boot_id=current.boot_id,
                               reason=decision.reason, now=now,
                               held=repaired(current.held, self._policy))
        attempt = len(new.attempts)
        message = f"requested a reboot ({request}, attempt {attempt}): {decision.reason}"
        if not await self._write(current, new, event=("Normal", "RebootRequested", message)):
            return
        self._started(current, "reboot")
        try:
            await self._ensure_request(current)
        except ForeignRequest:  # created meanwhile by someone else: the next pass says so
            self._work.mark(current.name)
        self._later(current.name, self._repair.reboot_timeout)

    async def _reboot_problem(self, ref: RemediationTemplate, node: str) -> str:
        """Why no reboot can be requested for `node` now ("" when one can): the
        template unreadable or unusable, or someone else's request for the node."""
        template_ref = f"{ref.kind} {ref.namespace}/{ref.name}"
        try:
            template = await self._kube.get(template_resource(ref), ref.name, ref.namespace)
        except KubeError as exc:
            return f"the remediation template {template_ref} cannot be read: {exc}"
        if template_spec(template) is None:
            return f"the remediation template {template_ref} has no spec.template.spec"
        try:
            existing = await self._kube.get(request_resource(ref), node, ref.namespace)
        except NotFound:
            return ""
        except KubeError as exc:
            return f"{request_name(ref, node)} cannot be read: {exc}"
        return "" if ours(existing, node, self._keys.node_name) else someone_elses(ref, node)

    async def _ensure_request(self, current: NodeRepair) -> None:
        """Create the node's reboot request unless this term did; one of ours that
        exists is it. KubeError (the API refused): said once, retried by the loop."""
        ref, node = self._repair.reboot, current.name
        if ref is None or node in self._requested:
            return
        try:
            template = await self._kube.get(template_resource(ref), ref.name, ref.namespace)
            body = request_body(ref, template, node, self._keys.node_name)
            await self._kube.create(request_resource(ref), body, ref.namespace)
        except Conflict:  # AlreadyExists: ours from an earlier leader, or someone else's
            existing = await self._kube.get(request_resource(ref), node, ref.namespace)
            if not ours(existing, node, self._keys.node_name):
                raise ForeignRequest(someone_elses(ref, node)) from None
        except KubeError as exc:
            await self._say_refused(current, f"{request_name(ref, node)} could not be "
                                    f"created: {exc}; retrying")
            raise
        self._requested.add(node)
        self._refused.pop(node, None)

    async def _say_refused(self, current: NodeRepair, why: str) -> None:
        """A Warning Event when the request's create is refused, once per reason."""
        if self._refused.get(current.name) == why:
            return
        self._refused[current.name] = why
        log.warning("node %s: %s", current.name, why, extra={"node": current.name})
        await self._events.record(_node_ref(current), type="Warning",
                                  reason="RebootRequestFailed", message=why)

    async def _withdraw_request(self, node: str) -> None:
        """Delete the node's reboot request (the remediator keeps a node fenced while
        its request exists); one already gone is fine."""
        ref = self._repair.reboot
        self._requested.discard(node)
        self._refused.pop(node, None)
        if ref is None:
            return
        with contextlib.suppress(NotFound):
            await self._kube.delete(request_resource(ref), node, ref.namespace)

    async def _follow_reboot(self, current: NodeRepair, now: float) -> None:
        repair = current.repair
        if rebooted(current):
            await self._withdraw_request(current.name)
            await self._validate(current, validating(repair, now), (
                "Normal", "RebootDone", f"the node rebooted (boot id {current.boot_id})"))
            return
        left = (parse_time(repair.since) or now) + self._repair.reboot_timeout - now
        if left > 0:
            try:
                await self._ensure_request(current)
            except ForeignRequest as exc:  # ours never got made: held, the attempt failed
                why = f"{REBOOT_NEEDED}: {exc}"
                await self._write(current, replace(finished(repair, "failed", why, now),
                                                   state=HELD),
                                  event=("Warning", "RebootRequestFailed", why))
                return
            self._later(current.name, left)
            return
        await self._withdraw_request(current.name)
        why = (f"the node did not reboot within {self._repair.reboot_timeout:g} s of "
               f"{repair.request or 'the request'}: hardware inspection")
        if await self._write(current, timed_out(repair, why, now),
                             event=("Warning", "RebootTimedOut", why)):
            self._metrics.count_repair("reboot", "timed-out")

    async def _settle(self, current: NodeRepair, state: str, reason: str, now: float,
                      event: tuple[str, str], step: Step) -> None:
        """Enter `state` unless the node is in it already for the same reason (or at
        all, for hardware inspection: its reason is the one it was entered for)."""
        if current.state == state and (current.repair.reason == reason or state == INSPECTION):
            return
        message = f"{state}: {reason}"
        if await self._write(current, with_state(current.repair, state, reason, now),
                             event=(*event, message)):
            self._metrics.count_repair(ACTIONS[step], "started")

    def _started(self, current: NodeRepair, remedy: str) -> None:
        """A repair attempt recorded: count it, and remember when its findings began
        (the fault-to-PASS histogram's start)."""
        since = first_since(repaired(current.held, self._policy))
        if since is not None:
            self._fault_since[current.name] = since
        self._metrics.count_repair(remedy, "started")

    # -- a GPU reset ---------------------------------------------------------------

    async def _start_reset(self, node: Node, current: NodeRepair, decision: Decision,
                           now: float) -> None:
        """Record the attempt and pause the GPU Operator's operands in one write; the
        Job follows once everything has let go of the GPUs (`_follow_reset`)."""
        attempt = len(current.repair.attempts) + 1
        job = job_name(current.name, attempt)
        operands = operands_to_pause(current.labels, self._repair.gpu_operator)
        new = started_reset(current.repair, job=f"{self._repair.namespace}/{job}",
                            gpus=decision.gpus, reason=decision.reason, now=now,
                            held=repaired(current.held, self._policy), operands=operands)
        paused = f"; pausing {', '.join(sorted(operands))}" if operands else ""
        message = (f"resetting {', '.join(decision.gpus)} (attempt {attempt}, Job "
                   f"{new.job}){paused}: {decision.reason}")
        if not await self._write(current, new, event=("Normal", "GPUReset", message)):
            return
        self._started(current, "reset")
        self._later(current.name, self._reset_bound())

    def _reset_bound(self) -> float:
        """How long `resetting` may last, whatever the Job says: letting go, then the
        Job's own deadline, and a margin."""
        return self._repair.release_timeout + self._repair.reset_deadline + RESET_MARGIN_S

    async def _ensure_job(self, node: Node, repair: Repair, attempt: int) -> None:
        """Create the attempt's Job unless this term did; one that exists is it."""
        name = job_name(name_of(node), attempt)
        if name in self._ensured or name in self.jobs:
            return
        count = int(gpu_count(node, self._settings.gpu_resource, self._settings.capacity_source))
        body = reset_job(name_of(node), attempt, repair.gpus, count, self._config)
        with contextlib.suppress(Conflict):  # AlreadyExists: an earlier leader created it
            await self._kube.create(JOBS, body)
        self._ensured.add(name)

    async def _follow_reset(self, node: Node, current: NodeRepair, now: float) -> None:
        repair = current.repair
        attempt = len(repair.attempts)
        if repair.started and self._job_gone(current, attempt, now):
            # It ended long ago and the cluster removed it (its TTL) while no leader
            # watched: its outcome is lost, and a second Job would reset the GPUs twice.
            # The validation says whether the reset worked.
            await self._validate(current, validating(repair, now), (
                "Normal", "RepairValidating", "the GPU-reset Job ended and was removed"))
            return
        since = parse_time(repair.since) or now
        if now - since > self._reset_bound():
            await self._end_reset(current, "timed-out", f"the GPU reset {repair.job} did not "
                                  f"end within {self._reset_bound():g} s", now)
            return
        if not repair.started:
            await self._release(node, current, now)
            return
        await self._ensure_job(node, repair, attempt)
        job = self.jobs.get(job_name(current.name, attempt))
        outcome = job_outcome(job) if job is not None else ""
        if outcome == "failed" and job is not None:
            report = await self._reset_report(job)
            if report is not None and report.refused:
                await self._end_reset(current, "refused", f"the GPU-reset Job {repair.job} "
                                      f"reset nothing: {report.summary(SAID_CHARS)}", now)
            else:
                why = report.summary(SAID_CHARS) if report is not None else ""
                why = why or failure_of(job)
                await self._finish(current, "failed",
                                   f"the GPU-reset Job {repair.job} failed: {why}", now)
        elif outcome == "succeeded":
            await self._validate(current, validating(repair, now),
                                 ("Normal", "RepairValidating", "GPU reset done"))

    async def _release(self, node: Node, current: NodeRepair, now: float) -> None:
        """Before the Job: wait until the node's agent has ended its NVML session for
        this attempt and the paused operands' pods have left the node (a real reset
        refuses a GPU they hold); then record the Job's start and create it. Whatever
        has not let go within `release_timeout` refuses the attempt, named."""
        repair = current.repair
        holding = self._still_holding(current)
        if holding:
            waited = now - (parse_time(repair.since) or now)
            if waited < self._repair.release_timeout:
                if repair.operands:
                    self._follow_pods(current.name)
                self._later(current.name, self._repair.release_timeout - waited)
                return
            self._stop_following_pods(current.name)
            await self._end_reset(current, "refused", "nothing was reset: "
                                  f"{'; '.join(holding)} did not let go of the GPUs within "
                                  f"{self._repair.release_timeout:g} s", now)
            return
        if repair.operands and self._following_pods(current.name) is None:
            self._follow_pods(current.name)  # a new term: read the node's pods first
            return
        self._stop_following_pods(current.name)
        if await self._write(current, replace(repair, started=rfc3339(now))):
            await self._ensure_job(node, repair, len(repair.attempts))

    def _still_holding(self, current: NodeRepair) -> list[str]:
        """What still holds the node's GPUs before its reset, for a person."""
        holding = []
        if current.released != current.repair.job:
            holding.append("the node's healthd agent (its NVML session)")
        pods = self._following_pods(current.name) or {}
        paused = set(current.repair.operands)
        for pod in pods.values():
            selector = part(part(pod.get("spec")).get("nodeSelector"))
            if paused.intersection(selector) and phase_of(pod) not in ENDED_PHASES:
                holding.append(f"pod {namespace_of(pod)}/{name_of(pod)}")
        return holding

    async def _end_reset(self, current: NodeRepair, outcome: str, why: str,
                         now: float) -> None:
        """An attempt that reset nothing it could vouch for: refused (not spent from the
        budget) or timed out; its Job, if any, is withdrawn."""
        name = job_name(current.name, len(current.repair.attempts))
        self._stop_following_pods(current.name)
        if name in self.jobs or name in self._ensured:
            with contextlib.suppress(NotFound):
                await self._kube.delete(JOBS, name, self._repair.namespace)
        event = ("Warning", "GPUResetRefused" if outcome == "refused" else "GPUResetTimedOut",
                 why)
        if await self._write(current, finished(current.repair, outcome, why, now),
                             event=event):
            self._metrics.count_repair("reset", outcome)
            self._work.mark(current.name)  # the pause after it

    # -- the node's pods while its GPUs are let go of --------------------------------

    def _following_pods(self, node: str) -> dict[str, Pod] | None:
        """The node's pods as the watch `_follow_pods` started has them; None until
        that watch has listed them."""
        return self._node_pods.get(node)

    def _follow_pods(self, node: str) -> None:
        """Watch the pods bound to `node` (until `_stop_following_pods`): a paused
        operand's pod leaving wakes the node's repair. One watch per node being
        reset, for minutes: the caches hold AppWrapper pods only."""
        if node in self._pod_watches or self._group is None:
            return
        scope = anyio.CancelScope()
        self._pod_watches[node] = scope

        async def follow() -> None:
            pods: dict[str, Pod] = {}
            with scope:
                async for event in watch_forever(
                        self._kube, PODS, field_selector=f"spec.nodeName={node}",
                        listed=lambda: self._listed_pods(node, pods)):
                    key = f"{namespace_of(event.object)}/{name_of(event.object)}"
                    if event.type == DELETED:
                        pods.pop(key, None)
                    else:
                        pods[key] = view(Pod, event.object)
                    if node in self._node_pods:
                        self._work.mark(node)

        self._group.start_soon(follow)

    def _listed_pods(self, node: str, pods: dict[str, Pod]) -> None:
        self._node_pods[node] = pods
        self._work.mark(node)

    def _stop_following_pods(self, node: str) -> None:
        scope = self._pod_watches.pop(node, None)
        if scope is not None:
            scope.cancel()
        self._node_pods.pop(node, None)

    def _job_gone(self, current: NodeRepair, attempt: int, now: float) -> bool:
        """The attempt's Job is not there, and it can no longer be running: it was
        created longer ago than a Job may run (`reset_deadline`). (A Job a dead leader
        never created reads the same: the validation then fails the attempt, which is
        what it was.)"""
        name = job_name(current.name, attempt)
        if not self._jobs_listed.is_set() or name in self.jobs or name in self._ensured:
            return False
        started = parse_time(current.repair.started)
        return started is not None and now - started > self._repair.reset_deadline + JOB_START_S

    async def _validate(self, current: NodeRepair, new: Repair,
                        event: tuple[str, str, str]) -> None:
        """Enter `validating`: the validation set requested from the node's agent under
        `new.run_id`, with a clear of what a repair is for (none for a new node)."""
        checks = validation_set(self._config, new)
        extra = {self._keys.run: checks, self._keys.run_id: new.run_id}
        if new.run_id != NEW_NODE_RUN_ID:
            extra[self._keys.clear] = "true"
        if await self._write(current, new, extra=extra,
                             event=(event[0], event[1], f"{event[2]}; validating: {checks}")):
            self._later(current.name, self._repair.validation_timeout)

    async def _reset_report(self, job: dict[str, Any]) -> ResetReport | None:
        """What its pod's termination message says of each GPU (None: nothing
        readable)."""
        uid = job.get("metadata", {}).get("uid", "")
        try:
            listing = await self._kube.list(PODS, self._repair.namespace,
                                            label_selector=f"controller-uid={uid}")
        except KubeError:
            return None
        for pod in items_of(listing, Pod):
            for status in container_statuses_of(pod):
                message = part(part(status.get("state")).get("terminated")).get("message")
                if isinstance(message, str) and (report := reset_report(message)):
                    return report
        return None

    async def _follow_validation(self, current: NodeRepair, now: float) -> None:
        last, repair = current.last_run, current.repair
        if last is not None and last.id == repair.run_id:
            why = validation_passed(last, current.held, self._policy)
            await self._finish(current, "failed" if why else "passed",
                               why or f"validation passed: {last.request}", now)
            return
        started = parse_time(repair.since) or now
        left = started + self._repair.validation_timeout - now
        if left > 0:
            self._later(current.name, left)
            return
        await self._finish(current, "failed", "the node's agent did not answer the "
                           f"validation within {self._repair.validation_timeout:g} s", now)

    async def _finish(self, current: NodeRepair, outcome: str, why: str, now: float) -> None:
        attempts = current.repair.attempts
        remedy = attempts[-1].remedy if attempts and not attempts[-1].outcome else "validate"
        passed = outcome == "passed"
        event = ("Normal", "RepairSucceeded", why) if passed else (
            "Warning", "RepairFailed", why)
        if not await self._write(current, finished(current.repair, outcome, why, now),
                                 event=event):
            return
        self._metrics.count_repair(remedy, outcome)
        since = self._fault_since.pop(current.name, None)
        if passed and since is not None:
            self._metrics.observe_fault_to_pass(now - since)

    # -- writing ---------------------------------------------------------------------

    async def _write(self, current: NodeRepair, new: Repair, *,
                     extra: dict[str, str] | None = None,
                     event: tuple[str, str, str] | None = None,
                     restore: bool = True) -> bool:
        """Write `new` over the annotation as read; False when it changed meanwhile
        (the watch brings the new copy, which is looked at again)."""
        # The operands are paused with the record that remembers them and put back
        # with the record that forgets them: whatever ends an attempt restores them.
        # (`restore=False`: a refused record's operands are not ours to put back.)
        was, will = current.repair.operands if restore else {}, new.operands
        labels = operand_labels(will, current.labels, restore=False) if will and not was \
            else operand_labels(was, current.labels, restore=True) if was and not will else {}
        try:
            await self._kube.json_patch(NODES, current.name,
                                        repair_ops(current, new, self._keys, extra, labels))
        except (Invalid, Conflict, NotFound) as exc:
            log.info("node %s: repair annotation changed meanwhile (%s); looking again",
                     current.name, exc, extra={"node": current.name})
            return False
        log.info("node %s: repair %s -> %s: %s", current.name, current.state or "idle",
                 new.state or "idle", new.reason, extra={"node": current.name})
        if event is not None:
            await self._events.record(_node_ref(current), type=event[0],
                                      reason=event[1], message=event[2])
        return True


class ForeignRequest(Exception):
    """A reboot request for the node exists that healthd did not create."""


def _node_ref(node: NodeRepair) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.name,
                                                            "uid": node.uid}}
