"""Test doubles for the pciebw check: a bandwidth probe that answers from a table,
NVML's view of what uses each GPU, and a fake `libcuda` that keeps count of every
resource the real child takes.

All sit at our own seams: `BandwidthProbe` and `ActivityReader` (what the check
calls) and the loaded driver library (what checks.cuda calls through ctypes).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import anyio

from checks.probes import Bandwidth, GpuActivity

HEALTHY = Bandwidth(52.0, 53.0)  # a Gen5 x16 GPU on a good day
IDLE = GpuActivity(pids=(), rx_kbps=0, tx_kbps=0)


def busy(processes: int = 1, h2d_gbps: float = 0.0, d2h_gbps: float = 0.0) -> GpuActivity:
    """What NVML shows for a GPU a job uses: its processes and PCIe traffic."""
    return GpuActivity(pids=tuple(7000 + n for n in range(processes)),
                       rx_kbps=round(h2d_gbps * 1e6), tx_kbps=round(d2h_gbps * 1e6))


@dataclass
class FakeProbe:
    """Answers per PCI bus id: a Bandwidth, or an exception to raise. Records calls."""

    answers: dict[str, Any] = field(default_factory=dict)
    default: Any = HEALTHY
    calls: list[tuple[str, int, int]] = field(default_factory=list)

    async def measure(self, pci_bus_id: str, size_bytes: int, iterations: int) -> Bandwidth:
        self.calls.append((pci_bus_id, size_bytes, iterations))
        answer = self.answers.get(pci_bus_id, self.default)
        if isinstance(answer, BaseException):
            raise answer
        return answer  # type: ignore[no-any-return]


@dataclass
class BlockingProbe:
    """Hangs like a copy to a broken GPU, until released or cancelled."""

    release: threading.Event = field(default_factory=threading.Event)

    async def measure(self, pci_bus_id: str, size_bytes: int, iterations: int) -> Bandwidth:
        while not self.release.is_set():
            await anyio.sleep(0.01)
        return HEALTHY


@dataclass
class FakeActivity:
    """NVML's view per PCI bus id: one reading per call, the last one repeated
    (IDLE when none given). Records every bus id asked about."""

    readings: dict[str, Sequence[GpuActivity]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    def activity(self, pci_bus_id: str) -> GpuActivity:
        seen = self.readings.get(pci_bus_id) or [IDLE]
        asked = self.calls.count(pci_bus_id)
        self.calls.append(pci_bus_id)
        return seen[min(asked, len(seen) - 1)]

    def hold(self) -> AbstractContextManager[str]:
        """The GPUs are never let go here: every hold is granted."""
        return nullcontext("")


# Which resource kind each creating call makes, and which call destroys it.
_CREATES = {
    "cuDevicePrimaryCtxRetain": "context",
    "cuMemAllocHost_v2": "pinned",
    "cuMemAlloc_v2": "device memory",
    "cuStreamCreate": "stream",
    "cuEventCreate": "event",
}
_DESTROYS = {
    "cuMemFreeHost": "pinned",
    "cuMemFree_v2": "device memory",
    "cuStreamDestroy_v2": "stream",
    "cuEventDestroy_v2": "event",
}


@dataclass
class FakeCuda:
    """A CUDA driver library in Python: devices by ordinal with their PCI bus ids,
    injected CUresults per call, and a ledger of live resources (empty = all freed)."""

    bus_ids: list[str]
    fail: dict[str, int] = field(default_factory=dict)
    elapsed_ms: float = 50.0
    init_result: int = 0
    live: dict[int, str] = field(default_factory=dict)
    retained: list[int] = field(default_factory=list)
    current: Any = None
    calls: list[str] = field(default_factory=list)
    _next: int = 0x1000

    def load(self, name: str) -> SimpleNamespace:
        """The `loader` argument: returns the library's entry points."""
        names = [*_CREATES, *_DESTROYS, "cuInit", "cuDeviceGetCount", "cuDeviceGet",
                 "cuDeviceGetPCIBusId", "cuDevicePrimaryCtxRelease_v2", "cuCtxSetCurrent",
                 "cuEventRecord", "cuEventSynchronize", "cuEventElapsedTime_v2",
                 "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2"]
        return SimpleNamespace(**{n: self._entry(n) for n in names})

    def _entry(self, name: str) -> Callable[..., int]:
        def call(*args: Any) -> int:  # a plain function: ctypes sets argtypes on it
            self.calls.append(name)
            if name in self.fail:
                return self.fail[name]
            return self._do(name, args)

        return call

    def _do(self, name: str, args: tuple[Any, ...]) -> int:
        if name == "cuInit":
            return self.init_result
        if name in _CREATES:
            return self._create(name, args)
        if name in _DESTROYS:
            self.live.pop(args[0])
        elif name == "cuDevicePrimaryCtxRelease_v2":
            self.live.pop(next(h for h, k in self.live.items() if k == "context"))
        elif name == "cuCtxSetCurrent":
            self.current = getattr(args[0], "value", args[0])
        elif name == "cuDeviceGetCount":
            args[0]._obj.value = len(self.bus_ids)
        elif name == "cuDeviceGet":
            args[0]._obj.value = args[1]
        elif name == "cuDeviceGetPCIBusId":
            args[0].value = self.bus_ids[args[2]].encode()
        elif name == "cuEventElapsedTime_v2":
            args[0]._obj.value = self.elapsed_ms
        return 0

    def _create(self, name: str, args: tuple[Any, ...]) -> int:
        self._next += 0x10
        args[0]._obj.value = self._next
        self.live[self._next] = _CREATES[name]
        if name == "cuDevicePrimaryCtxRetain":
            self.retained.append(args[1])
        return 0
