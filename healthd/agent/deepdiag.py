"""Deep diagnostics as Kubernetes Jobs: the agent's way to run an exclusive check.

An exclusive check (`dcgm:3`) needs every GPU of the node. Running it inside the
agent would hide that from the scheduler, which could place work on GPUs the
diagnostic is hammering. So the agent creates a Job pinned to its node that
requests (and limits) all the node's GPUs: the scheduler reserves them, and nothing
else lands there while it runs. The pod runs `healthd check --checks <key>` and
leaves a compact summary (healthd.check.termination) in its termination message, which
the agent reads back into a CheckResult.

The Job's shape (pinned by node affinity, all GPUs requested) is healthd.kube.jobs',
shared with the controller's GPU resets.

Whatever happens (no pod within the schedule deadline, the pod dies, the API fails,
the caller is cancelled) the Job is deleted in a shielded `finally`, and a failure
is a `DiagOutcome` with a readable `error` plus a Warning Event on the Node, never
an exception. One exception: a stopping agent (`hand_over`) leaves the Job it follows
running. The run belongs to the node: the Job carries what it is for
(healthd.agent.deeprecord), and the next agent finds it (`find`), follows it to its
end (`resume`), reads its result once and deletes it. A Job whose pod is gone
without a result is a run without a result, never a pass.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from checks.base import Check, CheckContext, CheckResult
from checks.catalog import Catalog
from healthd.agent.deeprecord import DeepRecord
from healthd.check.termination import SummaryError, parse_summary
from healthd.kube.conventions import Keys, Reason
from healthd.kube.errors import KubeError
from healthd.kube.jobs import (
    MAX_NAME,
    TERMINATION_LOG,
    PodPlacement,
    gpu_job,
    job_end,
    label_value,
)
from healthd.kube.objects import (
    JOBS,
    PODS,
    annotations_of,
    condition_of,
    container_statuses_of,
    dicts,
    meta,
    name_of,
    node_name_of,
    phase_of,
)
from healthd.kube.pods import is_terminated
from healthd.kube.shapes import ContainerState, ContainerStateTerminated, Pod, part, view
from healthd.kube.watching import watch_forever

if TYPE_CHECKING:
    from healthd.config.agent import DeepDiagSettings
    from healthd.kube.client import Kube
    from healthd.kube.events import EventRecorder

Obj = dict[str, Any]  # a Kubernetes object as JSON

DELETE_TIMEOUT_S = 10.0
_GENERATED_SUFFIX = 5  # characters the API server appends to generateName


@dataclass(frozen=True)
class DiagOutcome:
    """A diagnostic's result, or (result None) why it could not produce one."""

    result: CheckResult | None
    error: str = ""


class DiagnosticFailed(Exception):
    """Internal: the run ended without a result; the message says why."""


def job_name_prefix(node: str) -> str:
    prefix = f"healthd-diag-{node.lower()}"[: MAX_NAME - _GENERATED_SUFFIX - 1]
    return re.sub(r"[^a-z0-9-]", "-", prefix).rstrip("-") + "-"


def diagnostic_command(key: str) -> list[str]:
    return ["healthd", "check", "--checks", key, "--output", "json",
            "--termination-log", TERMINATION_LOG]


# The pod needs no API access and no privilege: dcgmi asks the node's host engine over
# the network. It meets Pod Security "restricted", which its namespace enforces, and
# the shape deploy/daemonset/base/probe-policy.yaml allows the agent to create.
def pod_security() -> Obj:
    return {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}


def container_security() -> Obj:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def job_manifest(node: str, key: str, gpu_count: int, settings: DeepDiagSettings,
                 keys: Keys, env: Mapping[str, str] | None = None,
                 record: DeepRecord | None = None) -> Obj:
    """The Job that runs check `key` on `node` with all `gpu_count` GPUs reserved;
    `env` reaches its container (e.g. the agent's DCGM host engine), `record` says
    what the run is for (so another agent can finish it)."""
    labels = {keys.diagnostic: "true", keys.node: label_value(node)}
    container = {
        "name": "diagnostic",
        "image": settings.image,
        "command": diagnostic_command(key),
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                *({"name": k, "value": v} for k, v in sorted((env or {}).items()))],
        "securityContext": container_security(),
    }
    metadata = {"generateName": job_name_prefix(node), "namespace": settings.namespace,
                "labels": {**labels, keys.check: label_value(key)},
                "annotations": {keys.node_name: node,
                                **({keys.diagnostic_run: record.encode()} if record else {})}}
    return gpu_job(metadata=metadata, node=node, gpu_count=gpu_count, container=container,
                   placement=placement_of(settings, pod_security()), pod_labels=labels,
                   deadline_s=settings.schedule_deadline_s + settings.run_deadline_s)


def placement_of(settings: DeepDiagSettings, security: Obj) -> PodPlacement:
    """The configured placement of a node's Job pod (tolerations, classes)."""
    return PodPlacement(tolerations=settings.tolerations,
                        priority_class=settings.priority_class,
                        runtime_class=settings.runtime_class,
                        service_account=settings.service_account, security=security)


