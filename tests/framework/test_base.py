"""The check framework: severity order, result building, and run_check turning
exceptions and timeouts into UNKNOWN (never a crash, never PASS) with the traceback
logged once per fault."""

from __future__ import annotations

import logging

import anyio
import pytest

from checks.base import (
    BaseCheck,
    CheckContext,
    CheckResult,
    Entity,
    ResultBuilder,
    Severity,
    run_check,
    worst,
)
from checks.catalog import Catalog

S = Severity


def test_ordered_severities() -> None:
    assert [s.rank for s in (S.PASS, S.WARN, S.ERR, S.EVICT)] == [0, 1, 2, 3]
    assert not S.UNKNOWN.ordered and not S.SKIPPED.ordered


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        ([], S.PASS),
        ([S.PASS, S.WARN], S.WARN),
        ([S.WARN, S.UNKNOWN], S.UNKNOWN),  # an unknown check may hide a fault
        ([S.ERR, S.UNKNOWN], S.ERR),
        ([S.EVICT, S.ERR, S.PASS], S.EVICT),
        ([S.SKIPPED, S.SKIPPED], S.SKIPPED),
        ([S.SKIPPED, S.PASS], S.PASS),
    ],
)
def test_worst(statuses: list[Severity], expected: Severity) -> None:
    assert worst(statuses) is expected


@pytest.mark.parametrize(
    ("status", "code"),
    [(S.PASS, 0), (S.SKIPPED, 0), (S.WARN, 1), (S.ERR, 2), (S.EVICT, 2), (S.UNKNOWN, 3)],
)
def test_exit_codes_follow_nagios(status: Severity, code: int) -> None:
    assert status.exit_code == code


def test_builder_reports_every_entity_and_takes_severity_from_catalog() -> None:
    builder = ResultBuilder("remapped", Catalog())
    gpu0, gpu1, gpu2 = (Entity.gpu(i, f"GPU-{i}") for i in range(3))
    builder.seen(gpu0, pending=False)
    builder.finding("REMAP_FAILURE", gpu1, "row remapping failed", failure=True)
    builder.skip(gpu2, "not supported")
    result = builder.build()
    by_gpu = {e.entity.index: e for e in result.entities}
    assert by_gpu[0].status is S.PASS
    assert by_gpu[1].status is S.EVICT
    assert by_gpu[2].status is S.SKIPPED and by_gpu[2].reason == "not supported"
    assert result.status is S.EVICT
    (finding,) = result.findings
    assert finding.sticky and finding.severity is S.EVICT and finding.values == {"failure": True}


def test_builder_unknown_entity_makes_check_unknown_unless_worse() -> None:
    builder = ResultBuilder("power", Catalog())
    builder.seen(Entity.gpu(0))
    builder.unknown(Entity.gpu(1), "nvmlDeviceGetPowerUsage: Unknown Error")
    assert builder.build().status is S.UNKNOWN


class _Raises(BaseCheck):
    NAME = "raises"

    async def run(self, ctx: CheckContext) -> CheckResult:
        raise RuntimeError("boom")


class _Hangs(BaseCheck):
    NAME = "hangs"

    async def run(self, ctx: CheckContext) -> CheckResult:
        await anyio.sleep(60)
        raise AssertionError("not reached")


@pytest.mark.anyio
async def test_exception_becomes_unknown_with_reason() -> None:
    result = await run_check(_Raises(), CheckContext(catalog=Catalog()))
    assert result.status is S.UNKNOWN
    assert "RuntimeError: boom" in result.reason


@pytest.mark.anyio
async def test_timeout_becomes_unknown() -> None:
    with anyio.fail_after(5):
        result = await run_check(_Hangs(), CheckContext(catalog=Catalog()), timeout_s=0.05)
    assert result.status is S.UNKNOWN
    assert "timed out after 0.05 s" in result.reason
    assert 0.04 < result.duration_s < 5


class _Buggy(BaseCheck):
    """Raises a KeyError on every run, or a ValueError from another line when asked."""

    NAME = "buggy"

    def __init__(self, other: bool = False) -> None:
        super().__init__()
        self.other = other

    async def run(self, ctx: CheckContext) -> CheckResult:
        if self.other:
            raise ValueError("another fault")
        return {}["missing"]  # type: ignore[no-any-return]


def _tracebacks(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.exc_info and r.name == "checks.base"]


@pytest.mark.anyio
async def test_a_raising_check_logs_its_traceback_once_per_fault(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ctx = CheckContext(catalog=Catalog())
    with caplog.at_level(logging.ERROR, logger="checks.base"):
        results = [await run_check(_Buggy(), ctx) for _ in range(3)]
    assert [r.status for r in results] == [S.UNKNOWN] * 3
    (logged,) = _tracebacks(caplog)  # three runs, one traceback
    assert "check buggy failed: KeyError" in logged.getMessage()
    assert 'return {}["missing"]' in caplog.text  # the line that raised, for the fix
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="checks.base"):
        other = await run_check(_Buggy(other=True), ctx)
    assert other.status is S.UNKNOWN
    (logged,) = _tracebacks(caplog)  # a new fault of the same check shows too
    assert "ValueError: another fault" in logged.getMessage()
