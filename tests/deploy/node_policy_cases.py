"""What the agent's admission policy (deploy/daemonset/base/node-policy.yaml) must
decide, as data: a list of `Case(description, old, new, allowed)`, each an UPDATE of
the Node `NODE` by the agent's own node-bound identity (user `AGENT`, token extra
`OWN`). `tests/deploy/test_node_policy.py` judges them with a CEL runtime; the same
table is replayed against a real API server (update `old` to `new` as the agent),
all but the cases of a field no Kubernetes has yet (`in_schema=False`: a real
server drops such a field before admission, so only the CEL runtime can judge them).

`node()` is a Node as a kubelet registers it (addresses, daemon endpoints, node info,
images, volumes, runtime handlers, features) with other owners' labels, annotations,
taints and conditions.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.deploy.manifests import AGENT

Obj = dict[str, Any]
NODE = "gpu-7"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
OWN = {NODE_NAME_EXTRA: [NODE]}
__all__ = ["AGENT", "CASES", "NODE", "NODE_NAME_EXTRA", "OWN", "Case", "edited", "node"]


@dataclass(frozen=True)
class Case:
    description: str
    old: Obj
    new: Obj
    allowed: bool
    in_schema: bool = True  # every field of old and new is one a real API server keeps


def node() -> Obj:
    """A GPU node as the kubelet and other owners left it."""
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE,
                     "labels": {"kubernetes.io/hostname": NODE, "nvidia.com/gpu.present": "true",
                                "nvidia.com/gpu.deploy.dcgm": "true",
                                "autopilot.ibm.com/gpuhealth": "PASS"},
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"podCIDR": "10.0.7.0/24",
                 "taints": [{"key": "example.com/maintenance", "effect": "NoSchedule"}]},
        "status": {
            "capacity": {"nvidia.com/gpu": "8", "cpu": "96"},
            "allocatable": {"nvidia.com/gpu": "8", "cpu": "95"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"},
                           {"type": "MemoryPressure", "status": "False"}],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.7"},
                          {"type": "Hostname", "address": NODE}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"kubeletVersion": "v1.35.0", "osImage": "Ubuntu 24.04",
                         "machineID": "abc", "systemUUID": "def", "bootID": "ghi",
                         "kernelVersion": "6.8.0", "containerRuntimeVersion": "containerd://2",
                         "kubeProxyVersion": "", "operatingSystem": "linux",
                         "architecture": "amd64"},
            "images": [{"names": ["ghcr.io/healthd/healthd:0.1.0"], "sizeBytes": 100}],
            "volumesInUse": ["kubernetes.io/csi/x^vol-1"],
            "volumesAttached": [{"name": "kubernetes.io/csi/x^vol-1", "devicePath": ""}],
            "runtimeHandlers": [
                {"name": "", "features": {"recursiveReadOnlyMounts": True,
                                          "userNamespaces": True}},
                {"name": "runc", "features": {"recursiveReadOnlyMounts": True,
                                              "userNamespaces": True}}],
            "features": {"supplementalGroupsPolicy": True},
        },
    }


def edited(change: Callable[[Obj], Any], base: Callable[[], Obj] = node) -> Obj:
    new = copy.deepcopy(base())
    change(new)
    return new


def labels(n: Obj) -> dict[str, str]:
    return n["metadata"]["labels"]


def annotations(n: Obj) -> dict[str, str]:
    return n["metadata"]["annotations"]


def conditions(n: Obj) -> list[Obj]:
    return n["status"]["conditions"]


def status(n: Obj) -> Obj:
    return n["status"]


GPU_UNHEALTHY = {"type": "GPUUnhealthy", "status": "True", "reason": "XID_79",
                 "message": "XID 79 on GPU 5"}
DCGM_3 = "autopilot.ibm.com/dcgm.level.3"


def _with(**annotations_: str) -> Callable[[], Obj]:
    """node() with these annotations (as an admin or the agent left them)."""
    return lambda: edited(lambda n: annotations(n).update(annotations_))


AGENT_WRITES: dict[str, Callable[[Obj], Any]] = {
    "verdict label": lambda n: labels(n).update({"autopilot.ibm.com/gpuhealth": "EVICT"}),
    "verdict label TESTING": lambda n: labels(n).update({"autopilot.ibm.com/gpuhealth":
                                                         "TESTING"}),
    "verdict label removed": lambda n: labels(n).pop("autopilot.ibm.com/gpuhealth"),
    "dcgm level label": lambda n: labels(n).update({DCGM_3: "PASS_2025-05-13_19.54.55UTC"}),
    "dcgm level label ERR": lambda n: labels(n).update({DCGM_3: "ERR_2025-05-13_19.54.55UTC"}),
    "health annotation": lambda n: annotations(n).update({"healthd.io/health": "{}"}),
    "last-run annotation": lambda n: annotations(n).update({"healthd.io/last-run": "{}"}),
    "nvml-released annotation": lambda n: annotations(n).update(
        {"healthd.io/nvml-released": "healthd-system-repair/healthd-gpu-reset-gpu-7-1"}),
    "clearing annotation": lambda n: annotations(n).update(
        {"healthd.io/clearing": '{"id":"c1","request":"true","start":"2026-01-01T00:00:00Z"}'}),
    "condition added": lambda n: conditions(n).append(GPU_UNHEALTHY),
    "nothing": lambda n: None,
}

FOREIGN_WRITES: dict[str, Callable[[Obj], Any]] = {
    "changes a foreign label": lambda n: labels(n).update({"nvidia.com/gpu.present": "false"}),
    "removes a foreign label": lambda n: labels(n).pop("kubernetes.io/hostname"),
    "adds a foreign label": lambda n: labels(n).update({"team.example.com/owner": "me"}),
    "adds a label beside its own": lambda n: labels(n).update({"autopilot.ibm.com/other": "x"}),
    "changes a foreign annotation": lambda n: annotations(n).update(
        {"node.alpha.kubernetes.io/ttl": "9"}),
    "removes every annotation": lambda n: n["metadata"].pop("annotations"),
    "adds a taint": lambda n: n["spec"]["taints"].append({"key": "x", "effect": "NoExecute"}),
    "removes the taints": lambda n: n["spec"].pop("taints"),
    "cordons": lambda n: n["spec"].update({"unschedulable": True}),
    "changes Ready": lambda n: conditions(n)[0].update({"status": "False"}),
    "removes a condition": lambda n: conditions(n).pop(1),
    "adds another condition": lambda n: conditions(n).append({"type": "X", "status": "True"}),
    "hides GPUs": lambda n: n["status"]["allocatable"].update({"nvidia.com/gpu": "0"}),
    "removes capacity": lambda n: n["status"].pop("capacity"),
    # Fields no rule of the policy names: it holds every part of the Node but the
    # agent's own to stay as it was, so these are refused like the named ones.
    "changes runtimeHandlers": lambda n: status(n)["runtimeHandlers"][1]["features"].update(
        {"userNamespaces": False}),
    "adds a runtime handler": lambda n: status(n)["runtimeHandlers"].append(
        {"name": "nvidia", "features": {"recursiveReadOnlyMounts": True,
                                        "userNamespaces": True}}),
    "changes features": lambda n: status(n)["features"].update(
        {"supplementalGroupsPolicy": False}),
    "removes features": lambda n: status(n).pop("features"),
    "declares features": lambda n: status(n).update({"declaredFeatures": ["ExampleFeature"]}),
    "changes generateName": lambda n: n["metadata"].update({"generateName": "gpu-"}),
    "sets the providerID": lambda n: n["spec"].update({"providerID": "example://gpu-7"}),
}

# Fields no Kubernetes has yet, as a later one may add them: refused all the same.
FUTURE_WRITES: dict[str, Callable[[Obj], Any]] = {
    "adds a status field the policy does not know": lambda n: status(n).update(
        {"futureField": {"x": 1}}),
    "adds a metadata field the policy does not know": lambda n: n["metadata"].update(
        {"futureField": "x"}),
    "adds a part of the Node the policy does not know": lambda n: n.update(
        {"futurePart": {"x": 1}}),
}

# What a stolen agent token must not do even under healthd's own prefixes.
OVERREACHING_WRITES: dict[str, Callable[[Obj], Any]] = {
    "verdict label not a verdict": lambda n: labels(n).update(
        {"autopilot.ibm.com/gpuhealth": "HEALTHY"}),
    "verdict label empty": lambda n: labels(n).update({"autopilot.ibm.com/gpuhealth": ""}),
    "dcgm level 9 label": lambda n: labels(n).update(
        {"autopilot.ibm.com/dcgm.level.9": "PASS_2025-05-13_19.54.55UTC"}),
    "dcgm level label of another shape": lambda n: labels(n).update(
        {"autopilot.ibm.com/dcgm.level.3.x": "PASS_2025-05-13_19.54.55UTC"}),
    "dcgm level label with any value": lambda n: labels(n).update({DCGM_3: "whatever"}),
    "another healthd.io annotation": lambda n: annotations(n).update({"healthd.io/extra": "x"}),
    "writes an on-demand request": lambda n: annotations(n).update({"healthd.io/run": "all"}),
    "writes a clear": lambda n: annotations(n).update({"healthd.io/clear": "true"}),
    "changes addresses": lambda n: status(n)["addresses"][0].update({"address": "10.9.9.9"}),
    "removes addresses": lambda n: status(n).pop("addresses"),
    "changes daemonEndpoints": lambda n: status(n).update(
        {"daemonEndpoints": {"kubeletEndpoint": {"Port": 1}}}),
    "changes nodeInfo": lambda n: status(n)["nodeInfo"].update({"kubeletVersion": "v9"}),
    "changes images": lambda n: status(n)["images"].append({"names": ["evil"], "sizeBytes": 1}),
    "changes volumesInUse": lambda n: status(n).update({"volumesInUse": []}),
    "changes volumesAttached": lambda n: status(n).pop("volumesAttached"),
    "adds a finalizer": lambda n: n["metadata"].update({"finalizers": ["example.com/hold"]}),
    "adds an owner reference": lambda n: n["metadata"].update({"ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "1234"}]}),
}


def _cases() -> list[Case]:
    out = [Case(f"agent: {what}", node(), edited(change), True)
           for what, change in AGENT_WRITES.items()]
    out += [
        Case("agent: changes its own condition",
             edited(lambda n: conditions(n).append(GPU_UNHEALTHY)),
             edited(lambda n: conditions(n).append({**GPU_UNHEALTHY, "status": "False"})), True),
        Case("agent: consumes a request and its id",
             _with(**{"healthd.io/run": "dcgm:3", "healthd.io/run-id": "r1"})(), node(), True),
        Case("agent: consumes a clear", _with(**{"healthd.io/clear": "true"})(), node(), True),
        Case("agent: takes a clear, keeping it in flight",
             _with(**{"healthd.io/clear": "true", "healthd.io/run-id": "c1"})(),
             _with(**{"healthd.io/clearing": "{}"})(), True),
        Case("agent: removes the clear in flight with its answer",
             _with(**{"healthd.io/clearing": "{}"})(),
             _with(**{"healthd.io/last-run": "{}"})(), True),
        Case("agent: withdraws its nvml-released annotation",
             _with(**{"healthd.io/nvml-released": "healthd-system-repair/j-1"})(), node(), True),
        Case("agent: first verdict on a node without labels",
             edited(lambda n: n["metadata"].pop("labels")),
             edited(lambda n: n["metadata"].update(
                 {"labels": {"autopilot.ibm.com/gpuhealth": "PASS"}})), True),
        Case("agent: leaves another owner's odd key under its prefix alone",
             edited(lambda n: labels(n).update({"autopilot.ibm.com/dcgm.level.9": "x"})),
             edited(lambda n: labels(n).update({"autopilot.ibm.com/dcgm.level.9": "x",
                                                "autopilot.ibm.com/gpuhealth": "WARN"})),
             True),
        Case("refused: changes a request instead of consuming it",
             _with(**{"healthd.io/run": "dcgm:3"})(),
             _with(**{"healthd.io/run": "all"})(), False),
        Case("refused: removes another owner's odd key under its prefix",
             edited(lambda n: labels(n).update({"autopilot.ibm.com/dcgm.level.9": "x"})),
             node(), False),
        Case("refused: changes an existing owner reference",
             edited(lambda n: n["metadata"].update({"ownerReferences": [
                 {"apiVersion": "v1", "kind": "ConfigMap", "name": "a", "uid": "1"}]})),
             edited(lambda n: n["metadata"].update({"ownerReferences": [
                 {"apiVersion": "v1", "kind": "ConfigMap", "name": "b", "uid": "2"}]})),
             False),
    ]
    out += [Case(f"refused: {what}", node(), edited(change), False)
            for what, change in {**FOREIGN_WRITES, **OVERREACHING_WRITES}.items()]
    out += [Case(f"refused: {what}", node(), edited(change), False, in_schema=False)
            for what, change in FUTURE_WRITES.items()]
    out += [
        Case("refused: changes a status field the policy does not know",
             edited(lambda n: status(n).update({"futureField": {"x": 1}})),
             edited(lambda n: status(n).update({"futureField": {"x": 2}})), False,
             in_schema=False),
        Case("agent: leaves a field the policy does not know alone",
             edited(lambda n: status(n).update({"futureField": {"x": 1}})),
             edited(lambda n: (status(n).update({"futureField": {"x": 1}}),
                               conditions(n).append(GPU_UNHEALTHY))), True,
             in_schema=False),
    ]
    return out


CASES: list[Case] = _cases()
