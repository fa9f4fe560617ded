"""The C functions of the fake NVML library, one Python function per NVML symbol.

Each implementation receives exactly what pynvml passes to libnvidia-ml.so (ctypes
by-value arguments, `byref()` out-parameters, string buffers with their size, opaque
handle pointers) and returns an NVML return code, or raises `Fail(code)`. The
library (healthd.sim.fakenvml) resolves the device handle, applies injected errors
and GPU loss before a `device` symbol runs, so implementations only serve values.

Symbol kinds, which decide what the library checks first:
- `raw`: runs even before nvmlInit (init, shutdown, error strings);
- `system`: needs nvmlInit; injected errors on it fire whichever GPU names them;
- `lookup`: a handle lookup; injected errors and loss apply to the GPU it finds;
- `device`: the first argument is a device handle;
- `change`: a device call that changes the machine (made outside the library's lock,
  see FakeNvmlLibrary._change).

Units follow nvml.h: power in milliwatts, memory in bytes, versions as strings.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pynvml

from healthd.sim.gpustate import SUPPORTED_CLOCK_REASONS, GpuState
from healthd.sim.nvmlevents import SUPPORTED_EVENT_TYPES, EventSet

if TYPE_CHECKING:
    from healthd.sim.fakenvml import FakeNvmlLibrary

Impl = Callable[..., Any]
SYMBOLS: dict[str, tuple[str, Impl]] = {}
SUCCESS: int = int(pynvml.NVML_SUCCESS)


def symbol(name: str, kind: str = "device") -> Callable[[Impl], Impl]:
    """Register `impl` as the fake NVML symbol `name` (see the module docstring)."""

    def register(impl: Impl) -> Impl:
        SYMBOLS[name] = (kind, impl)
        return impl

    return register


def code(name: str) -> int:
    """NVML_ERROR_<name> as an int."""
    return int(getattr(pynvml, f"NVML_ERROR_{name}"))


class Fail(Exception):
    """Raised inside a symbol implementation to return an NVML error code."""

    def __init__(self, nvml_code: int) -> None:
        super().__init__(nvml_code)
        self.code = nvml_code


def val(arg: Any) -> Any:
    """The Python value of a by-value ctypes argument (c_uint(3) -> 3)."""
    return getattr(arg, "value", arg)


def address(pointer: Any) -> int:
    """The address an opaque handle pointer holds (0 for NULL)."""
    return ctypes.cast(pointer, ctypes.c_void_p).value or 0


def set_pointer(ref: Any, value: int) -> None:
    """Write a handle into an out-parameter passed as byref(handle)."""
    ctypes.c_void_p.from_buffer(ref._obj).value = value


def _out(ref: Any, value: Any) -> None:
    ref._obj.value = value


def _put_str(buffer: Any, size: Any, text: str) -> None:
    raw = text.encode()
    if len(raw) + 1 > val(size):
        raise Fail(code("INSUFFICIENT_SIZE"))
    buffer.value = raw


def bus_key(bus_id: str) -> tuple[int, int, int, int] | None:
    """(domain, bus, device, function) of `0000:18:00.0` or `00000000:18:00.0`."""
    m = re.fullmatch(r"(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])",
                     bus_id.strip())
    if m is None:
        return None
    domain, bus, device, function = m.groups()
    return int(domain or "0", 16), int(bus, 16), int(device, 16), int(function)


def _text(arg: Any) -> str:
    return (val(arg) or b"").decode(errors="replace")


# -- library life cycle and strings ------------------------------------------------

@symbol("nvmlInitWithFlags", "raw")
@symbol("nvmlInit_v2", "raw")
def _init(lib: FakeNvmlLibrary, *_flags: Any) -> int:
    if not lib.driver_present:
        return code("LIBRARY_NOT_FOUND")  # what pynvml raises when dlopen fails
    lib.raise_injected("nvmlInitWithFlags", None)
    lib.raise_injected("nvmlInit", None)
    lib.inits += 1
    lib.session_changed(lib.refcount + 1)
    lib.sessions_changed()
    return SUCCESS


@symbol("nvmlShutdown", "raw")
def _shutdown(lib: FakeNvmlLibrary) -> int:
    if lib.refcount == 0:
        return code("UNINITIALIZED")
    lib.session_changed(lib.refcount - 1)
    lib.sessions_changed()
    return SUCCESS


@symbol("nvmlErrorString", "raw")
def _error_string(_lib: FakeNvmlLibrary, result: Any) -> bytes:
    return str(pynvml.NVMLError._errcode_to_string.get(val(result), "Unknown Error")).encode()


# -- system ------------------------------------------------------------------------

@symbol("nvmlSystemGetDriverVersion", "system")
def _driver_version(lib: FakeNvmlLibrary, buf: Any, size: Any) -> None:
    _put_str(buf, size, lib.spec.driver_version)


@symbol("nvmlSystemGetNVMLVersion", "system")
def _nvml_version(lib: FakeNvmlLibrary, buf: Any, size: Any) -> None:
    # NVML reports "<CUDA major>.<driver version>", e.g. 13.580.65.06.
    _put_str(buf, size, f"{lib.spec.cuda_driver_version // 1000}.{lib.spec.driver_version}")


@symbol("nvmlSystemGetCudaDriverVersion", "system")
@symbol("nvmlSystemGetCudaDriverVersion_v2", "system")
def _cuda_version(lib: FakeNvmlLibrary, out: Any) -> None:
    _out(out, lib.spec.cuda_driver_version)


@symbol("nvmlDeviceGetCount_v2", "system")
def _count(lib: FakeNvmlLibrary, out: Any) -> None:
    _out(out, len(lib.enumerated()))


# -- handle lookups ----------------------------------------------------------------

@symbol("nvmlDeviceGetHandleByIndex_v2", "lookup")
def _by_index(lib: FakeNvmlLibrary, index: Any, out: Any) -> int:
    gpus = lib.enumerated()
    if not 0 <= val(index) < len(gpus):
        return code("INVALID_ARGUMENT")
    return lib.found("nvmlDeviceGetHandleByIndex_v2", gpus[val(index)], out)


@symbol("nvmlDeviceGetHandleByUUID", "lookup")
def _by_uuid(lib: FakeNvmlLibrary, uuid: Any, out: Any) -> int:
    wanted = _text(uuid)
    match = next((s for s in lib.enumerated() if s.uuid == wanted), None)
    return lib.found("nvmlDeviceGetHandleByUUID", match, out)


@symbol("nvmlDeviceGetHandleByPciBusId_v2", "lookup")
def _by_bus_id(lib: FakeNvmlLibrary, bus_id: Any, out: Any) -> int:
    wanted = bus_key(_text(bus_id))
    if wanted is None:
        return code("INVALID_ARGUMENT")
    match = next((s for s in lib.enumerated() if bus_key(s.pci_bus_id) == wanted), None)
    return lib.found("nvmlDeviceGetHandleByPciBusId_v2", match, out)


# -- identity ----------------------------------------------------------------------

@symbol("nvmlDeviceGetName")
def _name(_lib: FakeNvmlLibrary, gpu: GpuState, buf: Any, size: Any) -> None:
    _put_str(buf, size, gpu.model)


@symbol("nvmlDeviceGetUUID")
def _uuid(_lib: FakeNvmlLibrary, gpu: GpuState, buf: Any, size: Any) -> None:
    _put_str(buf, size, gpu.uuid)


@symbol("nvmlDeviceGetPciInfo_v3")
def _pci_info(_lib: FakeNvmlLibrary, gpu: GpuState, out: Any) -> None:
    info = out._obj
    domain, bus, device, _function = bus_key(gpu.pci_bus_id) or (0, 0, 0, 0)
    info.busId = info.busIdLegacy = gpu.pci_bus_id.encode()
    info.domain, info.bus, info.device = domain, bus, device
    info.pciDeviceId = 0x233010DE  # H100 SXM5: device 0x2330, vendor NVIDIA 0x10DE
    info.pciSubSystemId = 0x16C110DE


@symbol("nvmlDeviceGetMinorNumber")
def _minor(_lib: FakeNvmlLibrary, gpu: GpuState, out: Any) -> None:
    _out(out, gpu.index)


@symbol("nvmlDeviceGetIndex")
def _index(lib: FakeNvmlLibrary, gpu: GpuState, out: Any) -> None:
    _out(out, [s.index for s in lib.enumerated()].index(gpu.index))


@symbol("nvmlDeviceGetMigMode")
def _mig(_lib: FakeNvmlLibrary, gpu: GpuState, current: Any, pending: Any) -> int:
    if not gpu.mig_capable:
        return code("NOT_SUPPORTED")
    _out(current, int(gpu.mig))
    _out(pending, int(gpu.mig))
    return SUCCESS


@symbol("nvmlDeviceGetPersistenceMode")
def _persistence(lib: FakeNvmlLibrary, gpu: GpuState, out: Any) -> None:
    enabled = lib.persistence[gpu.index]
    _out(out, pynvml.NVML_FEATURE_ENABLED if enabled else pynvml.NVML_FEATURE_DISABLED)


@symbol("nvmlDeviceSetPersistenceMode", "change")
def _set_persistence(lib: FakeNvmlLibrary, gpu: GpuState, mode: Any) -> int:
    """What `nvidia-smi -pm` does: for every process on the machine (root only on a
    real node; the fake does not check)."""
    if val(mode) not in (pynvml.NVML_FEATURE_ENABLED, pynvml.NVML_FEATURE_DISABLED):
        return code("INVALID_ARGUMENT")
    enabled = val(mode) == pynvml.NVML_FEATURE_ENABLED
    if lib.publish is None:
        lib.set_persistence(gpu.index, enabled)
    else:
        lib.publish({"op": "persistence", "gpu": gpu.index, "enabled": enabled})
    return SUCCESS


@symbol("nvmlDeviceGetMemoryInfo")
@symbol("nvmlDeviceGetMemoryInfo_v2")
def _memory(_lib: FakeNvmlLibrary, gpu: GpuState, out: Any) -> None:
    memory = out._obj
    total = gpu.memory_mib * 1024 * 1024
    used = 512 * 1024 * 1024  # driver reservations on an idle GPU
    memory.total, memory.used, memory.free = total, used, total - used


# -- processes on a GPU: another workload's (a `busy` fault) --------------------------

BUSY_PID_BASE = 40000  # a busy fault's processes: pid 40000 + 100 x GPU + n
_BUSY_PROCESS_BYTES = 8 << 30
_NOT_A_MIG_INSTANCE = 0xFFFFFFFF


def busy_pids(gpu: GpuState) -> list[int]:
    """The pids NVML lists on `gpu`: a busy fault's processes, none when idle."""
    count = gpu.busy.processes if gpu.busy is not None else 0
    return [BUSY_PID_BASE + 100 * gpu.index + n for n in range(count)]


