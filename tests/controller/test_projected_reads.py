"""The caches keep only what the controller reads: a controller whose caches hold
objects that record every field read of them runs the story that touches every
activity (a node turning EVICT resets its AppWrapper and lowers the lendingLimit,
a cordon and a taint, recovery), and every field it read must be one the projection
keeps (healthd.kube.projections). A new read of a field the projection drops fails
here before it can fail in a cluster, where the field would silently be absent.

The objects are as a real server sends them: a kwok Node's status and annotations,
a pod's defaults, an AppWrapper's components; a read counts whether the field is
there or not.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import healthd.controller.caches as caches_module
from healthd.kube.conventions import Keys
from healthd.kube.projections import (
    ALL,
    APPWRAPPER_FIELDS,
    POD_FIELDS,
    Fields,
    Prefixed,
    node_fields,
)
from healthd.sim.apiserver import ApiEmulator
from tests.controller.conftest import (
    KubeFactory,
    appwrapper,
    controllers,
    default_flavor,
    eventually,
    gpu_limit,
    gpu_pod,
    node,
    phase,
    set_verdict,
    settings,
    settled,
    slack_queue,
)

pytestmark = pytest.mark.anyio

Path_ = tuple[str, ...]
EVERY = "*"  # the whole value was read (iterated, serialised)
# Reads made by the cache machinery itself (comparing a copy with the one stored)
# are not the controller's reads.
_PLUMBING = {str(Path(m.__file__ or "")) for m in (
    sys.modules["healthd.kube.watching"], sys.modules["healthd.kube.projections"])}


class Recorded(dict[str, Any]):
    """A JSON object that notes the path of every key read of it (or `*` when it is
    read whole) in `reads`; its sub-objects do the same, lists are transparent."""

    def __init__(self, obj: dict[str, Any], path: Path_, reads: set[Path_]) -> None:
        super().__init__({k: _wrap(v, (*path, k), reads) for k, v in obj.items()})
        self._path, self._reads = path, reads

    def _note(self, key: str) -> None:
        if sys._getframe(2).f_code.co_filename not in _PLUMBING:
            self._reads.add((*self._path, key))

    def __getitem__(self, key: str) -> Any:
        self._note(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self._note(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self._note(str(key))
        return super().__contains__(key)

    def keys(self) -> Any:
        self._note(EVERY)
        return super().keys()

    def items(self) -> Any:
        self._note(EVERY)
        return super().items()

    def values(self) -> Any:
        self._note(EVERY)
        return super().values()


def _wrap(value: Any, path: Path_, reads: set[Path_]) -> Any:
    if isinstance(value, dict):
        return Recorded(value, path, reads)
    if isinstance(value, list):
        return [_wrap(item, path, reads) for item in value]
    return value


def outside(fields: Fields, reads: set[Path_]) -> list[str]:
    """The reads (dotted paths) that `fields` does not keep."""
    return sorted(".".join(path) for path in reads if not _kept(fields, path))


def _kept(fields: Fields | Any, path: Path_) -> bool:
    for index, key in enumerate(path):
        if fields is ALL:
            return True
        if isinstance(fields, Prefixed):
            return key != EVERY and key.startswith(fields.prefixes) and index == len(path) - 1
        if key == EVERY or key not in fields:
            return False
        fields = fields[key]
    return True


# -- objects as a real API server sends them -------------------------------------------

def kwok_node(name: str) -> dict[str, Any]:
    obj = node(name)
    obj["metadata"].update({
        "uid": f"uid-{name}", "creationTimestamp": "2026-11-26T00:00:00Z",
        "annotations": {**obj["metadata"]["annotations"], "kwok.x-k8s.io/node": "fake",
                        "node.alpha.kubernetes.io/ttl": "0"},
        "managedFields": [{"manager": "kwok", "operation": "Update"}]})
    obj["spec"] = {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
                   "podCIDR": "10.0.0.0/24"}
    obj["status"].update({
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "kubelet is posting ready status",
                        "lastHeartbeatTime": "2026-11-26T00:00:00Z",
                        "lastTransitionTime": "2026-11-26T00:00:00Z"}],
        "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {"bootID": "b-1", "kubeletVersion": "fake", "architecture": "amd64"},
        "phase": "Running"})
    return obj


def defaulted_pod(owner: str, node_name: str) -> dict[str, Any]:
    obj = gpu_pod(owner, node_name)
    obj["metadata"]["ownerReferences"] = [{"kind": "AppWrapper", "name": owner}]
    obj["spec"].update({"tolerations": [{"key": "node.kubernetes.io/not-ready"}],
                        "volumes": [{"name": "kube-api-access", "projected": {}}],
                        "schedulerName": "default-scheduler"})
    obj["status"].update({"conditions": [{"type": "Ready", "status": "True"}],
                          "podIP": "10.1.0.1", "startTime": "2026-11-26T00:00:00Z"})
    return obj


def full_appwrapper(name: str) -> dict[str, Any]:
    obj = appwrapper(name)
    obj["spec"]["components"] = [{"template": {"kind": "Pod", "spec": {"containers": []}}}]
    obj["status"]["componentStatus"] = [{"name": name, "kind": "Pod"}]
    return obj


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, set[Path_]]]:
    """Per kind, the paths the controller read of its cached objects: the caches'
    projections are replaced by recorders of the whole object."""
    seen: dict[str, set[Path_]] = {"nodes": set(), "pods": set(), "appwrappers": set()}
    by_fields = {id(POD_FIELDS): "pods", id(APPWRAPPER_FIELDS): "appwrappers"}

    def recording(fields: Fields) -> Any:
        log = seen[by_fields.get(id(fields), "nodes")]
        return lambda obj: Recorded(obj, (), log)

    monkeypatch.setattr(caches_module, "projection", recording)
    yield seen


async def test_every_field_the_controller_reads_is_one_the_projection_keeps(
        api: ApiEmulator, kube_for: KubeFactory, reads: dict[str, set[Path_]]) -> None:
    api.seed(kwok_node("n1"), kwok_node("n2"), full_appwrapper("a"),
             defaulted_pod("a", "n1"), default_flavor(), slack_queue())
    async with controllers(kube_for, settings(), "ctl") as (ctl,):
        await settled(ctl)
        set_verdict(api, "n1", "EVICT", "XID_79")
        await eventually(lambda: phase(api, "a") == "Resetting" and gpu_limit(api) == "4")
        cordoned = api.get("Node", "n2")
        assert cordoned is not None
        cordoned["spec"]["unschedulable"] = True
        api.put(cordoned)
        await eventually(lambda: gpu_limit(api) == "0")
        set_verdict(api, "n1", "PASS")
        await eventually(lambda: gpu_limit(api) == "4")  # n2 still cordoned
    assert reads["nodes"] and reads["pods"] and reads["appwrappers"]
    assert outside(node_fields(Keys()), reads["nodes"]) == []
    assert outside(POD_FIELDS, reads["pods"]) == []
    assert outside(APPWRAPPER_FIELDS, reads["appwrappers"]) == []


def test_a_read_of_a_dropped_field_is_caught() -> None:
    log: set[Path_] = set()
    obj = Recorded(kwok_node("n1"), (), log)
    obj["status"].get("nodeInfo", {}).get("kubeletVersion")
    obj["metadata"]["annotations"].items()
    obj["status"]["conditions"][0].get("type")
    assert outside(node_fields(Keys()), log) == [
        "metadata.annotations.*", "status.nodeInfo.kubeletVersion"]
