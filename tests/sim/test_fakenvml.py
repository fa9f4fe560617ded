"""The fake NVML library, exercised only through the real pynvml API:

- identity and system queries (count, handles by index/UUID/bus id, name, PCI info,
  memory, MIG, versions), the init/shutdown life cycle, missing symbols;
- every health property with and without its fault, and faults that start and end
  on a stepped clock (the replay counter keeps rising, then holds);
- lost GPUs, missing GPUs, injected NVML errors (named, counted, version suffix),
  an absent driver and one that appears later;
- XID events: scheduled, emitted at run time or injected, delivered once to the sets
  registered when they fire and never to a set registered later; waited for from
  another thread (woken by an emitted XID, a stepped clock, a GPU registered while it
  waits, or a real-time schedule);
- install/uninstall restoring pynvml, and run-time fault injection.
"""

from __future__ import annotations

import threading
import time

import pynvml
import pytest

from healthd.sim.fakenvml import install
from healthd.sim.machine import BUNDLED_DIR, GpuFault, bundled_specs, load_machine_spec
from tests.sim.conftest import Machine, StepClock

N = pynvml


def handle(index: int) -> object:
    return N.nvmlDeviceGetHandleByIndex(index)


def raises(error: type[Exception], fn: object, *args: object) -> None:
    with pytest.raises(error):
        fn(*args)  # type: ignore[operator]


# -- identity and system --------------------------------------------------------------

def test_identity_of_every_gpu(machine: Machine) -> None:
    fake = machine(gpus={"count": 4})
    assert N.nvmlDeviceGetCount() == 4
    uuids = set()
    for i in range(4):
        h = handle(i)
        uuid = N.nvmlDeviceGetUUID(h)
        uuids.add(uuid)
        assert uuid == fake.spec.uuid(i)
        assert N.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"
        assert N.nvmlDeviceGetPciInfo(h).busId == fake.spec.pci_bus_id(i)
        assert N.nvmlDeviceGetMinorNumber(h) == i
        assert N.nvmlDeviceGetIndex(h) == i
        assert N.nvmlDeviceGetUUID(N.nvmlDeviceGetHandleByUUID(uuid)) == uuid
        assert N.nvmlDeviceGetMinorNumber(N.nvmlDeviceGetHandleByPciBusId(
            fake.spec.pci_bus_id(i))) == i
    assert len(uuids) == 4
    short = fake.spec.pci_bus_id(2)[4:].lower()  # "0000:38:00.0" form works too
    assert N.nvmlDeviceGetMinorNumber(N.nvmlDeviceGetHandleByPciBusId(short)) == 2
    raises(N.NVMLError_InvalidArgument, N.nvmlDeviceGetHandleByIndex, 4)
    raises(N.NVMLError_NotFound, N.nvmlDeviceGetHandleByUUID, "GPU-nope")
    raises(N.NVMLError_InvalidArgument, N.nvmlDeviceGetHandleByPciBusId, "garbage")


def test_system_versions_memory_and_mig(machine: Machine) -> None:
    machine(driver_version="570.86.15", cuda_driver_version=12080,
            gpus={"count": 2, "memory_mib": 1024}, faults=[{"gpu": 1, "mig": True}])
    assert N.nvmlSystemGetDriverVersion() == "570.86.15"
    assert N.nvmlSystemGetNVMLVersion() == "12.570.86.15"
    assert N.nvmlSystemGetCudaDriverVersion() == 12080
    assert N.nvmlSystemGetCudaDriverVersion_v2() == 12080
    memory = N.nvmlDeviceGetMemoryInfo(handle(0))
    assert memory.total == 1024 << 20 and memory.free + memory.used == memory.total
    assert N.nvmlDeviceGetMemoryInfo(handle(0), N.nvmlMemory_v2).total == 1024 << 20
    assert N.nvmlDeviceGetMigMode(handle(0)) == [0, 0]
    assert N.nvmlDeviceGetMigMode(handle(1)) == [1, 1]


def test_mig_unsupported_and_error_strings(machine: Machine) -> None:
    machine(gpus={"count": 1, "mig_capable": False})
    raises(N.NVMLError_NotSupported, N.nvmlDeviceGetMigMode, handle(0))
    assert N.nvmlErrorString(N.NVML_ERROR_GPU_IS_LOST) == "GPU is lost"


