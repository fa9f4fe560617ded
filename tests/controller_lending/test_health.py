"""The node health model: which nodes withhold capacity and why (verdicts as
configured, never WARN; cordon; NotReady and unreachable taints), what capacity
counts (`pods` never, capacity or allocatable), EVICT detection and the finding
codes behind it, and garbage that must not crash."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from healthd.capacity.health import (
    CORDONED,
    NOT_READY,
    UNREACHABLE,
    evict_codes,
    gpu_count,
    is_evict,
    unavailability,
)
from healthd.kube.conventions import Keys, Verdict
from tests.controller_lending.helpers import GPU, node

KEYS = Keys()
ALL = frozenset({Verdict.ERR, Verdict.TESTING, Verdict.EVICT})


def judge(obj: dict[str, Any], verdicts: frozenset[Verdict] = ALL, source: str = "capacity"
          ) -> frozenset[str] | None:
    found = unavailability(obj, keys=KEYS, bad_verdicts=verdicts, source=source)
    return None if found is None else found.reasons


@pytest.mark.parametrize(("obj", "reasons"), [
    (node("n"), None),
    (node("n", verdict="PASS"), None),
    (node("n", verdict="WARN"), None),
    (node("n", verdict="garbage"), None),
    (node("n", verdict="EVICT"), {"EVICT"}),
    (node("n", verdict="ERR"), {"ERR"}),
    (node("n", verdict="TESTING"), {"TESTING"}),
    (node("n", unschedulable=True), {CORDONED}),
    (node("n", taints=("node.kubernetes.io/not-ready",)), {NOT_READY}),
    (node("n", taints=("node.kubernetes.io/unreachable",)), {UNREACHABLE}),
    (node("n", taints=("nvidia.com/gpu",)), None),  # other owners' taints are not ours
    (node("n", verdict="WARN", unschedulable=True), {CORDONED}),
    (node("n", verdict="EVICT", unschedulable=True), {"EVICT", CORDONED}),
])
def test_reasons(obj: dict[str, Any], reasons: set[str] | None) -> None:
    assert judge(obj) == (None if reasons is None else frozenset(reasons))


def test_configured_verdicts_only() -> None:
    only_evict = frozenset({Verdict.EVICT})
    assert judge(node("n", verdict="ERR"), only_evict) is None
    assert judge(node("n", verdict="EVICT"), only_evict) == {"EVICT"}
    # WARN and PASS never count, even if a caller passes them
    assert judge(node("n", verdict="WARN"), frozenset(Verdict)) is None
    assert judge(node("n", verdict="PASS"), frozenset(Verdict)) is None


def test_primary_reason_prefers_the_verdict() -> None:
    found = unavailability(node("n", verdict="TESTING", unschedulable=True,
                                taints=("node.kubernetes.io/unreachable",)),
                           keys=KEYS, bad_verdicts=ALL)
    assert found is not None and found.reason == "TESTING"


def test_capacity_counts_all_but_pods() -> None:
    obj = node("n", verdict="EVICT", labels={"zone": "a"},
               capacity={GPU: "8", "cpu": "96", "memory": "1Ti", "pods": "110",
                         "hugepages-2Mi": "0", "bad": "lots"},
               allocatable={GPU: "7", "cpu": "95500m"})
    found = unavailability(obj, keys=KEYS, bad_verdicts=ALL)
    assert found is not None
    assert dict(found.capacity) == {GPU: Decimal(8), "cpu": Decimal(96),
                                    "memory": Decimal(2**40)}
    assert found.labels["zone"] == "a"
    allocatable = unavailability(obj, keys=KEYS, bad_verdicts=ALL, source="allocatable")
    assert allocatable is not None
    assert dict(allocatable.capacity) == {GPU: Decimal(7), "cpu": Decimal("95.5")}
    assert gpu_count(obj, GPU) == 8 and gpu_count(node("cpu", capacity={"cpu": "4"}), GPU) == 0


@pytest.mark.parametrize("obj", [{}, {"metadata": None}, {"spec": "x", "status": []},
                                 {"metadata": {"labels": ["x"]}, "spec": {"taints": "x"}},
                                 {"spec": {"taints": [None, 3, {"key": None}]}}])
def test_garbage_nodes_are_healthy(obj: dict[str, Any]) -> None:
    assert judge(obj) is None
    assert not is_evict(obj, KEYS)
    assert evict_codes(obj, KEYS) == ("EVICT",)


def with_health(body: object) -> dict[str, Any]:
    obj = node("n", verdict="EVICT")
    text = body if isinstance(body, str) else json.dumps(body)
    obj["metadata"]["annotations"] = {KEYS.health: text}
    return obj


@pytest.mark.parametrize(("body", "codes"), [
    ({"verdict": "EVICT", "top": "XID_79", "held": [
        {"code": "XID_79", "severity": "EVICT"}, {"code": "REMAP_FAILURE", "severity": "EVICT"},
        {"code": "PCIE_BW_LOW", "severity": "ERR"}, {"code": "XID_79", "severity": "EVICT"}]},
     ("XID_79", "REMAP_FAILURE")),
    ({"verdict": "EVICT", "top": "GPU_MISSING", "held": []}, ("GPU_MISSING",)),
    ({"verdict": "EVICT", "top": None}, ("EVICT",)),
    ("{not json", ("EVICT",)),
    (["a list"], ("EVICT",)),
])
def test_evict_codes(body: object, codes: tuple[str, ...]) -> None:
    obj = with_health(body)
    assert is_evict(obj, KEYS)
    assert evict_codes(obj, KEYS) == codes


def test_custom_label_prefix() -> None:
    keys = Keys(label_prefix="example.com/")
    obj = node("n")
    obj["metadata"]["labels"]["example.com/gpuhealth"] = "EVICT"
    assert is_evict(obj, keys) and not is_evict(obj, KEYS)