def _list_processes(pids: list[int], count: Any, infos: Any) -> int:
    """NVML's two-call protocol: too small a `count` answers INSUFFICIENT_SIZE with the
    number needed; else the array is filled and `count` set."""
    room = count._obj.value
    count._obj.value = len(pids)
    if len(pids) > room or (pids and not infos):
        return code("INSUFFICIENT_SIZE")
    for n, pid in enumerate(pids):
        infos[n].pid = pid
        infos[n].usedGpuMemory = _BUSY_PROCESS_BYTES
        infos[n].gpuInstanceId = infos[n].computeInstanceId = _NOT_A_MIG_INSTANCE
    return SUCCESS


@symbol("nvmlDeviceGetComputeRunningProcesses_v3")
def _compute_processes(_lib: FakeNvmlLibrary, gpu: GpuState, count: Any, infos: Any) -> int:
    return _list_processes(busy_pids(gpu), count, infos)


@symbol("nvmlDeviceGetGraphicsRunningProcesses_v3")
def _graphics_processes(_lib: FakeNvmlLibrary, _gpu: GpuState, count: Any, infos: Any) -> int:
    return _list_processes([], count, infos)  # a compute node draws nothing


# -- health ------------------------------------------------------------------------

@symbol("nvmlDeviceGetRemappedRows")
def _remapped(_lib: FakeNvmlLibrary, gpu: GpuState, corr: Any, unc: Any, pending: Any,
              failure: Any) -> None:
    rows = gpu.remapped
    _out(corr, rows.correctable)
    _out(unc, rows.uncorrectable)
    _out(pending, int(rows.pending))
    _out(failure, int(rows.failure))


