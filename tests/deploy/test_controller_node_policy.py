"""The admission policy that keeps the controller's Node writes to ping's peers
(deploy/daemonset/base/controller-peers-policy.yaml), evaluated with a real CEL
runtime: publishing or removing `healthd.io/peers` passes; touching any other
annotation, a label, the taints or cordon, the status, or other metadata is refused
for one reason that says what; other users are not judged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.deploy.admission import Policy
from tests.deploy.manifests import AGENT, BASE, documents, one
from tests.deploy.node_policy_cases import edited, node

CONTROLLER = "system:serviceaccount:healthd-system:healthd-controller"
PEERS = "healthd.io/peers"
NAME = "healthd-controller-node-writes"


@pytest.fixture(scope="module")
def policy() -> Policy:
    objects = documents((BASE / "controller-peers-policy.yaml").read_text())
    binding = one(objects, "ValidatingAdmissionPolicyBinding", NAME)
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["policyName"] == NAME
    return Policy(one(objects, "ValidatingAdmissionPolicy", NAME))


def with_peers(obj: dict[str, Any]) -> None:
    obj["metadata"]["annotations"][PEERS] = '{"epoch":1,"peers":[]}'


def test_publishing_and_removing_peers_pass(policy: Policy) -> None:
    assert policy.review(old=node(), new=edited(with_peers), user=CONTROLLER).allowed
    published = edited(with_peers)
    assert policy.review(old=published, new=node(), user=CONTROLLER).allowed


FOREIGN: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "writes the verdict annotation": (
        lambda n: n["metadata"]["annotations"].update({"healthd.io/health": "{}"}),
        "only the annotation healthd.io/peers"),
    "removes another owner's annotation": (
        lambda n: n["metadata"]["annotations"].pop("node.alpha.kubernetes.io/ttl"),
        "only the annotation healthd.io/peers"),
    "relabels the node": (
        lambda n: n["metadata"]["labels"].update({"autopilot.ibm.com/gpuhealth": "EVICT"}),
        "labels or metadata"),
    "adds a finalizer": (lambda n: n["metadata"].update({"finalizers": ["x/y"]}),
                         "labels or metadata"),
    "cordons the node": (lambda n: n["spec"].update({"unschedulable": True}), "spec"),
    "removes a taint": (lambda n: n["spec"].pop("taints"), "spec"),
    "changes a condition": (lambda n: n["status"]["conditions"].pop(), "status"),
}


@pytest.mark.parametrize("what", FOREIGN)
def test_anything_else_is_refused_for_one_reason(policy: Policy, what: str) -> None:
    change, says = FOREIGN[what]

    def both(obj: dict[str, Any]) -> None:
        with_peers(obj)
        change(obj)
    verdict = policy.review(old=node(), new=edited(both), user=CONTROLLER)
    assert not verdict.allowed
    assert len(verdict.denials) == 1 and says in verdict.denials[0], verdict.denials


def test_other_users_are_not_judged(policy: Policy) -> None:
    assert not policy.review(old=node(), new=edited(with_peers), user=AGENT).judged