def test_life_cycle_and_missing_symbols(machine: Machine) -> None:
    machine(init=False, gpus={"count": 1})
    raises(N.NVMLError_Uninitialized, N.nvmlDeviceGetCount)
    N.nvmlInit()
    assert N.nvmlDeviceGetCount() == 1
    raises(N.NVMLError_FunctionNotFound, N.nvmlDeviceGetFanSpeed, handle(0))
    N.nvmlShutdown()
    raises(N.NVMLError_Uninitialized, N.nvmlDeviceGetCount)


def test_handles_from_elsewhere_are_rejected(machine: Machine) -> None:
    machine(gpus={"count": 1})
    raises(N.NVMLError_InvalidArgument, N.nvmlDeviceGetUUID, N.c_nvmlDevice_t())


# -- health properties ----------------------------------------------------------------

HEALTHY = {"count": 2, "nvlinks": 4}


def test_healthy_gpu_readings(machine: Machine) -> None:
    machine(gpus=HEALTHY)
    h = handle(0)
    assert N.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)
    assert N.nvmlDeviceGetCurrentClocksEventReasons(h) == N.nvmlClocksEventReasonGpuIdle
    assert N.nvmlDeviceGetSupportedClocksEventReasons(h) == 0x1FF
    assert N.nvmlDeviceGetSupportedClocksThrottleReasons(h) == 0x1FF
    assert N.nvmlDeviceGetPowerUsage(h) == 95_000
    assert N.nvmlDeviceGetPowerManagementLimit(h) == 700_000
    assert N.nvmlDeviceGetEnforcedPowerLimit(h) == 700_000
    assert N.nvmlDeviceGetCurrPcieLinkGeneration(h) == N.nvmlDeviceGetMaxPcieLinkGeneration(h) == 5
    assert N.nvmlDeviceGetGpuMaxPcieLinkGeneration(h) == 5
    assert N.nvmlDeviceGetCurrPcieLinkWidth(h) == N.nvmlDeviceGetMaxPcieLinkWidth(h) == 16
    assert N.nvmlDeviceGetPcieReplayCounter(h) == 0
    assert N.nvmlDeviceGetEccMode(h) == [1, 1]
    for kind in (N.NVML_MEMORY_ERROR_TYPE_CORRECTED, N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED):
        for counter in (N.NVML_VOLATILE_ECC, N.NVML_AGGREGATE_ECC):
            assert N.nvmlDeviceGetTotalEccErrors(h, kind, counter) == 0
    raises(N.NVMLError_NotSupported, N.nvmlDeviceGetRetiredPagesPendingStatus, h)  # H100
    assert [N.nvmlDeviceGetNvLinkState(h, link) for link in range(4)] == [1, 1, 1, 1]
    raises(N.NVMLError_InvalidArgument, N.nvmlDeviceGetNvLinkState, h, 4)


def test_every_fault_shows_on_its_gpu_only(machine: Machine) -> None:
    fault = {
        "gpu": 1,
        "remapped_rows": {"correctable": 2, "uncorrectable": 1, "pending": True},
        "clock_event_reasons": ["hw_slowdown", "hw_thermal_slowdown"],
        "power": {"usage_w": 650.5, "limit_w": 500},
        "pcie": {"gen": 3, "width": 8},
        "pcie_replays": 40,
        "ecc": {"corrected_volatile": 7, "uncorrected_volatile": 3,
                "retired_pages_pending": True},
        "nvlink_down": [0, 2],
    }
    machine(gpus={**HEALTHY, "page_retirement": True}, faults=[fault])
    h = handle(1)
    assert N.nvmlDeviceGetRemappedRows(h) == (2, 1, 1, 0)
    assert N.nvmlDeviceGetCurrentClocksEventReasons(h) == 0x48
    assert N.nvmlDeviceGetCurrentClocksThrottleReasons(h) == 0x48  # the pre-13 name
    assert N.nvmlDeviceGetPowerUsage(h) == 650_500
    assert N.nvmlDeviceGetEnforcedPowerLimit(h) == 500_000
    assert (N.nvmlDeviceGetCurrPcieLinkGeneration(h), N.nvmlDeviceGetCurrPcieLinkWidth(h)) == (3, 8)
    assert (N.nvmlDeviceGetMaxPcieLinkGeneration(h), N.nvmlDeviceGetMaxPcieLinkWidth(h)) == (5, 16)
    assert N.nvmlDeviceGetPcieReplayCounter(h) == 40
    assert N.nvmlDeviceGetTotalEccErrors(
        h, N.NVML_MEMORY_ERROR_TYPE_CORRECTED, N.NVML_VOLATILE_ECC) == 7
    assert N.nvmlDeviceGetTotalEccErrors(
        h, N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, N.NVML_VOLATILE_ECC) == 3
    assert N.nvmlDeviceGetRetiredPagesPendingStatus(h) == 1
    assert [N.nvmlDeviceGetNvLinkState(h, link) for link in range(4)] == [0, 1, 0, 1]
    other = handle(0)
    assert N.nvmlDeviceGetRemappedRows(other) == (0, 0, 0, 0)
    assert N.nvmlDeviceGetRetiredPagesPendingStatus(other) == 0
    assert N.nvmlDeviceGetNvLinkState(other, 0) == 1


