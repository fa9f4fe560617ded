"""The Kubernetes calls of the `pvc` probe, and the one place their errors are translated.

`checks` must not import `healthd`, so the probe cannot use `healthd.kube`; this module
is its small private equivalent. Every call the probe makes goes through `ProbeApi`,
and every failure of the official client (an HTTP error status, a refused connection,
a client-side timeout, a malformed answer) leaves it as one `ApiProblem` whose text is
a one-line reason fit for an UNKNOWN result.

Error tree:

    ApiProblem            "<what was being done>: <why it failed>"
      raised from kubernetes.aio.client.ApiException (HTTP status + Status message)
                  aiohttp.ClientError / OSError      (API unreachable)
                  TimeoutError                       (API too slow)
                  anything else                      (an answer we cannot read)

A 404 on delete is success (the object is already gone); a 404 on the storage class
read is returned as `None` so the check can tell "not found" from "cannot ask".
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

import aiohttp
import anyio

if TYPE_CHECKING:
    from kubernetes.aio.client.exceptions import ApiException

PVC_KIND = "PersistentVolumeClaim"
PROVISIONING_FAILED = "ProvisioningFailed"
_MAX_REASON = 300
_REWATCH_PAUSE_S = 0.2  # spacing between re-watches when the server ends a watch early
M = TypeVar("M")


# The official client is imported when a probe runs, not when the check is loaded:
# its typed API and model modules cost ~20 MiB of memory, and most agents run the
# probe rarely or never.
def _client() -> Any:
    from kubernetes.aio import client
    return client


def _api_exception() -> type[ApiException]:
    from kubernetes.aio.client.exceptions import ApiException
    return ApiException


def _watch() -> Any:
    from kubernetes.aio import watch  # no type hints
    return watch.Watch


class ApiProblem(Exception):
    """A Kubernetes call failed; `str(exc)` is a one-line reason."""


def describe_error(exc: BaseException) -> str:
    """One line saying why a call of the official client failed."""
    if isinstance(exc, _api_exception()):
        text = f"HTTP {exc.status} {exc.reason or ''}".rstrip()
        message = _status_message(exc.body)
        return f"{text}: {message}" if message else text
    if isinstance(exc, TimeoutError):  # before OSError: TimeoutError is one
        return "Kubernetes API did not answer in time"
    if isinstance(exc, aiohttp.ClientConnectionError | OSError):
        return f"Kubernetes API unreachable: {exc or type(exc).__name__}"
    if isinstance(exc, aiohttp.ClientError):
        return f"Kubernetes API request failed: {type(exc).__name__}: {exc}"
    return f"unexpected answer from the Kubernetes API: {type(exc).__name__}: {exc}"


def _status_message(body: Any) -> str:
    """The `message` of a Kubernetes Status body, or the raw body when it is not one."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not body:
        return ""
    try:
        status = json.loads(body)
    except ValueError:
        return " ".join(str(body).split())[:_MAX_REASON]
    message = status.get("message", "") if isinstance(status, dict) else ""
    return " ".join(str(message).split())[:_MAX_REASON]


@contextmanager
def translated(action: str) -> Iterator[None]:
    """Turn any client failure inside the block into `ApiProblem("<action>: <why>")`."""
    try:
        yield
    except ApiProblem:
        raise
    except Exception as exc:  # the client raises bare Exception for a malformed watch line
        raise ApiProblem(f"{action}: {describe_error(exc)}") from exc


def is_not_found(exc: BaseException) -> bool:
    cause = exc.__cause__ if isinstance(exc, ApiProblem) else exc
    return isinstance(cause, _api_exception()) and cause.status == 404


@dataclass(frozen=True)
class StorageClassInfo:
    """What the probe needs to know about a storage class."""

    name: str
    wait_for_first_consumer: bool
    reclaim_policy: str


