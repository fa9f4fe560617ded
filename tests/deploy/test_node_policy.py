"""The ValidatingAdmissionPolicy that keeps the agent on its own Node and its own keys,
evaluated with a real CEL runtime: what the agent writes passes; touching another
node, another owner's label, annotation or condition, the taints, the cordon or the
capacity is refused; other users are not judged at all."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from tests.deploy.admission import Policy
from tests.deploy.manifests import AGENT, BASE, Obj, documents, one

NODE = "gpu-7"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
OWN = {NODE_NAME_EXTRA: [NODE]}


@pytest.fixture(scope="module")
def policy() -> Policy:
    objects = documents((BASE / "node-policy.yaml").read_text())
    binding = one(objects, "ValidatingAdmissionPolicyBinding", "healthd-agent-node-writes")
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["policyName"] == "healthd-agent-node-writes"
    return Policy(one(objects, "ValidatingAdmissionPolicy", "healthd-agent-node-writes"))


def node() -> Obj:
    """A GPU node as the kubelet and other owners left it."""
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE,
                     "labels": {"kubernetes.io/hostname": NODE, "nvidia.com/gpu.present": "true",
                                "autopilot.ibm.com/gpuhealth": "PASS"},
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"podCIDR": "10.0.7.0/24",
                 "taints": [{"key": "example.com/maintenance", "effect": "NoSchedule"}]},
        "status": {"capacity": {"nvidia.com/gpu": "8", "cpu": "96"},
                   "allocatable": {"nvidia.com/gpu": "8", "cpu": "95"},
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"},
                                  {"type": "MemoryPressure", "status": "False"}]},
    }


def edited(change: Callable[[Obj], Any]) -> Obj:
    new = copy.deepcopy(node())
    change(new)
    return new


def labels(n: Obj) -> dict[str, str]:
    return n["metadata"]["labels"]


def annotations(n: Obj) -> dict[str, str]:
    return n["metadata"]["annotations"]


def conditions(n: Obj) -> list[Obj]:
    return n["status"]["conditions"]


GPU_UNHEALTHY = {"type": "GPUUnhealthy", "status": "True", "reason": "XID_79",
                 "message": "XID 79 on GPU 5"}

AGENT_WRITES: dict[str, Callable[[Obj], Any]] = {
    "verdict label": lambda n: labels(n).update({"autopilot.ibm.com/gpuhealth": "EVICT"}),
    "verdict label removed": lambda n: labels(n).pop("autopilot.ibm.com/gpuhealth"),
    "dcgm level label": lambda n: labels(n).update(
        {"autopilot.ibm.com/dcgm.level.3": "PASS_2025-05-13_19.54.55UTC"}),
    "health annotation": lambda n: annotations(n).update({"healthd.io/health": "{}"}),
    "last-run annotation": lambda n: annotations(n).update({"healthd.io/last-run": "{}"}),
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
}


@pytest.mark.parametrize("what", list(AGENT_WRITES))
def test_the_agent_may_write_its_own_keys_on_its_own_node(policy: Policy, what: str) -> None:
    verdict = policy.review(old=node(), new=edited(AGENT_WRITES[what]), user=AGENT, extra=OWN)
    assert verdict.judged and verdict.allowed, verdict.denials


def test_the_agent_may_change_its_own_condition(policy: Policy) -> None:
    old = edited(lambda n: conditions(n).append(GPU_UNHEALTHY))
    new = edited(lambda n: conditions(n).append({**GPU_UNHEALTHY, "status": "False"}))
    assert policy.review(old=old, new=new, user=AGENT, extra=OWN).allowed


def test_the_agent_may_consume_a_request(policy: Policy) -> None:
    old = edited(lambda n: annotations(n).update({"healthd.io/run": "dcgm:3"}))
    assert policy.review(old=old, new=node(), user=AGENT, extra=OWN).allowed


def test_a_node_without_labels_can_get_its_first_verdict(policy: Policy) -> None:
    old = edited(lambda n: n["metadata"].pop("labels"))
    new = edited(lambda n: n["metadata"].update(
        {"labels": {"autopilot.ibm.com/gpuhealth": "PASS"}}))
    assert policy.review(old=old, new=new, user=AGENT, extra=OWN).allowed


@pytest.mark.parametrize("what", list(FOREIGN_WRITES))
def test_the_agent_may_not_touch_what_others_own(policy: Policy, what: str) -> None:
    new = edited(FOREIGN_WRITES[what])
    verdict = policy.review(old=node(), new=new, user=AGENT, extra=OWN)
    assert verdict.judged and len(verdict.denials) == 1, verdict.denials


@pytest.mark.parametrize("extra", [{}, {NODE_NAME_EXTRA: ["gpu-8"]}, {NODE_NAME_EXTRA: []}],
                         ids=["no node in the token", "another node", "empty"])
def test_the_agent_may_write_only_the_node_it_runs_on(policy: Policy,
                                                      extra: dict[str, list[str]]) -> None:
    new = edited(AGENT_WRITES["verdict label"])
    verdict = policy.review(old=node(), new=new, user=AGENT, extra=extra)
    assert verdict.denials == ("the healthd agent may change only the Node it runs on",)


@pytest.mark.parametrize("user", ["system:node:gpu-7", "admin",
                                  "system:serviceaccount:healthd-system:healthd-controller"])
def test_other_users_are_not_judged(policy: Policy, user: str) -> None:
    verdict = policy.review(old=node(), new=edited(FOREIGN_WRITES["cordons"]), user=user)
    assert not verdict.judged and verdict.allowed
