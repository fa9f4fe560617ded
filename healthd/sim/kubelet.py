"""A stand-in for the Job controller, the scheduler and the kubelet over the API emulator.

The emulator stores objects but runs no controllers, so a Job created there never
gets a pod. `FakeKubelet` plays the three parts the agent's deep diagnostics rely
on, directly on the emulator's store (its own writes stay out of the request log):

- Job controller: for each new Job, one pod from the template (labels `job-name`,
  `controller-uid`, owner reference); the Job's status follows the pod
  (`active`, then `succeeded`/`failed` with a Complete/Failed condition);
  `activeDeadlineSeconds` kills the pod (reason DeadlineExceeded); a pod deleted
  before it ended (a drain, an admin) counts as failed, and with no retry
  (`backoffLimit: 0`, which every healthd Job sets) fails the Job (reason
  BackoffLimitExceeded); deleting the Job deletes its pods, as the garbage
  collector does.
- Scheduler: binds the pod to the node its affinity names (`matchFields`
  metadata.name In [...], `nodeName` or the hostname node selector) when that Node
  exists and has the GPUs free (`status.allocatable`, minus live pods holding GPUs);
  otherwise the pod stays Pending with `PodScheduled=False`, reason Unschedulable.
- Kubelet: marks the pod Running, calls the `runner` to play the container, then
  writes its termination state and message (with `FallbackToLogsOnError`: the tail
  of the logs when the message is empty and the container failed).

Modes: `Mode.RUN` (the above), `Mode.NEVER_SCHEDULE` (every pod stays unschedulable),
`Mode.FAIL` (the container dies at once: exit 137, no message, no logs).

`HealthdRunner(spec)` runs the container's own `healthd check ...` (or `healthd
gpu-reset ...`) command here, on a simulated machine, so a diagnostic Job's result is
real check output; with `control`, on the machine that control file names, the one
the node's agent runs on (a GPU reset there is seen by the agent)::

    async with anyio.create_task_group() as tg:
        tg.start_soon(FakeKubelet(api, runner=HealthdRunner("healthy-8xh100")).run)
        ...
        tg.cancel_scope.cancel()
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import random
import string
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from healthd.kube.conventions import GPU_RESOURCE
from healthd.sim.apiserver.emulator import ApiEmulator, ThreadedEmulator
from healthd.sim.apiserver.resources import Obj
from healthd.sim.apiserver.store import now_text
from healthd.sim.podgpus import gpus_needed, keeps_gpus

TERMINATION_LIMIT = 4096  # bytes the kubelet keeps of a termination message
LOG_FALLBACK_LIMIT = 2048  # bytes of log tail used by FallbackToLogsOnError
TERMINATION_LOG = "/dev/termination-log"

Emulator = ApiEmulator | ThreadedEmulator


class Mode(enum.StrEnum):
    RUN = "run"
    NEVER_SCHEDULE = "never-schedule"
    FAIL = "fail"


@dataclass(frozen=True)
class Termination:
    """How the container ended: exit code, termination-log content, and its logs."""

    exit_code: int
    message: str = ""
    logs: str = ""


Runner = Callable[[Obj], Awaitable[Termination]]  # gets the bound pod


async def succeed(pod: Obj) -> Termination:
    """The default runner: the container exits 0 with no message."""
    return Termination(0)


@dataclass
class HealthdRunner:
    """Plays a `healthd check ...` or `healthd gpu-reset ...` container here, on a
    simulated machine (the one `control` names, when given): runs the
    pod's command with `python -m healthd.cli`, `--sim <spec>` added, the container's
    literal `env` values set, and the termination log redirected to a temporary file."""

    spec: str | Path
    timeout_s: float = 120.0
    control: Path | None = None  # the machine's control file (`--sim-control`), if any

    def env(self, pod: Obj) -> dict[str, str]:
        """This process's environment plus the container's literal `env` values."""
        container = pod["spec"]["containers"][0]
        given = {e["name"]: str(e["value"]) for e in container.get("env") or []
                 if isinstance(e, dict) and "value" in e}
        return {**os.environ, **given}

    def argv(self, pod: Obj, termination_log: Path) -> list[str]:
        container = pod["spec"]["containers"][0]
        command = [*container.get("command", []), *container.get("args", [])]
        if command[:1] == ["healthd"]:
            command = command[1:]
        command = [str(termination_log) if a == TERMINATION_LOG else a for a in command]
        machine = ["--sim", str(self.spec)]
        if self.control is not None:
            machine += ["--sim-control", str(self.control)]
        # Options go before a `--` that ends them (`healthd gpu-reset ... -- UUID...`).
        at = command.index("--") if "--" in command else len(command)
        return [sys.executable, "-m", "healthd.cli", *command[:at], *machine, *command[at:]]

    async def __call__(self, pod: Obj) -> Termination:
        with tempfile.TemporaryDirectory() as folder:
            log = Path(folder) / "termination-log"
            log.touch()
            with anyio.fail_after(self.timeout_s):
                proc = await anyio.run_process(
                    self.argv(pod, log), check=False, stderr=subprocess.STDOUT,
                    env=self.env(pod),
                )
            return Termination(proc.returncode, log.read_text(errors="replace"),
                               proc.stdout.decode(errors="replace"))


async def follow(api: Emulator, api_version: str, kind: str,
                 on_event: Callable[[str, Obj], None]) -> None:
    """Each change of objects of `kind` in the emulator's store, the existing ones
    first (`on_event(type, obj)`), until cancelled; resubscribed where it was should
    the emulator drop its watches."""
    resource = api.table.by_kind(api_version, kind)
    assert resource is not None
    since: str | None = None
    while True:
        sub, initial = api.store.subscribe(resource, None, since, asyncio.get_running_loop())
        try:
            for first in initial:
                since = str(first.rv)
                on_event(first.type, first.obj)
            while (event := await sub.queue.get()) is not None:
                since = str(event.rv)
                on_event(event.type, event.obj)
        finally:
            api.store.unsubscribe(sub)
        await anyio.sleep(0.05)


def _random_suffix() -> str:
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=5))


def target_node(pod: Mapping[str, Any]) -> str | None:
    """The node a pod's spec pins it to, by affinity, nodeName or hostname selector."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    for term in required.get("nodeSelectorTerms") or []:
        for expr in term.get("matchFields") or []:
            if expr.get("key") == "metadata.name" and expr.get("operator") == "In":
                values = expr.get("values") or []
                if values:
                    return str(values[0])
    hostname = (spec.get("nodeSelector") or {}).get("kubernetes.io/hostname")
    return str(hostname) if hostname else None


