"""The `power` check: hardware slowdown reasons named, normal reasons ignored,
power values reported."""

from __future__ import annotations

import pytest

from checks.base import Severity
from checks.catalog import Override
from checks.power import PowerCheck, clock_event_names
from checks.snapshot import Ok, Unsupported

from .gpufakes import codes_by_gpu, context, entity_status, findings_on, healthy_gpu, node, run

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("mask", "reasons"),
    [
        (0x8, "hw_slowdown"),
        (0x40, "hw_thermal_slowdown"),
        (0x80, "hw_power_brake_slowdown"),
        (0x8 | 0x80 | 0x4, "hw_slowdown,hw_power_brake_slowdown"),
    ],
)
async def test_hardware_reasons_warn_with_reasons_named(mask: int, reasons: str) -> None:
    snap = node(healthy_gpu(0), healthy_gpu(5, clock_event_reasons=Ok(mask)))
    result = await run(PowerCheck(), context(snap))
    assert codes_by_gpu(result) == {5: ["HW_SLOWDOWN"]}
    finding = findings_on(result, 5)[0]
    assert finding.severity is Severity.WARN
    assert finding.values["reasons"] == reasons
    for name in reasons.split(","):
        assert name in finding.message
    assert "sw_power_cap" not in finding.message
    assert result.status is Severity.WARN


@pytest.mark.parametrize("mask", [0x1, 0x2, 0x4, 0x10, 0x20, 0x100, 0x1 | 0x4 | 0x20])
async def test_normal_reasons_are_never_a_finding(mask: int) -> None:
    result = await run(PowerCheck(), context(node(healthy_gpu(0, clock_event_reasons=Ok(mask)))))
    assert result.findings == ()
    assert result.status is Severity.PASS


async def test_power_draw_and_limit_are_values() -> None:
    result = await run(PowerCheck(), context(node(healthy_gpu(0))))
    values = entity_status(result, 0).values
    assert (values["power_w"], values["limit_w"]) == (95.0, 700.0)


async def test_power_unsupported_still_judges_clock_reasons() -> None:
    gpu = healthy_gpu(0, power=Unsupported(), clock_event_reasons=Ok(0x8))
    result = await run(PowerCheck(), context(node(gpu)))
    assert codes_by_gpu(result) == {0: ["HW_SLOWDOWN"]}
    assert "power_w" not in entity_status(result, 0).values


async def test_override_can_make_slowdown_an_error() -> None:
    snap = node(healthy_gpu(0, clock_event_reasons=Ok(0x40)))
    ctx = context(snap, overrides={"HW_SLOWDOWN": Override(severity=Severity.ERR)})
    result = await run(PowerCheck(), ctx)
    assert findings_on(result, 0)[0].severity is Severity.ERR


def test_unknown_bits_are_shown_not_dropped() -> None:
    assert clock_event_names(0x8 | 0x1000) == ["hw_slowdown", "0x1000"]