class ProbeApi:
    """The probe's view of the cluster: one namespace, PVCs, consumer pods, events."""

    def __init__(self, api_client: Any, namespace: str) -> None:
        client = _client()
        self.core = client.CoreV1Api(api_client)
        self.storage = client.StorageV1Api(api_client)
        self.namespace = namespace

    async def storage_class(self, name: str) -> StorageClassInfo | None:
        """The storage class, or None when it does not exist."""
        try:
            with translated(f"cannot read storage class {name}"):
                sc = await self.storage.read_storage_class(name)
        except ApiProblem as exc:
            if is_not_found(exc):
                return None
            raise
        return StorageClassInfo(
            name=name,
            wait_for_first_consumer=sc.volume_binding_mode == "WaitForFirstConsumer",
            reclaim_policy=sc.reclaim_policy or "Delete",
        )

    async def create_pvc(self, manifest: Mapping[str, Any]) -> tuple[str, str]:
        """Create the PVC; return its resourceVersion (where the watch starts) and uid."""
        with translated("cannot create the test PVC"):
            body = _model(_client().V1PersistentVolumeClaim, manifest)
            pvc = await self.core.create_namespaced_persistent_volume_claim(self.namespace, body)
        return _meta(pvc, "resource_version"), _meta(pvc, "uid")

    async def create_pod(self, manifest: Mapping[str, Any]) -> None:
        with translated("cannot create the consumer pod"):
            body = _model(_client().V1Pod, manifest)
            await self.core.create_namespaced_pod(self.namespace, body)

    async def wait_bound(self, name: str, resource_version: str) -> None:
        """Return once the PVC is Bound, WATCHING it (never polling); the caller sets
        the deadline. A watch the server ends (timeout, 410 Gone) is resumed after
        re-reading the PVC, so a bind that happened in between is not missed."""
        version: str | None = resource_version
        while True:
            if version and await self._watch_until_bound(name, version):
                return
            with translated("cannot read the test PVC"):
                pvc = await self.core.read_namespaced_persistent_volume_claim(name, self.namespace)
            if pvc.status is not None and pvc.status.phase == "Bound":
                return
            version = _meta(pvc, "resource_version")
            await anyio.sleep(_REWATCH_PAUSE_S)

    async def _watch_until_bound(self, name: str, version: str) -> bool:
        """True when the watch saw the PVC Bound; False when the stream ended first."""
        stream = _watch()(return_type="object")  # plain dicts: no model parsing
        try:
            with translated("cannot watch the test PVC"):
                async for event in stream.stream(
                    self.core.list_namespaced_persistent_volume_claim,
                    self.namespace,
                    field_selector=f"metadata.name={name}",
                    resource_version=version,
                    timeout_seconds=300,
                ):
                    if _bound(event, name):
                        return True
        except ApiProblem as exc:
            if _is_gone(exc):
                return False  # history expired: re-read and watch again
            raise
        finally:
            await stream.close()
        return False

    async def provisioning_failure(self, name: str, uid: str = "") -> str | None:
        """The message of the newest ProvisioningFailed event about the PVC, if any."""
        with translated("cannot list events of the test PVC"):
            events = await self.core.list_namespaced_event(
                self.namespace, field_selector=f"involvedObject.name={name}"
            )
        failures = [
            e
            for e in events.items or []
            if e.reason == PROVISIONING_FAILED and _about(e.involved_object, name, uid)
        ]
        if not failures:
            return None
        newest = max(failures, key=_event_time)
        return " ".join((newest.message or PROVISIONING_FAILED).split())[:_MAX_REASON]

    async def delete_probe(self, name: str, *, pod: bool) -> None:
        """Delete the consumer pod (first: it holds the PVC) and the PVC; a missing
        object is fine. Both are attempted even when one fails."""
        targets = [("pod", name)] if pod else []
        await self._delete_all([*targets, ("PVC", name)])

    async def sweep(self, label_selector: str) -> int:
        """Delete every pod and PVC matching the selector (leftovers of earlier runs);
        return how many there were."""
        with translated("cannot list leftover probe pods"):
            pods = await self.core.list_namespaced_pod(
                self.namespace, label_selector=label_selector
            )
        with translated("cannot list leftover probe PVCs"):
            pvcs = await self.core.list_namespaced_persistent_volume_claim(
                self.namespace, label_selector=label_selector
            )
        targets = [("pod", _meta(p, "name")) for p in pods.items or []]
        targets += [("PVC", _meta(p, "name")) for p in pvcs.items or []]
        await self._delete_all(targets)
        return len(targets)

    async def _delete_all(self, targets: list[tuple[str, str]]) -> None:
        """Delete (kind, name) pairs in order; raise one ApiProblem naming every failure."""
        problems = []
        for kind, name in targets:
            try:
                await self._delete(kind, name)
            except ApiProblem as exc:
                problems.append(str(exc))
        if problems:
            raise ApiProblem("; ".join(problems))

    async def _delete(self, kind: str, name: str) -> None:
        try:
            with translated(f"cannot delete probe {kind} {name}"):
                if kind == "pod":  # no grace: the pause container has nothing to flush
                    await self.core.delete_namespaced_pod(
                        name, self.namespace, grace_period_seconds=0
                    )
                else:
                    await self.core.delete_namespaced_persistent_volume_claim(name, self.namespace)
        except ApiProblem as exc:
            if not is_not_found(exc):
                raise


def _model(cls: type[M], manifest: Mapping[str, Any]) -> M:
    """A client model from a manifest dict (a ValueError when it cannot be built)."""
    model = cls.from_dict(dict(manifest))  # type: ignore[attr-defined]
    if model is None:
        raise ValueError(f"cannot build a {cls.__name__} from the manifest")
    return cast(M, model)


def _meta(obj: Any, key: str) -> str:
    """A metadata field of a returned object as text ("" when absent)."""
    meta = getattr(obj, "metadata", None)
    return str(getattr(meta, key, None) or "")


def _bound(event: Mapping[str, Any], name: str) -> bool:
    if event.get("type") == "DELETED":
        raise ApiProblem(f"the test PVC {name} was deleted by someone else while waiting")
    obj = event.get("raw_object") or {}
    return bool((obj.get("status") or {}).get("phase") == "Bound")


def _is_gone(exc: ApiProblem) -> bool:
    return isinstance(exc.__cause__, _api_exception()) and exc.__cause__.status == 410


def _about(ref: Any, name: str, uid: str) -> bool:
    """The event is about our PVC (and not an older object that had its name)."""
    if ref is None or ref.name != name or (ref.kind and ref.kind != PVC_KIND):
        return False
    return not (uid and ref.uid and ref.uid != uid)


def _event_time(event: Any) -> float:
    when = event.last_timestamp or event.event_time or event.metadata.creation_timestamp
    return when.timestamp() if when is not None else 0.0
