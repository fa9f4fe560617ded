"""The `ecc` check: uncorrected errors, pending page retirement (pre-Ampere), and
what is skipped where ECC or page retirement does not exist."""

from __future__ import annotations

import pytest

from checks.base import Severity
from checks.ecc import EccCheck
from checks.snapshot import Ecc, Failed, Ok, Unsupported

from .gpufakes import codes_by_gpu, context, entity_status, findings_on, healthy_gpu, node, run

pytestmark = pytest.mark.anyio


async def test_uncorrected_errors_are_err_on_that_gpu() -> None:
    bad = healthy_gpu(3, ecc=Ok(Ecc(corrected_volatile=12, uncorrected_volatile=2)))
    result = await run(EccCheck(), context(node(healthy_gpu(0), bad)))
    assert codes_by_gpu(result) == {3: ["ECC_UNCORRECTED"]}
    finding = findings_on(result, 3)[0]
    assert (finding.severity, finding.sticky) == (Severity.ERR, False)
    assert "2 uncorrected" in finding.message
    assert entity_status(result, 3).values["ecc_corrected"] == 12


async def test_corrected_errors_alone_pass() -> None:
    gpu = healthy_gpu(0, ecc=Ok(Ecc(corrected_volatile=40, uncorrected_volatile=0)))
    result = await run(EccCheck(), context(node(gpu)))
    assert result.status is Severity.PASS


async def test_pending_pages_are_err() -> None:
    gpu = healthy_gpu(1, retired_pages_pending=Ok(True))
    result = await run(EccCheck(), context(node(healthy_gpu(0), gpu)))
    assert codes_by_gpu(result) == {1: ["PAGES_PENDING"]}
    assert findings_on(result, 1)[0].severity is Severity.ERR


async def test_hopper_without_page_retirement_is_judged_not_skipped() -> None:
    gpu = healthy_gpu(0, retired_pages_pending=Unsupported("not supported"))
    result = await run(EccCheck(), context(node(gpu)))
    assert entity_status(result, 0).status is Severity.PASS
    assert "pages_pending" not in entity_status(result, 0).values


async def test_page_retirement_read_failure_is_unknown() -> None:
    gpu = healthy_gpu(0, retired_pages_pending=Failed("NVML error: Unknown Error"))
    result = await run(EccCheck(), context(node(gpu)))
    assert entity_status(result, 0).status is Severity.UNKNOWN
    assert "Unknown Error" in entity_status(result, 0).reason


async def test_ecc_disabled_skips_even_with_pending_pages() -> None:
    gpu = healthy_gpu(0, ecc=Unsupported("ECC disabled"), retired_pages_pending=Ok(True))
    result = await run(EccCheck(), context(node(gpu)))
    assert entity_status(result, 0).status is Severity.SKIPPED
    assert "ECC disabled" in entity_status(result, 0).reason
    assert result.status is Severity.SKIPPED
