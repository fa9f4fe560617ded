"""A fake storage provisioner (plus the scheduler's part of WaitForFirstConsumer) that
runs against the API emulator through the real `kubernetes.aio` client, as a CSI
external-provisioner would against a cluster.

It watches PVCs and pods in one namespace:

- a pod that mounts a PVC is "scheduled": the node its affinity pins it to is recorded
  and written on the PVC as `volume.kubernetes.io/selected-node`, as the scheduler does;
- a Pending PVC of a class it serves (Immediate binding, or WaitForFirstConsumer once a
  node is selected) is handled per `mode`: `bind` sets `status.phase: Bound` through the
  status subresource, `fail` posts a `ProvisioningFailed` Warning event on it, `never`
  ignores it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
from anyio.abc import TaskStatus
from kubernetes.aio import client, watch

from healthd.sim.apiserver import ApiEmulator

Mode = Literal["bind", "fail", "never"]
SELECTED_NODE = "volume.kubernetes.io/selected-node"
FAILURE_MESSAGE = "failed to provision volume: rpc error: code = ResourceExhausted desc = no space"


@dataclass
class FakeProvisioner:
    core: client.CoreV1Api
    namespace: str
    modes: Mapping[str, Mode]  # storage class -> behaviour
    wait_for_consumer: frozenset[str] = frozenset()  # classes that bind on first consumer
    scheduled: dict[str, str] = field(default_factory=dict)  # pod name -> pinned node
    handled: set[str] = field(default_factory=set)

    async def watch_pvcs(self, *, task_status: TaskStatus[None]) -> None:
        await self._watch(
            self.core.list_namespaced_persistent_volume_claim, self._on_pvc, task_status
        )

    async def watch_pods(self, *, task_status: TaskStatus[None]) -> None:
        await self._watch(self.core.list_namespaced_pod, self._on_pod, task_status)

    async def _watch(self, lister: Any, handle: Any, task_status: TaskStatus[None]) -> None:
        # List first, then watch from that version: nothing created after `started` is missed.
        listing = await lister(self.namespace)
        task_status.started()
        async with watch.Watch(return_type="object") as stream:
            async for event in stream.stream(
                lister, self.namespace, resource_version=listing.metadata.resource_version
            ):
                if event["type"] in ("ADDED", "MODIFIED"):
                    await handle(event["raw_object"])

    async def _on_pod(self, pod: dict[str, Any]) -> None:
        claims = [
            v["persistentVolumeClaim"]["claimName"]
            for v in pod["spec"].get("volumes", [])
            if "persistentVolumeClaim" in v
        ]
        node = pinned_node(pod)
        if not claims or node is None:
            return
        self.scheduled[pod["metadata"]["name"]] = node
        for claim in claims:
            with contextlib.suppress(client.ApiException):  # the claim may be gone already
                await self.core.patch_namespaced_persistent_volume_claim(
                    claim, self.namespace, {"metadata": {"annotations": {SELECTED_NODE: node}}}
                )

    async def _on_pvc(self, pvc: dict[str, Any]) -> None:
        meta, cls = pvc["metadata"], pvc["spec"].get("storageClassName", "")
        ready = cls not in self.wait_for_consumer or SELECTED_NODE in meta.get("annotations", {})
        if pvc.get("status", {}).get("phase") != "Pending" or not ready:
            return
        if meta["uid"] in self.handled:
            return
        self.handled.add(meta["uid"])
        mode = self.modes.get(cls, "never")
        with contextlib.suppress(client.ApiException):  # the check may have deleted it
            if mode == "bind":
                await self.core.patch_namespaced_persistent_volume_claim_status(
                    meta["name"], self.namespace, {"status": {"phase": "Bound"}}
                )
            elif mode == "fail":
                await self.core.create_namespaced_event(self.namespace, _failure_event(meta))


def pinned_node(pod: dict[str, Any]) -> str | None:
    """The node a pod must run on: `spec.nodeName`, or a required node affinity on
    `metadata.name` (how DaemonSets pin pods)."""
    if pod["spec"].get("nodeName"):
        return str(pod["spec"]["nodeName"])
    terms = (
        pod["spec"]
        .get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms", [])
    )
    for term in terms:
        for expr in term.get("matchFields", []):
            if expr["key"] == "metadata.name" and expr["operator"] == "In":
                return str(expr["values"][0])
    return None


def _failure_event(pvc_meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"generateName": f"{pvc_meta['name']}."},
        "involvedObject": {
            "kind": "PersistentVolumeClaim",
            "name": pvc_meta["name"],
            "namespace": pvc_meta["namespace"],
            "uid": pvc_meta["uid"],
            "apiVersion": "v1",
        },
        "reason": "ProvisioningFailed",
        "type": "Warning",
        "message": FAILURE_MESSAGE,
        "source": {"component": "fake.csi.healthd.io"},
        "count": 1,
    }


@contextlib.asynccontextmanager
async def running(
    emulator: ApiEmulator,
    namespace: str,
    modes: Mapping[str, Mode],
    *,
    wait_for_consumer: frozenset[str] = frozenset(),
) -> AsyncIterator[FakeProvisioner]:
    """The fake provisioner, watching until the block ends."""
    async with emulator.async_client() as api_client, anyio.create_task_group() as tg:
        fake = FakeProvisioner(client.CoreV1Api(api_client), namespace, modes, wait_for_consumer)
        await tg.start(fake.watch_pvcs)
        await tg.start(fake.watch_pods)
        yield fake
        tg.cancel_scope.cancel()