@symbol("nvmlDeviceGetCurrentClocksEventReasons")
@symbol("nvmlDeviceGetCurrentClocksThrottleReasons")
def _clock_reasons(_lib: FakeNvmlLibrary, gpu: GpuState, out: Any) -> None:
    _out(out, gpu.clock_reasons)


@symbol("nvmlDeviceGetSupportedClocksEventReasons")
@symbol("nvmlDeviceGetSupportedClocksThrottleReasons")
def _supported_reasons(_lib: FakeNvmlLibrary, _gpu: GpuState, out: Any) -> None:
    _out(out, SUPPORTED_CLOCK_REASONS)


@symbol("nvmlDeviceGetPowerUsage")
def _power_usage(_lib: FakeNvmlLibrary, gpu: GpuState, out: Any) -> None:
    _out(out, round(gpu.power.usage_w * 1000))


@symbol("nvmlDeviceGetPowerManagementLimit")
@symbol("nvmlDeviceGetEnforcedPowerLimit")
def _power_limit(_lib: FakeNvmlLibrary, gpu: GpuState, out: Any) -> None:
    _out(out, round(gpu.power.limit_w * 1000))


@symbol("nvmlDeviceGetCurrPcieLinkGeneration")
def _pcie_gen(_lib: FakeNvmlLibrary, gpu: GpuState, out: Any) -> None:
    _out(out, gpu.pcie_gen)