def test_ecc_disabled_and_no_nvlink_are_not_supported(machine: Machine) -> None:
    machine(gpus={"count": 1, "ecc_enabled": False, "nvlinks": 0})
    h = handle(0)
    assert N.nvmlDeviceGetEccMode(h) == [0, 0]
    raises(N.NVMLError_NotSupported, N.nvmlDeviceGetTotalEccErrors, h,
           N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, N.NVML_VOLATILE_ECC)
    raises(N.NVMLError_NotSupported, N.nvmlDeviceGetNvLinkState, h, 0)


def test_faults_follow_the_clock(machine: Machine, clock: StepClock) -> None:
    machine(gpus={"count": 1}, faults=[
        {"gpu": 0, "at": 10, "until": 20, "remapped_rows": {"pending": True},
         "pcie_replays": 5, "pcie_replay_rate": 2.0},
    ])
    h = handle(0)
    readings = []
    for t in (0, 10, 15, 20, 30):
        clock.t = t
        readings.append((N.nvmlDeviceGetRemappedRows(h)[2], N.nvmlDeviceGetPcieReplayCounter(h)))
    # pending only inside [10, 20); the replay counter rises from 10 and then holds.
    assert readings == [(0, 0), (1, 5), (1, 15), (0, 25), (0, 25)]


# -- lost, missing, injected errors, driver ---------------------------------------------

def test_lost_gpu_is_counted_but_answers_gpu_is_lost(machine: Machine,
                                                      clock: StepClock) -> None:
    fake = machine(gpus={"count": 3}, faults=[{"gpu": 1, "lost": True, "at": 5}])
    early = handle(1)
    assert N.nvmlDeviceGetUUID(early) == fake.spec.uuid(1)
    clock.t = 5
    assert N.nvmlDeviceGetCount() == 3
    raises(N.NVMLError_GpuIsLost, N.nvmlDeviceGetHandleByIndex, 1)
    raises(N.NVMLError_GpuIsLost, N.nvmlDeviceGetHandleByUUID, fake.spec.uuid(1))
    raises(N.NVMLError_GpuIsLost, N.nvmlDeviceGetUUID, early)  # a handle held from before
    raises(N.NVMLError_GpuIsLost, N.nvmlDeviceGetRemappedRows, early)
    assert N.nvmlDeviceGetUUID(handle(2)) == fake.spec.uuid(2)


def test_missing_gpu_is_not_enumerated(machine: Machine) -> None:
    fake = machine(gpus={"count": 4}, faults=[{"gpu": 1, "missing": True}])
    assert N.nvmlDeviceGetCount() == 3
    # The GPUs after the missing one move down an index, as on a real node.
    assert [N.nvmlDeviceGetUUID(handle(i)) for i in range(3)] == [
        fake.spec.uuid(0), fake.spec.uuid(2), fake.spec.uuid(3)]
    assert N.nvmlDeviceGetIndex(handle(2)) == 2 and N.nvmlDeviceGetMinorNumber(handle(2)) == 3
    raises(N.NVMLError_NotFound, N.nvmlDeviceGetHandleByUUID, fake.spec.uuid(1))


