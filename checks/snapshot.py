"""What the NVML checks judge: one NVML pass per round, as plain values.

`checks.nvml_reader.NvmlReader.read()` (the one place that talks to NVML, through
the real `pynvml`) walks every GPU once and returns a `NodeSnapshot`; the NVML checks
judge that snapshot and never call NVML themselves. NVML outcomes become values:

- library or driver missing -> `NodeSnapshot.driver_error` = "NVIDIA driver not found"
  (the checks turn it into UNKNOWN with that one-line reason)
- `NotSupported` for one property -> that reading is `Unsupported` (SKIPPED)
- `GPU_IS_LOST` -> `GpuSnapshot.lost` (the `gpus` check reports GPU_MISSING)
- any other NVML error for a property -> that reading is `Failed` (UNKNOWN)

Blocking NVML calls run in a worker thread (anyio) under the caller's deadline,
one at a time (a CapacityLimiter of 1 shared by every call of a source). XID waits
are short (100 ms by default) and looped, so cancelling a caller never leaves a
blocking C call running for long.

This module holds the snapshot types and `NvmlGpuSource`, the async `GpuSource`
the agent and `healthd check` hand to checks (it runs the reader in a thread).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import anyio
import anyio.to_thread

if TYPE_CHECKING:
    from checks.nvml_reader import NvmlReader

T = TypeVar("T")

DRIVER_NOT_FOUND = "NVIDIA driver not found"


@dataclass(frozen=True)
class Unsupported:
    """NVML says this GPU does not support the property: SKIPPED, not a failure.
    `function` and `error` name the NVML call and its error (`NOT_SUPPORTED`) when
    one said so, so a recording can replay the very same answer."""

    reason: str = "not supported"
    function: str = ""
    error: str = ""


@dataclass(frozen=True)
class Failed:
    """NVML failed to read the property: the check cannot tell (UNKNOWN). `function`
    and `error` name the NVML call and its `NVML_ERROR_*` name without the prefix
    (`UNKNOWN`, `NO_PERMISSION`); `error` is empty for a failure that is not an NVML
    error code (a binding surprise)."""

    reason: str
    function: str = ""
    error: str = ""


@dataclass(frozen=True)
class Ok(Generic[T]):
    value: T


Reading = Ok[T] | Unsupported | Failed


@dataclass(frozen=True)
class RemappedRows:
    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


@dataclass(frozen=True)
class PcieLink:
    gen: int
    width: int
    max_gen: int
    max_width: int


@dataclass(frozen=True)
class Power:
    usage_w: float
    limit_w: float


@dataclass(frozen=True)
class Ecc:
    """Volatile (since driver load) ECC error counts."""

    corrected_volatile: int
    uncorrected_volatile: int


@dataclass(frozen=True)
class NvLink:
    link: int
    up: bool


FabricState = Literal["not_started", "in_progress", "completed"]


@dataclass(frozen=True)
class Fabric:
    """The GPU's place in an NVLink fabric (NVSwitch systems), as NVML reports it:
    the Fabric Manager's registration `state`, its outcome `status` (an NVML_ERROR_*
    name without the prefix, `SUCCESS` once registered), the clique and cluster. A GPU
    without a fabric (PCIe boards) is an `Unsupported` reading, never a Fabric."""

    state: FabricState
    status: str = "SUCCESS"
    clique_id: int = 0
    cluster_uuid: str = ""
    health_mask: int = 0


@dataclass(frozen=True)
class GpuSnapshot:
    """Everything one NVML pass read about one GPU. Identity fields are empty when the
    GPU was lost before they could be read."""

    index: int
    uuid: str = ""
    pci_bus_id: str = ""
    model: str = ""
    lost: bool = False
    lost_reason: str = ""
    mig_enabled: bool = False
    mig_mode: Reading[bool] = Unsupported()  # what mig_enabled was derived from
    remapped: Reading[RemappedRows] = Unsupported()
    clock_event_reasons: Reading[int] = Unsupported()
    power: Reading[Power] = Unsupported()
    pcie: Reading[PcieLink] = Unsupported()
    pcie_replays: Reading[int] = Unsupported()
    ecc: Reading[Ecc] = Unsupported()
    retired_pages_pending: Reading[bool] = Unsupported()
    nvlinks: Reading[tuple[NvLink, ...]] = Unsupported()
    fabric: Reading[Fabric] = Unsupported()
    recovery_action: Reading[int] = Unsupported()  # NVML's number (checks.recovery names it)


@dataclass(frozen=True)
class NodeSnapshot:
    """One NVML pass over the whole node."""

    driver_error: str = ""
    driver_version: str = ""
    nvml_version: str = ""
    cuda_driver_version: int = 0  # major*1000 + minor*10; 0 when NVML could not say
    gpus: tuple[GpuSnapshot, ...] = ()
    taken_at: float = 0.0
    duration_s: float = 0.0


@dataclass(frozen=True)
class XidEvent:
    """An XID critical error delivered by NVML's event API."""

    xid: int
    gpu_index: int
    uuid: str
    at: float  # time.time() when received (or, from the kernel log, when logged)
    pci_bus_id: str = ""  # set for XIDs from the kernel log


