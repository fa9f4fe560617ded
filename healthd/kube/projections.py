"""Projections: each cached object cut down to the fields the controller reads.

client-go informers take a transform function that runs on every object before it
is stored; this is healthd's. A `Fields` tree names what to keep, key by key: `ALL`
keeps a value whole, a nested tree keeps those keys of a sub-object (applied to
every entry of a list of objects), and `Prefixed` keeps the keys of a string map
that start with given prefixes. `project` builds a new object of the kept parts
(whole values shared with the input, not copied), so everything else of the object
as received is freed as soon as the caller lets go of it; `share` interns a stored
object's keys and short strings, so the many Nodes of a fleet share their repeated
keys and values.

What each tree keeps is what the controller's code reads of that kind (the typed
views in healthd.kube.shapes, read through healthd.kube.objects and
healthd.capacity); `tests/controller/test_projected_reads.py` runs the controller over
objects that record every read and fails when one falls outside the tree. The
Node and pod trees also hold what the repair executor reads (its annotations,
cordon, taints, capacity, conditions, boot id; a pod's node, phase, deletion,
owner label and GPU requests): keep them when trimming.

What they drop matters as much: a Node condition's `lastHeartbeatTime` (and
kwok's or a kubelet's other status) is not kept, so a heartbeat projects to the
object already stored and costs the controller a decode and a compare
(`unchanged`), never a reaction.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Union

from healthd.kube.conventions import Keys


@dataclass(frozen=True)
class Prefixed:
    """Keep the entries of a string map whose keys start with one of `prefixes`."""

    prefixes: tuple[str, ...]


class _All:
    def __repr__(self) -> str:
        return "ALL"


ALL = _All()  # keep the value whole
_SHARED_CHARS = 64  # longer strings (a health annotation's JSON) are rarely repeated
Fields = Mapping[str, Union["Fields", _All, Prefixed]]
Projection = Callable[[dict[str, Any]], dict[str, Any]]

# Every object: what names it, versions it and says it is going away; an Event
# about it (healthd.kube.events) names it by these.
_IDENTITY: Fields = {"name": ALL, "namespace": ALL, "uid": ALL, "resourceVersion": ALL,
                     "generation": ALL, "deletionTimestamp": ALL}
_TYPE: Fields = {"apiVersion": ALL, "kind": ALL}
# A condition as the controller and the repair executor read it: not its heartbeat.
_CONDITION: Fields = {"type": ALL, "status": ALL, "reason": ALL, "message": ALL,
                      "lastTransitionTime": ALL, "observedGeneration": ALL}
# A container's GPU requests and limits (healthd.controller.resets.uses_gpu).
_CONTAINER: Fields = {"name": ALL, "resources": {"requests": ALL, "limits": ALL}}


def node_fields(keys: Keys) -> Fields:
    """A Node: labels (verdict, flavors' node labels), healthd's own annotations
    (health, ping reports, repair, last-run), cordon, taints, capacity and
    allocatable, conditions without heartbeats, and the boot id (repairs)."""
    return {**_TYPE,
            "metadata": {**_IDENTITY, "labels": ALL,
                         "annotations": Prefixed((keys.own_prefix, keys.label_prefix))},
            "spec": {"unschedulable": ALL, "taints": ALL},
            "status": {"capacity": ALL, "allocatable": ALL, "conditions": _CONDITION,
                       "nodeInfo": {"bootID": ALL}}}


# An AppWrapper pod: its owner label, node, phase, deletion and GPU requests.
POD_FIELDS: Fields = {
    **_TYPE,
    "metadata": {**_IDENTITY, "labels": ALL},
    "spec": {"nodeName": ALL, "containers": _CONTAINER, "initContainers": _CONTAINER},
    "status": {"phase": ALL},
}

# An AppWrapper: who manages it, its phase and its conditions whole (a reset's JSON
# patch tests the conditions list exactly as read), never its components.
APPWRAPPER_FIELDS: Fields = {
    **_TYPE,
    "metadata": _IDENTITY,
    "spec": {"managedBy": ALL},
    "status": {"phase": ALL, "conditions": ALL},
}


def project(obj: Mapping[str, Any], fields: Fields) -> dict[str, Any]:
    """The parts of `obj` that `fields` names (see the module docstring)."""
    kept: dict[str, Any] = {}
    for key, sub in fields.items():
        if key not in obj:
            continue
        kept[key] = _project_value(obj[key], sub)
    return kept


def _project_value(value: Any, sub: Fields | _All | Prefixed) -> Any:
    if isinstance(sub, _All):
        return value
    if isinstance(sub, Prefixed):
        return {k: v for k, v in value.items() if k.startswith(sub.prefixes)} \
            if isinstance(value, dict) else value
    if isinstance(value, dict):
        return project(value, sub)
    if isinstance(value, list):
        return [project(item, sub) if isinstance(item, dict) else item for item in value]
    return value  # a malformed value stays as sent: the readers judge it


def share(value: Any) -> Any:
    """`value` (an object, a list) with its keys and short strings interned, in
    place, and returned: a condition's reason, a capacity, a label repeat on every
    Node of a fleet (kwok's timestamps on many), and each decoded object holds its
    own copy of each; interned, the fleet holds one (a kwok Node: 6.1 -> 2.6 KiB).
    In place, because the watch and the store hold the same object; done when an
    object is stored, not in `project`, so a heartbeat that changes nothing does
    not pay for it. Names and versions are interned too, at the cost of an entry
    in the interpreter's table while they live."""
    if isinstance(value, dict):
        kept = [(sys.intern(k), _shared(v)) for k, v in value.items()]
        value.clear()
        value.update(kept)
    elif isinstance(value, list):
        value[:] = [_shared(item) for item in value]
    return value


def _shared(value: Any) -> Any:
    if isinstance(value, str):
        return sys.intern(value) if len(value) <= _SHARED_CHARS else value
    return share(value)


def projection(fields: Fields) -> Projection:
    """`project` with `fields`, as a watch takes it."""
    return lambda obj: project(obj, fields)


def without_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """For kinds cached whole (a few ClusterQueues and ResourceFlavors): all but
    server-side apply's bookkeeping, which nothing reads."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return obj


def unchanged(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether two projections of one object differ in nothing but their
    resourceVersion: a write the reader cannot see (a heartbeat, a field it drops)."""
    if old.keys() != new.keys():
        return False
    for key, value in new.items():
        if key != "metadata":
            if old[key] != value:
                return False
            continue
        before = old[key]
        if not (isinstance(before, dict) and isinstance(value, dict)):
            return bool(before == value)
        if before.keys() != value.keys() or any(
                before[k] != v for k, v in value.items() if k != "resourceVersion"):
            return False
    return True