def test_injected_errors_name_their_function(machine: Machine) -> None:
    machine(gpus={"count": 2}, faults=[{"gpu": 1, "nvml_errors": [
        {"function": "nvmlDeviceGetPowerUsage", "error": "UNKNOWN"},
        {"function": "nvmlDeviceGetRemappedRows", "error": "CORRUPTED_INFOROM", "times": 2},
        {"function": "nvmlSystemGetDriverVersion", "error": "NO_PERMISSION", "times": 1},
    ]}])
    raises(N.NVMLError_Unknown, N.nvmlDeviceGetPowerUsage, handle(1))
    assert N.nvmlDeviceGetPowerUsage(handle(0)) == 95_000  # other GPUs unaffected
    raises(N.NVMLError_CorruptedInforom, N.nvmlDeviceGetRemappedRows, handle(1))
    raises(N.NVMLError_CorruptedInforom, N.nvmlDeviceGetRemappedRows, handle(1))
    assert N.nvmlDeviceGetRemappedRows(handle(1)) == (0, 0, 0, 0)  # recovered after 2
    raises(N.NVMLError_NoPermission, N.nvmlSystemGetDriverVersion)  # takes no GPU
    assert N.nvmlSystemGetDriverVersion() == "580.65.06"


def test_injected_error_on_versioned_lookup(machine: Machine) -> None:
    machine(gpus={"count": 2}, faults=[{"gpu": 0, "nvml_errors": [
        {"function": "nvmlDeviceGetHandleByIndex", "error": "IRQ_ISSUE"}]}])
    raises(N.NVMLError_IrqIssue, N.nvmlDeviceGetHandleByIndex, 0)  # symbol is ..._v2
    assert N.nvmlDeviceGetMinorNumber(handle(1)) == 1


def test_init_errors_can_be_injected(machine: Machine) -> None:
    machine(init=False, gpus={"count": 1}, faults=[{"gpu": 0, "nvml_errors": [
        {"function": "nvmlInit", "error": "DRIVER_NOT_LOADED", "times": 1}]}])
    raises(N.NVMLError_DriverNotLoaded, N.nvmlInit)
    N.nvmlInit()
    assert N.nvmlDeviceGetCount() == 1


def test_no_driver_then_driver_appears(machine: Machine) -> None:
    fake = machine(init=False, driver_present=False)
    raises(N.NVMLError_LibraryNotFound, N.nvmlInit)
    raises(N.NVMLError_Uninitialized, N.nvmlDeviceGetCount)
    fake.set_driver_present(True)
    N.nvmlInit()
    assert N.nvmlDeviceGetCount() == 8


def test_runtime_inject_and_clear(machine: Machine) -> None:
    fake = machine(gpus={"count": 2}, faults=[{"gpu": 0, "remapped_rows": {"failure": True}}])
    fake.inject(GpuFault(gpu=1, nvlink_down=[3]))
    assert N.nvmlDeviceGetNvLinkState(handle(1), 3) == 0
    fake.clear_faults(gpu=1)
    assert N.nvmlDeviceGetNvLinkState(handle(1), 3) == 1
    assert N.nvmlDeviceGetRemappedRows(handle(0))[3] == 1
    fake.clear_faults()
    assert N.nvmlDeviceGetRemappedRows(handle(0))[3] == 0
    with pytest.raises(ValueError, match="nvlink_down"):  # validated like the spec
        fake.inject(GpuFault(gpu=1, nvlink_down=[99]))


# -- XID events ------------------------------------------------------------------------

def xid_set(*indices: int) -> object:
    event_set = N.nvmlEventSetCreate()
    for i in indices:
        N.nvmlDeviceRegisterEvents(handle(i), N.nvmlEventTypeXidCriticalError, event_set)
    return event_set


def test_scheduled_xid_arrives_when_its_time_comes(machine: Machine, clock: StepClock) -> None:
    fake = machine(gpus={"count": 2}, faults=[{"gpu": 1, "xid": [{"code": 79, "at": 5}]}])
    assert N.nvmlDeviceGetSupportedEventTypes(handle(1)) & N.nvmlEventTypeXidCriticalError
    event_set = xid_set(0, 1)
    raises(N.NVMLError_Timeout, N.nvmlEventSetWait, event_set, 20)
    clock.t = 5
    data = N.nvmlEventSetWait(event_set, 1000)
    assert data.eventType == N.nvmlEventTypeXidCriticalError and data.eventData == 79
    assert N.nvmlDeviceGetUUID(data.device) == fake.spec.uuid(1)
    raises(N.NVMLError_Timeout, N.nvmlEventSetWait, event_set, 0)  # delivered once
    N.nvmlEventSetFree(event_set)
    raises(N.NVMLError_InvalidArgument, N.nvmlEventSetWait, event_set, 0)