class FakeKubelet:
    """Job controller + scheduler + kubelet for Jobs in the emulator (see module doc)."""

    def __init__(self, api: Emulator, *, runner: Runner = succeed, mode: Mode = Mode.RUN,
                 run_delay_s: float = 0.0) -> None:
        self.api = api
        self.runner = runner
        self.mode = Mode(mode)
        self.run_delay_s = run_delay_s  # time a pod spends Running before the runner
        self.jobs_seen: list[str] = []  # "namespace/name" of every Job it picked up
        self._scopes: dict[str, anyio.CancelScope] = {}

    async def run(self) -> None:
        """Serve Jobs until cancelled."""
        async with anyio.create_task_group() as group:
            await follow(self.api, "batch/v1", "Job",
                         lambda kind, job: self._on_job(group, kind, job))

    def _on_job(self, group: anyio.abc.TaskGroup, kind: str, job: Obj) -> None:
        uid = job["metadata"]["uid"]
        if kind == "DELETED":
            scope = self._scopes.pop(uid, None)
            if scope is not None:
                scope.cancel()
            self._collect_pods(uid)
        elif kind == "ADDED" and uid not in self._scopes:
            self._scopes[uid] = anyio.CancelScope()
            self.jobs_seen.append(f"{job['metadata']['namespace']}/{job['metadata']['name']}")
            group.start_soon(self._serve_job, job, self._scopes[uid])

    # -- Job controller --------------------------------------------------------------

    async def _serve_job(self, job: Obj, scope: anyio.CancelScope) -> None:
        with scope:
            pod = self._create_pod(job)
            self._set_job_status(job, active=1, startTime=now_text())
            deadline = job["spec"].get("activeDeadlineSeconds")
            with anyio.move_on_after(float(deadline) if deadline else float("inf")) as timer:
                ended = await self._play_unless_deleted(pod)
            if timer.cancelled_caught:
                ended = self._terminate(pod, Termination(137), reason="DeadlineExceeded")
            if ended is None:  # deleted before it ended: a failure, and no retry
                self._finish_job(job, True, "BackoffLimitExceeded")
                return
            failed = ended["status"]["phase"] == "Failed"
            self._finish_job(job, failed, "DeadlineExceeded" if timer.cancelled_caught else "")

    async def _play_unless_deleted(self, pod: Obj) -> Obj | None:
        """The pod played to its end, or None when it is deleted first."""
        ended: Obj | None = None
        async with anyio.create_task_group() as group:
            async def play() -> None:
                nonlocal ended
                ended = await self._play_pod(pod)
                group.cancel_scope.cancel()
            group.start_soon(play)
            meta = pod["metadata"]
            while self.api.get("Pod", meta["name"], meta["namespace"]) is not None:
                await anyio.sleep(0.1)
            group.cancel_scope.cancel()
        return ended

    def _create_pod(self, job: Obj) -> Obj:
        meta, template = job["metadata"], job["spec"].get("template") or {}
        uid, name = meta["uid"], meta["name"]
        labels = {**(template.get("metadata") or {}).get("labels", {}),
                  "job-name": name, "controller-uid": uid,
                  "batch.kubernetes.io/job-name": name,
                  "batch.kubernetes.io/controller-uid": uid}
        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": f"{name}-{_random_suffix()}", "namespace": meta["namespace"],
                "labels": labels,
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                     "uid": uid, "controller": True,
                                     "blockOwnerDeletion": True}],
            },
            "spec": dict(template.get("spec") or {}),
            "status": {"phase": "Pending"},
        }
        return self.api.put(pod)

    def _set_job_status(self, job: Obj, **fields: Any) -> None:
        current = self.api.get("Job", job["metadata"]["name"], job["metadata"]["namespace"])
        if current is not None and current["metadata"]["uid"] == job["metadata"]["uid"]:
            current["status"] = {**(current.get("status") or {}), **fields}
            self.api.put(current)

    def _finish_job(self, job: Obj, failed: bool, reason: str) -> None:
        condition = {"type": "Failed" if failed else "Complete", "status": "True",
                     "lastTransitionTime": now_text()}
        if reason:
            condition["reason"] = reason
        counts = {"failed": 1} if failed else {"succeeded": 1}
        self._set_job_status(job, active=0, completionTime=now_text(),
                             conditions=[condition], **counts)

    def _collect_pods(self, job_uid: str) -> None:
        """Garbage collection: the deleted Job's pods go too."""
        for pod in self.api.list("Pod"):
            owners = pod["metadata"].get("ownerReferences") or []
            if any(o.get("uid") == job_uid for o in owners):
                with contextlib.suppress(Exception):  # already gone
                    self.api.remove("Pod", pod["metadata"]["name"], pod["metadata"]["namespace"])

    # -- scheduler -------------------------------------------------------------------

    def unschedulable_reason(self, pod: Obj) -> str | None:
        """Why the scheduler cannot bind `pod` now, or None when it can."""
        if self.mode is Mode.NEVER_SCHEDULE:
            return "0/1 nodes are available: 1 node(s) had untolerated taint(s)."
        node_name = target_node(pod)
        node = self.api.get("Node", node_name) if node_name else None
        if node is None:
            return "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        if GPU_RESOURCE not in allocatable:
            return None  # the node does not declare GPUs: no accounting to do
        used = sum(gpus_needed(p) for p in self.api.list("Pod")
                   if p["spec"].get("nodeName") == node_name and keeps_gpus(p))
        if gpus_needed(pod) > int(allocatable[GPU_RESOURCE]) - used:
            return f"0/1 nodes are available: 1 Insufficient {GPU_RESOURCE}."
        return None

    async def _schedule(self, pod: Obj) -> Obj:
        said = None
        while (why := self.unschedulable_reason(pod)) is not None:
            if why != said:  # write only when the reason changes, like the scheduler
                said = why
                pod = self._patch_pod(pod, conditions=[{
                    "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": why, "lastTransitionTime": now_text()}])
            await anyio.sleep(0.2)  # the scheduler retries
        pod["spec"]["nodeName"] = target_node(pod)
        return self._patch_pod(pod, conditions=[{"type": "PodScheduled", "status": "True",
                                                 "lastTransitionTime": now_text()}])

    # -- kubelet ---------------------------------------------------------------------

    async def _play_pod(self, pod: Obj) -> Obj:
        pod = await self._schedule(pod)
        started = now_text()
        pod = self._patch_pod(pod, phase="Running", podIP="10.0.0.10",
                              podIPs=[{"ip": "10.0.0.10"}], startTime=started,
                              containerStatuses=[container_status(
                                  pod, {"running": {"startedAt": started}})])
        if self.mode is Mode.FAIL:
            return self._terminate(pod, Termination(137), reason="Error")
        await anyio.sleep(self.run_delay_s)
        ended = await self.runner(pod)
        return self._terminate(pod, ended, reason="Completed" if ended.exit_code == 0
                               else "Error")

    def _terminate(self, pod: Obj, ended: Termination, *, reason: str) -> Obj:
        current = self.api.get("Pod", pod["metadata"]["name"], pod["metadata"]["namespace"])
        pod = current or pod
        return self._patch_pod(pod, **terminated_status(pod, ended, reason=reason))

    def _patch_pod(self, pod: Obj, **status: Any) -> Obj:
        """Write status fields onto the stored pod (if it still exists)."""
        meta = pod["metadata"]
        current = self.api.get("Pod", meta["name"], meta["namespace"])
        if current is None:  # deleted meanwhile (the Job went away)
            return pod
        current["spec"] = pod["spec"]
        current["status"] = {**(current.get("status") or {}), **status}
        return self.api.put(current)


