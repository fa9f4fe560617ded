"""The `nvlink` check: links down named on the right GPU; GPUs without NVLink skip."""

from __future__ import annotations

import pytest

from checks.base import Severity
from checks.nvlink import NvlinkCheck
from checks.snapshot import NvLink, Ok

from .gpufakes import codes_by_gpu, context, entity_status, findings_on, healthy_gpu, node, run

pytestmark = pytest.mark.anyio


def links(*down: int, count: int = 18) -> Ok[tuple[NvLink, ...]]:
    return Ok(tuple(NvLink(n, n not in down) for n in range(count)))


async def test_down_links_are_err_and_named() -> None:
    snap = node(healthy_gpu(0), healthy_gpu(7, nvlinks=links(3, 11)))
    result = await run(NvlinkCheck(), context(snap))
    assert codes_by_gpu(result) == {7: ["NVLINK_DOWN"]}
    finding = findings_on(result, 7)[0]
    assert finding.severity is Severity.ERR
    assert finding.message == "NVLinks 3, 11 down (16 of 18 up)"
    assert entity_status(result, 0).values["nvlinks_up"] == 18


async def test_one_link_down_reads_naturally() -> None:
    result = await run(NvlinkCheck(), context(node(healthy_gpu(0, nvlinks=links(0, count=4)))))
    assert findings_on(result, 0)[0].message == "NVLink 0 down (3 of 4 up)"


async def test_gpu_with_no_links_is_skipped() -> None:
    result = await run(NvlinkCheck(), context(node(healthy_gpu(0, nvlinks=Ok(())))))
    assert entity_status(result, 0).status is Severity.SKIPPED
    assert result.findings == ()
