"""The real probe on a real GPU (skipped without one): plausible numbers on GPU 0,
measured in a child process, never in this one."""

from __future__ import annotations

import os

import pytest

from checks.pciebw_probe import ChildBandwidthProbe, measure_within

pytestmark = pytest.mark.gpu


def _gpu0_bus_id() -> str:
    import pynvml

    pynvml.nvmlInit()
    try:
        bus_id = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).busId
    finally:
        pynvml.nvmlShutdown()
    return bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)


@pytest.mark.anyio
async def test_real_probe_measures_gpu_0_both_ways_in_a_child() -> None:
    bandwidth = await measure_within(ChildBandwidthProbe(), _gpu0_bus_id(), 64 << 20, 5, 60)
    assert bandwidth.h2d_gbps > 1.0 and bandwidth.d2h_gbps > 1.0
    assert bandwidth.h2d_gbps < 1000 and bandwidth.d2h_gbps < 1000  # not a timing bug
    assert bandwidth.pid not in (0, os.getpid())
