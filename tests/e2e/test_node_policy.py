"""The admission policy's table of cases (tests/deploy/node_policy_cases.py), replayed
on the real API server: each case's Node is registered as `old`, the DaemonSet gives it
an agent Pod, and the agent, with a token bound to that Pod, updates the Node to `new`
(a JSON patch: metadata and spec through the Node, status through nodes/status, as
the agent writes; the kubelet's fields too, runtime handlers and features). The
cases of a field no Kubernetes has yet are left out: the server drops such a field.
What the table says is allowed goes through; everything else is refused (403), and the
Node is left as it was.

The controller's policy (controller-node-policy.yaml) is checked the same way for the
one label write it allows: while it resets a node's GPUs the controller may set the
GPU Operator's operand labels the node carries to "false" and put them back, and
change no other label, nor add or remove one."""

from __future__ import annotations

import copy
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from healthd.sim.operands import OPERANDS
from tests.deploy.node_policy_cases import CASES as ALL_CASES
from tests.deploy.node_policy_cases import Case
from tests.e2e.healthd import GPU_NODE_LABEL, Healthd, eventually

Obj = dict[str, Any]
CASES = [case for case in ALL_CASES if case.in_schema]
# Cluster-side fields a real server adds to a registered Node, never part of a case.
SERVER_ANNOTATIONS = ("node.alpha.kubernetes.io/ttl",)
# The kubelet's own fields of the status, which no rule of the policy names: the
# server must hold them as registered, or their cases would prove nothing.
KUBELET_FIELDS = ("runtimeHandlers", "features", "declaredFeatures")


def _registered(case: Case, name: str, which: str) -> Obj:
    """The case's `old` or `new` Node under this test's name, selected by the agent's
    DaemonSet (its label added on both sides, so it is no part of the change)."""
    node = copy.deepcopy(case.old if which == "old" else case.new)
    meta = node["metadata"]
    meta["name"] = name
    labels = meta.setdefault("labels", {})
    labels[GPU_NODE_LABEL] = "true"
    if "kubernetes.io/hostname" in labels:
        labels["kubernetes.io/hostname"] = name
    for address in node.get("status", {}).get("addresses", []):
        if address.get("type") == "Hostname":
            address["address"] = name
    for key in ("capacity", "allocatable"):  # room for the agent's Pod, on both sides
        if key in node.get("status", {}):
            node["status"][key].setdefault("memory", "1Ti")
            node["status"][key].setdefault("pods", "110")
    return node


def _server_taints(node: Obj) -> list[Obj]:
    return [t for t in (node.get("spec") or {}).get("taints") or []
            if t["key"].startswith("node.kubernetes.io/")]


def _content(node: Obj) -> Obj:
    """What a case may change: labels, annotations (less the server's own), finalizers,
    owner references, generateName, spec and status (other writers may move the
    resourceVersion)."""
    meta = node["metadata"]
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                   if k not in SERVER_ANNOTATIONS}
    return {"labels": meta.get("labels"), "annotations": annotations,
            "finalizers": meta.get("finalizers"), "owners": meta.get("ownerReferences"),
            "generateName": meta.get("generateName"), "spec": node.get("spec"),
            "status": node.get("status")}


FIELDS = (("metadata", "labels"), ("metadata", "annotations"), ("metadata", "finalizers"),
          ("metadata", "ownerReferences"), ("metadata", "generateName"), ("spec",),
          ("status",))


def _json_patch(current: Obj, new: Obj, fields: tuple[tuple[str, ...], ...]) -> list[Obj]:
    """The JSON patch (RFC 6902) that turns `current` into `new` on `fields`."""
    ops: list[Obj] = []
    for path in fields:
        old_value, new_value = _get(current, path), _get(new, path)
        pointer = "/" + "/".join(path)
        if new_value is None and old_value is not None:
            ops.append({"op": "remove", "path": pointer})
        elif new_value != old_value:
            ops.append({"op": "add", "path": pointer, "value": new_value})
    return ops


def _get(obj: Obj, path: tuple[str, ...]) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def _update(core: k8s.CoreV1Api, current: Obj, new: Obj) -> int:
    """Turn `current` into `new` as the agent writes (it may patch, not update):
    status through nodes/status, the rest through the Node; the HTTP status of the
    refusal, or 200."""
    new = copy.deepcopy(new)
    for key in SERVER_ANNOTATIONS:  # what the server itself wrote stays as it is
        value = (current["metadata"].get("annotations") or {}).get(key)
        if value is not None and "annotations" in new["metadata"]:
            new["metadata"]["annotations"].setdefault(key, value)
    name = new["metadata"]["name"]
    try:
        status = _json_patch(current, new, FIELDS[-1:])
        if status:
            core.patch_node_status(name, status)
        else:
            core.patch_node(name, _json_patch(current, new, FIELDS[:-1]) or [
                {"op": "test", "path": "/metadata/name", "value": name}])
    except k8s.ApiException as exc:
        return int(exc.status)
    return 200


