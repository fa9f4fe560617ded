"""A minimal stand-in for the AppWrapper operator (and the scheduler and kubelet of
its pods) over the API emulator, so a reset healthd writes is carried through.

The emulator runs no controllers. This one plays the part of the AppWrapper
operator that a node-health story needs, through the API like the real one, and
level-triggered: every AppWrapper event (and every Node event, for those waiting for
room) makes it look at the AppWrapper as it is now and take the next step:

    (new, not suspended) -> Resuming -> Running      pods created and placed
    Resetting -> pods deleted -> pause -> Resuming -> Running on healthy nodes
    Succeeded / deleted -> pods deleted

Pods are what the operator's components would create: labelled
`workload.codeflare.dev/appwrapper=<name>`, owned by the AppWrapper, with the node
affinity the operator injects (`autopilot.ibm.com/gpuhealth NotIn [ERR, TESTING,
EVICT]`). Placement honours each pod's required node affinity, cordons and free
GPUs (first fit in natural node-name order: gpu-node-2 before gpu-node-10); a
pod is bound and marked Running at once.
The phase transitions are JSON patches on the status subresource guarded by a
`test` on the phase, so a concurrent reset is never overwritten.

The AppWrapper shape read (workload.codeflare.dev/v1beta2)::

    spec:
      components:
      - template: {apiVersion: v1, kind: Pod, spec: {containers: [...]}}
        podSets: [{replicas: 2, path: template}]       # path to a Pod or PodTemplate
"""

from __future__ import annotations

import logging
import random
import string
import time
from collections.abc import Iterable, Mapping
from typing import Any

import anyio

from healthd.kube.client import Kube
from healthd.kube.conventions import APPWRAPPER_LABEL, GPU_RESOURCE, Keys
from healthd.kube.errors import Invalid, KubeError, NotFound
from healthd.kube.objects import (
    APPWRAPPERS,
    NODES,
    PODS,
    key_of,
    meta,
    name_of,
    natural_name_key,
    phase_of,
)
from healthd.kube.shapes import AppWrapper, view
from healthd.kube.watching import DELETED, watch_forever
from healthd.sim.podgpus import gpus_needed, keeps_gpus
from healthd.util.times import rfc3339

log = logging.getLogger(__name__)

UNHEALTHY_VERDICTS = ("ERR", "TESTING", "EVICT")  # what the injected affinity keeps off
RESUMING, RUNNING, RESETTING, SUCCEEDED = "Resuming", "Running", "Resetting", "Succeeded"
RETRY_S = 1.0  # an AppWrapper with no room looks again this often
Obj = dict[str, Any]


def health_affinity(keys: Keys) -> Obj:
    """The required node affinity the operator injects into every pod."""
    expr = {"key": keys.gpuhealth, "operator": "NotIn", "values": list(UNHEALTHY_VERDICTS)}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [expr]}]}}}


# -- placement (pure) -----------------------------------------------------------------


def _expression_holds(labels: Mapping[str, str], expr: Mapping[str, Any]) -> bool:
    key, op, values = str(expr.get("key")), expr.get("operator"), expr.get("values") or []
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    return False  # Gt/Lt and unknown operators: not needed here, never matched


def affinity_allows(pod_spec: Mapping[str, Any], node: Obj) -> bool:
    """Whether `node` satisfies the pod's required node affinity (terms are OR-ed,
    expressions within a term AND-ed) and its nodeSelector."""
    labels = meta(node).get("labels") or {}
    selector = pod_spec.get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []
    return not terms or any(all(_expression_holds(labels, e)
                                for e in term.get("matchExpressions") or [])
                            for term in terms)


def free_gpus(nodes: Iterable[Obj], pods: Iterable[Obj]) -> dict[str, int]:
    """GPUs each schedulable node has left (allocatable minus live pods holding them)."""
    free: dict[str, int] = {}
    for node in nodes:
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        if not (node.get("spec") or {}).get("unschedulable"):
            free[name_of(node)] = int(str(allocatable.get(GPU_RESOURCE, 0)))
    for pod in pods:
        where = (pod.get("spec") or {}).get("nodeName")
        if where in free and keeps_gpus(pod):
            free[where] -= gpus_needed(pod)
    return free