@symbol("nvmlDeviceGetCurrPcieLinkWidth")
def _pcie_width(_lib: FakeNvmlLibrary, gpu: GpuState, out: Any) -> None:
    _out(out, gpu.pcie_width)


@symbol("nvmlDeviceGetMaxPcieLinkGeneration")
@symbol("nvmlDeviceGetGpuMaxPcieLinkGeneration")
def _pcie_max_gen(_lib: FakeNvmlLibrary, gpu: GpuState, out: Any) -> None:
    _out(out, gpu.pcie_max_gen)


@symbol("nvmlDeviceGetMaxPcieLinkWidth")
def _pcie_max_width(_lib: FakeNvmlLibrary, gpu: GpuState, out: Any) -> None:
    _out(out, gpu.pcie_max_width)


@symbol("nvmlDeviceGetPcieThroughput")
def _pcie_throughput(_lib: FakeNvmlLibrary, gpu: GpuState, counter: Any, out: Any) -> int:
    """KB/s a busy fault's workload moves (RX: received by the GPU); 0 when idle."""
    busy = gpu.busy
    rates = {pynvml.NVML_PCIE_UTIL_RX_BYTES: busy.pcie_rx_gbps if busy else 0.0,
             pynvml.NVML_PCIE_UTIL_TX_BYTES: busy.pcie_tx_gbps if busy else 0.0}
    if val(counter) not in rates:
        return code("INVALID_ARGUMENT")
    _out(out, round(rates[val(counter)] * 1e6))  # GB/s -> KB/s
    return SUCCESS


@symbol("nvmlDeviceGetPcieReplayCounter")
def _pcie_replays(_lib: FakeNvmlLibrary, gpu: GpuState, out: Any) -> None:
    _out(out, gpu.pcie_replays)


@symbol("nvmlDeviceGetEccMode")
def _ecc_mode(_lib: FakeNvmlLibrary, gpu: GpuState, current: Any, pending: Any) -> None:
    _out(current, int(gpu.ecc_enabled))
    _out(pending, int(gpu.ecc_enabled))


@symbol("nvmlDeviceGetTotalEccErrors")
def _ecc_total(_lib: FakeNvmlLibrary, gpu: GpuState, error_type: Any, _counter: Any,
               out: Any) -> int:
    if not gpu.ecc_enabled:
        return code("NOT_SUPPORTED")
    kind = val(error_type)
    if kind not in (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                    pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED):
        return code("INVALID_ARGUMENT")
    # The spec describes volatile counts; aggregate (lifetime) counts include them.
    corrected = kind == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    _out(out, gpu.ecc.corrected_volatile if corrected else gpu.ecc.uncorrected_volatile)
    return SUCCESS


