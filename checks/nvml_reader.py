"""The NVML pass: reads every GPU once through the real `pynvml` and maps each outcome
to a plain value (see checks.snapshot for the rules), plus the XID event subscription
and, for the pciebw check, what uses one GPU now (`activity`: processes, PCIe traffic).

This module and healthd's simulator are the only code that imports pynvml. The
reader is synchronous and thread-safe; checks.snapshot.NvmlGpuSource runs it in a worker
thread. NVML is initialised once and reused; when the driver is missing the pass
reports it, and the next pass tries again, so a driver that appears later is used.

Letting go. A GPU reset is refused while any NVML client holds the GPU, and an NVML
session holds every GPU of the node (its handles and event set keep `/dev/nvidia*`
open until nvmlShutdown). `release(reason)` is the one gate: from then on nothing here
opens NVML (the pass reports `reason` as its driver error, an XID wait raises
XidUnavailable with it, `activity` answers it, `hold` refuses), and once the
measurements that hold the GPUs (`hold`) and the XID wait in flight have ended, the
event set is freed and the session ended. `resume()` opens the gate: the next call
opens NVML again. A reader may start released (`NvmlReader(released=...)`), so that
nothing opens NVML before its owner knows it may.

Per GPU, one property failing never hides the others: each reading is taken on its
own. Only GPU_IS_LOST ends the GPU's pass early, since every further call on a lost
GPU fails the same way.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import replace
from typing import Any, TypeVar

import pynvml

from checks.probes import GpuActivity
from checks.snapshot import (
    DRIVER_NOT_FOUND,
    Ecc,
    Fabric,
    FabricState,
    Failed,
    GpuSnapshot,
    NodeSnapshot,
    NvLink,
    Ok,
    PcieLink,
    Power,
    Reading,
    RemappedRows,
    Unsupported,
    XidEvent,
)

T = TypeVar("T")
Handle = Any  # pynvml.c_nvmlDevice_t

_DRIVER_GONE = frozenset({
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    pynvml.NVML_ERROR_UNINITIALIZED,
})
_DRIVER_MISSING = frozenset({
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
})
_LOST = "GPU is lost"
ECC_DISABLED = "ECC is disabled"
# NVML error code -> its NVML_ERROR_* name without the prefix (999 -> "UNKNOWN").
_ERROR_NAMES: dict[int, str] = {
    value: name.removeprefix("NVML_ERROR_")
    for name, value in vars(pynvml).items()
    if name.startswith("NVML_ERROR_") and isinstance(value, int)
}


def error_name(nvml_code: int) -> str:
    """`NVML_ERROR_<name>` of an NVML return code, without the prefix."""
    return _ERROR_NAMES.get(nvml_code, str(nvml_code))


class _Lost(Exception):
    """A call said GPU_IS_LOST: the whole GPU is gone, not one property."""


class _Unreadable(Exception):
    """One call failed; `reading` is what the property becomes."""

    def __init__(self, reading: Unsupported | Failed, nvml_code: int | None) -> None:
        super().__init__(reading)
        self.reading = reading
        self.code = nvml_code


class XidUnavailable(Exception):
    """XID events cannot be received now (no driver, or the event set failed)."""


def _call(fn: Callable[..., T], *args: Any) -> T:
    """Call one pynvml function, turning its failure into _Lost or _Unreadable that
    name the function (`nvmlDeviceGetPowerUsage: Unknown Error`)."""
    name = getattr(fn, "__name__", "nvml")
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise _Lost(f"{name}: {exc}") from exc
        error = error_name(exc.value)
        if exc.value == pynvml.NVML_ERROR_NOT_SUPPORTED:
            raise _Unreadable(Unsupported(f"{name}: not supported", name, error),
                              exc.value) from exc
        raise _Unreadable(Failed(f"{name}: {exc}", name, error), exc.value) from exc
    except Exception as exc:  # a binding or ctypes surprise must not end the pass
        raise _Unreadable(Failed(f"{name}: {type(exc).__name__}: {exc}", name), None) from exc


def _reading(read: Callable[[Handle], T], handle: Handle) -> Reading[T]:
    try:
        return Ok(read(handle))
    except _Unreadable as exc:
        return exc.reading


# -- one reader per property (each takes a device handle) ---------------------------

def _remapped(h: Handle) -> RemappedRows:
    corr, unc, pending, failure = _call(pynvml.nvmlDeviceGetRemappedRows, h)
    return RemappedRows(int(corr), int(unc), bool(pending), bool(failure))


def _clock_reasons(h: Handle) -> int:
    try:
        return int(_call(pynvml.nvmlDeviceGetCurrentClocksEventReasons, h))
    except _Unreadable as exc:
        if exc.code != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            raise
    # Drivers older than the "clocks event" rename only have the throttle name.
    return int(_call(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, h))


def _power(h: Handle) -> Power:
    usage_mw = _call(pynvml.nvmlDeviceGetPowerUsage, h)
    limit_mw = _call(pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
    return Power(usage_w=usage_mw / 1000, limit_w=limit_mw / 1000)


def _pcie(h: Handle) -> PcieLink:
    return PcieLink(
        gen=int(_call(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h)),
        width=int(_call(pynvml.nvmlDeviceGetCurrPcieLinkWidth, h)),
        max_gen=int(_call(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h)),
        max_width=int(_call(pynvml.nvmlDeviceGetMaxPcieLinkWidth, h)),
    )


def _pcie_replays(h: Handle) -> int:
    return int(_call(pynvml.nvmlDeviceGetPcieReplayCounter, h))


def _ecc(h: Handle) -> Ecc:
    current, _pending = _call(pynvml.nvmlDeviceGetEccMode, h)
    if not current:
        raise _Unreadable(Unsupported(ECC_DISABLED, "nvmlDeviceGetEccMode"), None)

    def total(kind: int) -> int:
        return int(_call(pynvml.nvmlDeviceGetTotalEccErrors, h, kind, pynvml.NVML_VOLATILE_ECC))

    return Ecc(
        corrected_volatile=total(pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
        uncorrected_volatile=total(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
    )


def _pages_pending(h: Handle) -> bool:
    return bool(_call(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, h))


def _nvlinks(h: Handle) -> tuple[NvLink, ...]:
    """Every link the GPU has: NVML has no cheap link count, so read link states
    until one past the last answers INVALID_ARGUMENT (or NOT_SUPPORTED)."""
    links: list[NvLink] = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            state = _call(pynvml.nvmlDeviceGetNvLinkState, h, link)
        except _Unreadable as exc:
            ends = exc.code in (pynvml.NVML_ERROR_INVALID_ARGUMENT,
                                pynvml.NVML_ERROR_NOT_SUPPORTED)
            if links and ends:
                break
            raise
        links.append(NvLink(link, bool(state)))
    return tuple(links)


def _mig_mode(h: Handle) -> bool:
    current, _pending = _call(pynvml.nvmlDeviceGetMigMode, h)
    return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)


_FABRIC_STATES: dict[int, FabricState] = {
    pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED: "not_started",
    pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS: "in_progress",
    pynvml.NVML_GPU_FABRIC_STATE_COMPLETED: "completed",
}
NO_FABRIC = "no NVLink fabric (not an NVSwitch system)"


def _fabric(h: Handle) -> Fabric:
    """The GPU's fabric registration: the versioned call where the driver has it,
    the original one on drivers older than it. A GPU outside any fabric says state
    NOT_SUPPORTED (or the call says NOT_SUPPORTED): the reading is Unsupported."""
    info: Any = pynvml.c_nvmlGpuFabricInfoV_t()
    function = pynvml.nvmlDeviceGetGpuFabricInfoV
    try:
        _call(function, h, ctypes.byref(info))
    except _Unreadable as exc:
        if exc.code != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            raise
        info, function = pynvml.c_nvmlGpuFabricInfo_t(), pynvml.nvmlDeviceGetGpuFabricInfo
        _call(function, h, ctypes.byref(info))
    state = _FABRIC_STATES.get(int(info.state))
    if state is None:  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, or a state newer than us
        raise _Unreadable(Unsupported(NO_FABRIC, function.__name__), None)
    status = int(info.status)
    return Fabric(
        state=state,
        status="SUCCESS" if status == pynvml.NVML_SUCCESS else error_name(status),
        clique_id=int(info.cliqueId),
        cluster_uuid=bytes(info.clusterUuid).hex(),
        health_mask=int(getattr(info, "healthMask", 0)),
    )


# NVML field 230 (nvml.h): the recovery action the driver asks for the GPU.
RECOVERY_ACTION_FIELD = pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
_NO_FIELD = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})


def _recovery_action(h: Handle) -> int:
    """The driver's recovery action (NVML's number). A driver older than the field
    answers for it in the value's own return code (or, older still, refuses the
    call): Unsupported either way, the one reading a recording replays as a field
    error."""
    try:
        (value,) = _call(pynvml.nvmlDeviceGetFieldValues, h, [RECOVERY_ACTION_FIELD])
    except _Unreadable as exc:
        if exc.code not in _NO_FIELD:
            raise
        raise _Unreadable(_field_refused(exc.reading.error), exc.code) from exc
    if value.nvmlReturn != pynvml.NVML_SUCCESS:
        raise _Unreadable(_field_refused(error_name(value.nvmlReturn)), value.nvmlReturn)
    return int(value.value.uiVal)


def _field_refused(error: str) -> Unsupported:
    return Unsupported(f"not reported by this driver (field {RECOVERY_ACTION_FIELD}: {error})",
                       "nvmlDeviceGetFieldValues", error)


def _pids(h: Handle) -> tuple[int, ...]:
    """Every process holding a context on the GPU: compute, then graphics."""
    compute = _call(pynvml.nvmlDeviceGetComputeRunningProcesses, h)
    graphics = _call(pynvml.nvmlDeviceGetGraphicsRunningProcesses, h)
    return tuple(int(p.pid) for p in [*compute, *graphics])


def _throughput(counter: int) -> Callable[[Handle], int]:
    """One direction of the GPU's PCIe throughput (KB/s over a 20 ms sample)."""
    def read(h: Handle) -> int:
        return int(_call(pynvml.nvmlDeviceGetPcieThroughput, h, counter))
    return read