def place(pod_specs: list[Obj], nodes: list[Obj], pods: list[Obj]) -> list[str] | None:
    """A node for each pod spec (first fit by node name), or None when they do not
    all fit now."""
    free = free_gpus(nodes, pods)
    chosen: list[str] = []
    for spec in pod_specs:
        need = gpus_needed({"spec": spec})
        fits = [name_of(n) for n in sorted(nodes, key=lambda n: natural_name_key(name_of(n)))
                if free.get(name_of(n), -1) >= need and affinity_allows(spec, n)]
        if not fits:
            return None
        free[fits[0]] -= need
        chosen.append(fits[0])
    return chosen


def pod_specs_of(aw: Obj, keys: Keys) -> list[Obj]:
    """One pod spec per replica of every podSet, with the health affinity injected."""
    specs: list[Obj] = []
    for component in (aw.get("spec") or {}).get("components") or []:
        for pod_set in component.get("podSets") or [{"replicas": 1, "path": "template"}]:
            template: Any = component
            for part in str(pod_set.get("path") or "template").split("."):
                template = template.get(part) if isinstance(template, dict) else None
            spec = dict((template or {}).get("spec") or {})
            spec["affinity"] = health_affinity(keys)
            specs.extend(dict(spec) for _ in range(int(pod_set.get("replicas") or 1)))
    return specs


# -- the operator ---------------------------------------------------------------------


