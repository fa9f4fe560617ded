"""The resource table: which kinds the emulator serves and how each behaves.

One line per resource keeps adding a kind cheap. Versions of one kind that the real
server stores once (core and `events.k8s.io` Events, Kueue `v1beta1`/`v1beta2`) share
a `storage` name; `renames` maps each field of the storage shape to the name this
version uses, which is all the conversion those pairs need.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

Obj = dict[str, Any]
J = TypeVar("J")

# Field selectors every resource supports, like the real server.
COMMON_FIELDS = ("metadata.name", "metadata.namespace")


@dataclass(frozen=True)
class ResourceType:
    """One served resource of one group/version."""

    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool
    status: bool = False  # has a /status subresource
    returns_deleted: bool = False  # DELETE answers the object instead of a Status
    keeps_status_on_create: bool = False  # nodes register with their status
    initial_status: Obj | None = None  # what create sets when it drops the status
    fields: tuple[str, ...] = ()  # extra field-selector labels
    storage: str = ""  # shared storage name; defaults to group/plural
    renames: tuple[tuple[str, str], ...] = ()  # (storage path, this version's path)
    short_names: tuple[str, ...] = field(default=())

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def storage_key(self) -> str:
        return self.storage or f"{self.group}/{self.plural}"

    @property
    def is_custom(self) -> bool:
        """Custom resources: no strategic merge patch, like a CRD-backed kind."""
        return self.group in CUSTOM_GROUPS

    @property
    def field_labels(self) -> frozenset[str]:
        return frozenset(COMMON_FIELDS + self.fields)


CUSTOM_GROUPS = frozenset({"workload.codeflare.dev", "kueue.x-k8s.io",
                           "remediation.medik8s.io"})

_EVENT_FIELDS = (
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "reason",
    "type",
)
_EVENTS_V1_RENAMES = (
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
)
_KUEUE_V1BETA1_RENAMES = (("spec.cohortName", "spec.cohort"),)

R = ResourceType
RESOURCES: tuple[ResourceType, ...] = (
    R("", "v1", "nodes", "Node", False, status=True, keeps_status_on_create=True,
      fields=("spec.unschedulable",), short_names=("no",)),
    R("", "v1", "namespaces", "Namespace", False, status=True, returns_deleted=True,
      initial_status={"phase": "Active"}, fields=("status.phase",), short_names=("ns",)),
    R("", "v1", "pods", "Pod", True, status=True, returns_deleted=True,
      initial_status={"phase": "Pending"},
      fields=("spec.nodeName", "status.phase", "spec.schedulerName", "spec.serviceAccountName"),
      short_names=("po",)),
    R("", "v1", "events", "Event", True, fields=_EVENT_FIELDS, storage="events",
      short_names=("ev",)),
    R("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, status=True,
      returns_deleted=True, initial_status={"phase": "Pending"}, fields=("status.phase",),
      short_names=("pvc",)),
    R("", "v1", "services", "Service", True, status=True, returns_deleted=True,
      short_names=("svc",)),
    R("", "v1", "endpoints", "Endpoints", True, short_names=("ep",)),
    R("", "v1", "configmaps", "ConfigMap", True, short_names=("cm",)),
    R("events.k8s.io", "v1", "events", "Event", True, storage="events",
      renames=_EVENTS_V1_RENAMES, short_names=("ev",)),
    R("batch", "v1", "jobs", "Job", True, status=True, initial_status={}),
    R("coordination.k8s.io", "v1", "leases", "Lease", True),
    R("storage.k8s.io", "v1", "storageclasses", "StorageClass", False, returns_deleted=True,
      short_names=("sc",)),
    R("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True),
    R("workload.codeflare.dev", "v1beta2", "appwrappers", "AppWrapper", True, status=True,
      returns_deleted=True, short_names=("aw",)),
    R("kueue.x-k8s.io", "v1beta2", "clusterqueues", "ClusterQueue", False, status=True,
      returns_deleted=True, short_names=("cq",)),
    R("kueue.x-k8s.io", "v1beta1", "clusterqueues", "ClusterQueue", False, status=True,
      returns_deleted=True, renames=_KUEUE_V1BETA1_RENAMES, short_names=("cq",)),
    R("kueue.x-k8s.io", "v1beta2", "resourceflavors", "ResourceFlavor", False,
      returns_deleted=True, short_names=("rf",)),
    R("kueue.x-k8s.io", "v1beta1", "resourceflavors", "ResourceFlavor", False,
      returns_deleted=True, short_names=("rf",)),
    # medik8s Self Node Remediation: the default reboot hand-off of repairs
    R("remediation.medik8s.io", "v1alpha1", "selfnoderemediations", "SelfNodeRemediation",
      True, status=True, returns_deleted=True, short_names=("snr",)),
    R("remediation.medik8s.io", "v1alpha1", "selfnoderemediationtemplates",
      "SelfNodeRemediationTemplate", True, status=True, returns_deleted=True,
      short_names=("snrt",)),
)


def _get_path(obj: Obj, path: str) -> tuple[bool, Any]:
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _move(obj: Obj, src: str, dst: str) -> None:
    found, value = _get_path(obj, src)
    if not found:
        return
    *parents, leaf = src.split(".")
    holder = obj
    for part in parents:
        holder = holder[part]
    del holder[leaf]
    *parents, leaf = dst.split(".")
    holder = obj
    for part in parents:
        holder = holder.setdefault(part, {})
    holder[leaf] = value


def copy_json(value: J) -> J:
    """A deep copy of JSON-shaped data (dicts, lists, scalars): several times faster
    than `copy.deepcopy`, which the store's every read and write would pay."""
    if isinstance(value, dict):
        return cast(J, {key: copy_json(item) for key, item in value.items()})
    if isinstance(value, list):
        return cast(J, [copy_json(item) for item in value])
    return value


