"""The ValidatingAdmissionPolicy that holds the controller's Node writes to its repair
and ping's peers (deploy/daemonset/base/controller-node-policy.yaml), evaluated with a
real CEL runtime: recording a repair, asking the agent to validate, and publishing or
removing a node's peers pass; the verdict label,
another annotation, the cordon, the taints, the status, any other field, or a clear
that is not `true` are refused; other users are not judged."""

from __future__ import annotations

import json

import pytest

from tests.deploy.admission import Policy
from tests.deploy.manifests import AGENT, BASE, CONTROLLER, documents, one
from tests.deploy.node_policy_cases import FOREIGN_WRITES, FUTURE_WRITES, Obj, edited, node

NAME = "healthd-controller-node-writes"
REPAIR = "healthd.io/repair"
PEERS = "healthd.io/peers"
DCGM = "nvidia.com/gpu.deploy.dcgm"  # an operand label the test node carries
RESETTING = json.dumps({"state": "resetting", "since": "2026-01-01T00:00:00Z",
                        "gpus": ["GPU-1"], "attempts": []})


def annotated(**values: str | None) -> Obj:
    def change(n: Obj) -> None:
        for key, value in values.items():
            if value is None:
                n["metadata"]["annotations"].pop(key, None)
            else:
                n["metadata"]["annotations"][key] = value
    return edited(change)


@pytest.fixture(scope="module")
def policy() -> Policy:
    objects = documents((BASE / "controller-node-policy.yaml").read_text())
    binding = one(objects, "ValidatingAdmissionPolicyBinding", NAME)
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["policyName"] == NAME
    return Policy(one(objects, "ValidatingAdmissionPolicy", NAME))


@pytest.mark.parametrize(("old", "new"), [
    (node(), annotated(**{REPAIR: RESETTING})),
    (annotated(**{REPAIR: RESETTING}), annotated(**{
        REPAIR: '{"state":"validating"}', "healthd.io/clear": "true",
        "healthd.io/run": "remapped,pciebw", "healthd.io/run-id": "repair-1"})),
    (annotated(**{REPAIR: RESETTING}), annotated(**{REPAIR: '{"state":""}'})),
    (node(), annotated(**{PEERS: '{"epoch":1,"peers":[]}'})),
    (annotated(**{PEERS: '{"epoch":1,"peers":[]}'}), node()),
    (node(), edited(lambda n: n["metadata"]["labels"].update({DCGM: "false"}))),
    (edited(lambda n: n["metadata"]["labels"].update({DCGM: "false"})), node()),
], ids=["records a repair", "asks for validation", "ends a repair", "publishes peers",
        "removes peers", "pauses an operand", "puts an operand back"])
def test_the_controller_may_record_a_repair_ask_for_validation_and_publish_peers(
        policy: Policy, old: Obj, new: Obj) -> None:
    verdict = policy.review(old=old, new=new, user=CONTROLLER)
    assert verdict.judged and verdict.allowed, verdict.denials


@pytest.mark.parametrize(("old", "new", "says"), [
    (node(), edited(lambda n: n["metadata"]["labels"].update(
        {"autopilot.ibm.com/gpuhealth": "PASS "})), "labels"),
    (node(), edited(lambda n: n["metadata"]["labels"].pop("autopilot.ibm.com/gpuhealth")),
     "labels"),
    (node(), annotated(**{"healthd.io/health": "{}"}), "annotations"),
    (node(), annotated(**{"node.alpha.kubernetes.io/ttl": None}), "annotations"),
    (node(), annotated(**{"healthd.io/clear": "yes"}), "annotations"),
    (annotated(**{"healthd.io/run": "all"}), annotated(**{"healthd.io/run": None}),
     "annotations"),
    (node(), edited(FOREIGN_WRITES["cordons"]), "spec"),
    (node(), edited(FOREIGN_WRITES["removes the taints"]), "spec"),
    (node(), edited(FOREIGN_WRITES["changes Ready"]), "status"),
    (node(), edited(FOREIGN_WRITES["hides GPUs"]), "status"),
    (node(), edited(FOREIGN_WRITES["changes generateName"]), "metadata"),
    (node(), edited(FUTURE_WRITES["adds a part of the Node the policy does not know"]),
     "any other part"),
    (node(), edited(lambda n: n["metadata"]["labels"].update(
        {"nvidia.com/gpu.deploy.dcgm-exporter": "false"})), "labels"),
    (node(), edited(lambda n: n["metadata"]["labels"].pop(DCGM)), "labels"),
    (node(), edited(lambda n: n["metadata"]["labels"].update(
        {"nvidia.com/gpu.deploy.driver": "false"})), "labels"),
], ids=["sets the verdict", "removes the verdict", "writes the agent's health",
        "removes a foreign annotation", "a clear that is not true",
        "takes the agent's request", "cordons", "removes the taints",
        "changes Ready", "hides GPUs", "changes generateName", "adds an unknown part",
        "adds an operand label", "removes an operand label", "pauses the driver"])
def test_anything_else_is_refused_for_one_reason(policy: Policy, old: Obj, new: Obj,
                                                 says: str) -> None:
    verdict = policy.review(old=old, new=new, user=CONTROLLER)
    assert len(verdict.denials) == 1 and says in verdict.denials[0], verdict.denials


@pytest.mark.parametrize("user", [AGENT, "admin", "system:node:gpu-7"])
def test_other_users_are_not_judged(policy: Policy, user: str) -> None:
    verdict = policy.review(old=node(), new=edited(FOREIGN_WRITES["cordons"]), user=user)
    assert not verdict.judged
