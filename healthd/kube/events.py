"""Kubernetes Events: the record a person reads with `kubectl describe`.

`EventRecorder` posts core v1 Events about any object (a Node, an AppWrapper, a
Job). Every Event names its object by kind, apiVersion, name and uid: `kubectl
describe` finds an object's Events by uid, so one without it is invisible there.
When the caller holds only a name, the recorder reads the object for its uid.
Recording is best effort by design: an Event that cannot be written is logged and
dropped, never an error for the caller, because no verdict or reset may wait on,
or fail because of, its paper trail.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from healthd.kube.client import Kube
from healthd.kube.errors import KubeError
from healthd.kube.objects import (
    APPWRAPPERS,
    CLUSTERQUEUES_V1BETA1,
    CLUSTERQUEUES_V1BETA2,
    EVENTS,
    JOBS,
    LEASES,
    NODES,
    PODS,
    Resource,
    meta,
)
from healthd.util.times import rfc3339

log = logging.getLogger(__name__)

MAX_MESSAGE = 1024  # the server's own limit on an Event's message
_KINDS = {(r.api_version, r.kind): r for r in (
    NODES, PODS, JOBS, LEASES, APPWRAPPERS, CLUSTERQUEUES_V1BETA1, CLUSTERQUEUES_V1BETA2)}
NORMAL = "Normal"
WARNING = "Warning"


def _trim(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."


def involved_reference(obj: Mapping[str, Any], res: Resource | None = None) -> dict[str, str]:
    """An ObjectReference to `obj`. Objects from a list carry no kind/apiVersion:
    `res` supplies them."""
    m = meta(obj)
    ref = {
        "kind": str(obj.get("kind") or (res.kind if res else "")),
        "apiVersion": str(obj.get("apiVersion") or (res.api_version if res else "")),
        "name": str(m.get("name") or ""),
        "namespace": str(m.get("namespace") or ""),
        "uid": str(m.get("uid") or ""),
        "resourceVersion": str(m.get("resourceVersion") or ""),
    }
    return {k: v for k, v in ref.items() if v}


class EventRecorder:
    """Posts Events as `component` (running on `host`, e.g. the node name)."""

    def __init__(self, kube: Kube, *, component: str, host: str | None = None) -> None:
        self._kube = kube
        self.component = component
        self.host = host

    def event(self, involved: Mapping[str, Any], *, type: str, reason: str, message: str,
              res: Resource | None = None) -> dict[str, Any]:
        """The Event object `record` posts (namespace: the involved object's, or
        "default" for cluster-scoped objects such as Nodes)."""
        ref = involved_reference(involved, res)
        now = rfc3339(time.time())
        source = {"component": self.component}
        if self.host:
            source["host"] = self.host
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{ref.get('name') or 'unknown'}.",
                         "namespace": ref.get("namespace") or "default"},
            "involvedObject": ref,
            "type": type,
            "reason": reason,
            "message": _trim(message),
            "source": source,
            "reportingComponent": self.component,
            "reportingInstance": self.host or self.component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }

    async def record(self, involved: Mapping[str, Any], *, type: str, reason: str, message: str,
                     res: Resource | None = None) -> None:
        """Post one Event about `involved`; never raises (a failure is logged)."""
        try:
            body = self.event(involved, type=type, reason=reason, message=message, res=res)
            if "uid" not in body["involvedObject"]:
                await self._add_uid(body["involvedObject"], res)
            await self._kube.create(EVENTS, body)
        except KubeError as exc:
            log.warning("could not record event %s on %s: %s", reason,
                        meta(involved).get("name"), exc)
        except Exception:  # a malformed object must not break the caller's work
            log.exception("could not record event %s", reason)

    async def _add_uid(self, ref: dict[str, str], res: Resource | None) -> None:
        """Read the object `ref` names for its uid (and its kind and apiVersion, when
        `res` knows them better). An object that cannot be read keeps its Event, without."""
        res = res or _KINDS.get((ref.get("apiVersion", ""), ref.get("kind", "")))
        if res is None or not ref.get("name"):
            return
        try:
            obj = await self._kube.get(res, ref["name"], ref.get("namespace"))
        except KubeError as exc:
            log.debug("no uid for the event on %s %s: %s", res.kind, ref["name"], exc)
            return
        fresh = involved_reference(obj, res)
        ref.update({k: fresh[k] for k in ("kind", "apiVersion", "uid") if k in fresh})
