"""The one place that talks to the CUDA driver (`libcuda.so.1`), through ctypes.

Only what the pciebw check needs: find a CUDA device by its PCI bus id, and time
pinned host<->device copies with CUDA events. No toolkit, no compiled helper, no
extra package: the driver library ships with every NVIDIA driver (the container
toolkit mounts it into the agent's pod). CUDA numbers devices differently from NVML,
so devices are matched by PCI bus id, never by ordinal.

Errors, translated here once:

    CudaError             one call failed: that GPU cannot be measured
    └── CudaUnavailable   the driver cannot be used at all (library missing, cuInit
                          failed): nothing on this node can be measured

Every resource a measurement takes (primary context, pinned and device memory,
stream, events) is released on every path, errors included. Every call blocks: the
pciebw check makes them in a short-lived child process (checks.cuda_child), never in
the agent, so what the driver keeps after a release (the context's host memory, a
thread hung in a copy) ends with the child. Only the standard library is imported
here: the child loads nothing else.
"""

from __future__ import annotations

import ctypes
import re
import threading
from collections.abc import Callable
from contextlib import ExitStack, suppress
from ctypes import POINTER, byref, c_char_p, c_float, c_int, c_size_t, c_uint, c_uint64, c_void_p
from typing import Any

CUDA_LIBRARY = "libcuda.so.1"
CUDA_NOT_FOUND = "CUDA driver not found"

# The CUresult codes a node is likely to show (cuda.h); others print as their number.
CU_RESULT_NAMES: dict[int, str] = {
    0: "CUDA_SUCCESS",
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    4: "CUDA_ERROR_DEINITIALIZED",
    34: "CUDA_ERROR_STUB_LIBRARY",
    36: "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER",
    46: "CUDA_ERROR_DEVICE_UNAVAILABLE",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    102: "CUDA_ERROR_DEVICE_NOT_LICENSED",
    201: "CUDA_ERROR_INVALID_CONTEXT",
    214: "CUDA_ERROR_ECC_UNCORRECTABLE",
    220: "CUDA_ERROR_NVLINK_UNCORRECTABLE",
    304: "CUDA_ERROR_OPERATING_SYSTEM",
    400: "CUDA_ERROR_INVALID_HANDLE",
    500: "CUDA_ERROR_NOT_FOUND",
    600: "CUDA_ERROR_NOT_READY",
    700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    702: "CUDA_ERROR_LAUNCH_TIMEOUT",
    719: "CUDA_ERROR_LAUNCH_FAILED",
    800: "CUDA_ERROR_NOT_PERMITTED",
    801: "CUDA_ERROR_NOT_SUPPORTED",
    802: "CUDA_ERROR_SYSTEM_NOT_READY",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
    909: "CUDA_ERROR_TIMEOUT",
    999: "CUDA_ERROR_UNKNOWN",
}

CU_STREAM_NON_BLOCKING = 0x1
_BUS_ID_LEN = 32  # "dddd:bb:dd.f" plus the NUL, with room to spare

# Argument types of every entry point used (all return CUresult). A name tuple lists
# the newest symbol first and the older ABI it falls back to on old drivers.
_SIGNATURES: dict[tuple[str, ...], tuple[Any, ...]] = {
    ("cuInit",): (c_uint,),
    ("cuDeviceGetCount",): (POINTER(c_int),),
    ("cuDeviceGet",): (POINTER(c_int), c_int),
    ("cuDeviceGetPCIBusId",): (c_char_p, c_int, c_int),
    ("cuDevicePrimaryCtxRetain",): (POINTER(c_void_p), c_int),
    ("cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"): (c_int,),
    ("cuCtxSetCurrent",): (c_void_p,),
    ("cuMemAllocHost_v2",): (POINTER(c_void_p), c_size_t),
    ("cuMemFreeHost",): (c_void_p,),
    ("cuMemAlloc_v2",): (POINTER(c_uint64), c_size_t),
    ("cuMemFree_v2",): (c_uint64,),
    ("cuStreamCreate",): (POINTER(c_void_p), c_uint),
    ("cuStreamDestroy_v2",): (c_void_p,),
    ("cuEventCreate",): (POINTER(c_void_p), c_uint),
    ("cuEventRecord",): (c_void_p, c_void_p),
    ("cuEventSynchronize",): (c_void_p,),
    ("cuEventElapsedTime_v2", "cuEventElapsedTime"): (POINTER(c_float), c_void_p, c_void_p),
    ("cuEventDestroy_v2",): (c_void_p,),
    ("cuMemcpyHtoDAsync_v2",): (c_uint64, c_void_p, c_size_t, c_void_p),
    ("cuMemcpyDtoHAsync_v2",): (c_void_p, c_uint64, c_size_t, c_void_p),
}