class AppWrapperOperator:
    """See the module docstring. `run()` until cancelled; `finish(key)` ends a job
    as if its pods had completed."""

    def __init__(self, kube: Kube, *, keys: Keys | None = None,
                 reset_pause_s: float = 1.0) -> None:
        self.kube = kube
        self.keys = keys or Keys()
        self.reset_pause_s = reset_pause_s  # the operator's retry pause after a reset
        self._dirty: set[str] = set()
        self._wake = anyio.Event()
        self._paused_since: dict[str, float] = {}  # AppWrapper -> when its reset began

    def mark(self, key: str) -> None:
        self._dirty.add(key)
        self._wake.set()

    async def run(self) -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(self._watch_appwrappers)
            group.start_soon(self._watch_nodes)
            group.start_soon(self._work)

    async def _watch_appwrappers(self) -> None:
        async for event in watch_forever(self.kube, APPWRAPPERS):
            key = key_of(event.object)
            if event.type == DELETED:
                await self._delete_pods(key)
            else:
                self.mark(key)

    async def _watch_nodes(self) -> None:
        async for _ in watch_forever(self.kube, NODES):
            if self._paused_since:  # room may have appeared for those waiting
                self._wake.set()

    async def _work(self) -> None:
        while True:
            with anyio.move_on_after(RETRY_S):
                await self._wake.wait()
            self._wake = anyio.Event()
            keys, self._dirty = self._dirty | set(self._paused_since), set()
            for key in sorted(keys):
                try:
                    await self.reconcile(key)
                except KubeError as exc:  # the next event or retry tries again
                    log.warning("AppWrapper %s: %s", key, exc)
                    self._dirty.add(key)

    async def reconcile(self, key: str) -> None:
        """Take the next step for AppWrapper `key` ("namespace/name")."""
        namespace, _, name = key.partition("/")
        try:
            aw = await self.kube.get(APPWRAPPERS, name, namespace)
        except NotFound:
            self._paused_since.pop(key, None)
            return
        phase = phase_of(view(AppWrapper, aw))
        if (aw.get("spec") or {}).get("suspend"):
            return
        if phase in ("", "Suspended"):
            await self._set_phase(aw, RESUMING, condition=("QuotaReserved", "True", "Resuming"))
        elif phase == RESETTING:
            await self._reset(key, aw)
        elif phase == RESUMING:
            await self._resume(key, aw)
        elif phase == SUCCEEDED:
            await self._delete_pods(key)

    async def _reset(self, key: str, aw: Obj) -> None:
        started = self._paused_since.setdefault(key, anyio.current_time())
        if await self._delete_pods(key):
            return  # the pods' deletion brings us back
        if anyio.current_time() - started >= self.reset_pause_s:
            await self._set_phase(aw, RESUMING, condition=("ResourcesDeployed", "False",
                                                           "Resetting"))

    async def _resume(self, key: str, aw: Obj) -> None:
        specs = pod_specs_of(aw, self.keys)
        mine = await self._pods(key)
        if not mine:
            nodes = (await self.kube.list(NODES)).get("items") or []
            pods = (await self.kube.list(PODS)).get("items") or []
            placement = place(specs, nodes, pods)
            if placement is None:
                self._paused_since.setdefault(key, anyio.current_time())  # retry later
                return
            for index, (spec, node) in enumerate(zip(specs, placement, strict=True)):
                await self._create_pod(aw, index, spec, node)
        self._paused_since.pop(key, None)
        await self._set_phase(aw, RUNNING, condition=("ResourcesDeployed", "True",
                                                      "ComponentsDeployed"))

    # -- pods -----------------------------------------------------------------------

    async def _pods(self, key: str) -> list[Obj]:
        namespace, _, name = key.partition("/")
        found = await self.kube.list(PODS, namespace, label_selector=f"{APPWRAPPER_LABEL}={name}")
        return list(found.get("items") or [])

    async def _delete_pods(self, key: str) -> bool:
        """Delete the AppWrapper's pods; True when there were any."""
        pods = await self._pods(key)
        for pod in pods:
            await self.kube.delete(PODS, name_of(pod), meta(pod).get("namespace"))
        return bool(pods)

    async def _create_pod(self, aw: Obj, index: int, spec: Obj, node: str) -> None:
        name, namespace = name_of(aw), meta(aw).get("namespace")
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{name}-{index}-{_suffix()}", "namespace": namespace,
                             "labels": {APPWRAPPER_LABEL: name},
                             "ownerReferences": [{"apiVersion": APPWRAPPERS.api_version,
                                                  "kind": "AppWrapper", "name": name,
                                                  "uid": meta(aw).get("uid"),
                                                  "controller": True}]},
                "spec": {**spec, "nodeName": node}}
        pod = await self.kube.create(PODS, body, namespace)
        status = {"status": {"phase": "Running", "startTime": rfc3339(time.time()), "conditions": [
            {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]}}
        await self.kube.merge_patch(PODS, name_of(pod), status, namespace, subresource="status")

    # -- status ---------------------------------------------------------------------

    async def _set_phase(self, aw: Obj, phase: str, *,
                         condition: tuple[str, str, str]) -> None:
        """Phase and one condition, only if the phase is still the one read."""
        status = aw.get("status") or {}
        kind, value, reason = condition
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != kind]
        conditions.append({"type": kind, "status": value, "reason": reason, "message": "",
                           "lastTransitionTime": rfc3339(time.time())})
        ops: list[Obj] = []
        if "phase" in status:
            ops.append({"op": "test", "path": "/status/phase", "value": status["phase"]})
        ops.append({"op": "add", "path": "/status", "value": {**status, "phase": phase,
                                                               "conditions": conditions}})
        try:
            await self.kube.json_patch(APPWRAPPERS, name_of(aw), ops, meta(aw).get("namespace"),
                                       subresource="status")
        except (Invalid, NotFound):
            return  # changed or gone meanwhile: its event brings us back
        log.info("AppWrapper %s: %s -> %s", key_of(aw), phase_of(view(AppWrapper, aw)) or "new",
                 phase)

    async def finish(self, key: str) -> None:
        """The job completed: phase Succeeded, then its pods go."""
        namespace, _, name = key.partition("/")
        aw = await self.kube.get(APPWRAPPERS, name, namespace)
        await self._set_phase(aw, SUCCEEDED, condition=("ResourcesDeployed", "False",
                                                        "Completed"))


def _suffix() -> str:
    """A random pod name suffix, as controllers' generated names have (a reset makes
    new pods with new names)."""
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
