"""Kubernetes collections healthd talks to, and how their URLs are built.

A `Resource` names one collection (group, version, plural, namespaced) and knows
its REST paths, so no module spells an API path by hand. The constants below are
every collection the agent and controller use.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from healthd.kube.shapes import (
    AppWrapper,
    Condition,
    Container,
    ContainerStatus,
    Node,
    ObjectMeta,
    PersistentVolumeClaim,
    Pod,
    ResourceFlavor,
    T,
    Taint,
    entries,
    part,
    view,
)


def _segment(value: str) -> str:
    # Names are DNS subdomains in practice; quote anyway so a bad name cannot change the path.
    return quote(value, safe="")


@dataclass(frozen=True)
class Resource:
    """One collection of one API group/version, e.g. `Resource("", "v1", "nodes", False)`."""

    group: str  # "" for the core group
    version: str
    plural: str
    namespaced: bool
    kind: str = ""  # for error messages and created bodies

    @property
    def api_version(self) -> str:
        """`v1`, `batch/v1`, ...: the value of `apiVersion` in objects."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def base(self) -> str:
        """`/api/v1` or `/apis/<group>/<version>`."""
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def path(self, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
        """The REST path of the collection (all namespaces when `namespace` is None),
        or of one object, or of one object's subresource."""
        parts = [self.base]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{_segment(namespace)}")
        elif namespace and not self.namespaced:
            raise ValueError(f"{self.plural} are not namespaced (got namespace {namespace!r})")
        parts.append(self.plural)
        if name is not None:
            if not name:
                raise ValueError(f"empty {self.plural} name")
            parts.append(_segment(name))
            if subresource:
                parts.append(_segment(subresource))
        elif subresource:
            raise ValueError("a subresource needs an object name")
        return "/".join(parts)

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


NODES = Resource("", "v1", "nodes", False, "Node")
NAMESPACES = Resource("", "v1", "namespaces", False, "Namespace")
PODS = Resource("", "v1", "pods", True, "Pod")
EVENTS = Resource("", "v1", "events", True, "Event")
PVCS = Resource("", "v1", "persistentvolumeclaims", True, "PersistentVolumeClaim")
JOBS = Resource("batch", "v1", "jobs", True, "Job")
STORAGECLASSES = Resource("storage.k8s.io", "v1", "storageclasses", False, "StorageClass")
LEASES = Resource("coordination.k8s.io", "v1", "leases", True, "Lease")
ENDPOINTSLICES = Resource("discovery.k8s.io", "v1", "endpointslices", True, "EndpointSlice")
APPWRAPPERS = Resource("workload.codeflare.dev", "v1beta2", "appwrappers", True, "AppWrapper")
CLUSTERQUEUES_V1BETA1 = Resource("kueue.x-k8s.io", "v1beta1", "clusterqueues", False,
                                 "ClusterQueue")
CLUSTERQUEUES_V1BETA2 = Resource("kueue.x-k8s.io", "v1beta2", "clusterqueues", False,
                                 "ClusterQueue")
RESOURCEFLAVORS_V1BETA1 = Resource("kueue.x-k8s.io", "v1beta1", "resourceflavors", False,
                                   "ResourceFlavor")
RESOURCEFLAVORS_V1BETA2 = Resource("kueue.x-k8s.io", "v1beta2", "resourceflavors", False,
                                   "ResourceFlavor")


# -- reading fields anyone may write ---------------------------------------------------
# An object from the API server (or an annotation's JSON) may hold any shape where a
# field is expected: these read it as the shape wanted, or as empty.


def as_dict(value: object) -> dict[str, Any]:
    """`value` when it is a JSON object, else {}."""
    return value if isinstance(value, dict) else {}


def as_list(value: object) -> list[Any]:
    """`value` when it is a JSON list, else []."""
    return value if isinstance(value, list) else []


def dicts(value: object) -> list[dict[str, Any]]:
    """The JSON objects in `value` when it is a list (anything else in it is skipped)."""
    return [item for item in as_list(value) if isinstance(item, dict)]


def meta(obj: Mapping[str, Any]) -> ObjectMeta:
    """`obj["metadata"]` of any object (typed view or not), {} when absent or malformed."""
    return view(ObjectMeta, obj.get("metadata")) if isinstance(obj, Mapping) else {}


def slim(obj: T) -> T:
    """`obj` without `metadata.managedFields`, server-side apply's bookkeeping, which
    healthd never reads and which is a third of a Node's JSON on a real API server
    (client-go informers drop it the same way): what a cache keeps."""
    meta(obj).pop("managedFields", None)
    return obj


def name_of(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("name") or "")


def namespace_of(obj: Mapping[str, Any]) -> str | None:
    ns = meta(obj).get("namespace")
    return str(ns) if ns else None


def resource_version_of(obj: Mapping[str, Any]) -> str | None:
    rv = meta(obj).get("resourceVersion")
    return str(rv) if rv else None


def is_deleting(obj: Mapping[str, Any]) -> bool:
    """`metadata.deletionTimestamp` is set: the object is on its way out."""
    return bool(meta(obj).get("deletionTimestamp"))


def _strings(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    """`metadata.labels`, {} when absent or malformed."""
    return _strings(meta(obj).get("labels"))


def annotations_of(obj: Mapping[str, Any]) -> dict[str, str]:
    """`metadata.annotations`, {} when absent or malformed."""
    return _strings(meta(obj).get("annotations"))


def spec_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    """`obj["spec"]` of an object without a typed view (healthd.kube.shapes), {} when
    absent or malformed."""
    return as_dict(obj.get("spec")) if isinstance(obj, Mapping) else {}


def status_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    """`obj["status"]` of an object without a typed view, {} when absent or malformed."""
    return as_dict(obj.get("status")) if isinstance(obj, Mapping) else {}


def condition_of(obj: Node | Pod | AppWrapper, kind: str) -> Condition | None:
    """The `status.conditions` entry of type `kind`, or None."""
    return next((c for c in entries(part(obj.get("status")).get("conditions"))
                 if c.get("type") == kind), None)


# -- Pods ------------------------------------------------------------------------------


def phase_of(obj: Pod | AppWrapper | PersistentVolumeClaim) -> str:
    """`status.phase` of a pod (or an AppWrapper, a PVC), "" when absent."""
    return str(part(obj.get("status")).get("phase") or "")


def node_name_of(pod: Pod) -> str:
    """`spec.nodeName`: the node a pod is bound to, "" while unbound."""
    return str(part(pod.get("spec")).get("nodeName") or "")


def containers_of(pod: Pod, *, init: bool = False) -> list[Container]:
    """`spec.containers` (or `spec.initContainers` with `init`)."""
    spec = part(pod.get("spec"))
    return entries(spec.get("initContainers") if init else spec.get("containers"))


def amounts_of(container: Container, resource: str) -> list[object]:
    """What a container requests and limits of `resource`, as written (each absent
    one left out): quantities are read by their users, who differ on what counts."""
    resources = part(container.get("resources"))
    found = (part(resources.get("requests")).get(resource),
             part(resources.get("limits")).get(resource))
    return [amount for amount in found if amount is not None]


def container_statuses_of(pod: Pod) -> list[ContainerStatus]:
    """`status.containerStatuses` (regular containers), [] before the kubelet reports."""
    return entries(part(pod.get("status")).get("containerStatuses"))


# -- Nodes and flavors -----------------------------------------------------------------


def is_cordoned(node: Node) -> bool:
    """`spec.unschedulable` is true (`kubectl cordon`)."""
    return part(node.get("spec")).get("unschedulable") is True


def taints_of(node: Node) -> list[Taint]:
    return entries(part(node.get("spec")).get("taints"))


def resources_of(node: Node, source: str = "capacity") -> dict[str, Any]:
    """`status.capacity` (or `status.allocatable` when `source` says so): resource ->
    quantity as written, {} when absent or malformed."""
    status = part(node.get("status"))
    return as_dict(status.get("allocatable") if source == "allocatable"
                   else status.get("capacity"))


def node_labels_of(flavor: ResourceFlavor) -> dict[str, str]:
    """A Kueue ResourceFlavor's `spec.nodeLabels` (the nodes it stands for)."""
    return _strings(part(flavor.get("spec")).get("nodeLabels"))


def items_of(listing: object, shape: type[T]) -> list[T]:
    """The objects of a list response (`items`) seen as `shape`; [] when it is not one."""
    return [view(shape, item) for item in dicts(as_dict(listing).get("items"))]


# Annotations are anyone's to write (node-patch rights, a bug): whatever healthd reads
# from one is decoded within these bounds, never trusted for size or shape.
MAX_JSON_BYTES = 256 * 1024  # the API's limit for all of an object's annotations together
MAX_JSON_DEPTH = 32  # healthd's own documents nest 5 deep at most


class Unreadable(ValueError):
    """JSON text that is too large, nested too deep, or not JSON at all."""


def bounded_json(text: str | bytes, *, max_bytes: int = MAX_JSON_BYTES,
                 max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Decode `text`, refusing (`Unreadable`, saying why) anything over `max_bytes` or
    nested deeper than `max_depth`. Python's decoder recurses per level: without the
    bound a deeply nested value raises RecursionError, which no caller expects."""
    size = len(text) if isinstance(text, bytes) else len(text.encode(errors="replace"))
    if size > max_bytes:
        raise Unreadable(f"{size} bytes, more than the {max_bytes} allowed")
    try:
        value = json.loads(text)
    except RecursionError:
        raise Unreadable(f"nested deeper than {max_depth} levels") from None
    except ValueError as exc:
        raise Unreadable(f"not JSON: {exc}") from None
    if _deeper_than(value, max_depth):
        raise Unreadable(f"nested deeper than {max_depth} levels")
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether lists and objects in `value` nest more than `limit` deep (no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(
            item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def read_annotation_json(obj: Mapping[str, Any], key: str) -> tuple[dict[str, Any], str]:
    """The JSON object in annotation `key` of `obj`, and "" ; ({}, "") when the
    annotation is absent; ({}, why) when it is there but unreadable (too large, too
    deep, not JSON, not an object)."""
    annotations = meta(obj).get("annotations")
    text = annotations.get(key) if isinstance(annotations, dict) else None
    if text is None:
        return {}, ""
    if not isinstance(text, str):
        return {}, "not a string"
    try:
        body = bounded_json(text)
    except Unreadable as exc:
        return {}, str(exc)
    return (body, "") if isinstance(body, dict) else ({}, "not a JSON object")


def natural_name_key(name: str) -> tuple[tuple[int, str], ...]:
    """Sort key for names with numbers in them: gpu-node-2 before gpu-node-10."""
    return tuple((int(part), "") if part.isdigit() else (-1, part)
                 for part in re.split(r"(\d+)", name))


def key_of(obj: Mapping[str, Any]) -> str:
    """`namespace/name`, or `name` for cluster-scoped objects: a cache key."""
    ns = namespace_of(obj)
    return f"{ns}/{name_of(obj)}" if ns else name_of(obj)