_BUS_ID_RE = re.compile(
    r"^\s*(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-9a-f])\s*$", re.IGNORECASE
)

# One measurement at a time in this process: concurrent copies would share the host
# bridge and under-read each other, and a call hung on a broken GPU keeps the lock.
_MEASURING = threading.Lock()
_LOCK_WAIT_S = 30.0


def cu_result_name(code: int) -> str:
    """`CUDA_ERROR_NO_DEVICE` for 100; `CUresult 4242` for codes not in the table."""
    return CU_RESULT_NAMES.get(code, f"CUresult {code}")


class CudaError(Exception):
    """A CUDA driver call failed, or a measurement could not be made."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code

    @classmethod
    def from_result(cls, call: str, code: int) -> CudaError:
        return cls(f"{call} failed: {cu_result_name(code)}", code)


class CudaUnavailable(CudaError):
    """The CUDA driver cannot be used at all on this node."""


def parse_bus_id(text: str) -> tuple[int, int, int, int] | None:
    """(domain, bus, device, function) of a PCI bus id in NVML's form
    (`00000000:18:00.0`) or CUDA's (`0000:18:00.0`); None if it is not one."""
    m = _BUS_ID_RE.match(text or "")
    if m is None:
        return None
    domain, bus, device, function = m.groups()
    return int(domain or "0", 16), int(bus, 16), int(device, 16), int(function, 16)