@symbol("nvmlDeviceGetRetiredPagesPendingStatus")
def _pages_pending(_lib: FakeNvmlLibrary, gpu: GpuState, out: Any) -> int:
    if not gpu.page_retirement:
        return code("NOT_SUPPORTED")  # Ampere and later remap rows instead
    _out(out, int(gpu.ecc.retired_pages_pending))
    return SUCCESS


# A GPU's architecture, by the model names NVML reports (the first that matches).
_ARCHITECTURES = (
    (re.compile(r"\b(B100|B200|B300|GB200|GB300)\b", re.I), pynvml.NVML_DEVICE_ARCH_BLACKWELL),
    (re.compile(r"\b(H100|H200|H800|H20|GH200)\b", re.I), pynvml.NVML_DEVICE_ARCH_HOPPER),
    (re.compile(r"\b(L4|L40S?|L20)\b", re.I), pynvml.NVML_DEVICE_ARCH_ADA),
    (re.compile(r"\b(A100|A800|A30|A40|A10G?|A16|A2)\b", re.I), pynvml.NVML_DEVICE_ARCH_AMPERE),
    (re.compile(r"\bT4\b", re.I), pynvml.NVML_DEVICE_ARCH_TURING),
    (re.compile(r"\bV100\b", re.I), pynvml.NVML_DEVICE_ARCH_VOLTA),
    (re.compile(r"\b(P100|P40|P4)\b", re.I), pynvml.NVML_DEVICE_ARCH_PASCAL),
)


def architecture(model: str, page_retirement: bool) -> int:
    """The architecture NVML reports for a GPU of `model` (a board that retires pages
    instead of remapping rows is from before Ampere: Volta, when the name says nothing)."""
    for pattern, arch in _ARCHITECTURES:
        if pattern.search(model):
            return int(arch)
    return int(pynvml.NVML_DEVICE_ARCH_VOLTA if page_retirement
               else pynvml.NVML_DEVICE_ARCH_UNKNOWN)


def _no_such_link(gpu: GpuState, link: Any) -> int | None:
    """What NVML answers a link query about a link the GPU lacks (None: it has it)."""
    if gpu.nvlink_count == 0:
        return code("NOT_SUPPORTED")
    if not 0 <= val(link) < gpu.nvlink_count:
        return code("INVALID_ARGUMENT")
    return None


@symbol("nvmlDeviceGetArchitecture")
def _architecture(_lib: FakeNvmlLibrary, gpu: GpuState, out: Any) -> int:
    _out(out, architecture(gpu.model, gpu.page_retirement))
    return SUCCESS


@symbol("nvmlDeviceGetNvLinkRemoteDeviceType")
def _nvlink_remote_type(_lib: FakeNvmlLibrary, gpu: GpuState, link: Any, out: Any) -> int:
    """An NVSwitch at the far end of every link of a board with a fabric, else a GPU."""
    if (refused := _no_such_link(gpu, link)) is not None:
        return refused
    _out(out, pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH if gpu.fabric is not None
         else pynvml.NVML_NVLINK_DEVICE_TYPE_GPU)
    return SUCCESS


@symbol("nvmlDeviceGetNvLinkState")
def _nvlink_state(_lib: FakeNvmlLibrary, gpu: GpuState, link: Any, out: Any) -> int:
    if (refused := _no_such_link(gpu, link)) is not None:
        return refused
    _out(out, int(val(link) not in gpu.nvlinks_down))
    return SUCCESS


_FABRIC_STATES = {
    "not_started": pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED,
    "in_progress": pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS,
    "completed": pynvml.NVML_GPU_FABRIC_STATE_COMPLETED,
}


