"""The ValidatingAdmissionPolicy that holds the agent to creating what it creates
(deploy/daemonset/base/probe-policy.yaml), evaluated with a real CEL runtime over the
table of tests/deploy/agent_creates_cases.py: the product's own diagnostic Job and pvc
probe pass; everything else is refused by the policy itself, whatever Pod Security the
namespace enforces; a token bound to no node creates nothing; other users are not
judged. The policy's spelled-out images are the config's."""

from __future__ import annotations

import pytest

from checks.pvc import PvcParams
from tests.deploy.admission import Policy
from tests.deploy.agent_creates_cases import (
    AGENT,
    CASES,
    NODE_NAME_EXTRA,
    Case,
    diagnostic_job,
    probe_pod,
    probe_pvc,
    shipped,
)
from tests.deploy.manifests import BASE, CONTROLLER, PROBES, documents, one

NODE = "gpu-7"
POLICY = "healthd-agent-creates"


@pytest.fixture(scope="module")
def policy() -> Policy:
    objects = documents((BASE / "probe-policy.yaml").read_text())
    binding = one(objects, "ValidatingAdmissionPolicyBinding", POLICY)
    assert binding["spec"] == {"policyName": POLICY, "validationActions": ["Deny"]}
    return Policy(one(objects, "ValidatingAdmissionPolicy", POLICY))


@pytest.mark.parametrize("case", CASES, ids=[c.description for c in CASES])
def test_the_policy_decides_each_case(policy: Policy, case: Case) -> None:
    verdict = policy.review(old=None, new=case.make(NODE), user=AGENT, operation="CREATE",
                            extra={NODE_NAME_EXTRA: [NODE]}, namespace=case.namespace)
    assert verdict.judged
    assert verdict.allowed == case.allowed, verdict.denials


@pytest.mark.parametrize("extra", [{}, {NODE_NAME_EXTRA: []}], ids=["no node", "empty"])
def test_a_token_bound_to_no_node_creates_nothing(policy: Policy,
                                                  extra: dict[str, list[str]]) -> None:
    for make in (diagnostic_job, probe_pvc, probe_pod):
        verdict = policy.review(old=None, new=make(NODE), user=AGENT, operation="CREATE",
                                extra=extra, namespace=PROBES)
        assert len(verdict.denials) == 1 and "node it runs on" in verdict.denials[0]


@pytest.mark.parametrize("user", ["admin", CONTROLLER,
                                  "system:serviceaccount:kube-system:job-controller"])
def test_other_users_are_not_judged(policy: Policy, user: str) -> None:
    verdict = policy.review(old=None, new=probe_pod(NODE), user=user, operation="CREATE",
                            namespace=PROBES)
    assert not verdict.judged


def test_the_policy_names_the_configured_images() -> None:
    """kustomize `images:` does not reach CEL: the policy spells the images out."""
    text = (BASE / "probe-policy.yaml").read_text()
    pause = PvcParams.model_validate(shipped().check_section("pvc").params).pod_image
    for image in (shipped().agent.deep_diagnostics.image, pause):
        assert f"c.image == '{image}'" in text, image