def _or_none(read: Callable[[Handle], T], handle: Handle, problems: list[str]) -> T | None:
    """`read(handle)`, or None with the reason appended to `problems`."""
    try:
        return read(handle)
    except (_Lost, _Unreadable) as exc:
        problems.append(_reason(exc))
        return None


def _reason(exc: _Lost | _Unreadable) -> str:
    return exc.reading.reason if isinstance(exc, _Unreadable) else str(exc)


_PROPERTIES: dict[str, Callable[[Handle], Any]] = {
    "mig_mode": _mig_mode,
    "remapped": _remapped,
    "clock_event_reasons": _clock_reasons,
    "power": _power,
    "pcie": _pcie,
    "pcie_replays": _pcie_replays,
    "ecc": _ecc,
    "retired_pages_pending": _pages_pending,
    "nvlinks": _nvlinks,
    "fabric": _fabric,
    "recovery_action": _recovery_action,
}


def _optional(fn: Callable[..., Any], *args: Any) -> str:
    """A string property that may fail (but not with GPU_IS_LOST): "" on failure."""
    try:
        return str(_call(fn, *args))
    except _Unreadable:
        return ""


def _system_optional(fn: Callable[..., Any]) -> str:
    """A machine-wide string (driver version): "" on any failure, GPU_IS_LOST
    included (no one GPU is lost by it; the per-GPU reads tell which)."""
    try:
        return _optional(fn)
    except _Lost:
        return ""