def terminated_status(pod: Obj, ended: Termination, *, reason: str) -> Obj:
    """The status a kubelet writes once the pod's container has ended: the phase, and
    the container's terminated state with its exit code and termination message."""
    running = ((pod.get("status") or {}).get("containerStatuses") or [{}])[0].get("state", {})
    terminated = {"exitCode": ended.exit_code, "reason": reason,
                  "startedAt": (running.get("running") or {}).get("startedAt", now_text()),
                  "finishedAt": now_text()}
    message = termination_message(pod, ended)
    if message:
        terminated["message"] = message
    return {"phase": "Succeeded" if ended.exit_code == 0 else "Failed",
            "containerStatuses": [container_status(pod, {"terminated": terminated})]}


def termination_message(pod: Obj, ended: Termination) -> str:
    """What the kubelet reports: the termination log, or (FallbackToLogsOnError,
    failed container, empty log) the tail of the logs; 4096 bytes at most."""
    container = (pod["spec"].get("containers") or [{}])[0]
    message = ended.message
    fallback = container.get("terminationMessagePolicy") == "FallbackToLogsOnError"
    if not message.strip() and ended.exit_code != 0 and fallback:
        message = ended.logs.encode()[-LOG_FALLBACK_LIMIT:].decode(errors="ignore")
    return message.encode()[:TERMINATION_LIMIT].decode(errors="ignore")


def container_status(pod: Obj, state: Obj) -> Obj:
    container = (pod["spec"].get("containers") or [{}])[0]
    return {"name": container.get("name", "main"), "image": container.get("image", ""),
            "ready": "running" in state, "restartCount": 0, "state": state}


def pods_of(api: Emulator, job_name: str, namespace: str) -> Sequence[Obj]:
    """The pods the fake Job controller made for a Job (tests use it)."""
    return [p for p in api.list("Pod", namespace)
            if (p["metadata"].get("labels") or {}).get("job-name") == job_name]
