"""The agent's orchestrator: wires the config to the runner, the verdict, the Node and
the metrics, and runs every activity of `healthd agent` until stopped.

Activities (tasks of one task group, all children of `Agent.run`):

- the schedule (healthd.agent.schedule): periodic rounds through the runner;
- the node watch (healthd.agent.node_watch): feeds the publisher what the Node
  shows, the GPU capacity, and on-demand requests (healthd.agent.ondemand);
- the XID consumer: every XID event NVML delivers triggers a run of the `xid` check
  at once (trigger `event`), so a fault reaches the label in seconds;
- the SXID watch: an SXID line in the kernel log triggers a run of the `sxid` check
  at once (NVML has no event for NVSwitch errors);
- the publisher loop (healthd.agent.node_status), the peer watch (ping's peers) and
  a small loop that reports the publisher's health to the metrics.

Every result goes through `_on_result`: the pure verdict machine folds it into the
state, the metrics record it, and the publisher gets the new desired Node. Exclusive
checks run as Jobs through healthd.agent.deepruns, only when no pod holds the node's
GPUs; the node shows TESTING meanwhile and leaves it whatever happens. /readyz comes
from the schedule's progress (healthd.agent.readiness).

`stop()` is the graceful end (SIGTERM): cancel the checks (their subprocesses die
with them), give the publisher `shutdown_flush_s` to write the last state, return.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
from prometheus_client import CollectorRegistry

from checks.base import Attachment, CheckResult, Severity
from checks.kernel_log import KernelLog, LogUnavailable
from checks.probes import Probes
from checks.snapshot import NvmlGpuSource, XidEvent
from healthd.agent.deepdiag import DeepDiagnostic
from healthd.agent.deepruns import DeepRuns, deep_job_env
from healthd.agent.metrics import AgentMetrics, read_cpu_model
from healthd.agent.node_status import NodePublisher, desired_from
from healthd.agent.node_watch import NodeWatch
from healthd.agent.ondemand import RequestHandler
from healthd.agent.peers import PeerWatcher
from healthd.agent.readiness import Readiness
from healthd.agent.runner import RoundInputs, Runner
from healthd.agent.schedule import Job, Schedule, plan_jobs
from healthd.agent.verdict import (
    HealthState,
    Policy,
    Trigger,
    apply,
    end_testing,
    initial,
    request_clear,
)
from healthd.agent.verdict import start_testing as testing_started
from healthd.capacity.health import gpu_count
from healthd.config import Config
from healthd.http import serve_http
from healthd.kube.client import Kube
from healthd.kube.conventions import (
    COMPONENT,
    GPU_RESOURCE,
    Keys,
    Reason,
    Verdict,
)
from healthd.kube.events import WARNING, EventRecorder
from healthd.kube.pods import gpu_pods
from healthd.kube.pvc_probe import KubeProbeApi
from healthd.plans import Planned, planned_check
from healthd.requests import Request, take

log = logging.getLogger(__name__)

PUBLISHER_REPORT_S = 1.0  # how often the publisher's health reaches the metrics
LABEL_WAIT_S = 60.0  # fault-to-label: give up measuring after this long
KERNEL_LOG_POLL_S = 1.0  # a kernel log that is a regular file (simulation) is polled
KERNEL_LOG_RETRY_S = 60.0  # after the log could not be read


def effective_config(config: Config) -> Config:
    """The agent's xid check listens for `agent.xid_window_s` per periodic run unless
    its params say otherwise (events stream in continuously anyway)."""
    if "window_s" in config.check_section("xid").params:
        return config
    return with_xid_window(config, config.agent.xid_window_s)


def with_xid_window(config: Config, window_s: float) -> Config:
    """`config` with the xid check listening for `window_s` per run."""
    section = config.check_section("xid")
    xid = section.model_copy(update={"params": {**section.params, "window_s": window_s}})
    return config.model_copy(update={"checks": {**config.checks, "xid": xid}})


class Agent:
    """`healthd agent`: see the module docstring. Construct, then `await run()`."""

    def __init__(self, config: Config, *, node: str, kubeconfig: str | None = None,
                 context: str | None = None, kube: Kube | None = None,
                 probes: Probes | None = None, http_port: int | None = None,
                 registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        """`probes`: what checks measure with besides NVML (None: the real thing); a
        simulated machine hands its own, with a config it adapted."""
        self.config = effective_config(config)
        self.settings = self.config.agent
        self.node = node
        self.keys = Keys(config.label_prefix, config.own_prefix)
        self.clock = clock
        self.registry = registry or CollectorRegistry()
        self.http_port = self.settings.http_port if http_port is None else http_port
        self.policy = Policy(recover_after=self.settings.recover_after,
                             catalog=self.config.catalog(),
                             max_doublings=self.settings.flap_max_doublings,
                             flap_window=self.settings.flap_window,
                             min_hold=self.settings.min_hold)
        self.state: HealthState = initial(clock())
        self.port: int | None = None  # the bound HTTP port, once serving
        self.last_run: str | None = None  # the answer to the latest on-demand request
        self.node_watch = NodeWatch(node, self._observe_node)
        self._kubeconfig, self._context, self._given_kube = kubeconfig, context, kube
        self.readiness = Readiness()
        self._told_unavailable: set[str] = set()  # checks whose setup problem was told
        self._stopping = False
        self._work: anyio.CancelScope | None = None
        self._tasks: anyio.abc.TaskGroup | None = None
        self.metrics = AgentMetrics(self.registry, node=node, cpu_model=read_cpu_model())
        self.inputs = RoundInputs(catalog=self.config.catalog(), node_name=node,
                                  namespace=self.config.namespace,
                                  expected_gpus=self.config.expected_gpus)
        self.probes = probes or Probes()
        self.kernel_log = self._kernel_log(self.probes)
        if self.kernel_log is not None:
            self.probes = replace(self.probes, kernel_log=self.kernel_log)
        self.runner = Runner(self.inputs.context, on_result=self._on_result)

    def _kernel_log(self, probes: Probes) -> KernelLog | None:
        """The kernel log the xid and sxid checks read, from the config (unless the
        probes brought one), remembering its position in the state file."""
        settings = self.settings.kernel_log
        if probes.kernel_log is not None or not settings.enabled:
            return None
        return KernelLog(Path(settings.path), state_file=Path(settings.state_file),
                         dedup_window_s=settings.dedup_window_s, uptime=probes.uptime)

    # -- probes ------------------------------------------------------------------------

    def healthy(self) -> tuple[bool, str]:
        return (False, "shutting down") if self._stopping else (True, "ok")

    def ready(self) -> tuple[bool, str]:
        return self.readiness.ready(self.clock())

    # -- lifecycle ---------------------------------------------------------------------

    def stop(self) -> None:
        """End `run()` gracefully: cancel the checks, flush the last state, return."""
        self._stopping = True
        if self._work is not None:
            self._work.cancel()

    async def run(self) -> None:
        """Run until cancelled or `stop()`; KubeError when no API config is usable."""
        kube = self._given_kube or await Kube.connect(self._kubeconfig, context=self._context,
                                                      timeout_s=self.settings.api_timeout_s)
        gpus = NvmlGpuSource()
        try:
            await self._run_with(kube, gpus)
        finally:
            with anyio.CancelScope(shield=True):
                await gpus.aclose()
                if self.kernel_log is not None:
                    self.kernel_log.close()
                if self._given_kube is None:
                    await kube.close()

    async def _run_with(self, kube: Kube, gpus: NvmlGpuSource) -> None:
        self.kube = kube
        self.inputs.gpus = gpus
        # The pvc check's API needs the live client, which exists only from here: every
        # check is planned below (the schedule, events, on-demand requests), so each is
        # built with it, and no context or check changes after it is built.
        self.probes = replace(self.probes, pvc_api=KubeProbeApi.factory(kube, self.keys))
        self.events = EventRecorder(kube, component=COMPONENT, host=self.node)
        self.publisher = NodePublisher(kube, self.node, self.keys, self.events,
                                       clock=self.clock)
        diag = DeepDiagnostic(kube, self.node, self.settings.deep_diagnostics, self.events,
                              catalog=self.inputs.catalog, keys=self.keys,
                              job_env=deep_job_env(self.config))
        self.deep = DeepRuns(self, self.runner, diag)
        peers = PeerWatcher(kube, self.node, namespace=self.settings.peers.namespace,
                            label_selector=self.settings.peers.label_selector,
                            on_change=self._peers_changed,
                            on_attachments=self._attachments_changed)
        requests = RequestHandler(self, self.keys)
        jobs = self._jobs()
        log.info("agent starting on node %s: %d scheduled jobs, API %s", self.node,
                 len(jobs), getattr(kube, "host", ""))
        async with serve_http(self.http_port, self.registry, healthy=self.healthy,
                              ready=self.ready) as port, anyio.create_task_group() as outer:
            self.port = port
            outer.start_soon(self.publisher.run)
            with anyio.CancelScope() as self._work:
                if self._stopping:
                    self._work.cancel()
                async with anyio.create_task_group() as self._tasks:
                    self._tasks.start_soon(self.node_watch.run, kube)
                    self._tasks.start_soon(requests.serve)
                    self._tasks.start_soon(peers.run)
                    self._tasks.start_soon(self._report_publisher)
                    self._tasks.start_soon(self._start_schedule, jobs)
                    if self.config.check_section("xid").enabled:
                        self._tasks.start_soon(self._consume_xids, gpus)
                    if self.kernel_log is not None and self.config.check_section("sxid").enabled:
                        self._tasks.start_soon(self._watch_sxids, self.kernel_log)
            if self._stopping:
                with anyio.CancelScope(shield=True):
                    synced = await self.publisher.flush(self.settings.shutdown_flush_s)
                log.info("agent stopped (last state %s)", "written" if synced else "NOT written")
            outer.cancel_scope.cancel()

    async def _start_schedule(self, jobs: list[Job]) -> None:
        # The GPU count may come from the Node: wait briefly for it before the first round.
        with anyio.move_on_after(self.settings.api_timeout_s):
            await self.node_watch.seen.wait()
        self.readiness.start(jobs, self.clock())
        await Schedule(jobs).run(self._fire)

    # -- plans -------------------------------------------------------------------------

    def _jobs(self) -> list[Job]:
        jobs = plan_jobs(self.config, self.probes)
        self.metrics.set_intervals({p.key: job.interval_s for job in jobs
                                    if job.interval_s is not None for p in job.planned})
        return jobs

    def plan(self, key: str) -> Planned:
        """The check `key` as configured (ValueError for a bad argument)."""
        return planned_check(self.config, key, probes=self.probes)

    async def _fire(self, job: Job) -> None:
        try:
            if self.runner.gate.exclusive_wanted and not any(p.exclusive for p in job.planned):
                # A deep diagnostic holds the GPUs: skip the turn rather than queue behind it.
                log.debug("%s: skipped while a deep diagnostic runs", job.name)
                return
            await self.run_planned(job.planned, Trigger.PERIODIC)
        finally:
            self.readiness.turn_ended(job.name, self.clock())  # a skipped turn counts too

    # -- running -----------------------------------------------------------------------

    async def run_planned(self, planned: tuple[Planned, ...] | list[Planned],
                          trigger: Trigger) -> dict[str, CheckResult | str]:
        """Shared checks in one round, then exclusive ones as Jobs. Returns each key's
        result, or the reason it did not run (an exclusive check on busy GPUs)."""
        out: dict[str, CheckResult | str] = {}
        shared = [p for p in planned if not p.exclusive]
        if shared:
            out.update(await self.runner.run_round(shared, trigger))
        for item in planned:
            if item.exclusive:
                out[item.key] = await self.deep.run(item, trigger)
        return out

    async def busy_pods(self) -> list[str]:
        """Pods holding this node's GPUs (KubeError when the API cannot tell)."""
        return await gpu_pods(self.kube, self.node, self.keys)

    # -- what deep runs use (healthd.agent.deepruns.DeepHost) ---------------------------

    def gpu_count(self) -> int:
        capacity = _node_gpus(self.node_watch.obj)
        return capacity or self.inputs.expected_gpus or 1

    def start_testing(self, key: str) -> None:
        self.set_state(testing_started(self.state, key, at=self.clock()))

    def end_testing(self, key: str) -> None:
        self.set_state(end_testing(self.state, key, at=self.clock()))

    # -- results and state -------------------------------------------------------------

    async def _on_result(self, key: str, result: CheckResult, trigger: Trigger) -> None:
        at = self.clock()
        state = apply(self.state, key, result, trigger=trigger, at=at, policy=self.policy)
        if self.deep.finished(key, result, at):
            state = end_testing(state, key, at=at)  # one write: result and end of TESTING
        self.metrics.observe_result(key, result)
        self._tell_unavailable(key, result)
        before = self.state.checks.get(key)
        changed = before is None or before.status is not result.status
        log.log(logging.INFO if changed else logging.DEBUG, "%s: %s%s", key,
                result.status.value, f" ({result.reason})" if result.reason else "",
                extra={"trigger": trigger.value, "duration_s": round(result.duration_s, 3)})
        self.set_state(state)

    def _tell_unavailable(self, key: str, result: CheckResult) -> None:
        """One Warning Event when a check cannot be used on this node (its tool or
        service is missing), not one per run; told again only after it worked."""
        if result.status.ordered:  # it worked: a later relapse is news again
            self._told_unavailable.discard(key)
        if not (result.status is Severity.SKIPPED and result.actionable):
            return
        if key in self._told_unavailable or self._tasks is None:
            return
        self._told_unavailable.add(key)
        self._tasks.start_soon(self.node_event, WARNING, Reason.CHECK_UNAVAILABLE,
                               f"check {key} cannot run on this node: {result.reason}")

    async def node_event(self, type_: str, reason: str, message: str) -> None:
        """Post an Event about this agent's Node (never raises)."""
        node: dict[str, Any] = self.node_watch.obj or {
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node}}
        involved = {"apiVersion": "v1", "kind": "Node", "metadata": node.get("metadata", {})}
        await self.events.record(involved, type=type_, reason=reason, message=message)

    def set_state(self, state: HealthState) -> None:
        """Adopt a new state: metrics, and the desired Node to the publisher."""
        if state.verdict is not self.state.verdict:
            log.info("verdict %s -> %s", self.state.verdict.value, state.verdict.value,
                     extra={"verdict": state.verdict.value})
        self.state = state
        self.metrics.observe_state(state)
        self.publish()

    def publish(self) -> None:
        desired = desired_from(self.state, self.keys, node=self.node,
                               dcgm_levels=self.deep.dcgm_levels, last_run=self.last_run)
        self.publisher.want(desired, self.state)

    # -- watches and streams -----------------------------------------------------------

    def _observe_node(self, node: dict[str, Any]) -> None:
        """A new copy of the Node from the watch: the publisher's view, the GPU count."""
        self.publisher.observe(node)
        if self.config.expected_gpus is None and (count := _node_gpus(node)):
            self.inputs.expected_gpus = count

    # -- what on-demand requests use (healthd.agent.ondemand.RequestHost) -------------

    def now(self) -> float:
        return self.clock()

    @property
    def verdict(self) -> Verdict:
        return self.state.verdict

    async def next_node(self) -> dict[str, Any] | None:
        return await self.node_watch.next()

    async def take(self, request: Request) -> bool:
        return await take(self.publisher, request, self.keys)

    def start_clear(self) -> list[str]:
        state, keys = request_clear(self.state, at=self.clock())
        self.set_state(state)
        return sorted(keys)

    async def publish_answer(self, last_run: str, flush_s: float) -> None:
        self.last_run = last_run
        self.publish()
        await self.publisher.flush(flush_s)

    async def _consume_xids(self, gpus: NvmlGpuSource) -> None:
        # The event is already queued for the run it triggers: listening on would only
        # delay the label (periodic runs keep their window).
        xid = planned_check(with_xid_window(self.config, 0.0), "xid", probes=self.probes)
        last: CheckResult | None = None
        async for event in gpus.watch_xids():
            log.info("XID %d on GPU %d", event.xid, event.gpu_index)
            if last is not None and _covers(last, event):
                continue  # a burst: the run for an earlier event drained this one too
            last = result = await self._run_on_event(xid)
            if not _reports(result, event):
                # It joined a run whose window had closed: this run drains the event.
                last = result = await self._run_on_event(xid)
            if self.state.judged and _reports(result, event) and self._tasks is not None:
                self._tasks.start_soon(self._measure_fault_to_label, event.at)

    async def _watch_sxids(self, kernel_log: KernelLog) -> None:
        """Run the sxid check as soon as the kernel log holds an SXID line (NVML has
        no event for them). XIDs are left to NVML's events and the periodic runs: a
        run for a line NVML already delivered would count as a clean run."""
        sxid = planned_check(self.config, "sxid", probes=self.probes)
        while True:
            try:
                await kernel_log.wait(KERNEL_LOG_POLL_S)
                if await anyio.to_thread.run_sync(kernel_log.pending, "sxid"):
                    log.info("SXID in the kernel log")
                    await self._run_on_event(sxid)
            except (LogUnavailable, OSError):
                await anyio.sleep(KERNEL_LOG_RETRY_S)  # the checks report why

    async def _run_on_event(self, xid: Planned) -> CheckResult:
        return await self.runner.run(xid.key, xid.check, Trigger.EVENT, xid.timeout_s,
                                     gated=False)

    async def _measure_fault_to_label(self, detected_at: float) -> None:
        if await self.publisher.flush(LABEL_WAIT_S):
            self.metrics.observe_fault_to_label(self.clock() - detected_at)

    async def _report_publisher(self) -> None:
        while True:
            self.metrics.observe_publisher(self.publisher.in_sync, self.publisher.last_error)
            await anyio.sleep(PUBLISHER_REPORT_S)

    def _peers_changed(self, peers: list[Any]) -> None:
        self.inputs.peers = peers  # the ping check's

    def _attachments_changed(self, attachments: tuple[Attachment, ...]) -> None:
        self.inputs.attachments = attachments  # the nic and rdma checks' interfaces


def _reports(result: CheckResult, event: XidEvent) -> bool:
    """Whether an xid run's result carries `event` (its code on its GPU)."""
    code = f"XID_{event.xid}"
    return any(f.code == code and (f.entity.uuid == event.uuid or
                                   f.entity.index == event.gpu_index)
               for f in result.findings)


def _covers(result: CheckResult, event: XidEvent) -> bool:
    """Whether `result` already accounts for `event`: it reports it and ended after
    the event was received (so it collected it, rather than an earlier one)."""
    return result.started_at + result.duration_s >= event.at and _reports(result, event)


def _node_gpus(node: dict[str, Any] | None) -> int:
    """The node's GPU capacity (`status.capacity["nvidia.com/gpu"]`), 0 when unknown."""
    return int(gpu_count(node, GPU_RESOURCE)) if node is not None else 0
