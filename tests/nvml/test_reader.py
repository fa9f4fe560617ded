"""NvmlReader over the fake NVML library (under the real pynvml): how every NVML
outcome becomes a reading.

- a healthy machine reads Ok everywhere (retired pages: Unsupported on H100);
- each bundled fault spec shows its fault on the GPU its comment names;
- NOT_SUPPORTED -> Unsupported; other errors -> Failed naming the function, without
  hiding the GPU's other readings; older drivers' throttle-reason name still works;
- GPU_IS_LOST -> lost (keeping the identity an earlier pass read);
- no driver -> driver_error, and a driver that appears or comes back is used;
- a missing GPU is not enumerated.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from checks.nvml_reader import NvmlReader
from checks.snapshot import (
    DRIVER_NOT_FOUND,
    Ecc,
    Failed,
    GpuSnapshot,
    NvLink,
    Ok,
    PcieLink,
    Power,
    RemappedRows,
    Unsupported,
)
from healthd.sim.fakenvml import install
from healthd.sim.machine import GpuFault, load_machine_spec
from tests.sim.conftest import Machine, StepClock

READINGS = ("remapped", "clock_event_reasons", "power", "pcie", "pcie_replays", "ecc",
            "retired_pages_pending", "nvlinks")


@pytest.fixture
def reader() -> NvmlReader:
    return NvmlReader()


def value(gpu: GpuSnapshot, name: str) -> object:
    reading = getattr(gpu, name)
    assert isinstance(reading, Ok), f"gpu{gpu.index} {name}: {reading}"
    return reading.value


def test_healthy_machine_reads_ok_everywhere(reader: NvmlReader) -> None:
    spec = load_machine_spec("healthy-8xh100")
    with install(spec):
        snap = reader.read()
    assert (snap.driver_error, snap.driver_version, snap.nvml_version,
            snap.cuda_driver_version) == ("", "580.65.06", "13.580.65.06", 13000)
    assert [g.index for g in snap.gpus] == list(range(8))
    for gpu in snap.gpus:
        assert (gpu.uuid, gpu.pci_bus_id, gpu.model) == (
            spec.uuid(gpu.index), spec.pci_bus_id(gpu.index), "NVIDIA H100 80GB HBM3")
        assert not gpu.lost and not gpu.mig_enabled
        assert value(gpu, "remapped") == RemappedRows(0, 0, False, False)
        assert value(gpu, "clock_event_reasons") == 0x1  # idle
        assert value(gpu, "power") == Power(95.0, 700.0)
        assert value(gpu, "pcie") == PcieLink(5, 16, 5, 16)
        assert value(gpu, "pcie_replays") == 0
        assert value(gpu, "ecc") == Ecc(0, 0)
        assert value(gpu, "nvlinks") == tuple(NvLink(n, True) for n in range(18))
        # H100 remaps rows instead of retiring pages: NVML does not support the query.
        assert gpu.retired_pages_pending == Unsupported(
            "nvmlDeviceGetRetiredPagesPendingStatus: not supported",
            "nvmlDeviceGetRetiredPagesPendingStatus", "NOT_SUPPORTED")
        assert gpu.mig_mode == Ok(False)
    assert snap.duration_s < 1.0 and snap.taken_at > 0


def test_page_retirement_gpu_reads_ok_everywhere(machine: Machine, reader: NvmlReader) -> None:
    machine(init=False, gpus={"count": 2, "page_retirement": True})
    for gpu in reader.read().gpus:
        assert all(isinstance(getattr(gpu, name), Ok) for name in READINGS), gpu
        assert value(gpu, "retired_pages_pending") is False


EXPECTED: dict[str, tuple[int, Callable[[GpuSnapshot], bool]]] = {
    "remap-pending": (3, lambda g: value(g, "remapped").pending),  # type: ignore[attr-defined]
    "remap-failure": (2, lambda g: value(g, "remapped").failure),  # type: ignore[attr-defined]
    "hw-slowdown": (1, lambda g: value(g, "clock_event_reasons") == 0x88),
    "pcie-degraded": (4, lambda g: value(g, "pcie") == PcieLink(3, 8, 5, 16)),
    "ecc-uncorrected": (0, lambda g: value(g, "ecc") == Ecc(17, 2)),
    "nvlink-down": (7, lambda g: [n.link for n in value(g, "nvlinks") if not n.up]  # type: ignore[attr-defined]
                    == [4, 11]),
    "mig-enabled": (0, lambda g: g.mig_enabled),
    "gpu-lost": (6, lambda g: g.lost),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bundled_fault_shows_on_its_gpu_only(name: str, reader: NvmlReader) -> None:
    bad, shows = EXPECTED[name]
    with install(load_machine_spec(name)):
        gpus = reader.read().gpus
    assert [g.index for g in gpus if shows(g)] == [bad]
    healthy = load_machine_spec("healthy-8xh100")
    for gpu in gpus:  # every other GPU reads like the healthy machine
        if gpu.index != bad:
            assert value(gpu, "remapped") == RemappedRows(0, 0, False, False)
            assert value(gpu, "pcie") == PcieLink(5, 16, 5, 16)
            assert gpu.model == healthy.gpus.model


def test_missing_gpu_is_not_enumerated(reader: NvmlReader) -> None:
    spec = load_machine_spec("gpu-missing")
    with install(spec):
        gpus = reader.read().gpus
    assert len(gpus) == 7
    assert [g.uuid for g in gpus] == [spec.uuid(i) for i in range(7)]


def test_not_supported_becomes_unsupported(machine: Machine, reader: NvmlReader) -> None:
    machine(init=False, gpus={"count": 1, "ecc_enabled": False, "nvlinks": 0},
            faults=[{"gpu": 0, "nvml_errors": [
                {"function": "nvmlDeviceGetPcieReplayCounter", "error": "NOT_SUPPORTED"}]}])
    gpu = reader.read().gpus[0]
    assert gpu.ecc == Unsupported("ECC is disabled", "nvmlDeviceGetEccMode")
    assert gpu.nvlinks == Unsupported("nvmlDeviceGetNvLinkState: not supported",
                                      "nvmlDeviceGetNvLinkState", "NOT_SUPPORTED")
    assert gpu.pcie_replays == Unsupported("nvmlDeviceGetPcieReplayCounter: not supported",
                                           "nvmlDeviceGetPcieReplayCounter", "NOT_SUPPORTED")
    assert value(gpu, "power") == Power(95.0, 700.0)


def test_error_fails_one_reading_and_names_the_function(machine: Machine,
                                                         reader: NvmlReader) -> None:
    machine(init=False, gpus={"count": 2}, faults=[{"gpu": 1, "nvml_errors": [
        {"function": "nvmlDeviceGetEnforcedPowerLimit", "error": "UNKNOWN"},
        {"function": "nvmlDeviceGetNvLinkState", "error": "TIMEOUT"},
    ]}])
    good, bad = reader.read().gpus
    assert bad.power == Failed("nvmlDeviceGetEnforcedPowerLimit: Unknown Error",
                               "nvmlDeviceGetEnforcedPowerLimit", "UNKNOWN")
    assert bad.nvlinks == Failed("nvmlDeviceGetNvLinkState: Timeout",
                                 "nvmlDeviceGetNvLinkState", "TIMEOUT")
    assert value(bad, "remapped") == RemappedRows(0, 0, False, False)  # others unhidden
    assert not bad.lost and bad.uuid
    assert value(good, "power") == Power(95.0, 700.0)


def test_handle_failure_fails_every_reading(machine: Machine, reader: NvmlReader) -> None:
    machine(init=False, gpus={"count": 2}, faults=[{"gpu": 0, "nvml_errors": [
        {"function": "nvmlDeviceGetHandleByIndex", "error": "NO_PERMISSION"}]}])
    gpu = reader.read().gpus[0]
    failed = Failed("nvmlDeviceGetHandleByIndex: Insufficient Permissions",
                    "nvmlDeviceGetHandleByIndex", "NO_PERMISSION")
    assert all(getattr(gpu, name) == failed for name in READINGS)


def test_old_driver_throttle_reasons_still_read(machine: Machine, reader: NvmlReader) -> None:
    machine(init=False, gpus={"count": 1}, faults=[{
        "gpu": 0, "clock_event_reasons": ["hw_slowdown"], "nvml_errors": [
            {"function": "nvmlDeviceGetCurrentClocksEventReasons",
             "error": "FUNCTION_NOT_FOUND"}]}])
    assert value(reader.read().gpus[0], "clock_event_reasons") == 0x8


def test_gpu_lost_later_keeps_its_identity(machine: Machine, reader: NvmlReader,
                                           clock: StepClock) -> None:
    fake = machine(init=False, gpus={"count": 2}, faults=[{"gpu": 1, "lost": True, "at": 5}])
    assert not reader.read().gpus[1].lost
    clock.t = 5
    gpu = reader.read().gpus[1]
    assert gpu.lost and "GPU is lost" in gpu.lost_reason
    assert gpu.lost_reason.startswith("nvmlDevice")  # names the call that found it
    assert gpu.uuid == fake.spec.uuid(1)  # from the earlier pass
    assert gpu.remapped == Failed("GPU is lost")


def test_no_driver_reports_driver_error_then_recovers(machine: Machine,
                                                       reader: NvmlReader) -> None:
    fake = machine(init=False, driver_present=False)
    snap = reader.read()
    assert (snap.driver_error, snap.gpus) == (DRIVER_NOT_FOUND, ())
    fake.set_driver_present(True)  # the driver is installed later: the next pass uses it
    assert len(reader.read().gpus) == 8
    fake.set_driver_present(False)  # and unloaded again
    assert reader.read().driver_error == DRIVER_NOT_FOUND
    fake.set_driver_present(True)
    assert reader.read().driver_error == ""


def test_other_init_errors_are_reported(machine: Machine, reader: NvmlReader) -> None:
    machine(init=False, gpus={"count": 1}, faults=[{"gpu": 0, "nvml_errors": [
        {"function": "nvmlInit", "error": "LIB_RM_VERSION_MISMATCH", "times": 1}]}])
    assert reader.read().driver_error.startswith("nvmlInit: RM has detected")
    assert reader.read().driver_error == ""


def test_one_init_is_reused_and_close_shuts_down(machine: Machine, reader: NvmlReader) -> None:
    fake = machine(init=False, gpus={"count": 2})
    for _ in range(3):
        reader.read()
    assert fake.library.calls["nvmlInitWithFlags"] == 1
    assert fake.library.calls["nvmlDeviceGetHandleByIndex_v2"] == 2  # handles cached
    reader.close()
    assert fake.library.refcount == 0


def test_faults_appear_between_passes(machine: Machine, reader: NvmlReader) -> None:
    fake = machine(init=False, gpus={"count": 2})
    assert value(reader.read().gpus[0], "remapped") == RemappedRows(0, 0, False, False)
    fake.inject(GpuFault(gpu=0, remapped_rows={"pending": True}))  # type: ignore[arg-type]
    assert value(reader.read().gpus[0], "remapped") == RemappedRows(0, 0, True, False)


def test_fabric_info_comes_through_pynvmls_own_struct(reader: NvmlReader) -> None:
    from checks.snapshot import Fabric

    spec = load_machine_spec("hgx-h100-fabric-not-registered")
    spec = spec.model_copy(update={"faults": [GpuFault(gpu=2, fabric={  # type: ignore[arg-type]
        "state": "completed", "status": "INSUFFICIENT_RESOURCES"})]})
    with install(spec):
        snap = reader.read()
    assert value(snap.gpus[0], "fabric") == Fabric("not_started", "SUCCESS", 0, "00" * 16)
    assert value(snap.gpus[2], "fabric") == Fabric(
        "completed", "INSUFFICIENT_RESOURCES", 0, "00" * 16)


def test_no_fabric_is_unsupported(reader: NvmlReader) -> None:
    with install(load_machine_spec("healthy-8xh100")):
        snap = reader.read()
    assert all(isinstance(gpu.fabric, Unsupported) for gpu in snap.gpus)


def test_older_driver_without_the_versioned_call_uses_the_original(
        reader: NvmlReader, monkeypatch: pytest.MonkeyPatch) -> None:
    from checks.snapshot import Fabric
    from healthd.sim import nvmlsymbols

    monkeypatch.delitem(nvmlsymbols.SYMBOLS, "nvmlDeviceGetGpuFabricInfoV")
    with install(load_machine_spec("hgx-h100-fabric-not-registered")):
        snap = reader.read()
    assert snap.gpus[0].fabric == Ok(Fabric("not_started", "SUCCESS", 0, "00" * 16))