# The longest single XID wait. The C call cannot be interrupted, so cancelling a
# watch or a window waits for the wait in flight: this bounds how long an agent takes
# to stop (well inside a pod's grace period). Nothing else queues behind a wait:
# reads have their own limiter and windows collect from a running watch. Longer waits
# only mean fewer thread hand-offs (2 a second instead of 10).
POLL_MS = 500


class NvmlGpuSource:
    """The real `GpuSource`: NVML read through pynvml in worker threads.

    `snapshot()` reads once per round (`new_round()` starts the next one);
    `xid_events(window_s)` returns the XIDs received during the window plus any that
    arrived while nobody was collecting; `watch_xids()` streams them as they come.
    Every XID reaches every running `watch_xids()`, and every `xid_events()` window
    open when it arrives (or, when none is open, the next window). While a watch
    runs, it alone waits on NVML and windows collect what it hands out, so a window
    never queues behind the watch's wait in flight.
    """

    def __init__(self, reader: NvmlReader | None = None, *, poll_ms: int = POLL_MS,
                 backlog: int = 1000) -> None:
        if reader is None:
            from checks.nvml_reader import NvmlReader

            reader = NvmlReader()
        self.reader = reader
        self.poll_ms = poll_ms
        self._limiter: anyio.CapacityLimiter | None = None  # reads
        self._wait_limiter: anyio.CapacityLimiter | None = None  # XID waits, one at a time
        self._round_lock: anyio.Lock | None = None
        self._cached: NodeSnapshot | None = None
        self._round = 0  # bumped by new_round(): a read begun in an older round is stale
        self._cached_round = -1
        self._backlog: deque[XidEvent] = deque(maxlen=backlog)
        self._collectors: list[list[XidEvent]] = []
        self._watchers: list[deque[XidEvent]] = []

    def new_round(self) -> None:
        """Start a new round: the next `snapshot()` reads NVML again, even when a read
        of the old round is still in flight (its result must not serve the new one)."""
        self._round += 1

    async def snapshot(self) -> NodeSnapshot:
        if self._round_lock is None:
            self._round_lock = anyio.Lock()
        async with self._round_lock:  # concurrent checks share one read
            if self._cached is None or self._cached_round != self._round:
                round_ = self._round
                self._cached = await self._in_thread(self.reader.read)
                self._cached_round = round_
            return self._cached

    async def xid_events(self, window_s: float) -> list[XidEvent]:
        mine: list[XidEvent] = list(self._backlog)
        self._backlog.clear()
        self._collectors.append(mine)
        try:
            if self._watchers:  # a watch receives for everyone: only collect meanwhile
                await anyio.sleep(max(0.0, window_s))
            else:
                await self._receive_for(window_s)
        finally:
            self._collectors.remove(mine)
        return mine

    async def _receive_for(self, window_s: float) -> None:
        deadline = anyio.current_time() + max(0.0, window_s)
        await self._receive(0)  # what NVML queued before the window
        while (left := deadline - anyio.current_time()) > 0:
            await self._receive(min(self.poll_ms, max(1, int(left * 1000))))

    async def watch_xids(self) -> AsyncIterator[XidEvent]:
        """XID events as they arrive, until the caller stops iterating."""
        queue: deque[XidEvent] = deque()
        self._watchers.append(queue)
        try:
            while True:
                while queue:
                    yield queue.popleft()
                await self._receive(self.poll_ms)
        finally:
            self._watchers.remove(queue)

    async def release(self, reason: str) -> None:
        """Let go of NVML until `resume()` (checks.nvml_reader.NvmlReader.release):
        returns once the reader holds nothing on any GPU. Meanwhile every snapshot
        says `reason` (its checks are UNKNOWN) and XID waits find no events. Cancelled
        (the agent stops), it stops waiting for a read a wedged driver holds."""
        await anyio.to_thread.run_sync(self.reader.release, reason, abandon_on_cancel=True)

    async def resume(self) -> None:
        """Take NVML up again, XID events included (registered before this returns, so
        none from here on is missed); the next snapshot reads afresh (a snapshot of
        the gap is not served again)."""
        self.reader.resume()
        self.new_round()
        await anyio.to_thread.run_sync(self.reader.listen)

    async def aclose(self) -> None:
        """End the NVML session (frees the XID event set)."""
        async with self._waits():  # never free the event set under a wait in flight
            await self._in_thread(self.reader.close)

    async def _receive(self, timeout_ms: int) -> None:
        """One short wait for XIDs; hand what arrives to collectors and watchers.
        When events cannot be received (no driver), sleep instead of spinning."""
        from checks.nvml_reader import XidUnavailable

        while True:
            try:
                event = await anyio.to_thread.run_sync(self.reader.wait_xid, timeout_ms,
                                                       limiter=self._waits())
            except XidUnavailable:
                await anyio.sleep(timeout_ms / 1000)
                return
            if event is None:
                return
            self._publish(event)
            timeout_ms = 0  # drain whatever else is queued without waiting

    def _publish(self, event: XidEvent) -> None:
        if self._collectors:
            for collected in self._collectors:
                collected.append(event)
        else:
            self._backlog.append(event)
        for queue in self._watchers:
            queue.append(event)

    def _waits(self) -> anyio.CapacityLimiter:
        if self._wait_limiter is None:
            self._wait_limiter = anyio.CapacityLimiter(1)
        return self._wait_limiter

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(1)
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)
