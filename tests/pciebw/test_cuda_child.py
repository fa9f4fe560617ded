"""The child's CUDA measurement (checks.cuda_child) against a fake libcuda: GPUs found
by PCI bus id whatever CUDA's ordering, GB/s from event timings, CUresult names in the
answer, every resource released on every path; and its one answer line both ways.
No driver on this machine: the real child, started for real, makes the whole check
UNKNOWN "CUDA driver not found"."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
from functools import partial

import pytest

from checks.base import Severity
from checks.cuda import CUDA_NOT_FOUND, CudaDriver, cu_result_name, parse_bus_id
from checks.cuda_child import Answer, decode, encode, measure
from checks.pciebw import PcieBwCheck
from checks.pciebw_probe import cuda_child_command
from checks.probes import Probes
from tests.checks.gpufakes import context, node, run

from .fakes import FakeActivity, FakeCuda

NVML_BUS_0 = "00000000:18:00.0"
MIB = 1 << 20


def libcuda_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def child_measure(fake: FakeCuda, bus_id: str = NVML_BUS_0, size: int = MIB,
                  iterations: int = 1) -> Answer:
    return measure(bus_id, size, iterations, open_driver=partial(CudaDriver, loader=fake.load))


@pytest.mark.anyio
@pytest.mark.skipif(libcuda_present(), reason="this machine has a CUDA driver")
async def test_without_a_cuda_driver_the_real_child_makes_the_check_unknown() -> None:
    check = PcieBwCheck(probes=Probes(gpu_activity=FakeActivity()))  # the real child
    result = await run(check, context(node(count=2)))
    assert (result.status, result.reason) == (Severity.UNKNOWN, CUDA_NOT_FOUND)


@pytest.mark.skipif(libcuda_present(), reason="this machine has a CUDA driver")
def test_the_real_child_answers_one_line_with_its_pid() -> None:
    proc = subprocess.run(cuda_child_command(NVML_BUS_0, MIB, 1), capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    answer = decode(proc.stdout)
    assert (answer.error, answer.unavailable) == (CUDA_NOT_FOUND, True)
    assert answer.pid > 0 and answer.pid != os.getpid()


def test_missing_library_is_driver_not_found() -> None:
    answer = measure(NVML_BUS_0, MIB, 1, open_driver=partial(CudaDriver, "libcuda-absent.so.1"))
    assert (answer.error, answer.unavailable) == (CUDA_NOT_FOUND, True)


def test_cuinit_failure_is_unavailable_with_its_name() -> None:
    answer = child_measure(FakeCuda(["0000:18:00.0"], init_result=100))
    assert (answer.error, answer.unavailable) == ("cuInit failed: CUDA_ERROR_NO_DEVICE", True)


def test_gpu_is_found_by_bus_id_not_by_ordinal_and_everything_is_released() -> None:
    fake = FakeCuda(["0000:28:00.0", "0000:18:00.0"], elapsed_ms=50.0)
    answer = child_measure(fake, size=64 * MIB, iterations=5)
    assert fake.retained == [1]  # CUDA ordinal 1 is NVML's bus 18
    # 5 x 64 MiB in 50 ms each way
    assert answer.h2d_gbps == answer.d2h_gbps == pytest.approx(5 * 64 * MIB / 0.05 / 1e9)
    assert answer.pid == os.getpid() and not answer.error
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
def test_failed_call_is_the_answer_and_releases_everything(
    call: str, code: int, name: str
) -> None:
    fake = FakeCuda(["0000:18:00.0"], fail={call: code})
    answer = child_measure(fake, iterations=2)
    assert (answer.error, answer.unavailable) == (f"{call} failed: {name}", False)
    assert fake.live == {} and fake.current is None


def test_gpu_cuda_cannot_see_is_an_error() -> None:
    fake = FakeCuda(["0000:28:00.0"])
    assert re.search(re.escape(f"no CUDA device at PCI bus id {NVML_BUS_0}"),
                     child_measure(fake).error)
    assert "not a PCI bus id" in child_measure(fake, bus_id="garbage").error


def test_zero_elapsed_time_is_an_error_not_infinite_bandwidth() -> None:
    fake = FakeCuda(["0000:18:00.0"], elapsed_ms=0.0)
    assert "timed the copies" in child_measure(fake).error
    assert fake.live == {}


def test_driver_lacking_an_entry_point_is_unavailable() -> None:
    fake = FakeCuda(["0000:18:00.0"])

    def old_driver(name: str) -> object:
        lib = fake.load(name)
        del lib.cuMemAllocHost_v2
        return lib

    answer = measure(NVML_BUS_0, MIB, 1, open_driver=partial(CudaDriver, loader=old_driver))
    assert answer.unavailable and re.search(r"too old.*cuMemAllocHost_v2", answer.error)


@pytest.mark.parametrize("answer", [
    Answer(55.41, 55.33, pid=7), Answer(error="CUDA driver not found", unavailable=True, pid=8),
    Answer(error="cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY", pid=9)])
def test_an_answer_reads_back_as_it_was_written(answer: Answer) -> None:
    assert decode(encode(answer) + "\n") == answer


@pytest.mark.parametrize("garbage", [
    "", "hello", "[1, 2]", '{"h2d_gbps": 1}', '{"h2d_gbps": "fast", "d2h_gbps": 1}',
    '{"h2d_gbps": 1, "d2h_gbps": 1}\n{"h2d_gbps": 1, "d2h_gbps": 1}', '{"error": ""}',
    '{"h2d_gbps": true, "d2h_gbps": 1}'])
def test_anything_else_is_no_answer(garbage: str) -> None:
    with pytest.raises(ValueError):
        decode(garbage)


def test_bus_ids_in_nvml_and_cuda_forms_match() -> None:
    assert parse_bus_id("00000000:18:00.0") == parse_bus_id("0000:18:00.0") == (0, 0x18, 0, 0)
    assert parse_bus_id("0001:AB:1f.3") == (1, 0xAB, 0x1F, 3)
    assert parse_bus_id("not-a-bus") is None


def test_result_names() -> None:
    assert cu_result_name(100) == "CUDA_ERROR_NO_DEVICE"
    assert cu_result_name(4242) == "CUresult 4242"