def _cuda_driver_version() -> int:
    """nvmlSystemGetCudaDriverVersion (13000 = CUDA 13.0); 0 when unreadable."""
    try:
        return int(_call(pynvml.nvmlSystemGetCudaDriverVersion))
    except (_Unreadable, _Lost):
        return 0


def _handle_address(handle: Handle) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


class NvmlReader:
    """Reads the whole node through pynvml: `read()` for a snapshot, `wait_xid()` for
    XID events. Safe to call from several threads; NVML is initialised on first use
    and shut down by `close()`, or by `release()` until `resume()` (module docstring).
    `released`: start released, for that reason ("": open on first use)."""

    def __init__(self, *, released: str = "") -> None:
        self._lock = threading.RLock()
        self._waiting = threading.Lock()  # held across an XID wait: its set is not freed under it
        self._gate = threading.Condition()  # guards _released and _holds
        self._released = released  # why NVML may not be opened now ("": it may)
        self._holds = 0  # measurements keeping the GPUs from being let go (`hold`)
        self._initialized = False
        self._count_seen = -1
        self._handles: dict[int, Handle] = {}
        self._identity: dict[int, tuple[str, str, str]] = {}  # index -> uuid, bus id, model
        self._event_set: Any = None
        self._event_gpus: dict[int, tuple[int, str]] = {}  # handle address -> index, uuid

    # -- the pass --------------------------------------------------------------

    def read(self) -> NodeSnapshot:
        """One pass over every GPU. Never raises: problems become readings."""
        taken_at, started = time.time(), time.perf_counter()
        with self._lock:
            snapshot = self._read()
        return replace(snapshot, taken_at=taken_at, duration_s=time.perf_counter() - started)

    def _read(self) -> NodeSnapshot:
        count, error = self._count()
        if error:
            return NodeSnapshot(driver_error=error)
        return NodeSnapshot(
            driver_version=_system_optional(pynvml.nvmlSystemGetDriverVersion),
            nvml_version=_system_optional(pynvml.nvmlSystemGetNVMLVersion),
            cuda_driver_version=_cuda_driver_version(),
            gpus=tuple(self._read_gpu(index) for index in range(count)),
        )

    def _count(self) -> tuple[int, str]:
        """The GPU count, (re)initialising NVML when needed; or the driver error."""
        for _attempt in range(2):
            error = self._ensure_init()
            if error:
                return 0, error
            try:
                count = int(_call(pynvml.nvmlDeviceGetCount))
            except _Lost as exc:  # no GPU can be named: the node cannot be read
                return 0, str(exc)
            except _Unreadable as exc:
                if exc.code in _DRIVER_GONE:  # the driver went away: start over once
                    self._forget_session()
                    continue
                return 0, exc.reading.reason
            if count != self._count_seen:
                self._handles.clear()  # GPUs came or went: indices may have moved
                self._identity.clear()
                self._count_seen = count
            return count, ""
        return 0, DRIVER_NOT_FOUND

    def _ensure_init(self) -> str:
        if self._released:
            return self._released
        if self._initialized:
            return ""
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            return DRIVER_NOT_FOUND if exc.value in _DRIVER_MISSING else f"nvmlInit: {exc}"
        except Exception as exc:  # e.g. a broken library file
            return f"nvmlInit: {type(exc).__name__}: {exc}"
        self._initialized = True
        return ""

    def _forget_session(self) -> None:
        """End this reader's NVML session; the next call initialises again."""
        if self._initialized:
            with suppress(pynvml.NVMLError):  # balance nvmlInit, even for a dead driver
                pynvml.nvmlShutdown()
        self._initialized = False
        self._count_seen = -1
        self._handles.clear()
        self._identity.clear()
        self._event_set = None
        self._event_gpus.clear()

    def _read_gpu(self, index: int) -> GpuSnapshot:
        try:
            handle = self._handle(index)
        except _Lost as lost:
            return self._lost(index, str(lost))
        except _Unreadable as exc:  # no handle: every property shares the reason
            every: dict[str, Any] = {name: exc.reading for name in _PROPERTIES}
            return GpuSnapshot(index, *self._identity.get(index, ("", "", "")), **every)
        try:
            uuid, bus_id, model = self._identify(index, handle)
            values: dict[str, Any] = {n: _reading(read, handle) for n, read in _PROPERTIES.items()}
            mig = values["mig_mode"]  # not MIG-capable (or unreadable): treat as off
            return GpuSnapshot(index, uuid, bus_id, model,
                               mig_enabled=isinstance(mig, Ok) and mig.value, **values)
        except _Lost as lost:
            return self._lost(index, str(lost))

    def _lost(self, index: int, reason: str) -> GpuSnapshot:
        # Identity from an earlier pass still names the GPU that fell off the bus.
        every: dict[str, Any] = {name: Failed(_LOST) for name in _PROPERTIES}
        return GpuSnapshot(index, *self._identity.get(index, ("", "", "")), lost=True,
                           lost_reason=reason, **every)

    def _handle(self, index: int) -> Handle:
        handle = self._handles.get(index)
        if handle is None:
            handle = _call(pynvml.nvmlDeviceGetHandleByIndex, index)
            self._handles[index] = handle
        return handle

    def _identify(self, index: int, handle: Handle) -> tuple[str, str, str]:
        known = self._identity.get(index)
        if known is not None:
            return known
        uuid = _optional(pynvml.nvmlDeviceGetUUID, handle)
        try:
            bus_id = str(_call(pynvml.nvmlDeviceGetPciInfo, handle).busId)
        except _Unreadable:
            bus_id = ""
        found = (uuid, bus_id, _optional(pynvml.nvmlDeviceGetName, handle))
        if all(found):  # cache only a complete identity; retry the rest next pass
            self._identity[index] = found
        return found

    # -- what uses a GPU now (the pciebw check's busy test, checks.busy) -------------

    def activity(self, pci_bus_id: str) -> GpuActivity:
        """The processes on the GPU at `pci_bus_id` and its PCIe traffic, now. Never
        raises: what cannot be read is None, `problem` saying why."""
        with self._lock:
            error = self._ensure_init()
            if error:
                return GpuActivity(None, None, None, error)
            try:
                handle = _call(pynvml.nvmlDeviceGetHandleByPciBusId, pci_bus_id)
            except (_Lost, _Unreadable) as exc:
                return GpuActivity(None, None, None, _reason(exc))
            problems: list[str] = []
            pids = _or_none(_pids, handle, problems)
            rx = _or_none(_throughput(pynvml.NVML_PCIE_UTIL_RX_BYTES), handle, problems)
            tx = _or_none(_throughput(pynvml.NVML_PCIE_UTIL_TX_BYTES), handle, problems)
            return GpuActivity(pids, rx, tx, "; ".join(dict.fromkeys(problems)))

    # -- XID events ----------------------------------------------------------------

    def wait_xid(self, timeout_ms: int) -> XidEvent | None:
        """Wait up to `timeout_ms` for one XID event on any GPU (registering for XID
        events on every GPU on first use). Keep the timeout short: the C call cannot
        be interrupted (`close` and `release` wait for it). Raises XidUnavailable when
        events cannot be received, NVML being released among the reasons."""
        with self._waiting:
            event_set = self._xid_event_set()
            try:
                data = pynvml.nvmlEventSetWait(event_set, max(0, int(timeout_ms)))
            except pynvml.NVMLError as exc:
                if exc.value in (pynvml.NVML_ERROR_TIMEOUT, pynvml.NVML_ERROR_GPU_IS_LOST):
                    return None
                with self._lock:
                    if self._event_set is event_set:
                        self._forget_events(exc.value)
                raise XidUnavailable(f"nvmlEventSetWait: {exc}") from exc
        if not data.eventType & pynvml.nvmlEventTypeXidCriticalError:
            return None
        index, uuid = self._event_gpu(data.device)
        return XidEvent(xid=int(data.eventData), gpu_index=index, uuid=uuid, at=time.time())

    def listen(self) -> None:
        """Register for XID events now rather than at the next wait: from here on
        events are queued for `wait_xid`. What fails (no driver, released) is tried
        again by the next wait."""
        with suppress(XidUnavailable):
            self._xid_event_set()

    def _xid_event_set(self) -> Any:
        with self._lock:
            if self._event_set is not None:
                return self._event_set
            count, error = self._count()
            if error:
                raise XidUnavailable(error)
            try:
                event_set = _call(pynvml.nvmlEventSetCreate)
            except (_Unreadable, _Lost) as exc:
                raise XidUnavailable(str(exc)) from exc
            for index in range(count):
                self._register_xids(event_set, index)
            self._event_set = event_set
            return event_set

    def _register_xids(self, event_set: Any, index: int) -> None:
        """Register one GPU for XID events; a lost or unsupporting GPU is skipped."""
        try:
            handle = self._handle(index)
            supported = _call(pynvml.nvmlDeviceGetSupportedEventTypes, handle)
            if not supported & pynvml.nvmlEventTypeXidCriticalError:
                return
            _call(pynvml.nvmlDeviceRegisterEvents, handle,
                  pynvml.nvmlEventTypeXidCriticalError, event_set)
            uuid = self._identify(index, handle)[0]
        except (_Lost, _Unreadable):
            return
        self._event_gpus[_handle_address(handle)] = (index, uuid)

    def _forget_events(self, nvml_code: int) -> None:
        if nvml_code in _DRIVER_GONE or nvml_code == pynvml.NVML_ERROR_INVALID_ARGUMENT:
            self._forget_session()
        self._event_set = None
        self._event_gpus.clear()

    def _event_gpu(self, device: Handle) -> tuple[int, str]:
        with self._lock:
            known = self._event_gpus.get(_handle_address(device))
        if known is not None:
            return known
        try:  # a GPU we did not register ourselves: ask NVML
            return int(_call(pynvml.nvmlDeviceGetIndex, device)), _optional(
                pynvml.nvmlDeviceGetUUID, device)
        except (_Lost, _Unreadable):
            return -1, ""

    # -- letting go of the GPUs (see the module docstring) ----------------------------

    @property
    def released(self) -> str:
        """Why NVML may not be opened now; "" when it may."""
        return self._released

    def release(self, reason: str) -> None:
        """Let go of the GPUs until `resume()`: from now on nothing opens NVML (every
        call answers `reason`) and no `hold` is granted; once the holds and the XID
        wait in flight have ended, free the event set and end the session. When this
        returns, the reader holds nothing on any GPU. Blocks: call it in a thread."""
        with self._gate:
            self._released = reason or "NVML released"
            self._gate.wait_for(lambda: self._holds == 0)
        self.close()

    def resume(self) -> None:
        """Open the gate again: the next call opens NVML (and a new XID event set)."""
        with self._gate:
            self._released = ""

    @contextmanager
    def hold(self) -> Iterator[str]:
        """Keep the GPUs from being let go while a measurement touches them (the
        pciebw probe's copies in its child): enters with "" (held until the block
        ends) or, when released, with why the GPUs may not be touched (nothing held).
        Never blocks."""
        with self._gate:
            refused = self._released
            if not refused:
                self._holds += 1
        try:
            yield refused
        finally:
            if not refused:
                with self._gate:
                    self._holds -= 1
                    self._gate.notify_all()

    def close(self) -> None:
        """Free the event set and end this reader's NVML session (after the XID wait
        in flight); the next call opens it again unless the reader is released."""
        with self._waiting, self._lock:
            if self._event_set is not None:
                with suppress(pynvml.NVMLError):  # the driver may already be gone
                    pynvml.nvmlEventSetFree(self._event_set)
            self._forget_session()


