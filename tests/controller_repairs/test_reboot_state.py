"""The reboot's pure half: the request made from the template, whose request is ours,
the boot id that says the node rebooted, the annotation for each step, and what the
node's condition says of it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from healthd.config.controller import RemediationTemplate, RepairSettings
from healthd.controller.reboot_request import (
    ours,
    request_body,
    request_name,
    request_resource,
    template_resource,
    template_spec,
)
from healthd.controller.repair_state import (
    finished,
    history,
    node_repair,
    rebooted,
    requested_reboot,
    timed_out,
    validating,
)
from healthd.kube.conventions import Keys
from healthd.kube.shapes import Node, view
from healthd.published import REPAIR_STATES, Holding, Repair, awaits_validation, dumps
from healthd.repair.decision import Remedy

KEYS = Keys()
REF = RemediationTemplate.model_validate({
    "apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediationTemplate",
    "namespace": "medik8s", "name": "automatic"})
HELD = Holding(code="XID_79", check="xid", entity="gpu5", severity="EVICT", sticky=True,
               message="", since="2026-01-01T00:00:00Z", uuid="GPU-5")
TEMPLATE = {"apiVersion": "remediation.medik8s.io/v1alpha1",
            "kind": "SelfNodeRemediationTemplate",
            "metadata": {"name": "automatic", "namespace": "medik8s"},
            "spec": {"template": {"spec": {"remediationStrategy": "Automatic"}}}}


def node(boot_id: str, repair: Repair | None = None) -> Node:
    annotations = {KEYS.repair: dumps(repair.to_json())} if repair else {}
    return view(Node, {"metadata": {"name": "n1", "annotations": annotations, "labels": {}},
                       "spec": {}, "status": {"nodeInfo": {"bootID": boot_id}}})


def test_the_request_is_the_templates_kind_without_the_suffix_named_after_the_node() -> None:
    assert template_resource(REF).path("medik8s", "automatic") == (
        "/apis/remediation.medik8s.io/v1alpha1/namespaces/medik8s/"
        "selfnoderemediationtemplates/automatic")
    assert request_resource(REF).path("medik8s", "n1") == (
        "/apis/remediation.medik8s.io/v1alpha1/namespaces/medik8s/selfnoderemediations/n1")
    body = request_body(REF, TEMPLATE, "n1", KEYS.node_name)
    assert body["kind"] == "SelfNodeRemediation" and body["metadata"]["name"] == "n1"
    assert body["spec"] == {"remediationStrategy": "Automatic"}
    assert ours(body, "n1", KEYS.node_name) and not ours(body, "n2", KEYS.node_name)
    assert not ours({"metadata": {"name": "n1"}}, "n1", KEYS.node_name)
    assert request_name(REF, "n1") == "SelfNodeRemediation medik8s/n1"


@pytest.mark.parametrize("template", [{}, {"spec": {}}, {"spec": {"template": "x"}},
                                      {"spec": {"template": {"spec": []}}}])
def test_a_template_without_a_spec_to_copy_is_unusable(template: dict[str, object]) -> None:
    assert template_spec(template) is None


@pytest.mark.parametrize(("ref", "said"), [
    ({"apiVersion": "v1", "kind": "SelfNodeRemediationTemplate", "namespace": "m",
      "name": "a"}, "e.g. remediation.medik8s.io/v1alpha1"),
    ({"apiVersion": "a.io/v1", "kind": "SelfNodeRemediation", "namespace": "m", "name": "a"},
     "e.g. SelfNodeRemediationTemplate"),
    ({"apiVersion": "a.io/v1", "kind": "XTemplate", "namespace": "", "name": "a"},
     "namespace"),
])
def test_a_reference_that_names_no_template_is_refused_at_start(ref: dict[str, str],
                                                                said: str) -> None:
    with pytest.raises(ValidationError, match=said):
        RepairSettings.model_validate({"reboot": ref})


def test_a_reboot_attempt_records_the_boot_id_and_counts_in_the_budget() -> None:
    start = node_repair(node("boot-1"), KEYS)
    new = requested_reboot(start.repair, request="SelfNodeRemediation medik8s/n1",
                           boot_id=start.boot_id, reason="XID 79", now=100, held=[HELD])
    assert new.state == "reboot-requested" in REPAIR_STATES
    assert (new.boot_id, new.checks) == ("boot-1", ("xid",))
    assert [(a.remedy, a.remedy in (r.value for r in Remedy)) for a in new.attempts] == [
        ("reboot", True)]
    assert [a.remedy for a in history(new)] == [Remedy.REBOOT]
    assert not rebooted(node_repair(node("boot-1", new), KEYS))
    assert not rebooted(node_repair(node("", new), KEYS))  # no report is no reboot
    assert rebooted(node_repair(node("boot-2", new), KEYS))

    checking = validating(new, 200)
    assert (checking.state, checking.run_id, checking.request) == ("validating", "repair-1", "")
    assert finished(checking, "passed", "ok", 300).attempts[-1].outcome == "passed"
    late = timed_out(new, "no reboot", 2000)
    assert (late.state, late.attempts[-1].outcome) == ("hardware-inspection", "timed-out")


def test_what_the_condition_says_of_a_repair() -> None:
    assert Repair("held", "", reason="reboot needed: no hand-off").note == "reboot needed"
    assert Repair("held", "", reason="the breaker is open").note == ""
    assert Repair("reboot-requested", "", request="SNR m/n1").note == (
        "reboot requested (SNR m/n1)")
    assert Repair("hardware-inspection", "").note == "hardware inspection"
    assert Repair("validating", "").note == ""


@pytest.mark.parametrize(("annotations", "new"), [
    ({}, True),  # nothing published yet
    ({"health": {"verdict": "TESTING", "since": "", "testing": ["repair"]}}, True),  # awaits
    ({"health": {"verdict": "PASS", "since": ""}}, False),  # judged before: not new
    ({"repair": {"state": "", "since": ""}}, False),  # validated or repaired before
])
def test_a_node_is_new_until_it_has_a_repair_record_or_a_verdict_of_its_own(
        annotations: dict[str, dict[str, object]], new: bool) -> None:
    obj = view(Node, {"metadata": {"name": "n1", "annotations": {
        getattr(KEYS, key): dumps(body) for key, body in annotations.items()}}})
    assert awaits_validation(obj, KEYS) is new
    assert node_repair(obj, KEYS).new is new
