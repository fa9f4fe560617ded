"""The agent's wiring: builds its parts from the config, connects them, and runs every
activity of `healthd agent` until stopped.

Parts (each handed what it uses at construction):

- the node's health (healthd.agent.health): the verdict state and its policy; every
  result, TESTING and clear goes through it to the metrics and the publisher;
- the runner (healthd.agent.runner) and the planned runs over it
  (healthd.agent.deepruns: exclusive checks as Jobs, only when no pod holds the
  node's GPUs); the diagnostics an earlier agent left running
  (healthd.agent.deepresume), found before the first judgement is shown;
- the publisher (healthd.agent.node_status), the one writer of the Node;
- the node watch (healthd.agent.node_watch): its first copy of the Node is what the
  node's health resumes (healthd.agent.resume), before anything is written; on-demand requests
  (healthd.agent.ondemand), ping's peers as the controller publishes them on the
  Node (healthd.agent.peers), Events about the node (healthd.agent.node_events);
- the NVML release (healthd.agent.nvml_release): the one NVML reader, shared by the
  GPU source and pciebw's busy test, stays shut until the Node is read and while the
  controller's repair resets the GPUs.

Activities (tasks of one task group, all children of `Agent.run`): the schedule
(healthd.agent.schedule): periodic rounds through the runner; the node watch; the
request handler; finishing the diagnostics an earlier agent left running; finding
this node's own agent pod once (the `nic` check's interfaces, healthd.agent.peers); an
event run per check that declares an event source (healthd.agent.event_runs); the
Warnings about unusable checks; a small loop that reports the publisher's health to
the metrics; one that tells the node's health when the first round has ended and the
diagnostics left running are known (the verdict is shown only from then on); the NVML
release; and the publisher's own loop. /readyz comes from the schedule's progress
(healthd.agent.readiness). The schedule's first round waits (briefly) for the Node,
for the release to act on it and for the diagnostics left running to hold the GPUs.

`stop()` is the graceful end (SIGTERM): cancel the checks (their subprocesses die
with them) but leave a diagnostic Job in flight running, with the node TESTING, for
the next agent to finish; give the publisher `shutdown_flush_s` to write the last
state, return.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from prometheus_client import CollectorRegistry

import checks
from checks.base import Attachment, CheckResult
from checks.kernel_log import KernelLog, SkippedLines
from checks.nvml_reader import NvmlReader
from checks.probes import Probes
from checks.snapshot import NvmlGpuSource
from healthd.agent.deepdiag import DeepDiagnostic
from healthd.agent.deepresume import ResumedDiagnostics
from healthd.agent.deepruns import DeepRuns, deep_job_env
from healthd.agent.event_runs import Activity, Feeds, effective_config, event_loops
from healthd.agent.health import NodeHealth, policy_of, validates_new_nodes
from healthd.agent.metrics import AgentMetrics, read_cpu_model
from healthd.agent.node_events import NodeEvents, UnavailableChecks
from healthd.agent.node_status import NodePublisher
from healthd.agent.node_watch import NodeWatch
from healthd.agent.nvml_release import NOT_READ, NvmlRelease
from healthd.agent.ondemand import RequestHandler
from healthd.agent.peers import OwnPod, PublishedPeers
from healthd.agent.readiness import Readiness
from healthd.agent.runner import OnResult, RoundInputs, Runner
from healthd.agent.schedule import Job, Schedule, plan_jobs
from healthd.agent.verdict import Trigger
from healthd.capacity.health import gpu_count
from healthd.check.plans import Planned, planned_check
from healthd.config import Config
from healthd.config.selection import SelectionError, parse_selection
from healthd.kube.client import Kube
from healthd.kube.conventions import COMPONENT, GPU_RESOURCE, Keys
from healthd.kube.events import EventRecorder
from healthd.kube.pods import gpu_pods
from healthd.kube.pvc_probe import KubeProbeApi
from healthd.kube.shapes import Node, view
from healthd.published import Repair, awaits_validation, read_repair
from healthd.util.http import serve_http

log = logging.getLogger(__name__)

PUBLISHER_REPORT_S = 1.0  # how often the publisher's health reaches the metrics


@dataclass(frozen=True)
class Parts:
    """The parts that need the live API client, built in one place once connected."""

    kube: Kube
    publisher: NodePublisher
    node_watch: NodeWatch
    events: NodeEvents
    unavailable: UnavailableChecks
    health: NodeHealth
    runner: Runner
    runs: DeepRuns
    requests: RequestHandler
    resumed: ResumedDiagnostics
    own_pod: OwnPod
    peers: PublishedPeers
    release: NvmlRelease


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
        self.port: int | None = None  # the bound HTTP port, once serving
        self.parts: Parts | None = None  # once connected
        self._kubeconfig, self._context, self._given_kube = kubeconfig, context, kube
        self.readiness = Readiness()
        self._stopping = False
        self._work: anyio.CancelScope | None = None
        self.skipped_lines = SkippedLines()  # this agent's unusable kernel-log lines
        self.metrics = AgentMetrics(self.registry, node=node, cpu_model=read_cpu_model(),
                                    skipped_lines=self.skipped_lines)
        self.inputs = RoundInputs(catalog=self.config.catalog(), node_name=node,
                                  namespace=self.config.probe_namespace,
                                  expected_gpus=self.config.expected_gpus)
        self.probes = probes or Probes()
        self.kernel_log = self._kernel_log(self.probes)
        if self.kernel_log is not None:
            self.probes = replace(self.probes, kernel_log=self.kernel_log)

    def _kernel_log(self, probes: Probes) -> KernelLog | None:
        """The kernel log the xid and sxid checks read, from the config (unless the
        probes brought one), remembering its position in the state file."""
        settings = self.settings.kernel_log
        if probes.kernel_log is not None or not settings.enabled:
            return None
        return KernelLog(Path(settings.path), state_file=Path(settings.state_file),
                         dedup_window_s=settings.dedup_window_s, uptime=probes.uptime,
                         skipped=self.skipped_lines)

    # -- probes ------------------------------------------------------------------------

    def healthy(self) -> tuple[bool, str]:
        return (False, "shutting down") if self._stopping else (True, "ok")

    def ready(self) -> tuple[bool, str]:
        return self.readiness.ready(self.clock())

    # -- lifecycle ---------------------------------------------------------------------

    def stop(self) -> None:
        """End `run()` gracefully: cancel the checks, flush the last state, return. A
        diagnostic Job in flight is left running for the next agent."""
        self._stopping = True
        if self.parts is not None:
            self.parts.runs.diag.hand_over()
        if self._work is not None:
            self._work.cancel()

    async def run(self) -> None:
        """Run until cancelled or `stop()`; KubeError when no API config is usable."""
        kube = self._given_kube or await Kube.connect(self._kubeconfig, context=self._context,
                                                      timeout_s=self.settings.api_timeout_s)
        gpus = NvmlGpuSource(NvmlReader(released=NOT_READ))  # shut until the Node is read
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
        self.inputs.gpus = gpus
        # The pvc check's API and the node's GPU pods (pciebw's free_gpus_only) need the
        # live client, which exists only from here: every check is planned below (the
        # schedule, events, on-demand requests), so each is built with them, and no
        # context or check changes after it is built.
        self.probes = replace(self.probes, pvc_api=KubeProbeApi.factory(kube, self.keys),
                              gpu_pods=partial(gpu_pods, kube, self.node, self.keys),
                              gpu_activity=self.probes.gpu_activity or gpus.reader)
        self.parts = parts = self._build(kube, gpus)
        jobs = self._jobs()
        activities = self._activities(parts, gpus, jobs)
        log.info("agent starting on node %s: %d scheduled jobs, API %s", self.node,
                 len(jobs), getattr(kube, "host", ""))
        async with serve_http(self.http_port, self.registry, healthy=self.healthy,
                              ready=self.ready) as port, anyio.create_task_group() as outer:
            self.port = port
            outer.start_soon(parts.publisher.run)
            with anyio.CancelScope() as self._work:
                if self._stopping:
                    self._work.cancel()
                async with anyio.create_task_group() as tasks:
                    for activity in activities:
                        tasks.start_soon(activity)
            if self._stopping:
                with anyio.CancelScope(shield=True):
                    synced = await parts.publisher.flush(self.settings.shutdown_flush_s)
                log.info("agent stopped (last state %s)", "written" if synced else "NOT written")
            outer.cancel_scope.cancel()

    # -- wiring ------------------------------------------------------------------------

    def _build(self, kube: Kube, gpus: NvmlGpuSource) -> Parts:
        """Every part that talks to the API, each given what it uses."""
        recorder = EventRecorder(kube, component=COMPONENT, host=self.node)
        publisher = NodePublisher(kube, self.node, self.keys, recorder, clock=self.clock)
        health = NodeHealth(policy_of(self.config), publisher, self.metrics, keys=self.keys,
                            node=self.node, clock=self.clock,
                            validates_new=validates_new_nodes(self.config))
        peers = PublishedPeers(self.keys, self._peers_changed)
        release = NvmlRelease(gpus, on_change=health.observe_release)
        node_watch = NodeWatch(self.node, partial(self._observe_node, publisher, health, peers,
                                                  release))
        events = NodeEvents(recorder, node_watch)
        unavailable = UnavailableChecks(events)
        runner = Runner(self.inputs.context, on_result=_results_to(health, unavailable))
        diag = DeepDiagnostic(kube, self.node, self.settings.deep_diagnostics, recorder,
                              catalog=self.inputs.catalog, keys=self.keys,
                              job_env=deep_job_env(self.config))
        busy_pods = partial(gpu_pods, kube, self.node, self.keys)
        runs = DeepRuns(runner, diag, health, busy_pods=busy_pods,
                        gpu_count=partial(self._job_gpus, node_watch))
        plan = partial(planned_check, self.config, probes=self.probes)
        requests = RequestHandler(health, runs, watch=node_watch, publisher=publisher,
                                  events=events, plan=plan, keys=self.keys)
        resumed = ResumedDiagnostics(runs, watch=node_watch, plan=plan, known=_known_check,
                                     answer=requests.answer_resumed, keys=self.keys)
        own_pod = OwnPod(kube, self.node, namespace=self.settings.peers.namespace,
                         label_selector=self.settings.peers.label_selector,
                         on_attachments=self._attachments_changed,
                         pod_name=self.config.pod_name)
        return Parts(kube, publisher, node_watch, events, unavailable, health, runner, runs,
                     requests, resumed, own_pod, peers, release)

    def _activities(self, parts: Parts, gpus: NvmlGpuSource, jobs: list[Job]) -> list[Activity]:
        """What runs until stopped, besides the publisher (which outlives them to flush)."""
        feeds = Feeds(gpus, self.kernel_log, run=partial(_run_on_event, parts.runner),
                      label_shown=parts.health.label_shown)
        return [partial(parts.node_watch.run, parts.kube), parts.requests.serve,
                parts.resumed.run, parts.own_pod.run, parts.unavailable.run,
                partial(self._report_publisher, parts), parts.release.run,
                partial(self._start_schedule, parts, jobs), partial(self._first_round, parts),
                *event_loops(self.config, feeds, self.probes)]

    # -- the schedule ------------------------------------------------------------------

    def _jobs(self) -> list[Job]:
        jobs = plan_jobs(self.config, self.probes)
        self.metrics.set_intervals({p.key: job.interval_s for job in jobs
                                    if job.interval_s is not None for p in job.planned})
        return jobs

    async def _start_schedule(self, parts: Parts, jobs: list[Job]) -> None:
        # The GPU count may come from the Node, and NVML opens only once the Node is
        # read (it may say a GPU reset is under way); a diagnostic an earlier agent left
        # running holds the GPUs: wait briefly for all three.
        with anyio.move_on_after(self.settings.api_timeout_s):
            await parts.node_watch.seen.wait()
            await parts.release.decided.wait()
            await parts.resumed.looked.wait()
        self.readiness.start(jobs, self.clock())
        await Schedule(jobs).run(partial(self._fire, parts))

    async def _first_round(self, parts: Parts) -> None:
        await self.readiness.first_round.wait()
        await parts.resumed.looked.wait()  # a diagnostic left running keeps the node TESTING
        parts.health.first_round_done()

    async def _fire(self, parts: Parts, job: Job) -> None:
        try:
            if parts.runner.gate.exclusive_wanted and not any(p.exclusive for p in job.planned):
                # A deep diagnostic holds the GPUs: skip the turn rather than queue behind it.
                log.debug("%s: skipped while a deep diagnostic runs", job.name)
                return
            await parts.runs.run_planned(job.planned, Trigger.PERIODIC)
        finally:
            self.readiness.turn_ended(job.name, self.clock())  # a skipped turn counts too

    # -- what the parts learn from the watches -----------------------------------------

    def _job_gpus(self, node_watch: NodeWatch) -> int:
        """The GPUs a diagnostic Job reserves: all of the node's."""
        capacity = _node_gpus(node_watch.obj)
        return capacity or self.inputs.expected_gpus or 1

    def _observe_node(self, publisher: NodePublisher, health: NodeHealth,
                      peers: PublishedPeers, release: NvmlRelease,
                      node: dict[str, Any]) -> None:
        """A new copy of the Node from the watch: the publisher's view, the GPU count,
        ping's peers, the controller's repair (TESTING while it resets or validates,
        NVML let go while it resets); the first one is what the node's health resumes."""
        publisher.observe(node)
        peers.observe(node)
        health.resume(node, known=_known_check)
        repair = read_repair(node, self.keys)
        release.observe(repair)
        health.observe_repair(repair if isinstance(repair, Repair) else None,
                              new=awaits_validation(node, self.keys))
        if self.config.expected_gpus is None and (count := _node_gpus(node)):
            self.inputs.expected_gpus = count

    async def _report_publisher(self, parts: Parts) -> None:
        while True:
            self.metrics.observe_publisher(parts.publisher.in_sync, parts.publisher.last_error)
            await anyio.sleep(PUBLISHER_REPORT_S)

    def _peers_changed(self, peers: list[Any]) -> None:
        self.inputs.peers = peers  # the ping check's

    def _attachments_changed(self, attachments: tuple[Attachment, ...]) -> None:
        self.inputs.attachments = attachments  # the nic and rdma checks' interfaces


def _results_to(health: NodeHealth, unavailable: UnavailableChecks) -> OnResult:
    """Where every result goes: the Warning if its check cannot run here, the verdict."""
    async def on_result(key: str, result: CheckResult, trigger: Trigger) -> None:
        unavailable.observe(key, result)
        health.record(key, result, trigger)
    return on_result


async def _run_on_event(runner: Runner, planned: Planned) -> CheckResult:
    """An event run: ungated, since it merely listens (healthd.agent.runner)."""
    return await runner.run(planned.key, planned.check, Trigger.EVENT, planned.timeout_s,
                            gated=False)


def _known_check(key: str) -> bool:
    """Whether `key` names a check of this agent's registry (`remapped`, `dcgm:3`)."""
    try:
        return len(parse_selection(key, checks.REGISTRY)) == 1
    except SelectionError:
        return False


def _node_gpus(node: dict[str, Any] | None) -> int:
    """The node's GPU capacity (`status.capacity["nvidia.com/gpu"]`), 0 when unknown."""
    return int(gpu_count(view(Node, node), GPU_RESOURCE)) if node is not None else 0