def _fill_fabric(gpu: GpuState, info: Any) -> int:
    """Write the GPU's fabric info into pynvml's own struct, as the driver does: a
    GPU outside any fabric answers SUCCESS with state NOT_SUPPORTED (driver 580 on an
    H200 without NVSwitches, tests/record/recordings/h200-vm.yaml)."""
    fabric = gpu.fabric
    if fabric is None:
        info.state = pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
        info.status = SUCCESS
        return SUCCESS
    info.state = _FABRIC_STATES[fabric.state]
    info.status = SUCCESS if fabric.status == "SUCCESS" else code(fabric.status)
    info.cliqueId = fabric.clique_id
    uuid = bytes.fromhex(fabric.cluster_uuid) if fabric.cluster_uuid else bytes(16)
    ctypes.memmove(info.clusterUuid, uuid, len(uuid))
    return SUCCESS


@symbol("nvmlDeviceGetGpuFabricInfo")
def _fabric_info(_lib: FakeNvmlLibrary, gpu: GpuState, out: Any) -> int:
    return _fill_fabric(gpu, out._obj)


@symbol("nvmlDeviceGetGpuFabricInfoV")
def _fabric_info_v(_lib: FakeNvmlLibrary, gpu: GpuState, out: Any) -> int:
    info = out._obj
    if info.version != pynvml.nvmlGpuFabricInfo_v2:
        return code("ARGUMENT_VERSION_MISMATCH")
    result = _fill_fabric(gpu, info)
    if result == SUCCESS:
        info.healthMask = 0
    return result


# -- field values ----------------------------------------------------------------------

@symbol("nvmlDeviceGetFieldValues")
def _field_values(lib: FakeNvmlLibrary, gpu: GpuState, count: Any, values: Any) -> None:
    """Fill each requested field, as the driver does: the call succeeds and every value
    carries its own return code. The fake serves the recovery action (field 230);
    any other field, or one the spec lists in `field_errors`, answers an error."""
    taken_us = int(lib.clock() * 1_000_000)
    for value in values._obj[:val(count)]:
        value.timestamp, value.latencyUsec = taken_us, 0
        error = gpu.field_errors.get(int(value.fieldId))
        if error is None and value.fieldId != pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
            error = "NOT_SUPPORTED"
        if error is not None:
            value.nvmlReturn = code(error)
            continue
        value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        value.value.uiVal = gpu.recovery_action
        value.nvmlReturn = SUCCESS


# -- events ------------------------------------------------------------------------

@symbol("nvmlDeviceGetSupportedEventTypes")
def _event_types(_lib: FakeNvmlLibrary, _gpu: GpuState, out: Any) -> None:
    _out(out, SUPPORTED_EVENT_TYPES)


@symbol("nvmlDeviceRegisterEvents")
def _register(lib: FakeNvmlLibrary, gpu: GpuState, types: Any, handle: Any) -> int:
    mask = val(types)
    if mask & ~SUPPORTED_EVENT_TYPES:
        return code("NOT_SUPPORTED")
    lib.event_set(handle).register(gpu.index, mask, lib.clock())
    lib.wake()  # a waiter on this set may now have a scheduled XID to sleep until
    return SUCCESS


@symbol("nvmlEventSetCreate", "system")
def _set_create(lib: FakeNvmlLibrary, out: Any) -> None:
    event_set = EventSet(lib.new_event_set_handle())
    lib.event_sets[event_set.handle] = event_set
    lib.sessions_changed()
    set_pointer(out, event_set.handle)


@symbol("nvmlEventSetFree", "system")
def _set_free(lib: FakeNvmlLibrary, handle: Any) -> None:
    lib.event_sets.pop(lib.event_set(handle).handle)
    lib.sessions_changed()
    lib.wake()


@symbol("nvmlEventSetWait_v2", "system")
def _set_wait(lib: FakeNvmlLibrary, handle: Any, data_ref: Any, timeout_ms: Any) -> int:
    event = lib.wait_event(handle, max(0, val(timeout_ms)) / 1000)
    if event is None:
        return code("TIMEOUT")
    data = data_ref._obj
    data.device = ctypes.cast(ctypes.c_void_p(lib.handle_of(event.gpu)), pynvml.c_nvmlDevice_t)
    data.eventType = event.event_type
    data.eventData = event.data
    data.gpuInstanceId = data.computeInstanceId = 0xFFFFFFFF  # not a MIG instance
    return SUCCESS