def test_a_set_registered_after_a_scheduled_xid_fired_never_gets_it(
        machine: Machine, clock: StepClock) -> None:
    machine(gpus={"count": 2}, faults=[{"gpu": 1, "xid": [{"code": 79, "at": 5}]}])
    clock.t = 6  # XID 79 fired at 5 s; nobody listened
    late = xid_set(0, 1)
    raises(N.NVMLError_Timeout, N.nvmlEventSetWait, late, 0)
    clock.t = 60
    raises(N.NVMLError_Timeout, N.nvmlEventSetWait, late, 0)


def test_a_set_hears_only_the_gpus_it_was_registered_on_when_the_xid_fired(
        machine: Machine, clock: StepClock) -> None:
    machine(gpus={"count": 2}, faults=[{"gpu": 1, "xid": [{"code": 48, "at": 5},
                                                          {"code": 79, "at": 9}]}])
    event_set = xid_set(0)
    clock.t = 7  # XID 48 fires on GPU 1, which this set does not listen to yet
    N.nvmlDeviceRegisterEvents(handle(1), N.nvmlEventTypeXidCriticalError, event_set)
    clock.t = 9
    assert N.nvmlEventSetWait(event_set, 0).eventData == 79
    raises(N.NVMLError_Timeout, N.nvmlEventSetWait, event_set, 0)  # and never 48


def test_emitted_xid_reaches_only_sets_registered_on_that_gpu(machine: Machine) -> None:
    fake = machine(gpus={"count": 2})
    on_zero, on_one = xid_set(0), xid_set(1)
    fake.emit_xid(1, 48)
    later = xid_set(1)
    raises(N.NVMLError_Timeout, N.nvmlEventSetWait, on_zero, 0)
    raises(N.NVMLError_Timeout, N.nvmlEventSetWait, later, 0)  # registered after it fired
    data = N.nvmlEventSetWait(on_one, 0)
    assert (data.eventData, N.nvmlDeviceGetIndex(data.device)) == (48, 1)
    raises(N.NVMLError_Timeout, N.nvmlEventSetWait, on_one, 0)  # once


def test_a_set_reads_xids_in_the_order_they_fired(machine: Machine, clock: StepClock) -> None:
    fake = machine(gpus={"count": 1}, faults=[{"gpu": 0, "xid": [{"code": 48, "at": 5}]}])
    event_set = xid_set(0)
    clock.t = 6  # XID 48 fired at 5 s, nobody has read it yet
    fake.emit_xid(0, 79)
    assert [N.nvmlEventSetWait(event_set, 0).eventData for _ in range(2)] == [48, 79]


def test_an_injected_faults_past_xids_fire_when_it_is_injected(machine: Machine,
                                                               clock: StepClock) -> None:
    fake = machine(gpus={"count": 1})
    before = xid_set(0)
    clock.t = 10
    fake.inject(GpuFault.model_validate({"gpu": 0, "xid": [{"code": 79, "at": 5},
                                                           {"code": 48, "at": 20}]}))
    after = xid_set(0)
    assert N.nvmlEventSetWait(before, 0).eventData == 79  # fired when injected
    raises(N.NVMLError_Timeout, N.nvmlEventSetWait, after, 0)
    clock.t = 20
    assert [N.nvmlEventSetWait(s, 0).eventData for s in (before, after)] == [48, 48]


def test_wait_blocks_in_a_thread_while_other_calls_run(machine: Machine) -> None:
    fake = machine(gpus={"count": 2})
    event_set = xid_set(0, 1)
    got: list[int] = []

    def waiter() -> None:
        got.append(N.nvmlEventSetWait(event_set, 5000).eventData)

    thread = threading.Thread(target=waiter)
    started = time.monotonic()
    thread.start()
    for _ in range(50):  # the waiting thread must not block ordinary calls
        assert N.nvmlDeviceGetPowerUsage(handle(0)) == 95_000
    fake.emit_xid(0, 13)
    thread.join(timeout=5)
    assert got == [13]
    assert time.monotonic() - started < 4  # woken by the event, not by the timeout


def wait_in_thread(event_set: object, timeout_ms: int) -> tuple[threading.Thread, list[int]]:
    """Start a thread that waits once on `event_set`; it records the XID it got."""
    got: list[int] = []

    def waiter() -> None:
        try:
            got.append(N.nvmlEventSetWait(event_set, timeout_ms).eventData)
        except N.NVMLError_Timeout:
            got.append(-1)

    thread = threading.Thread(target=waiter)
    thread.start()
    return thread, got


