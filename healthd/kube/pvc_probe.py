"""The `pvc` check's door to the cluster: `checks.probes.ProbeApi` over `Kube`.

`checks` never imports healthd, so the check gets a factory of these through
`Probes.pvc_api`. Every test object is labelled as this node's probe
(`<own prefix>probe=pvc`, `...node=<node>`, `...storage-class=<class>`, the full node
name in an annotation), so a later run finds and deletes what an agent killed
mid-probe left behind. Every `KubeError` leaves as one `ApiProblem`:

    ApiProblem  "<what was being done>: HTTP <status> <reason>: <server's message>"
                "<what was being done>: Kubernetes API unreachable: <why>"
                "<what was being done>: Kubernetes API did not answer in time"
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing, asynccontextmanager
from typing import Any

import anyio

from checks.probes import ApiProblem, ProbeApi, ProbeApiFactory, StorageClassInfo
from healthd.kube.client import Kube
from healthd.kube.conventions import Keys
from healthd.kube.errors import Gone, KubeError, NotFound
from healthd.kube.objects import EVENTS, PODS, PVCS, STORAGECLASSES, meta, name_of, phase_of
from healthd.kube.shapes import PersistentVolumeClaim, view
from healthd.kube.watching import DELETED, watch
from healthd.util.times import parse_time

PVC_KIND = "PersistentVolumeClaim"
PROVISIONING_FAILED = "ProvisioningFailed"
PROBE_VALUE = "pvc"
_MAX_LABEL = 63
_MAX_REASON = 300
_REWATCH_PAUSE_S = 0.2  # spacing between re-watches when the server ends a watch early


def label_value(text: str) -> str:
    """`text` as a label value: unchanged up to 63 characters, else cut and hashed."""
    if len(text) <= _MAX_LABEL:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return f"{text[: _MAX_LABEL - 11].rstrip('-.')}-{digest}"


def describe(exc: KubeError) -> str:
    """One line saying why a request failed."""
    message = " ".join(exc.message.split())[:_MAX_REASON]
    if exc.status is not None:
        return f"HTTP {exc.status} {exc.reason}".rstrip() + (f": {message}" if message else "")
    if exc.reason == "Timeout":
        return "Kubernetes API did not answer in time"
    return f"Kubernetes API unreachable: {message}"


@asynccontextmanager
async def translated(action: str) -> AsyncIterator[None]:
    """Turn a `KubeError` inside the block into `ApiProblem("<action>: <why>")`."""
    try:
        yield
    except KubeError as exc:
        raise ApiProblem(f"{action}: {describe(exc)}") from exc


def probe_object(manifest: Mapping[str, Any], keys: Keys, node: str,
                 storage_class: str) -> dict[str, Any]:
    """`manifest` labelled as `node`'s probe object: what the agent creates."""
    metadata = dict(manifest.get("metadata") or {})
    metadata["labels"] = {**metadata.get("labels", {}), keys.probe: PROBE_VALUE,
                          keys.node: label_value(node),
                          keys.storage_class: label_value(storage_class)}
    metadata["annotations"] = {**metadata.get("annotations", {}), keys.node_name: node}
    return {**manifest, "metadata": metadata}


def _not_found(exc: ApiProblem) -> bool:
    return isinstance(exc.__cause__, NotFound)