class CudaDriver:
    """An initialised CUDA driver: `cuInit` has succeeded.

    `loader` opens the library (ctypes.CDLL; tests pass a fake)."""

    def __init__(
        self, library: str = CUDA_LIBRARY, loader: Callable[[str], Any] = ctypes.CDLL
    ) -> None:
        try:
            lib = loader(library)
        except OSError as exc:
            raise CudaUnavailable(CUDA_NOT_FOUND) from exc
        self._fns = _bind(lib)
        code = self._fns["cuInit"](0)
        if code != 0:
            raise CudaUnavailable(f"cuInit failed: {cu_result_name(code)}", code)
        self._devices: dict[tuple[int, int, int, int], int] | None = None

    def device(self, pci_bus_id: str) -> int:
        """The CUdevice at this PCI bus id (as NVML writes it)."""
        key = parse_bus_id(pci_bus_id)
        if key is None:
            raise CudaError(f"not a PCI bus id: {pci_bus_id!r}")
        if self._devices is None:
            self._devices = self._enumerate()
        if key not in self._devices:
            raise CudaError(
                f"no CUDA device at PCI bus id {pci_bus_id} "
                f"(CUDA sees {len(self._devices)}; hidden by CUDA_VISIBLE_DEVICES?)"
            )
        return self._devices[key]

    def copy_seconds(
        self, pci_bus_id: str, size_bytes: int, iterations: int
    ) -> tuple[float, float]:
        """Seconds for `iterations` pinned copies of `size_bytes`, host-to-device then
        device-to-host, on the GPU at `pci_bus_id`, timed by CUDA events."""
        if size_bytes <= 0 or iterations <= 0:
            raise CudaError(f"nothing to copy: {size_bytes} bytes x {iterations}")
        if not _MEASURING.acquire(timeout=_LOCK_WAIT_S):
            raise CudaError("an earlier bandwidth measurement is still running (hung GPU?)")
        try:
            with ExitStack() as stack:
                return self._measure(stack, self.device(pci_bus_id), size_bytes, iterations)
        finally:
            _MEASURING.release()

    def _measure(
        self, stack: ExitStack, dev: int, size: int, iterations: int
    ) -> tuple[float, float]:
        self._enter_primary_context(stack, dev)
        host = self._acquire(stack, "cuMemAllocHost_v2", "cuMemFreeHost", c_void_p, size)
        gpu = self._acquire(stack, "cuMemAlloc_v2", "cuMemFree_v2", c_uint64, size)
        stream = self._acquire(
            stack, "cuStreamCreate", "cuStreamDestroy_v2", c_void_p, CU_STREAM_NON_BLOCKING
        )
        events = [
            self._acquire(stack, "cuEventCreate", "cuEventDestroy_v2", c_void_p, 0)
            for _ in range(2)
        ]

        def h2d() -> None:
            self._call("cuMemcpyHtoDAsync_v2", gpu, host, size, stream)

        def d2h() -> None:
            self._call("cuMemcpyDtoHAsync_v2", host, gpu, size, stream)

        return (
            self._timed(h2d, stream, events, iterations),
            self._timed(d2h, stream, events, iterations),
        )

    def _enter_primary_context(self, stack: ExitStack, dev: int) -> None:
        ctx = c_void_p()
        self._call("cuDevicePrimaryCtxRetain", byref(ctx), dev)
        stack.callback(self._quietly, "cuDevicePrimaryCtxRelease_v2", dev)
        self._call("cuCtxSetCurrent", ctx)
        # Leave the worker thread without a current context, so it holds nothing.
        stack.callback(self._quietly, "cuCtxSetCurrent", None)

    def _acquire(
        self, stack: ExitStack, create: str, destroy: str, ctype: Any, arg: int
    ) -> Any:
        """Create a handle with `create(&handle, arg)`; `destroy(handle)` on exit."""
        handle = ctype()
        self._call(create, byref(handle), arg)
        stack.callback(self._quietly, destroy, handle.value)
        return handle.value

    def _timed(
        self, copy: Callable[[], None], stream: Any, events: list[Any], iterations: int
    ) -> float:
        start, stop = events
        copy()  # warm-up: wakes the link from its idle speed, faults in the mappings
        self._call("cuEventRecord", start, stream)
        for _ in range(iterations):
            copy()
        self._call("cuEventRecord", stop, stream)
        self._call("cuEventSynchronize", stop)
        elapsed_ms = c_float()
        self._call("cuEventElapsedTime_v2", byref(elapsed_ms), start, stop)
        if not elapsed_ms.value > 0:
            raise CudaError(f"CUDA events timed the copies at {elapsed_ms.value} ms")
        return elapsed_ms.value / 1000.0

    def _enumerate(self) -> dict[tuple[int, int, int, int], int]:
        count = c_int()
        self._call("cuDeviceGetCount", byref(count))
        devices: dict[tuple[int, int, int, int], int] = {}
        for ordinal in range(count.value):
            dev = c_int()
            self._call("cuDeviceGet", byref(dev), ordinal)
            buf = ctypes.create_string_buffer(_BUS_ID_LEN)
            self._call("cuDeviceGetPCIBusId", buf, _BUS_ID_LEN, dev.value)
            key = parse_bus_id(buf.value.decode("ascii", "replace"))
            if key is not None:
                devices[key] = dev.value
        return devices

    def _call(self, name: str, *args: Any) -> None:
        code = self._fns[name](*args)
        if code != 0:
            raise CudaError.from_result(name, code)

    def _quietly(self, name: str, *args: Any) -> None:
        # Clean-up must not mask the error that got us here, nor fail a good result.
        with suppress(Exception):
            self._fns[name](*args)


def _bind(lib: Any) -> dict[str, Callable[..., int]]:
    """The entry points, typed, keyed by their first (newest) name."""
    fns: dict[str, Callable[..., int]] = {}
    for names, argtypes in _SIGNATURES.items():
        fn = next((getattr(lib, n) for n in names if hasattr(lib, n)), None)
        if fn is None:
            raise CudaUnavailable(f"CUDA driver too old: it lacks {names[-1]}")
        fn.argtypes = argtypes
        fn.restype = c_int
        fns[names[0]] = fn
    return fns
