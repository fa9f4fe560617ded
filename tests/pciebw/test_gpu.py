"""The real CUDA probe on a real GPU (skipped without one): plausible numbers on GPU 0."""

from __future__ import annotations

import pytest

from checks.pciebw import CudaBandwidthProbe

pytestmark = pytest.mark.gpu


def _gpu0_bus_id() -> str:
    import pynvml

    pynvml.nvmlInit()
    try:
        bus_id = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).busId
    finally:
        pynvml.nvmlShutdown()
    return bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)


def test_real_probe_measures_gpu_0_both_ways() -> None:
    bandwidth = CudaBandwidthProbe().measure(_gpu0_bus_id(), 256 << 20, 5)
    assert bandwidth.h2d_gbps > 1.0 and bandwidth.d2h_gbps > 1.0
    assert bandwidth.h2d_gbps < 1000 and bandwidth.d2h_gbps < 1000  # not a timing bug