# -- reading the pod -------------------------------------------------------------------


def _container_state(pod: Pod) -> ContainerState:
    statuses = container_statuses_of(pod)
    return part(statuses[0].get("state")) if statuses else {}


def _terminated(pod: Pod) -> ContainerStateTerminated:
    return part(_container_state(pod).get("terminated"))


def is_scheduled(pod: Pod) -> bool:
    return bool(node_name_of(pod))


def is_finished(pod: Pod) -> bool:
    return is_terminated(pod) or "terminated" in _container_state(pod)


def unscheduled_reason(pod: Pod | None) -> str:
    """The scheduler's explanation (PodScheduled condition), or what is known."""
    if pod is None:
        return "no pod was created for the Job"
    cond = condition_of(pod, "PodScheduled")
    if cond is not None and cond.get("status") != "True":
        return str(cond.get("message") or cond.get("reason") or "pending")
    return "pod pending"


def failure_reason(pod: Pod) -> str:
    """Why a pod ended without a result: container reason and exit code, or the pod's."""
    terminated = _terminated(pod)
    status = part(pod.get("status"))
    reason = terminated.get("reason") or status.get("reason") or status.get("phase") or "unknown"
    exit_code = terminated.get("exitCode")
    text = f"{reason} (exit code {exit_code})" if exit_code is not None else str(reason)
    detail = str(terminated.get("message") or status.get("message") or "").strip()
    return f"{text}: {detail[-300:]}" if detail else text


def result_from_pod(pod: Pod, check: str, catalog: Catalog) -> CheckResult:
    """The check result in a finished pod's termination message."""
    message = str(_terminated(pod).get("message") or "")
    try:
        return parse_summary(message, check, catalog)
    except SummaryError as exc:
        if phase_of(pod) == "Failed" or not message.strip():
            raise DiagnosticFailed(f"diagnostic pod failed: {failure_reason(pod)}") from exc
        raise DiagnosticFailed(f"diagnostic pod finished without a readable result: {exc}") \
            from exc


# -- the run ---------------------------------------------------------------------------