def test_a_waiter_sees_the_stepped_clock_reach_a_scheduled_xid(machine: Machine,
                                                                clock: StepClock) -> None:
    machine(gpus={"count": 1}, faults=[{"gpu": 0, "xid": [{"code": 79, "at": 5}]}])
    thread, got = wait_in_thread(xid_set(0), 5000)
    started = time.monotonic()
    time.sleep(0.05)  # the waiter is asleep: nothing tells it the clock moves
    clock.t = 5
    thread.join(timeout=5)
    assert got == [79]
    assert time.monotonic() - started < 4  # seen when the clock moved, not at the timeout


def test_a_waiter_learns_of_a_gpu_registered_while_it_waits(machine: Machine,
                                                           clock: StepClock) -> None:
    machine(gpus={"count": 2}, faults=[{"gpu": 1, "xid": [{"code": 48, "at": 5}]}])
    event_set = xid_set(0)  # nothing scheduled for it: the waiter sleeps until its timeout
    thread, got = wait_in_thread(event_set, 5000)
    started = time.monotonic()
    time.sleep(0.05)
    N.nvmlDeviceRegisterEvents(handle(1), N.nvmlEventTypeXidCriticalError, event_set)
    time.sleep(0.05)
    clock.t = 5  # then GPU 1's XID fires
    thread.join(timeout=5)
    assert got == [48]
    assert time.monotonic() - started < 4  # woken by the registration, not the timeout


def test_a_scheduled_xid_wakes_a_waiter_on_the_real_time_clock() -> None:
    spec = load_machine_spec("healthy-8xh100").model_copy(update={"faults": [
        GpuFault.model_validate({"gpu": 3, "xid": [{"code": 79, "at": 0.2}]})]})
    with install(spec):
        N.nvmlInit()
        thread, got = wait_in_thread(xid_set(3), 5000)
        started = time.monotonic()
        thread.join(timeout=5)
        assert got == [79]
        assert time.monotonic() - started < 4  # at its time, not at the timeout


def test_register_rejects_unsupported_event_types(machine: Machine) -> None:
    machine(gpus={"count": 1})
    event_set = N.nvmlEventSetCreate()
    raises(N.NVMLError_NotSupported, N.nvmlDeviceRegisterEvents, handle(0), 1 << 40, event_set)


# -- install / uninstall ---------------------------------------------------------------

def test_uninstall_restores_pynvml() -> None:
    before = N.nvmlLib
    with install(load_machine_spec("healthy-8xh100")) as fake:
        N.nvmlInit()
        N.nvmlInit()
        assert N.nvmlDeviceGetCount() == 8
    assert N.nvmlLib is before
    assert fake.library.refcount == 0  # both inits were shut down
    assert "nvmlDeviceGetCount_v2" not in N._nvmlGetFunctionPointer_cache


# -- bundled examples ---------------------------------------------------------------------

@pytest.mark.parametrize("name", bundled_specs())
def test_bundled_example_has_one_fault_on_the_gpu_its_comment_names(name: str) -> None:
    spec = load_machine_spec(name)
    comment = (BUNDLED_DIR / f"{name}.yaml").read_text().splitlines()[0]
    if not spec.faults:
        # Only the healthy machine, the driverless one, faults NVML cannot see (a
        # failing DCGM diagnostic, an NVSwitch error in the kernel log), a machine
        # whose NVML refuses some calls on every GPU and one whose whole fabric is
        # unregistered have no per-GPU fault.
        fabric_down = spec.fabric is not None and spec.fabric.state != "completed"
        assert name in ("healthy-8xh100", "no-driver") or spec.dcgm.output != "v4-pass-r1" \
            or spec.gpus.unsupported or fabric_down or spec.kernel_log
        return
    assert len(spec.faults) == 1, name
    assert f"GPU {spec.faults[0].gpu}" in comment, comment


def test_machine_wide_unsupported_call_is_not_supported_on_every_gpu() -> None:
    spec = load_machine_spec("h100-vm-notsupported")
    with install(spec):
        N.nvmlInit()
        for index in range(spec.gpus.count):
            handle = N.nvmlDeviceGetHandleByIndex(index)
            with pytest.raises(N.NVMLError_NotSupported):
                N.nvmlDeviceGetCurrentClocksEventReasons(handle)
            assert N.nvmlDeviceGetPowerUsage(handle) == 95000  # the rest still answers
