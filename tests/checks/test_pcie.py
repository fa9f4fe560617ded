"""The `pcie` check: degraded link width/generation, the idle generation drop, and
the replay counter rising between two runs of one instance."""

from __future__ import annotations

import pytest

from checks.base import Severity
from checks.pcie import PcieCheck
from checks.snapshot import Failed, Ok, PcieLink, Unsupported

from .gpufakes import codes_by_gpu, context, entity_status, findings_on, healthy_gpu, node, run

pytestmark = pytest.mark.anyio

IDLE = 0x1


def link(gen: int, width: int, max_gen: int = 5, max_width: int = 16) -> Ok[PcieLink]:
    return Ok(PcieLink(gen, width, max_gen, max_width))


async def test_degraded_link_warns_on_that_gpu() -> None:
    snap = node(healthy_gpu(0), healthy_gpu(6, pcie=link(3, 8)))
    result = await run(PcieCheck(), context(snap))
    assert codes_by_gpu(result) == {6: ["PCIE_LINK_DEGRADED"]}
    finding = findings_on(result, 6)[0]
    assert finding.severity is Severity.WARN
    assert finding.message == "PCIe Gen3 x8, capable of Gen5 x16"
    assert entity_status(result, 6).values["pcie_width"] == 8


async def test_gen4_board_at_its_own_max_passes() -> None:
    result = await run(PcieCheck(), context(node(healthy_gpu(0, pcie=link(4, 16, max_gen=4)))))
    assert result.status is Severity.PASS


async def test_idle_gen_drop_is_not_a_finding_by_default() -> None:
    gpu = healthy_gpu(0, pcie=link(1, 16), clock_event_reasons=Ok(IDLE))
    result = await run(PcieCheck(), context(node(gpu)))
    assert result.findings == ()
    assert entity_status(result, 0).values["idle_gen_drop"] is True


async def test_idle_gen_drop_reported_when_not_ignored() -> None:
    gpu = healthy_gpu(0, pcie=link(1, 16), clock_event_reasons=Ok(IDLE))
    result = await run(PcieCheck({"ignore_idle_gen_drop": False}), context(node(gpu)))
    assert codes_by_gpu(result) == {0: ["PCIE_LINK_DEGRADED"]}


@pytest.mark.parametrize("reasons", [Ok(0x4), Unsupported(), Failed("Timeout")])
async def test_gen_drop_on_busy_or_unknown_activity_warns(reasons: object) -> None:
    gpu = healthy_gpu(0, pcie=link(3, 16), clock_event_reasons=reasons)
    result = await run(PcieCheck(), context(node(gpu)))
    assert codes_by_gpu(result) == {0: ["PCIE_LINK_DEGRADED"]}


async def test_width_drop_warns_even_when_idle() -> None:
    gpu = healthy_gpu(0, pcie=link(1, 8), clock_event_reasons=Ok(IDLE))
    result = await run(PcieCheck(), context(node(gpu)))
    assert findings_on(result, 0)[0].message == "PCIe Gen1 x8, capable of Gen5 x16"


async def test_replay_rise_between_two_runs_warns_on_that_gpu() -> None:
    first = node(healthy_gpu(0, pcie_replays=Ok(100)), healthy_gpu(1, pcie_replays=Ok(7)))
    second = node(healthy_gpu(0, pcie_replays=Ok(100)), healthy_gpu(1, pcie_replays=Ok(57)))
    check, ctx = PcieCheck(), context(first, second)
    baseline = await run(check, ctx)
    assert baseline.findings == ()  # the first run only records a baseline
    result = await run(check, ctx)
    assert codes_by_gpu(result) == {1: ["PCIE_REPLAYS"]}
    finding = findings_on(result, 1)[0]
    assert finding.severity is Severity.WARN
    assert "rose by 50" in finding.message
    assert entity_status(result, 1).values["pcie_replay_rise"] == 50
    assert entity_status(result, 0).status is Severity.PASS


@pytest.mark.parametrize(("tolerated", "raised"), [(0, True), (4, True), (5, False), (8, False)])
async def test_replay_tolerance_parameter(tolerated: int, raised: bool) -> None:
    runs = [node(healthy_gpu(0, pcie_replays=Ok(n))) for n in (10, 15)]
    check, ctx = PcieCheck({"max_replay_rise": tolerated}), context(*runs)
    await run(check, ctx)
    result = await run(check, ctx)
    assert bool(result.findings) is raised


async def test_counter_reset_starts_new_baseline() -> None:
    runs = [node(healthy_gpu(0, pcie_replays=Ok(n))) for n in (500, 3, 5)]
    check, ctx = PcieCheck(), context(*runs)
    results = [await run(check, ctx) for _ in runs]
    assert [r.findings for r in results] == [(), (), ()]


async def test_replays_are_tracked_per_gpu_uuid() -> None:
    # The same UUID at another index (re-enumeration) keeps its baseline.
    gpu = healthy_gpu(0, pcie_replays=Ok(0))
    moved = healthy_gpu(1, uuid=gpu.uuid, pcie_replays=Ok(40))
    check, ctx = PcieCheck(), context(node(gpu), node(moved))
    await run(check, ctx)
    result = await run(check, ctx)
    assert codes_by_gpu(result) == {1: ["PCIE_REPLAYS"]}


async def test_replay_counter_unsupported_still_judges_link() -> None:
    gpu = healthy_gpu(0, pcie_replays=Unsupported(), pcie=link(5, 4))
    result = await run(PcieCheck(), context(node(gpu)))
    assert codes_by_gpu(result) == {0: ["PCIE_LINK_DEGRADED"]}
    assert "pcie_replays" not in entity_status(result, 0).values


def test_bad_params_are_refused() -> None:
    with pytest.raises(ValueError, match="max_replay_rise"):
        PcieCheck({"max_replay_rise": -1})
