"""The `remapped` check: pending remaps (ERR), remap failures (sticky EVICT), counts
on every GPU, and a config override of a code's severity."""

from __future__ import annotations

import pytest

from checks.base import Severity
from checks.catalog import Override
from checks.remapped import RemappedCheck
from checks.snapshot import Ok, RemappedRows

from .gpufakes import codes_by_gpu, context, entity_status, findings_on, healthy_gpu, node, run

pytestmark = pytest.mark.anyio


def rows(correctable: int = 0, uncorrectable: int = 0, pending: bool = False,
         failure: bool = False) -> Ok[RemappedRows]:
    return Ok(RemappedRows(correctable, uncorrectable, pending, failure))


async def test_pending_remap_is_err_on_that_gpu_only() -> None:
    snap = node(healthy_gpu(0), healthy_gpu(1), healthy_gpu(2, remapped=rows(1, 2, pending=True)))
    result = await run(RemappedCheck(), context(snap))
    assert codes_by_gpu(result) == {2: ["REMAP_PENDING"]}
    finding = findings_on(result, 2)[0]
    assert (finding.severity, finding.sticky) == (Severity.ERR, False)
    assert "2 uncorrectable" in finding.message and "1 correctable" in finding.message
    assert result.status is Severity.ERR
    assert entity_status(result, 0).status is Severity.PASS


async def test_remap_failure_is_sticky_evict() -> None:
    snap = node(healthy_gpu(0), healthy_gpu(1, remapped=rows(0, 9, failure=True)))
    result = await run(RemappedCheck(), context(snap))
    assert codes_by_gpu(result) == {1: ["REMAP_FAILURE"]}
    finding = findings_on(result, 1)[0]
    assert (finding.severity, finding.sticky) == (Severity.EVICT, True)
    assert "9 uncorrectable" in finding.message
    assert result.status is Severity.EVICT


async def test_counts_are_values_on_every_gpu() -> None:
    snap = node(healthy_gpu(0), healthy_gpu(1, remapped=rows(correctable=3, uncorrectable=1)))
    result = await run(RemappedCheck(), context(snap))
    assert result.findings == ()  # remapped rows without pending/failure are repaired rows
    assert dict(entity_status(result, 0).values) == {
        "correctable": 0, "uncorrectable": 0, "pending": False, "failure": False,
    }
    assert entity_status(result, 1).values["correctable"] == 3


async def test_override_changes_severity_and_stickiness() -> None:
    overrides = {"REMAP_PENDING": Override(severity=Severity.EVICT, sticky=True)}
    snap = node(healthy_gpu(0, remapped=rows(pending=True)))
    result = await run(RemappedCheck(), context(snap, overrides=overrides))
    finding = findings_on(result, 0)[0]
    assert (finding.severity, finding.sticky) == (Severity.EVICT, True)
    assert result.status is Severity.EVICT