class KubeProbeApi(ProbeApi):
    """`ProbeApi` for the test objects of `node` in `namespace`."""

    def __init__(self, kube: Kube, keys: Keys, namespace: str, node: str) -> None:
        self.kube, self.keys, self.namespace, self.node = kube, keys, namespace, node

    @classmethod
    def factory(cls, kube: Kube, keys: Keys) -> ProbeApiFactory:
        """What `Probes.pvc_api` holds: (namespace, node) -> a probe API."""
        return lambda namespace, node: cls(kube, keys, namespace, node)

    @property
    def selector(self) -> str:
        """Label selector of every probe object of this node."""
        return f"{self.keys.probe}={PROBE_VALUE},{self.keys.node}={label_value(self.node)}"

    def _labelled(self, manifest: Mapping[str, Any], storage_class: str) -> dict[str, Any]:
        return probe_object(manifest, self.keys, self.node, storage_class)

    async def storage_class(self, name: str) -> StorageClassInfo | None:
        try:
            async with translated(f"cannot read storage class {name}"):
                sc = await self.kube.get(STORAGECLASSES, name)
        except ApiProblem as exc:
            if _not_found(exc):
                return None
            raise
        return StorageClassInfo(
            name=name,
            wait_for_first_consumer=sc.get("volumeBindingMode") == "WaitForFirstConsumer",
            reclaim_policy=str(sc.get("reclaimPolicy") or "Delete"),
        )

    async def create_pvc(self, manifest: Mapping[str, Any], storage_class: str
                         ) -> tuple[str, str]:
        async with translated("cannot create the test PVC"):
            pvc = await self.kube.create(PVCS, self._labelled(manifest, storage_class),
                                         self.namespace)
        return str(meta(pvc).get("resourceVersion") or ""), str(meta(pvc).get("uid") or "")

    async def create_pod(self, manifest: Mapping[str, Any], storage_class: str) -> None:
        async with translated("cannot create the consumer pod"):
            await self.kube.create(PODS, self._labelled(manifest, storage_class), self.namespace)

    async def wait_bound(self, name: str, resource_version: str) -> None:
        """Watch the PVC until Bound. A watch the server ends (timeout, 410 Gone) is
        resumed after re-reading the PVC, so a bind that happened in between is not
        missed."""
        version = resource_version
        while True:
            if version and await self._watch_until_bound(name, version):
                return
            async with translated("cannot read the test PVC"):
                pvc = view(PersistentVolumeClaim, await self.kube.get(PVCS, name, self.namespace))
            if phase_of(pvc) == "Bound":
                return
            version = str(meta(pvc).get("resourceVersion") or "")
            await anyio.sleep(_REWATCH_PAUSE_S)

    async def _watch_until_bound(self, name: str, version: str) -> bool:
        """True when the watch saw the PVC Bound; False when the stream ended first."""
        events = watch(self.kube, PVCS, self.namespace, field_selector=f"metadata.name={name}",
                       resource_version=version)
        try:
            async with translated("cannot watch the test PVC"), aclosing(events):
                async for event in events:
                    if event.type == DELETED:
                        raise ApiProblem(f"the test PVC {name} was deleted by someone else "
                                         "while waiting")
                    if phase_of(view(PersistentVolumeClaim, event.object)) == "Bound":
                        return True
        except ApiProblem as exc:
            if isinstance(exc.__cause__, Gone):
                return False  # history expired: re-read and watch again
            raise
        return False

    async def provisioning_failure(self, name: str, uid: str = "") -> str | None:
        async with translated("cannot list events of the test PVC"):
            listed = await self.kube.list(EVENTS, self.namespace,
                                          field_selector=f"involvedObject.name={name}")
        failures = [e for e in listed.get("items") or []
                    if isinstance(e, dict) and e.get("reason") == PROVISIONING_FAILED
                    and _about(e.get("involvedObject"), name, uid)]
        if not failures:
            return None
        newest = max(failures, key=_event_time)
        return " ".join(str(newest.get("message") or PROVISIONING_FAILED).split())[:_MAX_REASON]

    async def delete_probe(self, name: str, *, pod: bool) -> None:
        targets = [("pod", name)] if pod else []
        await self._delete_all([*targets, ("PVC", name)])

    async def sweep(self) -> int:
        async with translated("cannot list leftover probe pods"):
            pods = await self.kube.list(PODS, self.namespace, label_selector=self.selector)
        async with translated("cannot list leftover probe PVCs"):
            pvcs = await self.kube.list(PVCS, self.namespace, label_selector=self.selector)
        targets = [("pod", name_of(p)) for p in pods.get("items") or []]
        targets += [("PVC", name_of(p)) for p in pvcs.get("items") or []]
        await self._delete_all(targets)
        return len(targets)

    async def _delete_all(self, targets: list[tuple[str, str]]) -> None:
        """Delete (kind, name) pairs in order; raise one ApiProblem naming every failure."""
        problems = []
        for kind, name in targets:
            try:
                async with translated(f"cannot delete probe {kind} {name}"):
                    if kind == "pod":  # no grace: the pause container has nothing to flush
                        await self.kube.delete(PODS, name, self.namespace, grace_period_s=0)
                    else:
                        await self.kube.delete(PVCS, name, self.namespace)
            except ApiProblem as exc:
                problems.append(str(exc))
        if problems:
            raise ApiProblem("; ".join(problems))


def _about(ref: Any, name: str, uid: str) -> bool:
    """The event is about our PVC (and not an older object that had its name)."""
    if not isinstance(ref, dict) or ref.get("name") != name:
        return False
    if ref.get("kind") and ref.get("kind") != PVC_KIND:
        return False
    return not (uid and ref.get("uid") and ref.get("uid") != uid)


def _event_time(event: dict[str, Any]) -> float:
    for when in (event.get("lastTimestamp"), event.get("eventTime"),
                 meta(event).get("creationTimestamp")):
        if (at := parse_time(when)) is not None:
            return at
    return 0.0
