"""The pure half of resets: finding codes read from a node's health annotation, and
decisions that survive malformed objects instead of crashing the controller."""

from __future__ import annotations

import json
from typing import Any

import pytest

from healthd.capacity.health import evict_codes
from healthd.controller.resets import affected, decide
from healthd.kube.conventions import Keys, Verdict
from tests.controller_resets.conftest import KEYS, NS, appwrapper, node, pod


def annotated(health: Any) -> dict[str, Any]:
    obj = node("n1", Verdict.EVICT)
    obj["metadata"]["annotations"] = {KEYS.health: health}
    return obj


@pytest.mark.parametrize(("health", "codes"), [
    (json.dumps({"top": "XID_79", "held": [
        {"code": "PCIE_BW_LOW", "severity": "WARN"},
        {"code": "XID_79", "severity": "EVICT"},
        {"code": "REMAP_FAILURE", "severity": "EVICT"},
        {"code": "XID_79", "severity": "EVICT"}]}), ("XID_79", "REMAP_FAILURE")),
    (json.dumps({"top": "ECC_UNCORRECTED", "held": [{"code": "ECC_UNCORRECTED"}]}),
     ("ECC_UNCORRECTED",)),
    (json.dumps({"top": "GPU_MISSING", "held": []}), ("GPU_MISSING",)),
    (json.dumps({"verdict": "EVICT"}), ("EVICT",)),
    ("{not json", ("EVICT",)),
    (json.dumps(["a list"]), ("EVICT",)),
    (json.dumps({"held": "nonsense", "top": 7}), ("EVICT",)),
])
def test_evict_codes(health: str, codes: tuple[str, ...]) -> None:
    assert evict_codes(annotated(health), KEYS) == codes


def test_evict_codes_follow_the_configured_prefix() -> None:
    keys = Keys(own_prefix="example.org/")
    obj = node("n1", Verdict.EVICT)
    obj["metadata"]["annotations"] = {"example.org/health": json.dumps({"top": "XID_79"})}

    assert evict_codes(obj, keys) == ("XID_79",)
    assert evict_codes(obj, KEYS) == ("EVICT",)


@pytest.mark.parametrize("garbage", [
    {}, {"status": "Running"}, {"spec": [], "status": {"conditions": 5}},
    {"metadata": None, "spec": {"containers": "x"}},
    {"metadata": {"labels": ["x"]}, "spec": {"containers": [None, {"resources": 3}]},
     "status": {"phase": "Running"}},
])
def test_malformed_objects_decide_nothing(garbage: dict[str, Any]) -> None:
    good_pod = pod("job-0", "job", "n1")
    evict = {"n1": ("XID_79",)}

    assert decide(garbage, [good_pod], evict) is None
    assert decide(appwrapper("job"), [garbage], evict) is None
    assert affected([garbage]) == set()


def test_affected_names_the_appwrappers_of_counting_pods() -> None:
    pods = [pod("a-0", "a", "n1"), pod("a-1", "a", "n1"), pod("b-0", "b", "n1"),
            pod("c-0", "c", "n1", phase="Pending"), pod("d-0", "d", "n1", limits={"cpu": "1"})]

    assert affected(pods) == {f"{NS}/a", f"{NS}/b"}


def test_decision_message_names_at_most_ten_nodes() -> None:
    pods = [pod(f"job-{i}", "job", f"n{i:02}") for i in range(12)]
    evict = {f"n{i:02}": ("XID_79",) for i in range(12)}

    decision = decide(appwrapper("job"), pods, evict)

    assert decision is not None
    assert len(decision.nodes) == 12
    assert decision.message.endswith("n09 (XID_79) and 2 more")