def test_every_case_of_the_policy_table_on_the_real_api_server(healthd: Healthd,
                                                                tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:5]
    names = {case.description: f"policy-{suffix}-{i}" for i, case in enumerate(CASES)}
    healthd.applier.apply(_registered(case, names[case.description], "old") for case in CASES)
    healthd.nodes += list(names.values())  # removed at the end like any test's nodes
    outcomes: dict[str, str] = {}
    # The server taints a new Node not-ready until the node controller sees it Ready:
    # gone before any case runs, or it would count as the case's change.
    for name in names.values():
        eventually(lambda n=name: not _server_taints(healthd.node(n)), 60,
                   f"{name} without the server's registration taint")
    first = healthd.agent_pod(names[CASES[0].description])
    healthd.wait_for_node_policy(
        k8s.CoreV1Api(healthd.client_for(healthd.token_for(first, "healthd-agent"))),
        names[CASES[1].description])
    for case in CASES:
        name = names[case.description]
        pod = healthd.agent_pod(name)
        agent = k8s.CoreV1Api(healthd.client_for(healthd.token_for(pod, "healthd-agent")))
        before = healthd.node(name)
        registered = _registered(case, name, "old")["status"]
        assert {f: before["status"].get(f) for f in KUBELET_FIELDS} == {
            f: registered.get(f) for f in KUBELET_FIELDS}, case.description
        code = _update(agent, before, _registered(case, name, "new"))
        outcomes[case.description] = "allowed" if code == 200 else f"refused {code}"
        if code != 200:
            assert _content(healthd.node(name)) == _content(before), case.description
    expected = {case.description: "allowed" if case.allowed else "refused 403" for case in CASES}
    assert outcomes == expected


DCGM, EXPORTER, PLUGIN = (OPERANDS[name] for name in (
    "nvidia-dcgm", "nvidia-dcgm-exporter", "nvidia-device-plugin-daemonset"))
# The controller's label writes, in order, each a merge patch of labels (None removes).
CONTROLLER_LABEL_WRITES: list[tuple[str, dict[str, str | None], bool]] = [
    ("pauses the operands", {DCGM: "false", EXPORTER: "false"}, True),
    ("puts one back", {DCGM: "true"}, True),
    ("adds an operand label the node lacks", {PLUGIN: "false"}, False),
    ("removes an operand label", {EXPORTER: None}, False),
    ("changes another label", {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}, False),
    ("changes the verdict", {"autopilot.ibm.com/gpuhealth": "PASS"}, False),
    ("adds another label", {"example.com/owner": "healthd"}, False),
    ("puts the other back", {EXPORTER: "true"}, True),
]


def test_the_controller_changes_only_the_operand_labels_values_on_the_real_api_server(
        healthd: Healthd) -> None:
    name = f"policy-{uuid.uuid4().hex[:5]}"
    healthd.add_nodes(name)
    healthd.core.patch_node(name, {"metadata": {"labels": {  # as the admin and agent left it
        DCGM: "true", EXPORTER: "true", "autopilot.ibm.com/gpuhealth": "ERR"}}})
    pod = healthd.running_pod("app.kubernetes.io/name=healthd-controller")
    controller = k8s.CoreV1Api(healthd.client_for(healthd.token_for(pod, "healthd-controller")))
    healthd.wait_for_node_policy(controller, name)
    outcomes = {}
    for what, labels, _ in CONTROLLER_LABEL_WRITES:
        before = healthd.node(name)["metadata"]["labels"]
        try:
            controller.patch_node(name, {"metadata": {"labels": labels}})
            outcomes[what] = "allowed"
        except k8s.ApiException as exc:
            outcomes[what] = f"refused {exc.status}"
            assert healthd.node(name)["metadata"]["labels"] == before, what
    assert outcomes == {what: "allowed" if allowed else "refused 403"
                        for what, _, allowed in CONTROLLER_LABEL_WRITES}
    labels = healthd.node(name)["metadata"]["labels"]
    assert (labels[DCGM], labels[EXPORTER], PLUGIN in labels) == ("true", "true", False)
