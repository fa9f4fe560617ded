"""The reader on a real NVIDIA GPU (skipped without one): one pass reads every GPU
with its identity, and no reading fails on a healthy machine; a release for a GPU
reset leaves no NVIDIA device open in the process until it resumes."""

from __future__ import annotations

import os
from pathlib import Path

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


def nvidia_devices_open() -> list[str]:
    """The /dev/nvidia* files this process holds open (what a GPU reset refuses)."""
    found = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile (the fd listing's own)
            continue
        if target.startswith("/dev/nvidia"):
            found.append(target)
    return found


def test_a_release_leaves_no_nvidia_device_open_until_resumed() -> None:
    reader = NvmlReader()
    try:
        bus_id = reader.read().gpus[0].pci_bus_id
        reader.wait_xid(10)  # the XID event set, as the agent holds it
        assert nvidia_devices_open()
        reader.release("NVML released for a GPU reset")
        assert nvidia_devices_open() == []
        assert reader.read().driver_error == "NVML released for a GPU reset"
        assert reader.activity(bus_id).pids is None
        assert nvidia_devices_open() == []
        reader.resume()
        reader.listen()
        assert reader.read().gpus and nvidia_devices_open()
    finally:
        reader.close()
    assert nvidia_devices_open() == []