def to_version(obj: Obj, rt: ResourceType) -> Obj:
    """A stored object in the shape `rt` serves (the caller's copy is changed)."""
    for storage_path, version_path in rt.renames:
        _move(obj, storage_path, version_path)
    obj["apiVersion"] = rt.group_version
    obj["kind"] = rt.kind
    return obj


def from_version(obj: Obj, rt: ResourceType) -> Obj:
    """An object sent to `rt` in the storage shape (the caller's copy is changed)."""
    for storage_path, version_path in rt.renames:
        _move(obj, version_path, storage_path)
    obj.pop("apiVersion", None)
    obj.pop("kind", None)
    return obj


def get_field(obj: Obj, path: str) -> Any:
    """The value at a dotted path, or None."""
    return _get_path(obj, path)[1]


class ResourceTable:
    """The served resources, with group/versions that can be switched off."""

    def __init__(self, resources: tuple[ResourceType, ...] = RESOURCES,
                 unserved: tuple[str, ...] = ()) -> None:
        self._all = resources
        self._unserved = set(unserved)

    def serve(self, group_version: str, served: bool = True) -> None:
        """Serve or hide a group/version (e.g. `kueue.x-k8s.io/v1beta2`)."""
        if served:
            self._unserved.discard(group_version)
        else:
            self._unserved.add(group_version)

    def served(self) -> list[ResourceType]:
        return [rt for rt in self._all if rt.group_version not in self._unserved]

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        for rt in self.served():
            if (rt.group, rt.version, rt.plural) == (group, version, plural):
                return rt
        return None

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        """Any known resource, served or not: direct store access ignores serving."""
        for rt in self._all:
            if rt.group_version == api_version and rt.kind == kind:
                return rt
        return None

    def group_versions(self) -> dict[str, list[str]]:
        """Served versions per group, preferred (newest listed first in the table) first."""
        out: dict[str, list[str]] = {}
        for rt in self.served():
            versions = out.setdefault(rt.group, [])
            if rt.version not in versions:
                versions.append(rt.version)
        return out
