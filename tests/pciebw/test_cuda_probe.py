"""The ctypes CUDA probe: no driver on this machine -> UNKNOWN "CUDA driver not found";
against a fake libcuda: GPUs found by PCI bus id whatever CUDA's ordering, GB/s from
event timings, CUresult names in messages, and every resource released on every path."""

from __future__ import annotations

import ctypes
import re

import pytest

from checks.base import Severity
from checks.cuda import CUDA_NOT_FOUND, cu_result_name, parse_bus_id
from checks.pciebw import CudaBandwidthProbe, PcieBwCheck, ProbeError, ProbeUnavailable
from checks.probes import Probes
from tests.checks.gpufakes import context, node, run

from .fakes import FakeCuda

NVML_BUS_0 = "00000000:18:00.0"
MIB = 1 << 20


def libcuda_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def fake_probe(fake: FakeCuda) -> CudaBandwidthProbe:
    return CudaBandwidthProbe(loader=fake.load)


@pytest.mark.anyio
@pytest.mark.skipif(libcuda_present(), reason="this machine has a CUDA driver")
async def test_without_a_cuda_driver_the_check_is_unknown() -> None:
    result = await run(PcieBwCheck(), context(node(count=2)))
    assert (result.status, result.reason) == (Severity.UNKNOWN, CUDA_NOT_FOUND)


def test_missing_library_is_driver_not_found() -> None:
    with pytest.raises(ProbeUnavailable, match=f"^{CUDA_NOT_FOUND}$"):
        CudaBandwidthProbe(library="libcuda-absent.so.1").measure(NVML_BUS_0, MIB, 1)


@pytest.mark.anyio
async def test_cuinit_failure_is_unknown_for_the_whole_check_with_its_name() -> None:
    probe = fake_probe(FakeCuda(["0000:18:00.0"], init_result=100))
    result = await run(PcieBwCheck(probes=Probes(bandwidth=probe)), context(node(count=2)))
    assert (result.status, result.reason) == (
        Severity.UNKNOWN,
        "cuInit failed: CUDA_ERROR_NO_DEVICE",
    )


def test_gpu_is_found_by_bus_id_not_by_ordinal_and_everything_is_released() -> None:
    fake = FakeCuda(["0000:28:00.0", "0000:18:00.0"], elapsed_ms=50.0)
    bandwidth = fake_probe(fake).measure(NVML_BUS_0, 256 * MIB, 5)
    assert fake.retained == [1]  # CUDA ordinal 1 is NVML's bus 18
    # 5 x 256 MiB in 50 ms each way
    assert bandwidth.h2d_gbps == bandwidth.d2h_gbps == pytest.approx(5 * 256 * MIB / 0.05 / 1e9)
    assert fake.live == {} and fake.current is None
    assert fake.calls.count("cuMemcpyHtoDAsync_v2") == 6  # one warm-up, five timed


@pytest.mark.parametrize(
    ("call", "code", "name"),
    [
        ("cuDevicePrimaryCtxRetain", 46, "CUDA_ERROR_DEVICE_UNAVAILABLE"),
        ("cuMemAllocHost_v2", 2, "CUDA_ERROR_OUT_OF_MEMORY"),
        ("cuMemAlloc_v2", 2, "CUDA_ERROR_OUT_OF_MEMORY"),
        ("cuEventCreate", 999, "CUDA_ERROR_UNKNOWN"),
        ("cuMemcpyDtoHAsync_v2", 700, "CUDA_ERROR_ILLEGAL_ADDRESS"),
        ("cuEventSynchronize", 214, "CUDA_ERROR_ECC_UNCORRECTABLE"),
    ],
)
def test_failed_call_is_a_probe_error_and_releases_everything(
    call: str, code: int, name: str
) -> None:
    fake = FakeCuda(["0000:18:00.0"], fail={call: code})
    with pytest.raises(ProbeError, match=f"^{call} failed: {name}$"):
        fake_probe(fake).measure(NVML_BUS_0, MIB, 2)
    assert fake.live == {} and fake.current is None


def test_gpu_cuda_cannot_see_is_a_probe_error() -> None:
    fake = FakeCuda(["0000:28:00.0"])
    with pytest.raises(ProbeError, match=re.escape(f"no CUDA device at PCI bus id {NVML_BUS_0}")):
        fake_probe(fake).measure(NVML_BUS_0, MIB, 1)
    with pytest.raises(ProbeError, match="not a PCI bus id"):
        fake_probe(fake).measure("garbage", MIB, 1)


def test_zero_elapsed_time_is_a_probe_error_not_infinite_bandwidth() -> None:
    fake = FakeCuda(["0000:18:00.0"], elapsed_ms=0.0)
    with pytest.raises(ProbeError, match="timed the copies"):
        fake_probe(fake).measure(NVML_BUS_0, MIB, 1)
    assert fake.live == {}


def test_driver_lacking_an_entry_point_is_unavailable() -> None:
    fake = FakeCuda(["0000:18:00.0"])

    def old_driver(name: str) -> object:
        lib = fake.load(name)
        del lib.cuMemAllocHost_v2
        return lib

    with pytest.raises(ProbeUnavailable, match=r"too old.*cuMemAllocHost_v2"):
        CudaBandwidthProbe(loader=old_driver).measure(NVML_BUS_0, MIB, 1)


def test_bus_ids_in_nvml_and_cuda_forms_match() -> None:
    assert parse_bus_id("00000000:18:00.0") == parse_bus_id("0000:18:00.0") == (0, 0x18, 0, 0)
    assert parse_bus_id("0001:AB:1f.3") == (1, 0xAB, 0x1F, 3)
    assert parse_bus_id("not-a-bus") is None


def test_result_names() -> None:
    assert cu_result_name(100) == "CUDA_ERROR_NO_DEVICE"
    assert cu_result_name(4242) == "CUresult 4242"
