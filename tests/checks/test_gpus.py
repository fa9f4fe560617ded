"""The `gpus` check: fewer GPUs than expected and lost GPUs are GPU_MISSING (sticky
EVICT); reachable GPUs pass; no expected count means no comparison."""

from __future__ import annotations

import pytest

from checks.base import CheckResult, Finding, Severity
from checks.gpus import GpusCheck

from .gpufakes import codes_by_gpu, context, entity_status, findings_on, healthy_gpu, node, run

pytestmark = pytest.mark.anyio


def node_findings(result: CheckResult) -> list[Finding]:
    return [f for f in result.findings if f.entity.kind == "node"]


async def test_fewer_gpus_than_expected_is_sticky_evict_on_node() -> None:
    result = await run(GpusCheck({"expected": 8}), context(node(count=7), node_name="n1"))
    [finding] = node_findings(result)
    assert finding.code == "GPU_MISSING"
    assert (finding.severity, finding.sticky) == (Severity.EVICT, True)
    assert finding.message == "7 of 8 expected GPUs visible"
    assert finding.entity.name == "n1"
    assert result.status is Severity.EVICT
    assert [entity_status(result, i).status for i in range(7)] == [Severity.PASS] * 7


async def test_expected_count_from_context() -> None:
    result = await run(GpusCheck(), context(node(count=4), expected_gpus=8))
    assert [f.message for f in node_findings(result)] == ["4 of 8 expected GPUs visible"]


async def test_param_wins_over_context() -> None:
    result = await run(GpusCheck({"expected": 4}), context(node(count=4), expected_gpus=8))
    assert result.status is Severity.PASS


async def test_no_expected_count_means_no_comparison() -> None:
    result = await run(GpusCheck(), context(node(count=3)))
    assert result.findings == ()
    [node_row] = [e for e in result.entities if e.entity.kind == "node"]
    assert node_row.values["visible"] == 3


async def test_lost_gpu_is_gpu_missing_on_that_gpu() -> None:
    lost = healthy_gpu(5, lost=True, lost_reason="fell off the bus")
    snap = node(*(healthy_gpu(i) for i in range(5)), lost, *(healthy_gpu(i) for i in (6, 7)))
    result = await run(GpusCheck({"expected": 8}), context(snap))
    assert codes_by_gpu(result) == {5: ["GPU_MISSING"]}  # 8 enumerated: no node finding
    finding = findings_on(result, 5)[0]
    assert (finding.severity, finding.sticky) == (Severity.EVICT, True)
    assert "fell off the bus" in finding.message
    assert entity_status(result, 5).status is Severity.EVICT
    assert entity_status(result, 4).status is Severity.PASS


async def test_more_gpus_than_expected_is_fine() -> None:
    result = await run(GpusCheck({"expected": 2}), context(node(count=4)))
    assert result.status is Severity.PASS