class DeepDiagnostic:
    """Runs exclusive checks on `node` as Jobs (see the module docstring)."""

    def __init__(self, kube: Kube, node: str, settings: DeepDiagSettings,
                 events: EventRecorder, *, catalog: Catalog | None = None,
                 keys: Keys | None = None,
                 job_env: Mapping[str, str] | None = None) -> None:
        self.kube = kube
        self.keys = keys or Keys()
        self.node = node
        self.settings = settings
        self.job_env = dict(job_env or {})
        self.events = events
        self.catalog = catalog or Catalog()
        self._handing_over = False
        self._created: set[str] = set()  # names of the Jobs this process created
        self.left: set[str] = set()  # keys whose Job was left running for the next agent

    def hand_over(self) -> None:
        """The agent is stopping: a run cancelled from now on leaves its Job running
        (and its node TESTING) for the next agent, which finishes it."""
        self._handing_over = True

    async def run(self, key: str, gpu_count: int,
                  record: DeepRecord | None = None) -> DiagOutcome:
        """Create the Job (carrying `record`), follow its pod to the end, read the
        result, delete the Job."""
        started = time.time()
        if gpu_count < 1:  # a Job asking for no GPU would reserve nothing: not exclusive
            return await self._failed(key, f"no GPUs to reserve (gpu_count={gpu_count})")
        try:
            job = await self.kube.create(JOBS, job_manifest(self.node, key, gpu_count,
                                                            self.settings, self.keys,
                                                            self.job_env, record))
        except KubeError as exc:
            return await self._failed(key, f"cannot create the diagnostic Job: {exc}")
        self._created.add(name_of(job))
        return await self._finish(job, key, started)

    async def resume(self, job: Obj, key: str, started: float) -> DiagOutcome:
        """Follow a Job an earlier agent created (at `started`) to its end, read the
        result, delete the Job. A Job that ended while no agent watched, its pod gone,
        has no result."""
        return await self._finish(job, key, started, resumed=True)

    async def find(self) -> list[Obj]:
        """This node's diagnostic Jobs that this process did not create: those earlier
        agents left (KubeError when they cannot be listed)."""
        selector = f"{self.keys.diagnostic}=true,{self.keys.node}={label_value(self.node)}"
        listing = await self.kube.list(JOBS, self.settings.namespace, label_selector=selector)
        return [job for job in dicts(listing.get("items"))
                if annotations_of(job).get(self.keys.node_name) == self.node
                and name_of(job) not in self._created]

    async def discard(self, job: Obj, why: str) -> None:
        """Delete a Job of this node that cannot be finished, saying why."""
        await self.warn("cleanup", f"diagnostic Job {name_of(job)} {why}: deleted")
        with anyio.CancelScope(shield=True):
            await self._delete(job)

    async def _finish(self, job: Obj, key: str, started: float, *,
                      resumed: bool = False) -> DiagOutcome:
        outcome: DiagOutcome | None = None
        try:
            outcome = await self._read(job, key, started, resumed=resumed)
        finally:
            if outcome is None and self._handing_over:
                self.left.add(key)  # cancelled while stopping: the next agent finishes it
            else:
                with anyio.CancelScope(shield=True):
                    await self._delete(job)
        if outcome.error:
            await self.warn(key, outcome.error)
        return outcome

    async def _read(self, job: Obj, key: str, started: float, *, resumed: bool) -> DiagOutcome:
        try:
            if resumed:
                await self._pod_left(job)
            result = await self._follow(job, key.partition(":")[0])
        except DiagnosticFailed as exc:
            return DiagOutcome(None, str(exc))
        except KubeError as exc:
            return DiagOutcome(None, f"cannot follow the diagnostic Job: {exc}")
        return DiagOutcome(result.timed(started, result.duration_s), "")

    async def _failed(self, key: str, error: str) -> DiagOutcome:
        await self.warn(key, error)
        return DiagOutcome(None, error)

    async def _pod_left(self, job: Obj) -> None:
        """A resumed Job that has ended must still have its pod, whose termination
        message holds the result; DiagnosticFailed when it is gone (a drain, its TTL).
        When the API cannot say, the pod is followed as usual."""
        end = job_end(job)
        if not end:
            return
        selector = f"controller-uid={meta(job).get('uid', '')}"
        try:
            pods = await self.kube.list(PODS, self.settings.namespace, label_selector=selector)
        except KubeError:
            return
        if not pods.get("items"):
            raise DiagnosticFailed(f"the diagnostic pod is gone without a result (Job {end})")

    async def _follow(self, job: Obj, check: str) -> CheckResult:
        """Watch the Job's pod: scheduled within the schedule deadline, finished
        within the run deadline after that."""
        uid = meta(job).get("uid", "")
        schedule_s, run_s = self.settings.schedule_deadline_s, self.settings.run_deadline_s
        pod: Pod | None = None
        scheduled = False
        watching = watch_forever(self.kube, PODS, self.settings.namespace,
                                 label_selector=f"controller-uid={uid}")
        with anyio.CancelScope(deadline=anyio.current_time() + schedule_s) as scope:
            async with aclosing(watching) as events:
                async for event in events:
                    if event.type == "DELETED":
                        raise DiagnosticFailed(f"diagnostic pod {name_of(event.object)} was "
                                               "deleted before it finished")
                    pod = view(Pod, event.object)
                    if is_finished(pod):
                        return result_from_pod(pod, check, self.catalog)
                    if is_scheduled(pod) and not scheduled:
                        scheduled = True  # from now on, the run deadline applies
                        scope.deadline = anyio.current_time() + run_s
        if scheduled:
            raise DiagnosticFailed(f"diagnostic did not finish within {run_s:g} s")
        raise DiagnosticFailed(f"not scheduled within {schedule_s:g} s: "
                               f"{unscheduled_reason(pod)}")

    async def _delete(self, job: Obj) -> None:
        """Delete the Job and (Background propagation) its pods; failures are logged
        in an Event, the Job's TTL is the fallback."""
        try:
            with anyio.fail_after(DELETE_TIMEOUT_S):
                await self.kube.delete(JOBS, name_of(job), self.settings.namespace,
                                       propagation="Background")
        except (KubeError, TimeoutError) as exc:
            await self.warn("cleanup", f"cannot delete diagnostic Job {name_of(job)}: {exc}")

    async def warn(self, key: str, message: str) -> None:
        """A Warning Event on the Node: diagnostic `key` failed, and why."""
        involved = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node}}
        with anyio.CancelScope(shield=True), anyio.move_on_after(DELETE_TIMEOUT_S):
            await self.events.record(involved, type="Warning", reason=Reason.DIAGNOSTIC_FAILED,
                                     message=f"diagnostic {key}: {message}")


class DeepCheck:
    """An exclusive check run as a Job: the runner sees an ordinary exclusive check,
    so the gate keeps every other check off the GPUs while it runs. It creates its Job
    (carrying `record`), or follows `resumed`, a Job an earlier agent created at
    `started`."""

    def __init__(self, check: Check, diag: DeepDiagnostic, key: str, gpu_count: int, *,
                 record: DeepRecord | None = None, resumed: Obj | None = None,
                 started: float = 0.0) -> None:
        self.inner, self.diag, self.key, self.gpu_count = check, diag, key, gpu_count
        self.record, self.resumed, self.started = record, resumed, started
        self.NAME = check.NAME
        self.params = check.params

    @property
    def exclusive(self) -> bool:
        return True

    @property
    def timeout_s(self) -> float:
        settings = self.diag.settings
        return settings.schedule_deadline_s + settings.run_deadline_s + 30

    @property
    def labelled_level(self) -> int | None:
        return self.inner.labelled_level

    async def run(self, ctx: CheckContext) -> CheckResult:
        outcome = await (self.diag.resume(self.resumed, self.key, self.started)
                         if self.resumed is not None
                         else self.diag.run(self.key, self.gpu_count, self.record))
        if outcome.result is None:  # DeepDiagnostic already told the node (an Event)
            return CheckResult.unknown(self.NAME, outcome.error)
        return outcome.result
