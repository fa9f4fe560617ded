"""The `xid` check: events become XID_<n> findings on the right GPU with the
catalog's severity; application XIDs are informational; overrides apply."""

from __future__ import annotations

import pytest

from checks.base import ResultBuilder, Severity
from checks.catalog import Catalog, Override
from checks.snapshot import XidEvent
from checks.xid import MAX_WINDOW_S, XidCheck, findings_for_xids

from .gpufakes import (
    codes_by_gpu,
    context,
    entity_status,
    findings_on,
    gpu_entity_of,
    healthy_gpu,
    node,
    run,
)

pytestmark = pytest.mark.anyio


def event(xid: int, gpu: int) -> XidEvent:
    return XidEvent(xid=xid, gpu_index=gpu, uuid=healthy_gpu(gpu).uuid, at=1000.0)


async def test_xid_79_is_sticky_evict_on_its_gpu() -> None:
    ctx = context(node(count=8), events=[event(79, 3)])
    result = await run(XidCheck(), ctx)
    assert codes_by_gpu(result) == {3: ["XID_79"]}
    finding = findings_on(result, 3)[0]
    assert (finding.severity, finding.sticky) == (Severity.EVICT, True)
    assert "fallen off the bus" in finding.message
    assert finding.entity == gpu_entity_of(healthy_gpu(3))
    assert [entity_status(result, i).status for i in (0, 7)] == [Severity.PASS] * 2
    assert ctx.gpus.windows == [1.0]  # type: ignore[union-attr]


@pytest.mark.parametrize("xid", [13, 31, 43, 45])
async def test_application_xids_are_informational(xid: int) -> None:
    result = await run(XidCheck(), context(node(count=2), events=[event(xid, 1)]))
    assert codes_by_gpu(result) == {1: [f"XID_{xid}"]}
    assert findings_on(result, 1)[0].severity is Severity.PASS
    assert result.status is Severity.PASS


async def test_repeated_events_become_one_finding_with_a_count() -> None:
    events = [event(48, 0), event(48, 0), event(48, 0), event(94, 0), event(48, 2)]
    result = await run(XidCheck(), context(node(count=3), events=events))
    assert codes_by_gpu(result) == {0: ["XID_48", "XID_94"], 2: ["XID_48"]}
    assert findings_on(result, 0)[0].values["count"] == 3
    assert "(3 events)" in findings_on(result, 0)[0].message


async def test_override_demotes_an_xid() -> None:
    overrides = {"XID_79": Override(severity=Severity.WARN, sticky=False)}
    result = await run(XidCheck(), context(node(count=1), events=[event(79, 0)],
                                           overrides=overrides))
    finding = findings_on(result, 0)[0]
    assert (finding.severity, finding.sticky) == (Severity.WARN, False)


async def test_window_parameter_is_passed_and_bounded() -> None:
    ctx = context(node(count=1))
    await run(XidCheck({"window_s": 0.0}), ctx)
    assert ctx.gpus.windows == [0.0]  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="window_s"):
        XidCheck({"window_s": MAX_WINDOW_S + 1})
    # The longest window a run may listen for still fits in the run's timeout.
    assert XidCheck({"window_s": MAX_WINDOW_S}).settings.window_s < XidCheck.DEFAULT_TIMEOUT_S


async def test_event_source_failure_is_unknown() -> None:
    ctx = context(node(count=2))

    async def broken(window_s: float) -> list[XidEvent]:
        raise OSError("event set closed")

    ctx.gpus.xid_events = broken  # type: ignore[union-attr,method-assign]
    result = await run(XidCheck(), ctx)
    assert result.status is Severity.UNKNOWN
    assert "event set closed" in entity_status(result, 1).reason


async def test_xid_on_lost_gpu_lands_on_its_snapshot_entity() -> None:
    lost = healthy_gpu(1, uuid="", pci_bus_id="", model="", lost=True)
    stray = XidEvent(xid=79, gpu_index=1, uuid="GPU-unknown", at=0.0)
    result = await run(XidCheck(), context(node(healthy_gpu(0), lost), events=[stray]))
    assert entity_status(result, 1).status is Severity.EVICT  # one row, the finding decides


def test_findings_for_xids_is_reusable_without_a_run() -> None:
    builder = ResultBuilder("xid", Catalog())
    gpus = [healthy_gpu(0), healthy_gpu(1)]
    found = findings_for_xids([event(95, 1), event(63, 9)], gpus, builder)
    assert [(f.code, f.entity.index, f.severity) for f in found] == [
        ("XID_95", 1, Severity.EVICT),
        ("XID_63", 9, Severity.WARN),
    ]
    assert builder.build().status is Severity.EVICT
