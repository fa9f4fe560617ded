"""The ValidatingAdmissionPolicy that keeps the agent on its own Node and its own keys,
evaluated with a real CEL runtime: what the agent writes passes; touching another
node, another owner's label, annotation or condition, the taints, the cordon, the
capacity, the rest of the status, finalizers or owner references, any other field,
named by the policy or not (runtime handlers, features, one a later Kubernetes adds),
or writing its own keys with values it never writes is refused, for one reason that
says what was touched; other users are not judged at all. The cases are a table
(tests/deploy/node_policy_cases.py) so a real API server can be held to the same
decisions."""

from __future__ import annotations

import pytest

from tests.deploy.admission import Policy
from tests.deploy.manifests import BASE, documents, one
from tests.deploy.node_policy_cases import (
    AGENT,
    CASES,
    FOREIGN_WRITES,
    FUTURE_WRITES,
    NODE_NAME_EXTRA,
    OWN,
    Case,
    edited,
    node,
)


@pytest.fixture(scope="module")
def policy() -> Policy:
    objects = documents((BASE / "node-policy.yaml").read_text())
    binding = one(objects, "ValidatingAdmissionPolicyBinding", "healthd-agent-node-writes")
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["policyName"] == "healthd-agent-node-writes"
    return Policy(one(objects, "ValidatingAdmissionPolicy", "healthd-agent-node-writes"))


@pytest.mark.parametrize("case", CASES, ids=[c.description for c in CASES])
def test_the_policy_decides_each_case(policy: Policy, case: Case) -> None:
    verdict = policy.review(old=case.old, new=case.new, user=AGENT, extra=OWN)
    assert verdict.judged
    assert verdict.allowed == case.allowed, verdict.denials


@pytest.mark.parametrize("what", [*FOREIGN_WRITES, *FUTURE_WRITES])
def test_a_foreign_write_is_refused_for_one_reason(policy: Policy, what: str) -> None:
    change = {**FOREIGN_WRITES, **FUTURE_WRITES}[what]
    verdict = policy.review(old=node(), new=edited(change), user=AGENT, extra=OWN)
    assert len(verdict.denials) == 1, verdict.denials


@pytest.mark.parametrize(("what", "says"), [
    ("changes runtimeHandlers", "a Node's status beyond its condition"),
    ("declares features", "a Node's status beyond its condition"),
    ("adds a status field the policy does not know", "a Node's status beyond its condition"),
    ("changes generateName", "a Node's metadata beyond its labels and annotations"),
    ("sets the providerID", "a Node's spec"),
    ("adds a part of the Node the policy does not know", "any other part"),
])
def test_a_refusal_says_which_part_was_touched(policy: Policy, what: str, says: str) -> None:
    change = {**FOREIGN_WRITES, **FUTURE_WRITES}[what]
    verdict = policy.review(old=node(), new=edited(change), user=AGENT, extra=OWN)
    assert len(verdict.denials) == 1 and says in verdict.denials[0], verdict.denials


@pytest.mark.parametrize("extra", [{}, {NODE_NAME_EXTRA: ["gpu-8"]}, {NODE_NAME_EXTRA: []}],
                         ids=["no node in the token", "another node", "empty"])
def test_the_agent_may_write_only_the_node_it_runs_on(policy: Policy,
                                                      extra: dict[str, list[str]]) -> None:
    new = edited(lambda n: n["metadata"]["labels"].update({"autopilot.ibm.com/gpuhealth":
                                                           "EVICT"}))
    verdict = policy.review(old=node(), new=new, user=AGENT, extra=extra)
    assert verdict.denials == ("the healthd agent may change only the Node it runs on",)


@pytest.mark.parametrize("user", ["system:node:gpu-7", "admin",
                                  "system:serviceaccount:healthd-system:healthd-controller"])
def test_other_users_are_not_judged(policy: Policy, user: str) -> None:
    verdict = policy.review(old=node(), new=edited(FOREIGN_WRITES["cordons"]), user=user)
    assert not verdict.judged and verdict.allowed
