"""The reader on a real NVIDIA GPU (skipped without one): one pass reads every GPU
with its identity, and no reading fails on a healthy machine."""

from __future__ import annotations

import pytest

from checks.nvml_reader import NvmlReader
from checks.snapshot import Failed

pytestmark = pytest.mark.gpu


def test_real_pass_reads_every_gpu() -> None:
    reader = NvmlReader()
    try:
        snap = reader.read()
    finally:
        reader.close()
    assert snap.driver_error == "" and snap.driver_version
    assert snap.gpus, "the driver is loaded but NVML lists no GPU"
    for gpu in snap.gpus:
        assert gpu.uuid.startswith("GPU-") and gpu.pci_bus_id and gpu.model
        assert not gpu.lost, gpu.lost_reason
        failed = {name: r for name, r in vars(gpu).items() if isinstance(r, Failed)}
        assert not failed, f"gpu{gpu.index}: {failed}"
    assert snap.duration_s < 2.0
